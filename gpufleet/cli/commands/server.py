"""`gpufleet server`: the control plane alone, on SQLite or a shared PostgreSQL."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import typer

from gpufleet.cli.commands.up import (
    AdmissionConfigOption,
    AdvertiseAddressOption,
    ApiAudiencesOption,
    AuditLogMaxAgeOption,
    AuditLogMaxBackupOption,
    AuditLogMaxSizeOption,
    AuditLogPathOption,
    AuditPolicyOption,
    EncryptionConfigOption,
    GatewayPortOption,
    HpaSyncPeriodOption,
    InsecureOption,
    LocalPathHelp,
    MaxInflightOption,
    MaxMutatingInflightOption,
    MaxNodeGpusOption,
    MaxRequestBodyOption,
    NodeNameAllowedOption,
    PodSecurityDefaultOption,
    SaIssuerOption,
    SaKeyFileOption,
    SaSigningKeyOption,
    TlsCaOption,
    TlsCertOption,
    TlsKeyOption,
    TokenFileOption,
    apply_limits,
    audit_options,
    check_advertise_address,
    check_port_free,
    encryption_config,
    pod_security_config,
    security_options,
)


def register(app: typer.Typer) -> None:
    @app.command()
    def server(
        store: str = typer.Option("sqlite:///~/.gpufleet/state.db", "--store",
                                  help="sqlite:///PATH or postgresql://USER@HOST:PORT/DB"),
        port: int = typer.Option(6443, "--port"),
        host: str = typer.Option("127.0.0.1", "--host"),
        state_dir: Path = typer.Option(Path("~/.gpufleet"), "--state-dir",
                                       help="Where the kubeconfig, tokens and certificates are kept."),
        controllers: bool = typer.Option(True, "--controllers/--no-controllers",
                                         help="Run the controllers in this process."),
        verbose: bool = typer.Option(False, "--verbose", "-v"),
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
        leader_elect: bool = typer.Option(
            True, "--leader-elect/--no-leader-elect", help="Run the scheduler and the controllers only while "
            "holding their Lease in kube-system, so several servers on one PostgreSQL have one active of each."),
        lease_duration: float = typer.Option(
            15.0, "--leader-elect-lease-duration", help="Seconds a standby waits, after it last saw the "
            "leader renew, before it takes the Lease over."),
        renew_deadline: float = typer.Option(
            10.0, "--leader-elect-renew-deadline", help="Seconds the leader keeps trying to renew before it "
            "stops leading (less than the lease duration)."),
        retry_period: float = typer.Option(
            2.0, "--leader-elect-retry-period", help="Seconds between two attempts to acquire or renew."),
        local_path_dir: str = typer.Option("/var/lib/gpufleet/local-path", "--local-path-dir", help=LocalPathHelp),
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
        """Run the API server (and controllers) without a local node agent."""
        from gpufleet.cli.commands.up import _serve
        from gpufleet.cli.controlplane import ControlPlane

        logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        if store.startswith("sqlite:///~"):
            store = "sqlite:///" + str(Path(store.removeprefix("sqlite:///")).expanduser())
        if store.startswith("sqlite:///") and ":memory:" not in store:
            db_dir = Path(store.removeprefix("sqlite://")).parent
            try:
                db_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            except OSError as exc:
                raise typer.BadParameter(f"cannot create {db_dir} for the database ({exc.strerror}); "
                                         "choose a directory you can write to", param_hint="--store") from None
        pod_security = pod_security_config(pod_security_default, admission_config_file)
        encryption = encryption_config(encryption_provider_config)
        audit = audit_options(audit_policy_file, audit_log_path, audit_log_maxsize, audit_log_maxbackup,
                              audit_log_maxage)
        check_port_free(host, port)
        state_dir = state_dir.expanduser().resolve()
        cp = ControlPlane(store_url=store, host=host, port=port, state_dir=state_dir, run_controllers=controllers,
                          **security_options(insecure, tls_cert_file, tls_key_file, tls_ca_file, token_auth_file,
                                             service_account_signing_key_file=service_account_signing_key_file,
                                             service_account_key_files=service_account_key_file,
                                             service_account_issuers=service_account_issuer,
                                             api_audiences=api_audiences),
                          **audit)
        cp.advertise_address = check_advertise_address(advertise_address)
        cp.gateway_port = gateway_port if gateway_port >= 0 else None
        cp.hpa_sync_period = hpa_sync_period
        cp.local_path_dir = local_path_dir
        cp.pod_security = pod_security
        cp.encryption_provider_config = encryption
        cp.max_node_gpus, cp.node_name_allowed = max_node_gpus, list(node_name_allowed)
        apply_limits(cp, max_request_body_bytes, max_requests_inflight, max_mutating_requests_inflight)
        if leader_elect:
            from gpufleet.client.leaderelection import LeaderElectionConfig

            try:
                LeaderElectionConfig(name="check", identity="check", lease_duration=lease_duration,
                                     renew_deadline=renew_deadline, retry_period=retry_period)
            except ValueError as exc:
                raise typer.BadParameter(str(exc), param_hint="--leader-elect-lease-duration") from None
        cp.leader_elect = leader_elect
        cp.lease_duration, cp.renew_deadline, cp.retry_period = lease_duration, renew_deadline, retry_period
        asyncio.run(_serve(cp, state_dir))
