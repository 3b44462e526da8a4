"""`gpufleet agent`: the node agent for one server, joining a control plane over HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def agent(
        server: Annotated[str | None, typer.Option(
            "--server", help="API server URL (default: the kubeconfig's); several, comma-separated, for a "
            "highly available control plane: the agent moves to the next when one cannot be reached.")] = None,
        token_file: Annotated[Path | None, typer.Option(
            "--token-file", help="File holding the token to join with: the cluster's join token "
            "(<state-dir>/join-token of `gpufleet up`), exchanged at the first start for this node's own "
            "token, kept in the agent's state dir.")] = None,
        token: Annotated[str | None, typer.Option(
            "--token", envvar="GPUFLEET_TOKEN", help="The token itself, instead of --token-file.")] = None,
        certificate_authority: Annotated[Path | None, typer.Option(
            "--certificate-authority", help="CA certificate (PEM) to verify the API server with "
            "(<state-dir>/pki/ca.crt of `gpufleet up`).")] = None,
        kubeconfig: Annotated[Path | None, typer.Option(
            "--kubeconfig", help="Kubeconfig to reach the API server with (when --server is not given).")] = None,
        name: Annotated[str | None, typer.Option("--name", help="Node name (default: the host name).")] = None,
        gpus: Annotated[int | None, typer.Option(
            "--gpus", help="Declare this many GPUs instead of asking NVML (0: none).")] = None,
        gpu_model: Annotated[str | None, typer.Option("--gpu-model", help="Model of the declared GPUs.")] = None,
        gpu_memory: Annotated[int | None, typer.Option(
            "--gpu-memory", help="Memory of each declared GPU, in MiB.")] = None,
        gpu_inventory: Annotated[Path | None, typer.Option(
            "--gpu-inventory", help="YAML file declaring the GPUs one by one.")] = None,
        runtime: Annotated[str, typer.Option(
            "--runtime", help="How pods run: podman (OCI containers), process (sandboxed host processes: "
            "bare metal), simulated, or auto (podman where it can run containers, else process).")] = "auto",
        state_dir: Annotated[Path | None, typer.Option(
            "--state-dir", help="Where the node token, logs and runtime state live (default: "
            "~/.gpufleet/agents/<name>, one per node, apart from the agent of `gpufleet up`).")] = None,
        address: Annotated[str, typer.Option(
            "--address", help="Address the agent serves on and reports as the node's InternalIP.")] = "127.0.0.1",
        port: Annotated[int, typer.Option("--port", help="Port for logs, stats and metrics (0: any).")] = 0,
        labels: Annotated[str | None, typer.Option(
            "--labels", help="Node labels, k=v,... (e.g. gpufleet.io/rack=r1).")] = None,
        taints: Annotated[str | None, typer.Option(
            "--taints", help="Node taints, k=v:NoSchedule,...")] = None,
        checkpoint_root: Annotated[list[str] | None, typer.Option(
            "--checkpoint-root", help="A tree training checkpoint directories may be mounted into pods from "
            "(<root>/<namespace>/...; repeatable; default /var/tmp/gpufleet/checkpoints, the PyTorchJob "
            "controller's). Put a shared filesystem there for gangs across servers.")] = None,
        hide_path: Annotated[list[str] | None, typer.Option(
            "--hide-path", help="A host path the process runtime's sandboxes show empty (repeatable; the "
            "agent's state dir, ~/.gpufleet and ~/.kube always are).")] = None,
        shared_path: Annotated[list[str] | None, typer.Option(
            "--shared-path", help="A host path the process runtime's sandboxes show read-write at the same "
            "place (repeatable): a scratch or home filesystem every pod may use.")] = None,
        gpu_health_interval: Annotated[float, typer.Option(
            "--gpu-health-interval", help="Seconds between GPU health polls (NVML counters and events; "
            "the --gpu-inventory file is re-read when it changed).")] = 1.0,
        gpu_health_policy: Annotated[str | None, typer.Option(
            "--gpu-health-policy", help="Overrides of the GPU health policy table, comma-separated: "
            "xid:79=drain-node, xid:13=warn, throttle=ignore, xid:unknown=ignore, nvlink-threshold=50 "
            "(actions: ignore, warn, drain-gpu, drain-node; see docs/gpu-health.md).")] = None,
        gpu_validation_command: Annotated[str | None, typer.Option(
            "--gpu-validation-command", help="Command of the validation pod a fenced GPU must pass (exit 0) to "
            "return to service; the pod is given only that GPU (default: a short CUDA check on real GPUs; on "
            "declared GPUs, a check that the inventory reports it healthy). See docs/gpu-health.md.")] = None,
        gpu_validation_image: Annotated[str | None, typer.Option(
            "--gpu-validation-image", help="Image of the validation pod (default: the node's programs with the "
            "process runtime; with podman, a CUDA base image on real GPUs, busybox on declared ones).")] = None,
        gpu_validation_timeout: Annotated[float, typer.Option(
            "--gpu-validation-timeout", help="Seconds a validation may take before it counts as failed.")] = 120.0,
        gpu_validation_backoff: Annotated[float, typer.Option(
            "--gpu-validation-backoff", help="Seconds between a failed validation and the next.")] = 60.0,
        gpu_failure_limit: Annotated[int, typer.Option(
            "--gpu-failure-limit", help="Failures (fences and failed validations) within --gpu-failure-window "
            "that hold a GPU out until `gpufleet uncordon --gpu NODE:INDEX`.")] = 3,
        gpu_failure_window: Annotated[str, typer.Option(
            "--gpu-failure-window", help="The window of --gpu-failure-limit, e.g. 1h, 30m.")] = "1h",
        cpus: Annotated[float | None, typer.Option("--cpus", help="CPUs to offer (default: all).")] = None,
        memory: Annotated[str | None, typer.Option("--memory", help="Memory to offer, e.g. 16Gi.")] = None,
        verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
    ) -> None:
        """Run the node agent: register this server as a Node and run the pods bound to it."""
        from gpufleet.agent.agent import AgentConfig
        from gpufleet.agent.node import hostname, parse_labels, parse_taints
        from gpufleet.api.quantity import to_int_bytes

        logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        # One line per lease renewal and per watch is noise unless asked for.
        logging.getLogger("httpx").setLevel(logging.DEBUG if verbose else logging.WARNING)
        if gpu_inventory is not None and gpus is not None:
            raise typer.BadParameter("give --gpus or --gpu-inventory, not both", param_hint="--gpu-inventory")
        try:
            node_labels = parse_labels(labels)
            node_taints = parse_taints(taints)
            memory_bytes = to_int_bytes(memory) if memory else None
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
        health = _health_options(gpu_health_interval, gpu_health_policy, gpu_validation_command,
                                 gpu_validation_timeout, gpu_validation_backoff, gpu_failure_limit, gpu_failure_window)
        health["gpu_validation_image"] = gpu_validation_image
        node_name = name or hostname()
        # The node token kept there is this node's: two agents sharing a dir would take each
        # other's identity, so each node name gets its own by default.
        state_dir = state_dir if state_dir is not None else Path("~/.gpufleet/agents") / node_name
        config = AgentConfig(node_name=node_name, state_dir=state_dir.expanduser().resolve(), address=address,
                             port=port, labels=node_labels, taints=node_taints, cpus=cpus, memory_bytes=memory_bytes,
                             **health)
        if checkpoint_root:
            config.checkpoint_roots = tuple(str(Path(r).expanduser().resolve()) for r in checkpoint_root)
        if token is not None and token_file is not None:
            raise typer.BadParameter("give --token or --token-file, not both", param_hint="--token")
        if token_file is not None:
            token = token_file.expanduser().read_text().strip()
        if certificate_authority is not None and not certificate_authority.expanduser().is_file():
            raise typer.BadParameter(f"{certificate_authority} does not exist", param_hint="--certificate-authority")
        from gpufleet.agent.factory import check_declared

        try:
            check_declared(gpus, gpu_model, gpu_memory)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--gpus/--gpu-model/--gpu-memory") from None
        hidden = [*(hide_path or []), *([str(kubeconfig)] if kubeconfig else [])]
        paths = dict(hidden_paths=[str(Path(p).expanduser().resolve()) for p in hidden],
                     shared_paths=[str(Path(p).expanduser().resolve()) for p in shared_path or []])
        code = asyncio.run(_run(config, server, token, kubeconfig, runtime,
                                dict(gpus=gpus, gpu_model=gpu_model, gpu_memory_mib=gpu_memory,
                                     inventory=gpu_inventory),
                                str(certificate_authority.expanduser()) if certificate_authority else None,
                                paths))
        raise typer.Exit(code)


def _health_options(interval: float, policy: str | None, command: str | None, timeout: float, backoff: float,
                    limit: int, window: str) -> dict:
    import shlex

    from gpufleet.api.gpuhealth import parse_policy
    from gpufleet.cli.output import parse_duration

    if interval <= 0:
        raise typer.BadParameter("must be > 0", param_hint="--gpu-health-interval")
    if limit < 1:
        raise typer.BadParameter("must be >= 1", param_hint="--gpu-failure-limit")
    try:
        parsed = parse_policy(policy)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--gpu-health-policy") from None
    try:
        seconds = parse_duration(window)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--gpu-failure-window") from None
    argv = tuple(shlex.split(command)) if command else None
    return dict(gpu_health_interval=interval, gpu_health_policy=parsed, gpu_validation_command=argv,
                gpu_validation_timeout=timeout, gpu_validation_backoff=backoff, gpu_failure_limit=limit,
                gpu_failure_window=seconds)


async def _run(config, server: str | None, token: str | None, kubeconfig: Path | None, runtime_kind: str,
               gpu_options: dict, certificate_authority: str | None = None, paths: dict | None = None) -> int:
    from gpufleet.agent.agent import NodeAgent
    from gpufleet.agent.bootstrap import node_token
    from gpufleet.agent.factory import build_devices, build_runtime
    from gpufleet.client import Client, HttpTransport
    from gpufleet.client.kubeconfig import KubeConfig, load_kubeconfig
    from gpufleet.client.transport import FailoverTransport
    from gpufleet.utils.files import private_dir

    # The kubeconfig (when given, or when there is no --server) supplies what the flags do not.
    cfg = load_kubeconfig(kubeconfig) if kubeconfig is not None or not server else KubeConfig(server=server or "")
    urls = [u.strip() for u in (server or cfg.server).split(",") if u.strip()]
    ca_file = certificate_authority or cfg.ca_file
    ca_data = None if certificate_authority else cfg.ca_data

    def connect(t: str | None) -> Client:
        options = dict(token=t, ca_file=ca_file, ca_data=ca_data, insecure=cfg.insecure, client_cert=cfg.client_cert)
        if len(urls) > 1:
            return Client(FailoverTransport(urls, **options))
        return Client(HttpTransport(urls[0], **options))

    private_dir(config.state_dir)  # the node token lives there
    config.api_server = api_address(urls[0])
    client = connect(await node_token(connect, token or cfg.token, config.node_name, config.state_dir))
    agent = NodeAgent(client, build_runtime(runtime_kind, config.state_dir,
                                            hidden_paths=(paths or {}).get("hidden_paths"),
                                            shared_paths=(paths or {}).get("shared_paths"), address=config.address),
                      build_devices(config.node_name, **gpu_options), config)
    await serve_agent(agent)
    await client.close()
    return 0


def api_address(url: str) -> tuple[str, int] | None:
    """(host, port) of an API server URL, for the relay that pods reach it through."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if not parts.hostname:
        return None
    return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)


async def serve_agent(agent) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await agent.start()
    print(f"agent {agent.name} serving on {agent.config.address}:{agent.port}", flush=True)
    await stop.wait()
    await agent.stop()
