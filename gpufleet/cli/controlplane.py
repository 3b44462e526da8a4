"""Assembles a control plane in one process: store, API server (HTTP and in-process),
and the controllers, all on one event loop; or a part of one (``components``): the API
server alone, or the scheduler and controllers alone, reaching an API server over HTTP
with a kubeconfig as the node agents do."""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.apiserver.admission.podsecurity import PodSecurityConfig
from gpufleet.apiserver.app import HttpServer
from gpufleet.apiserver.flowcontrol import FlowControl, FlowControlConfig
from gpufleet.apiserver.limits import DEFAULT_MAX_REQUEST_BODY_BYTES
from gpufleet.apiserver.nodeproxy import NodeProxy
from gpufleet.apiserver.server import ApiServer
from gpufleet.client.api import Client
from gpufleet.client.kubeconfig import write_kubeconfig
from gpufleet.client.leaderelection import (
    CONTROLLER_MANAGER_LEASE,
    SCHEDULER_LEASE,
    LeaderElectionConfig,
    LeaderElector,
    default_identity,
)
from gpufleet.client.transport import LocalTransport
from gpufleet.store.base import Store, open_store
from gpufleet.utils.clock import REAL_CLOCK, Clock
from gpufleet.utils.files import private_dir, tighten_dir_files, write_private

log = logging.getLogger("gpufleet")


@dataclass
class ControlPlane:
    store_url: str
    host: str = "127.0.0.1"
    port: int = 6443
    state_dir: Path | None = None
    run_controllers: bool = True
    run_scheduler: bool | None = None  # default: with the controllers
    # False: no store, API server or gateway here; the scheduler and controllers use the API
    # server that `kubeconfig` (default <state_dir>/kubeconfig) names, over HTTP.
    run_apiserver: bool = True
    kubeconfig: Path | None = None
    api_wait: float = 60.0  # seconds to wait for that API server to answer at start
    clock: Clock = REAL_CLOCK
    rng: random.Random | None = None  # generated names and uids (None: the system's random source)
    store: Store | None = None
    api: ApiServer | None = None
    http: HttpServer | None = None
    client: Client | None = None
    node_proxy: NodeProxy | None = None
    # TLS and authentication (see gpufleet/apiserver/auth). secure=False serves plain HTTP
    # and lets every request in as an administrator: for development only.
    secure: bool = True
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_ca_file: Path | None = None  # the CA that signed tls_cert_file, for the kubeconfig
    token_auth_file: Path | None = None  # more static tokens, Kubernetes' CSV format
    # Service account tokens (kube-apiserver's flags of the same names): the signing key
    # (default <state-dir>/pki/sa.key, made once), more public keys to accept, the issuers
    # (the first signs) and the audiences the API accepts (default: the issuers).
    service_account_signing_key_file: Path | None = None
    service_account_key_files: list[Path] = field(default_factory=list)
    service_account_issuers: list[str] = field(default_factory=list)
    api_audiences: list[str] = field(default_factory=list)
    admin_token: str | None = None
    join_token: str | None = None
    loopback_token: str | None = None
    ca_pem: bytes | None = None
    # The service gateway (gpufleet.gateway) on its own port (0 picks a free one; None: none),
    # and how often the HPA controller evaluates each autoscaler.
    gateway_port: int | None = None
    hpa_sync_period: float = 15.0
    hpa_rate_watch: float = 1.0
    # Node IPAM: the pod network and the prefix length of each node's part of it.
    cluster_cidr: str = "10.244.0.0/16"
    node_cidr_mask_size: int = 24
    gateway: Any = None
    # Where the local-path StorageClass made at first start keeps volumes on each node
    # (None: /var/lib/gpufleet/local-path).
    local_path_dir: str | None = None
    # The scheduler and the controller manager run only while this process holds their
    # Lease (kube-system/gpufleet-scheduler, kube-system/gpufleet-controller-manager), so
    # several servers on one PostgreSQL have one active of each. leader_elect=False runs
    # them unconditionally (one server, or something else doing the electing).
    leader_elect: bool = True
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    identity: str | None = None  # default: <hostname>_<pid>_<random>
    # The default/kubernetes Service and its Endpoints (apiserver/kubernetesservice.py), with
    # this server at advertise_address (default: the listen address, or for a wildcard the
    # first non-loopback IPv4 address, as kube-apiserver's --advertise-address).
    kubernetes_service: bool = True
    advertise_address: str | None = None
    # The PodSecurity admission plugin's configuration (None: enforce baseline in every
    # namespace but kube-system).
    pod_security: PodSecurityConfig | None = None
    # kube-apiserver's --encryption-provider-config: an EncryptionConfiguration whose
    # providers encrypt the resources it names (Secrets, typically) before they reach the
    # store (None: stored as they are, Kubernetes' identity default). See store/encryption.py.
    encryption_provider_config: Path | None = None
    # What a joining node may claim (apiserver/auth/nodejoin.py): at most this many GPUs
    # (None: any), and only these names or patterns (empty: any).
    max_node_gpus: int | None = None
    node_name_allowed: list[str] = field(default_factory=list)
    # Audit logging (kube-apiserver's --audit-policy-file, --audit-log-path and the rotation
    # flags): off unless both a policy and a path are given.
    audit_policy: Any = None
    audit_log_path: str | None = None
    audit_log_options: Any = None
    # Request limits (kube-apiserver's flags of the same names; 0: no limit): the largest
    # body, and the requests worked on at once, read-only and mutating (see
    # apiserver/flowcontrol.py for how the seats are shared).
    max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES
    max_requests_inflight: int = 400
    max_mutating_requests_inflight: int = 200
    # Components only: the API server's address, and its gateway's (<state_dir>/gateway-url).
    remote_url: str | None = None
    remote_gateway_url: str | None = None
    electors: list[Any] = field(default_factory=list)
    _tasks: list[asyncio.Task] = field(default_factory=list)
    _stoppables: list[Any] = field(default_factory=list)
    # The informers of this process's scheduler and controller manager: one cache of each
    # kind for both, kept across leadership terms (a new term does not list again).
    _informers: Any = None

    @property
    def url(self) -> str:
        assert self.http is not None
        return f"{'https' if self.secure else 'http'}://{self.host}:{self.http.port}"

    def _security(self):
        """Tokens, PKI and the Security assembly; the admin and join tokens live in the
        state dir (tokens.csv, join-token) so they survive a restart."""
        from gpufleet.apiserver.auth import Security
        from gpufleet.apiserver.auth.certs import IN_CLUSTER_NAMES, ensure_pki, serving_hosts, uncovered
        from gpufleet.apiserver.auth.serviceaccounts import ServiceAccountTokens, ensure_service_account_key
        from gpufleet.apiserver.auth.tokens import ensure_admin_token, ensure_join_token, load_token_file

        state = private_dir(self.state_dir or Path(tempfile.mkdtemp(prefix="gpufleet-")))
        tokens_csv = state / "tokens.csv"
        self.admin_token = ensure_admin_token(tokens_csv)
        self.join_token = ensure_join_token(state / "join-token")
        static = load_token_file(tokens_csv)
        if self.token_auth_file is not None:
            static.update(load_token_file(self.token_auth_file))
        if self.tls_cert_file is None:
            pki = ensure_pki(state / "pki", serving_hosts(self.host))
            self.tls_cert_file, self.tls_key_file, self.tls_ca_file = pki.cert, pki.key, pki.ca_cert
        else:
            missing = uncovered(self.tls_cert_file.read_bytes(), list(IN_CLUSTER_NAMES))
            if missing:
                log.warning("%s does not name %s: programs in pods that dial the API server by these names "
                            "will not trust it", self.tls_cert_file, ", ".join(missing))
        ca = self.tls_ca_file or self.tls_cert_file
        self.ca_pem = ca.read_bytes() if ca is not None else None
        signing_key = self.service_account_signing_key_file
        if signing_key is None:
            signing_key, _ = ensure_service_account_key(state / "pki")
        service_accounts = ServiceAccountTokens.from_files(
            signing_key, self.service_account_key_files, self.service_account_issuers, self.api_audiences)
        self.loopback_token = secrets.token_urlsafe(32)
        from gpufleet.apiserver.auth.nodejoin import JoinPolicy

        return Security(self.store, static_tokens=static, join_token=self.join_token,
                        loopback_token=self.loopback_token, service_accounts=service_accounts, clock=self.clock,
                        join_policy=JoinPolicy(self.max_node_gpus, list(self.node_name_allowed)))

    async def start(self) -> None:
        if not self.run_apiserver:
            await self._start_components_only()
            return
        if self.state_dir is not None:
            tighten_state_dir(self.state_dir)
        codec = None
        if self.encryption_provider_config is not None:
            from gpufleet.store.encryption import load_encryption_config

            codec = load_encryption_config(self.encryption_provider_config)
        self.store = open_store(self.store_url, clock=self.clock, codec=codec)
        await self.store.start()
        # Logs and metrics.k8s.io come from the node agents, through the node proxy.
        self.node_proxy = NodeProxy(self.store, clock=self.clock)
        self.api = ApiServer(self.store, clock=self.clock, rng=self.rng, log_provider=self.node_proxy.log_provider,
                             pod_security=self.pod_security)
        self.node_proxy.install(self.api)
        if self.audit_policy is not None and self.audit_log_path:
            from gpufleet.apiserver.audit import AuditLog, Auditor

            self.api.telemetry.enable_audit(Auditor(self.audit_policy,
                                                    AuditLog(self.audit_log_path, self.audit_log_options)))
        self.api.limits.max_request_body_bytes = self.max_request_body_bytes
        self.api.flow = FlowControl(FlowControlConfig(
            max_requests_inflight=self.max_requests_inflight,
            max_mutating_requests_inflight=self.max_mutating_requests_inflight))
        # Team queues: queued jobs are created suspended; `get` columns of the queue kinds.
        from gpufleet.apiserver.admission.queues import install as install_queues

        install_queues(self.api)
        security = self._security() if self.secure else None
        if security is not None:
            security.install(self.api)
        else:
            # Plain HTTP issues no service account tokens (pods could not use them over
            # https anyway): pods still get their service account, but no token volume.
            from gpufleet.apiserver.admission.serviceaccount import ServiceAccountAdmission

            for plugin in self.api.mutating:
                if isinstance(plugin, ServiceAccountAdmission):
                    plugin.mount_token = False
        await self.api.start()
        if security is not None:
            await security.ensure_policy(self.api)
            node_credentials = await security.ensure_proxy_key(self.api)
            self.node_proxy.node_headers = security.node_proxy_headers
            await self.node_proxy.use_tls(node_credentials.ssl_context())
        certs = dict(certfile=str(self.tls_cert_file), keyfile=str(self.tls_key_file)) if self.secure else {}
        self.http = HttpServer(self.api, host=self.host, port=self.port, **certs)
        await self.http.start()
        self.client = Client(self.local_transport())
        if self.kubernetes_service:
            from gpufleet.apiserver.kubernetesservice import KubernetesService, advertise_address

            service = KubernetesService(self.api, self.advertise_address or advertise_address(self.host),
                                        self.http.port, clock=self.clock)
            await service.start()
            self._stoppables.append(service)
        if self.state_dir is not None:
            write_kubeconfig(self.state_dir / "kubeconfig", self.kubeconfig_url, token=self.admin_token,
                             ca_data=self.ca_pem)
        if self.state_dir is not None:
            # Written again below once this run's gateway listens: one left by an earlier
            # run must not point at a gateway that is not there.
            (self.state_dir / "gateway-url").unlink(missing_ok=True)
        if self.gateway_port is not None:
            from gpufleet.gateway import Gateway

            gateway = Gateway(self.client, host=self.host, port=self.gateway_port, clock=self.clock,
                              protected_ports=(self.http.port,),
                              authorize_metrics=(lambda token: security.non_resource_access(token, "/metrics"))
                              if security is not None else None)
            try:
                await gateway.start()
            except OSError as exc:
                # A taken port must not take the API down with it.
                log.error("gateway: cannot listen on %s:%s (%s); running without a gateway "
                          "(choose another with --gateway-port)", self.host, self.gateway_port, exc)
            else:
                self.gateway = gateway
                self._stoppables.append(gateway)
                if self.state_dir is not None:
                    write_private(self.state_dir / "gateway-url", gateway.url + "\n")
        await self._start_components()

    async def _start_components(self) -> None:
        if self.run_controllers:
            await self._run_leading(CONTROLLER_MANAGER_LEASE, "controller manager", self._new_controller_manager)
        if self.run_scheduler if self.run_scheduler is not None else self.run_controllers:
            await self._run_leading(SCHEDULER_LEASE, "scheduler", self._new_scheduler)

    async def _start_components_only(self) -> None:
        """The scheduler and controllers of an API server running elsewhere (another process,
        another machine): its kubeconfig gives the address, the CA and the credentials."""
        from gpufleet.client.kubeconfig import transport_from_config

        config, self.ca_pem, self.remote_gateway_url = _remote_settings(self.kubeconfig, self.state_dir)
        self.client = Client(transport_from_config(config))
        self.remote_url = config.server
        await self._wait_for_api()
        await self._start_components()

    async def _wait_for_api(self) -> None:
        """Until the API server answers /readyz (it may be starting too), within api_wait."""
        assert self.client is not None
        deadline = asyncio.get_running_loop().time() + self.api_wait
        while True:
            try:
                resp = await self.client.raw_request("GET", "/readyz", raise_for_status=False)
                if resp.status == 200:
                    return
                why = f"/readyz answered {resp.status}"
            except Exception as exc:  # refused, TLS, DNS: the server may not listen yet
                why = str(exc)
            if asyncio.get_running_loop().time() > deadline:
                raise RuntimeError(f"the API server at {self.remote_url} did not answer within "
                                   f"{self.api_wait:.0f} s ({why})")
            await asyncio.sleep(0.5)

    @property
    def gateway_url(self) -> str | None:
        if self.gateway is not None:
            return self.gateway.url
        return self.remote_gateway_url

    def _shared_informers(self) -> Any:
        if self._informers is None:
            from gpufleet.client.informer import SharedInformerFactory

            self._informers = SharedInformerFactory(self.client, strip_managed_fields=True)
        return self._informers

    def _new_controller_manager(self) -> Any:
        from gpufleet.controllers.manager import ControllerManager
        from gpufleet.scheduler.placement import room

        options: dict[str, Any] = {"worker_room": room}
        if self.local_path_dir is not None:
            options["local_path_node_path"] = self.local_path_dir
        return ControllerManager(self.client, clock=self.clock, hpa_sync_period=self.hpa_sync_period,
                                 hpa_rate_watch=self.hpa_rate_watch,
                                 hpa_gateway_url=self.gateway_url,
                                 cluster_cidr=self.cluster_cidr, node_cidr_mask_size=self.node_cidr_mask_size,
                                 root_ca=self.ca_pem, informers=self._shared_informers(), **options)

    def _new_scheduler(self) -> Any:
        from gpufleet.scheduler import Scheduler

        return Scheduler(self.client, clock=self.clock, informers=self._shared_informers())

    async def _run_leading(self, lease: str, what: str, make: Any) -> None:
        """Run a fresh ``make()`` component for each term this process holds ``lease``.
        When this process wins at once (one server, or the first), the component has started
        by the time this returns, as without an election."""
        assert self.client is not None
        if not self.leader_elect:
            component = make()
            await component.start()
            self._stoppables.append(component)
            return
        term = _Term(make, what)
        if self.identity is None:
            self.identity = default_identity()
        config = LeaderElectionConfig(name=lease, identity=self.identity, lease_duration=self.lease_duration,
                                      renew_deadline=self.renew_deadline, retry_period=self.retry_period)
        elector = LeaderElector(self.client, config, clock=self.clock, on_started_leading=term.start,
                                on_stopped_leading=term.stop,
                                on_new_leader=lambda holder: log.info("%s: the leader is now %s", what, holder),
                                holder_gone=_dead_on_this_host
                                if self.run_apiserver and self.store_url.startswith("sqlite:") else None)
        self.electors.append(elector)
        self._stoppables.append(elector)
        elector.start()
        await elector.first_attempt.wait()
        if elector.is_leader():
            await term.started.wait()

    @property
    def kubeconfig_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else "::1" if self.host == "::" else self.host
        host = f"[{host}]" if ":" in host else host
        assert self.http is not None
        return f"{'https' if self.secure else 'http'}://{host}:{self.http.port}"

    def local_transport(self, token: str | None = None) -> LocalTransport:
        """An in-process transport; without ``token`` it acts as the control plane itself."""
        assert self.api is not None
        return LocalTransport(self.api, token=token or self.loopback_token)

    async def stop(self) -> None:
        for s in reversed(self._stoppables):
            await s.stop()
        if self._informers is not None:
            await self._informers.stop()
        if self.http is not None:
            await self.http.stop()
        if self.node_proxy is not None:
            await self.node_proxy.close()
        if self.api is not None:
            self.api.telemetry.close()  # the last audit lines reach the file
        if self.store is not None:
            await self.store.close()
        if not self.run_apiserver and self.client is not None:
            await self.client.close()


def _remote_settings(kubeconfig: Path | None, state_dir: Path | None) -> tuple[Any, bytes | None, str | None]:
    """The kubeconfig (default <state_dir>/kubeconfig), the CA it trusts (what pods' service
    account volumes get as ca.crt), and the gateway's address the API server's process left in
    <state_dir>/gateway-url (None: no gateway)."""
    from gpufleet.client.kubeconfig import load_kubeconfig

    config = load_kubeconfig(kubeconfig or (state_dir / "kubeconfig" if state_dir is not None else None))
    ca = config.ca_data or (Path(config.ca_file).read_bytes() if config.ca_file else None)
    gateway_url = None
    if state_dir is not None and (state_dir / "gateway-url").exists():
        gateway_url = (state_dir / "gateway-url").read_text().strip() or None
    return config, ca, gateway_url


def tighten_state_dir(state: Path) -> None:
    """The state dir (0700) and what the control plane keeps in it (0600: the database, the
    tokens, the kubeconfig, the keys and certificates, the local agent's credentials), also
    when an earlier run, an older version or a loose umask left them readable to others.
    The pods' own trees (volumes, logs, sandboxes) keep the modes their specs ask for: the
    0700 dirs above them keep other users out."""
    private_dir(state)
    for directory in (state, state / "pki", state / "agent"):
        tighten_dir_files(directory)


class _Term:
    """One leader's component: made afresh for each term, stopped when the term ends."""

    def __init__(self, make: Any, what: str) -> None:
        self.make = make
        self.what = what
        self.component: Any = None
        self.started = asyncio.Event()  # set once the first start attempt is over

    async def start(self) -> None:
        self.component = self.make()
        try:
            await self.component.start()
            print(f"{self.what}: became leader", flush=True)
        finally:
            self.started.set()

    async def stop(self) -> None:
        component, self.component = self.component, None
        if component is not None:
            await component.stop()
            print(f"{self.what}: stopped leading", flush=True)


def _dead_on_this_host(holder: str) -> bool:
    """Whether a Lease holder (``<hostname>_<pid>_<random>``) was a process of this host that
    is gone: on an embedded store, a restarted `gpufleet up` takes its predecessor's Leases
    at once instead of waiting out their duration."""
    import os
    import socket

    parts = holder.rsplit("_", 2)
    if len(parts) != 3 or not parts[1].isdigit() or parts[0] != socket.gethostname().split(".")[0].lower():
        return False
    pid = int(parts[1])
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False
