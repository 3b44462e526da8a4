"""The flags `gpufleet up` and `gpufleet server` share (TLS and authentication, audit,
admission, limits, the gateway and the HPA period), their checks, and how they are applied
to a ControlPlane: one ServerOptions both commands take through ``with_server_options``."""

from __future__ import annotations

import errno
import functools
import inspect
import socket
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, get_type_hints

import typer


def security_options(insecure: bool, tls_cert_file: Path | None, tls_key_file: Path | None,
                     tls_ca_file: Path | None, token_auth_file: Path | None, *,
                     service_account_signing_key_file: Path | None = None,
                     service_account_key_files: list[Path] | None = None,
                     service_account_issuers: list[str] | None = None,
                     api_audiences: list[str] | None = None) -> dict:
    """ControlPlane keyword arguments for the TLS and authentication flags of up and server."""
    key_files = [p.expanduser().resolve() for p in service_account_key_files or []]
    signing_key = service_account_signing_key_file.expanduser().resolve() if service_account_signing_key_file else None
    if signing_key is not None or key_files:
        from gpufleet.apiserver.auth.serviceaccounts import KeyFileError, load_public_keys, load_signing_key

        try:
            if signing_key is not None:
                load_signing_key(signing_key)
            for p in key_files:
                load_public_keys(p)
        except KeyFileError as exc:
            flag = "--service-account-signing-key-file" if signing_key is not None and str(signing_key) in str(exc) \
                else "--service-account-key-file"
            raise typer.BadParameter(str(exc), param_hint=flag) from None
    issuers = [i.strip() for i in service_account_issuers or [] if i.strip()]
    for issuer in issuers:
        if ":" in issuer:
            from urllib.parse import urlsplit

            parts = urlsplit(issuer)
            if not (parts.scheme and parts.netloc):
                raise typer.BadParameter(f"{issuer!r} contained a ':' but was not a valid URL",
                                         param_hint="--service-account-issuer")
    audiences = [a.strip() for value in api_audiences or [] for a in value.split(",") if a.strip()]
    sa_options = dict(service_account_signing_key_file=signing_key, service_account_key_files=key_files,
                      service_account_issuers=issuers, api_audiences=audiences)
    if (tls_cert_file is None) != (tls_key_file is None):
        raise typer.BadParameter("give --tls-cert-file and --tls-private-key-file together",
                                 param_hint="--tls-cert-file")
    for p in (tls_cert_file, tls_key_file, tls_ca_file, token_auth_file):
        if p is not None and not p.expanduser().is_file():
            raise typer.BadParameter(f"{p} does not exist")
    if token_auth_file is not None:
        from gpufleet.apiserver.auth.tokens import TokenFileError, load_token_file

        try:
            load_token_file(token_auth_file.expanduser())
        except TokenFileError as exc:
            raise typer.BadParameter(str(exc), param_hint="--token-auth-file") from None

    def path(p: Path | None) -> Path | None:
        return p.expanduser().resolve() if p is not None else None
    return dict(secure=not insecure, tls_cert_file=path(tls_cert_file), tls_key_file=path(tls_key_file),
                tls_ca_file=path(tls_ca_file), token_auth_file=path(token_auth_file), **sa_options)


def check_port_free(host: str, port: int, flag: str = "--port") -> None:
    """Refuse at once, naming the flag to change, when something already listens on the
    port (another `gpufleet up` most often), instead of failing halfway through start-up."""
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise typer.BadParameter(f"cannot resolve {host}: {exc}", param_hint="--host") from None
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
        try:
            s.bind(addr)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise typer.BadParameter(f"cannot listen on {host}:{port} ({exc.strerror})",
                                         param_hint="--host") from None
            raise typer.BadParameter(
                f"{host}:{port} is already in use (is another `gpufleet up` or `gpufleet server` running?); "
                "stop it, or choose another port (0 picks a free one)", param_hint=flag) from None


InsecureOption = typer.Option(False, "--insecure", help="Serve plain HTTP and let every request in as an "
                              "administrator (development only; the default is TLS with tokens and RBAC).")
TlsCertOption = typer.Option(None, "--tls-cert-file", help="Serving certificate (PEM) instead of the one "
                             "made under <state-dir>/pki.")
TlsKeyOption = typer.Option(None, "--tls-private-key-file", help="Key of --tls-cert-file (PEM).")
TlsCaOption = typer.Option(None, "--tls-ca-file", help="CA that signed --tls-cert-file, written into the "
                           "kubeconfig.")
TokenFileOption = typer.Option(None, "--token-auth-file", help="More static tokens, one per line: "
                               'token,user,uid,"group1,group2".')


SaSigningKeyOption = typer.Option(None, "--service-account-signing-key-file", help="Private key (PEM, RSA or "
                                  "ECDSA) service account tokens are signed with (default <state-dir>/pki/sa.key, "
                                  "made once). Servers sharing a store must share it.")
SaKeyFileOption = typer.Option([], "--service-account-key-file", help="More keys (PEM: public keys, private keys "
                               "or certificates) service account tokens are accepted from, e.g. a previous signing "
                               "key's; repeatable.")
SaIssuerOption = typer.Option([], "--service-account-issuer", help="The iss of issued tokens (default "
                              "https://kubernetes.default.svc.cluster.local); repeat to also accept tokens of "
                              "earlier issuers (the first one signs).")
ApiAudiencesOption = typer.Option([], "--api-audiences", help="Audiences a token must carry one of to be accepted "
                                  "by the API (comma-separated or repeated; default: the issuers).")


AdvertiseAddressOption = typer.Option(None, "--advertise-address", help="The IP address the default/kubernetes "
                                      "Endpoints give for this server (default: --host, or for 0.0.0.0 the first "
                                      "non-loopback IPv4 address).")


def check_advertise_address(value: str | None) -> str | None:
    if value is None:
        return None
    import ipaddress

    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise typer.BadParameter(f"{value!r} is not an IP address", param_hint="--advertise-address") from None


PodSecurityDefaultOption = typer.Option(
    None, "--pod-security-default", help="Pod Security level enforced (and at least warned about) in "
    "namespaces without a pod-security.kubernetes.io/enforce label: privileged, baseline or restricted, "
    "optionally with a version (baseline:v1.30). Default: baseline, or what --admission-control-config-file "
    "says.")
AdmissionConfigOption = typer.Option(
    None, "--admission-control-config-file", help="An AdmissionConfiguration (apiserver.config.k8s.io/v1) "
    "whose PodSecurity plugin configuration gives the defaults and exemptions (usernames, runtimeClasses, "
    "namespaces), as kube-apiserver reads it.")


def pod_security_config(default: str | None, config_file: Path | None):
    """The PodSecurity configuration from --pod-security-default and
    --admission-control-config-file: the file's, else gpufleet's (baseline, kube-system
    exempt); --pod-security-default sets the enforce default on top."""
    from gpufleet.api.podsecurity import LevelVersion, PolicyValueError
    from gpufleet.apiserver.admission.podsecurity import ConfigError, PodSecurityConfig, load_admission_config

    config = None
    if config_file is not None:
        try:
            config = load_admission_config(config_file.expanduser().resolve())
        except ConfigError as exc:
            raise typer.BadParameter(str(exc), param_hint="--admission-control-config-file") from None
    if config is None:
        config = PodSecurityConfig.default()
    if default is not None:
        try:
            config = config.with_enforce(LevelVersion.parse(default))
        except PolicyValueError as exc:
            raise typer.BadParameter(f'"{default}": {exc} (optionally with a version: baseline:v1.30)',
                                     param_hint="--pod-security-default") from None
    return config


EncryptionConfigOption = typer.Option(
    None, "--encryption-provider-config", help="An EncryptionConfiguration (apiserver.config.k8s.io/v1), as "
    "kube-apiserver reads it: the resources it names (secrets, ...) are stored encrypted with its first "
    "provider (aescbc or aesgcm) and read with any of them. Default: stored as they are (identity).")


def encryption_config(path: Path | None) -> Path | None:
    """The --encryption-provider-config file, checked now: a bad one refuses to start,
    naming the field, rather than leaving secrets in the clear."""
    if path is None:
        return None
    from gpufleet.store.encryption import EncryptionConfigError, load_encryption_config

    path = path.expanduser().resolve()
    try:
        load_encryption_config(path)
    except EncryptionConfigError as exc:
        raise typer.BadParameter(str(exc), param_hint="--encryption-provider-config") from None
    return path


MaxNodeGpusOption = typer.Option(None, "--max-node-gpus", min=0, help="Refuse a node that claims more "
                                 "than this many GPUs (nvidia.com/gpu in its capacity; 422). Default: any.")
NodeNameAllowedOption = typer.Option([], "--node-name-allowed", help="Only nodes of these names join (a name or "
                                     "a shell pattern such as gpu-*; repeatable). Default: any name.")
AuditPolicyOption = typer.Option(
    None, "--audit-policy-file", help="An audit Policy (audit.k8s.io/v1): which requests are logged, at which "
    "level (None, Metadata, Request, RequestResponse); the first matching rule decides. Needs --audit-log-path.")
AuditLogPathOption = typer.Option(
    None, "--audit-log-path", help="The file audit events are appended to, one audit.k8s.io/v1 Event per line "
    "(mode 0600; '-' is standard output). Audit logging is off without it.")
AuditLogMaxSizeOption = typer.Option(0, "--audit-log-maxsize", min=0, help="Megabytes the audit log may reach "
                                     "before it is rotated (0: never).")
AuditLogMaxBackupOption = typer.Option(0, "--audit-log-maxbackup", min=0, help="Rotated audit logs kept "
                                       "(0: all).")
AuditLogMaxAgeOption = typer.Option(0, "--audit-log-maxage", min=0, help="Days a rotated audit log is kept "
                                    "(0: no limit).")


def audit_options(policy_file: Path | None, log_path: str | None, max_size: int = 0, max_backup: int = 0,
                  max_age: int = 0) -> dict:
    """ControlPlane keyword arguments for the audit flags of up and server."""
    if policy_file is None and not log_path:
        return {}
    if policy_file is None or not log_path:
        missing, given = ("--audit-policy-file", "--audit-log-path") if policy_file is None else \
            ("--audit-log-path", "--audit-policy-file")
        raise typer.BadParameter(f"{given} needs {missing} too: the policy says what is logged, the path where",
                                 param_hint=missing)
    from gpufleet.apiserver.audit import LogOptions, PolicyError, load_policy

    try:
        policy = load_policy(policy_file.expanduser().resolve())
    except PolicyError as exc:
        raise typer.BadParameter(str(exc), param_hint="--audit-policy-file") from None
    path = log_path if log_path == "-" else str(Path(log_path).expanduser().resolve())
    if path != "-" and Path(path).is_dir():
        raise typer.BadParameter(f"{path} is a directory: give a file name", param_hint="--audit-log-path")
    return dict(audit_policy=policy, audit_log_path=path,
                audit_log_options=LogOptions(max_size, max_backup, max_age))


GatewayPortOption = typer.Option(8080, "--gateway-port", help="Port of the service gateway "
                                 "(/services/<namespace>/<name>/...); 0 picks a free one, -1 runs none.")
MaxRequestBodyOption = typer.Option(3 * 1024 * 1024, "--max-request-body-bytes", min=0, help="The largest request "
                                    "body accepted; a larger one gets 413 RequestEntityTooLarge before it is read "
                                    "(0: no limit).")
MaxInflightOption = typer.Option(400, "--max-requests-inflight", min=0, help="Read-only requests worked on at "
                                 "once; past it 429 TooManyRequests with Retry-After (0: no limit). A quarter of "
                                 "the seats is kept for nodes and the control plane, one user holds at most a "
                                 "quarter of the rest; system:masters is never limited.")
MaxMutatingInflightOption = typer.Option(200, "--max-mutating-requests-inflight", min=0, help="The same for "
                                         "mutating requests (create, update, patch, delete).")


def apply_limits(cp, max_request_body_bytes: int, max_requests_inflight: int,
                 max_mutating_requests_inflight: int) -> None:
    cp.max_request_body_bytes = max_request_body_bytes
    cp.max_requests_inflight = max_requests_inflight
    cp.max_mutating_requests_inflight = max_mutating_requests_inflight


HpaSyncPeriodOption = typer.Option(15.0, "--hpa-sync-period", help="Seconds between two evaluations of "
                                   "each HorizontalPodAutoscaler.")
HpaRateWatchOption = typer.Option(1.0, "--hpa-rate-watch", help="Seconds between looks at the gateway's request "
                                  "metrics between HPA syncs: an HPA whose metric goes above its target is evaluated "
                                  "then, not at its next sync (0: only the periodic syncs).")
ClusterCidrOption = typer.Option("10.244.0.0/16", "--cluster-cidr", help="The pod network, cut into one "
                                 "subnet per node (spec.podCIDR), as kube-controller-manager's --cluster-cidr.")
NodeCidrMaskSizeOption = typer.Option(24, "--node-cidr-mask-size", help="The prefix length of each node's "
                                      "subnet: a /16 cluster CIDR with /24 subnets holds 256 nodes (254 pods "
                                      "each), a /12 holds 4,096.")


def check_cluster_cidr(cidr: str, mask: int) -> str:
    """The cluster CIDR, normalized, once it is known to hold at least one node subnet of
    ``mask``; a bad value refuses to start, naming its flag."""
    import ipaddress

    try:
        network = ipaddress.ip_network(cidr, strict=False)
    except ValueError:
        raise typer.BadParameter(f"{cidr!r} is not a CIDR (e.g. 10.244.0.0/16)", param_hint="--cluster-cidr") from None
    if not network.prefixlen <= mask <= network.max_prefixlen - 2:
        raise typer.BadParameter(
            f"/{mask} does not fit in {network}: give a prefix length from {network.prefixlen} to "
            f"{network.max_prefixlen - 2}", param_hint="--node-cidr-mask-size")
    return str(network)


LocalPathHelp = ("Where the StorageClass local-path, made at the first start, keeps each volume on its node "
                 "(a directory per claim); an existing class keeps its nodePath.")


@dataclass(frozen=True)
class ServerOptions:
    """The values of the shared flags, as typer parsed them."""

    insecure: bool = InsecureOption
    tls_cert_file: Path | None = TlsCertOption
    tls_key_file: Path | None = TlsKeyOption
    tls_ca_file: Path | None = TlsCaOption
    token_auth_file: Path | None = TokenFileOption
    service_account_signing_key_file: Path | None = SaSigningKeyOption
    service_account_key_file: list[Path] = SaKeyFileOption
    service_account_issuer: list[str] = SaIssuerOption
    api_audiences: list[str] = ApiAudiencesOption
    advertise_address: str | None = AdvertiseAddressOption
    gateway_port: int = GatewayPortOption
    hpa_sync_period: float = HpaSyncPeriodOption
    hpa_rate_watch: float = HpaRateWatchOption
    cluster_cidr: str = ClusterCidrOption
    node_cidr_mask_size: int = NodeCidrMaskSizeOption
    pod_security_default: str | None = PodSecurityDefaultOption
    admission_config_file: Path | None = AdmissionConfigOption
    encryption_provider_config: Path | None = EncryptionConfigOption
    max_node_gpus: int | None = MaxNodeGpusOption
    node_name_allowed: list[str] = NodeNameAllowedOption
    audit_policy_file: Path | None = AuditPolicyOption
    audit_log_path: str | None = AuditLogPathOption
    audit_log_maxsize: int = AuditLogMaxSizeOption
    audit_log_maxbackup: int = AuditLogMaxBackupOption
    audit_log_maxage: int = AuditLogMaxAgeOption
    max_request_body_bytes: int = MaxRequestBodyOption
    max_requests_inflight: int = MaxInflightOption
    max_mutating_requests_inflight: int = MaxMutatingInflightOption

    def checked(self) -> CheckedOptions:
        """The configuration files read and checked: a bad one refuses to start, naming its
        flag, before anything listens."""
        return CheckedOptions(
            self,
            pod_security=pod_security_config(self.pod_security_default, self.admission_config_file),
            encryption=encryption_config(self.encryption_provider_config),
            audit=audit_options(self.audit_policy_file, self.audit_log_path, self.audit_log_maxsize,
                                self.audit_log_maxbackup, self.audit_log_maxage),
            cluster_cidr=check_cluster_cidr(self.cluster_cidr, self.node_cidr_mask_size),
        )


@dataclass(frozen=True)
class CheckedOptions:
    options: ServerOptions
    pod_security: Any
    encryption: Path | None
    audit: dict
    cluster_cidr: str

    def control_plane(self, **kwargs: Any):
        """A ControlPlane with ``kwargs`` (store_url, host, port, state_dir, ...) and the shared
        flags applied."""
        from gpufleet.cli.controlplane import ControlPlane

        o = self.options
        cp = ControlPlane(**kwargs, **security_options(
            o.insecure, o.tls_cert_file, o.tls_key_file, o.tls_ca_file, o.token_auth_file,
            service_account_signing_key_file=o.service_account_signing_key_file,
            service_account_key_files=o.service_account_key_file,
            service_account_issuers=o.service_account_issuer, api_audiences=o.api_audiences),
            **self.audit)
        cp.advertise_address = check_advertise_address(o.advertise_address)
        cp.gateway_port = o.gateway_port if o.gateway_port >= 0 else None
        cp.hpa_sync_period = o.hpa_sync_period
        cp.hpa_rate_watch = o.hpa_rate_watch
        cp.cluster_cidr = self.cluster_cidr
        cp.node_cidr_mask_size = o.node_cidr_mask_size
        cp.pod_security = self.pod_security
        cp.encryption_provider_config = self.encryption
        cp.max_node_gpus, cp.node_name_allowed = o.max_node_gpus, list(o.node_name_allowed)
        apply_limits(cp, o.max_request_body_bytes, o.max_requests_inflight, o.max_mutating_requests_inflight)
        return cp


def with_server_options(fn: Callable[..., None]) -> Callable[..., None]:
    """A typer command taking ``options: ServerOptions``: its --help and parsing show each of
    ServerOptions' flags in that parameter's place, and the command gets them as one value."""
    sig = inspect.signature(fn, eval_str=True)
    names = [f.name for f in fields(ServerOptions)]
    hints = get_type_hints(ServerOptions)
    shared = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                                annotation=hints[f.name]) for f in fields(ServerOptions)]
    params: list[inspect.Parameter] = []
    for p in sig.parameters.values():
        if p.name == "options":
            params += shared
        else:
            params.append(p.replace(kind=inspect.Parameter.KEYWORD_ONLY))

    @functools.wraps(fn)
    def command(**kwargs: Any) -> None:
        options = ServerOptions(**{n: kwargs.pop(n) for n in names})
        fn(**kwargs, options=options)

    command.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    return command
