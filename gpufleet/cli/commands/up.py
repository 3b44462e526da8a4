"""`gpufleet up`: the whole control plane on this machine, with SQLite under a state dir."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import signal
import socket
from pathlib import Path

import typer
from rich.console import Console

console = Console(stderr=True, soft_wrap=True)  # no line breaks inside commands to copy


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
LocalPathHelp = ("Where the StorageClass local-path, made at the first start, keeps each volume on its node "
                 "(a directory per claim); an existing class keeps its nodePath.")


def register(app: typer.Typer) -> None:
    @app.command()
    def up(
        state_dir: Path = typer.Option(Path("~/.gpufleet"), "--state-dir", help="Where the database, "
                                       "kubeconfig and logs live."),
        port: int = typer.Option(6443, "--port", help="API port on 127.0.0.1 (0 picks a free one)."),
        host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
        verbose: bool = typer.Option(False, "--verbose", "-v"),
        # --- the local node agent ---
        agent: bool = typer.Option(True, "--agent/--no-agent", help="Also run a node agent for this machine."),
        keep_pods: bool = typer.Option(False, "--keep-pods", help="Leave the local node's containers running "
                                       "when gpufleet up stops (the next start adopts them); by default they "
                                       "stop with it."),
        gpus: int | None = typer.Option(None, "--gpus", help="Declare this many GPUs for the local agent "
                                        "(default: what NVML finds)."),
        gpu_model: str | None = typer.Option(None, "--gpu-model", help="Model of the declared GPUs."),
        runtime: str = typer.Option("auto", "--runtime", help="The local agent's runtime: podman (OCI "
                                    "containers), process (sandboxed host processes), simulated, or auto "
                                    "(podman where it can run containers, else process)."),
        insecure: bool = InsecureOption,
        tls_cert_file: Path | None = TlsCertOption,
        tls_key_file: Path | None = TlsKeyOption,
        tls_ca_file: Path | None = TlsCaOption,
        token_auth_file: Path | None = TokenFileOption,
        service_account_signing_key_file: Path | None = SaSigningKeyOption,
        service_account_key_file: list[Path] = SaKeyFileOption,
        service_account_issuer: list[str] = SaIssuerOption,
        api_audiences: list[str] = ApiAudiencesOption,
        advertise_address: str | None = AdvertiseAddressOption,
        gateway_port: int = GatewayPortOption,
        hpa_sync_period: float = HpaSyncPeriodOption,
        local_path_dir: Path | None = typer.Option(None, "--local-path-dir", help=LocalPathHelp
                                                   + " Default: <state-dir>/local-path."),
        pod_security_default: str | None = PodSecurityDefaultOption,
        admission_config_file: Path | None = AdmissionConfigOption,
        encryption_provider_config: Path | None = EncryptionConfigOption,
        max_node_gpus: int | None = MaxNodeGpusOption,
        node_name_allowed: list[str] = NodeNameAllowedOption,
        audit_policy_file: Path | None = AuditPolicyOption,
        audit_log_path: str | None = AuditLogPathOption,
        audit_log_maxsize: int = AuditLogMaxSizeOption,
        audit_log_maxbackup: int = AuditLogMaxBackupOption,
        audit_log_maxage: int = AuditLogMaxAgeOption,
        max_request_body_bytes: int = MaxRequestBodyOption,
        max_requests_inflight: int = MaxInflightOption,
        max_mutating_requests_inflight: int = MaxMutatingInflightOption,
    ) -> None:
        """Start a local cluster: API server, scheduler, controllers and a node agent (runs until interrupted).

        The only server of its embedded database, it leads at once: it takes the scheduler's
        and the controller manager's Leases as it starts, with no election to wait for (a Lease
        left by an earlier `gpufleet up` on this machine whose process is gone is taken over
        at once), so there are no --leader-elect flags here. For several servers on one
        PostgreSQL, one of them leading, run `gpufleet server` (--leader-elect and its timings).
        """
        from gpufleet.cli.controlplane import ControlPlane
        from gpufleet.utils.files import private_dir

        logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        # One line per probe and per metrics read is noise unless asked for.
        logging.getLogger("httpx").setLevel(logging.DEBUG if verbose else logging.WARNING)
        pod_security = pod_security_config(pod_security_default, admission_config_file)
        encryption = encryption_config(encryption_provider_config)
        audit = audit_options(audit_policy_file, audit_log_path, audit_log_maxsize, audit_log_maxbackup,
                              audit_log_maxage)
        check_port_free(host, port)
        state_dir = private_dir(state_dir.expanduser().resolve())
        cp = ControlPlane(store_url=f"sqlite:///{state_dir / 'state.db'}", host=host, port=port,
                          state_dir=state_dir, **security_options(
                              insecure, tls_cert_file, tls_key_file, tls_ca_file, token_auth_file,
                              service_account_signing_key_file=service_account_signing_key_file,
                              service_account_key_files=service_account_key_file,
                              service_account_issuers=service_account_issuer, api_audiences=api_audiences),
                          **audit)
        cp.advertise_address = check_advertise_address(advertise_address)
        cp.gateway_port = gateway_port if gateway_port >= 0 else None
        cp.hpa_sync_period = hpa_sync_period
        # This machine is the only node and its agent runs as this user: volumes live under
        # the state dir rather than in /var/lib.
        cp.local_path_dir = str((local_path_dir or state_dir / "local-path").expanduser().resolve())
        cp.pod_security = pod_security
        cp.encryption_provider_config = encryption
        cp.max_node_gpus, cp.node_name_allowed = max_node_gpus, list(node_name_allowed)
        apply_limits(cp, max_request_body_bytes, max_requests_inflight, max_mutating_requests_inflight)
        local_agent = dict(gpus=gpus, gpu_model=gpu_model, runtime=runtime, address=host,
                           keep_pods=keep_pods) if agent else None
        asyncio.run(_serve(cp, state_dir, local_agent))


async def _start_local_agent(cp, state_dir: Path, options: dict):
    """An agent for this machine in the same process, talking to the API in-process."""
    from gpufleet.agent.agent import AgentConfig, NodeAgent
    from gpufleet.agent.bootstrap import node_token
    from gpufleet.agent.factory import build_devices, build_runtime
    from gpufleet.agent.node import hostname
    from gpufleet.cli.commands.agent import api_address
    from gpufleet.client import Client, LocalTransport
    from gpufleet.utils.files import private_dir

    name = hostname()
    agent_dir = private_dir(state_dir / "agent")
    address = options["address"] if options["address"] not in ("0.0.0.0", "::") else "127.0.0.1"
    # It joins like any other agent (join token -> its own node token), so NodeRestriction
    # holds for it too; with --insecure there is no token and it runs unrestricted.
    token = None
    if cp.secure:
        token = await node_token(lambda t: Client(LocalTransport(cp.api, token=t)), cp.join_token, name, agent_dir)
    agent = NodeAgent(Client(LocalTransport(cp.api, token=token)), build_runtime(options["runtime"], agent_dir,
                                                                    hidden_paths=[str(state_dir)], address=address),
                      build_devices(name, gpus=options["gpus"], gpu_model=options["gpu_model"]),
                      AgentConfig(node_name=name, state_dir=agent_dir, address=address,
                                  secure_port=token is not None,
                                  api_server=api_address(cp.url),
                                  stop_pods_on_exit=not options.get("keep_pods", False)))
    await agent.start()
    return agent


async def _serve(cp, state_dir: Path, local_agent: dict | None = None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await cp.start()
    agent = None
    if local_agent is not None:
        agent = await _start_local_agent(cp, state_dir, local_agent)
    kubeconfig = state_dir / "kubeconfig"
    console.print(f"[green]gpufleet is up[/green]: API at [bold]{cp.url}[/bold]")
    console.print(f"kubeconfig: {kubeconfig}")
    console.print(f"  export KUBECONFIG={kubeconfig}   # for kubectl and the kubernetes client")
    if agent is not None:
        console.print(f"node {agent.name}: {len(agent.gpus)} GPU(s), {agent.runtime.name} runtime; "
                      f"join more with `gpufleet agent --server {cp.kubeconfig_url} --token-file "
                      f"{state_dir / 'join-token'}"
                      f"{' --certificate-authority ' + str(cp.tls_ca_file) if cp.secure and cp.tls_ca_file else ''}`")
    if cp.gateway is not None:
        console.print(f"gateway: [bold]{cp.gateway.url}[/bold]/services/<namespace>/<name>/  "
                      f"(address also in {state_dir / 'gateway-url'})")
        print(f"Gateway listening on {cp.gateway.url}", flush=True)
    print(f"API server listening on {cp.url}", flush=True)
    await stop.wait()
    console.print("stopping ...")
    if agent is not None:
        await agent.stop()
    await cp.stop()
