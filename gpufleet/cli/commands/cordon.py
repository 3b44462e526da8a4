"""`gpufleet cordon`, `uncordon` and `drain`: take a server out of scheduling and move its
pods elsewhere before maintenance, as kubectl does.

drain = cordon, then evict every pod on the node through the pods/eviction subresource
(which honours PodDisruptionBudgets: a 429 answer means "not now", and the eviction is
retried), then wait until the pods are gone. Pods that would be lost for good are refused
unless the user says otherwise: pods no controller would recreate (--force), pods with
emptyDir data (--delete-emptydir-data), DaemonSet pods (--ignore-daemonsets: left running,
since their controller would put them straight back). Mirror pods are skipped.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from gpufleet.cli.output import (
    ContextOpt,
    KubeconfigOpt,
    api_error_message,
    connect,
    err,
    out,
    parse_duration,
    run,
)
from gpufleet.client.api import Client
from gpufleet.client.errors import ApiError, NotFound, TooManyRequests

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
# kubectl waits this long between evictions refused with 429.
EVICTION_RETRY_SECONDS = 5.0
POLL_SECONDS = 1.0

_DAEMONSET_FATAL = "DaemonSet-managed Pods (use --ignore-daemonsets to ignore)"
_DAEMONSET_WARNING = "ignoring DaemonSet-managed Pods"
_LOCAL_STORAGE_FATAL = "Pods with local storage (use --delete-emptydir-data to override)"
_LOCAL_STORAGE_WARNING = "deleting Pods with local storage"
_UNMANAGED_FATAL = "Pods declare no controller (use --force to override)"
_UNMANAGED_WARNING = "deleting Pods that declare no controller"


def register(app: typer.Typer) -> None:
    @app.command()
    def cordon(
        nodes: Annotated[list[str] | None, typer.Argument(help="Nodes to mark unschedulable.",
                                                          show_default=False)] = None,
        gpu: Annotated[list[str] | None, typer.Option(
            "--gpu", help="Take one GPU out of service instead: NODE:INDEX (repeatable). Its pod keeps "
            "running; no new pod gets it.")] = None,
        kubeconfig: KubeconfigOpt = None,
        context: ContextOpt = None,
    ) -> None:
        """Mark nodes unschedulable: running pods stay, new ones go elsewhere."""
        targets = _targets(nodes, gpu)
        if gpu:
            run(lambda: _with_client(kubeconfig, context, lambda c: set_gpu_cordon(c, targets, True)))
        else:
            run(lambda: _with_client(kubeconfig, context, lambda c: set_schedulable(c, nodes or [], False)))

    @app.command()
    def uncordon(
        nodes: Annotated[list[str] | None, typer.Argument(help="Nodes to mark schedulable.",
                                                          show_default=False)] = None,
        gpu: Annotated[list[str] | None, typer.Option(
            "--gpu", help="Return one GPU to service instead: NODE:INDEX (repeatable); also releases a GPU "
            "the agent held out after repeated failures (it is validated again first).")] = None,
        kubeconfig: KubeconfigOpt = None,
        context: ContextOpt = None,
    ) -> None:
        """Mark nodes schedulable again."""
        targets = _targets(nodes, gpu)
        if gpu:
            run(lambda: _with_client(kubeconfig, context, lambda c: set_gpu_cordon(c, targets, False)))
        else:
            run(lambda: _with_client(kubeconfig, context, lambda c: set_schedulable(c, nodes or [], True)))

    @app.command()
    def drain(
        nodes: Annotated[list[str], typer.Argument(help="Nodes to drain.", show_default=False)],
        ignore_daemonsets: Annotated[bool, typer.Option(
            "--ignore-daemonsets", help="Leave DaemonSet-managed pods running instead of refusing.")] = False,
        delete_emptydir_data: Annotated[bool, typer.Option(
            "--delete-emptydir-data", help="Evict pods with emptyDir volumes (their data is lost).")] = False,
        force: Annotated[bool, typer.Option(
            "--force", help="Also evict pods that no controller manages (they are not recreated).")] = False,
        grace_period: Annotated[int, typer.Option(
            "--grace-period", help="Seconds each pod gets to stop; -1 uses the pod's own setting.")] = -1,
        timeout: Annotated[str, typer.Option(
            "--timeout", help="Give up after this long, e.g. 60s, 5m; 0s waits forever.")] = "0s",
        kubeconfig: KubeconfigOpt = None,
        context: ContextOpt = None,
    ) -> None:
        """Cordon nodes, then evict their pods and wait until they are gone."""
        try:
            seconds = parse_duration(timeout)
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--timeout") from None
        opts = DrainOptions(ignore_daemonsets, delete_emptydir_data, force, grace_period, seconds)
        run(lambda: _with_client(kubeconfig, context, lambda c: drain_nodes(c, nodes, opts)))


async def _with_client(kubeconfig: Path | None, context: str | None,
                       fn: Callable[[Client], Awaitable[int]]) -> int:
    async with connect(kubeconfig, None, context) as session:
        return await fn(session.client)


# -- cordon -----------------------------------------------------------------------------------


async def set_schedulable(client: Client, nodes: list[str], schedulable: bool,
                          emit: Callable[[str], None] = out) -> int:
    verb = "uncordoned" if schedulable else "cordoned"
    failed = False
    for name in nodes:
        try:
            node = await client.get("nodes", name, raw=True)
            if bool((node.get("spec") or {}).get("unschedulable")) != schedulable:
                emit(f"node/{name} already {verb}")
                continue
            await client.patch("nodes", name, {"spec": {"unschedulable": None if schedulable else True}})
        except ApiError as e:
            err(api_error_message(e))
            failed = True
            continue
        emit(f"node/{name} {verb}")
    return 1 if failed else 0


def _targets(nodes: list[str] | None, gpus: list[str] | None) -> list[tuple[str, int]]:
    if nodes and gpus:
        raise typer.BadParameter("give nodes or --gpu NODE:INDEX, not both", param_hint="--gpu")
    if not nodes and not gpus:
        raise typer.BadParameter("name at least one node (or --gpu NODE:INDEX)", param_hint="NODES")
    out = []
    for spec in gpus or []:
        name, colon, index = spec.rpartition(":")
        if not colon or not name or not index.isdigit():
            raise typer.BadParameter(f"{spec!r} is not NODE:INDEX (e.g. gpu-node-1:3)", param_hint="--gpu")
        out.append((name, int(index)))
    return out


async def set_gpu_cordon(client: Client, targets: list[tuple[str, int]], cordon: bool,
                         emit: Callable[[str], None] = out) -> int:
    """Add or remove GPU indices in the node's gpufleet.io/gpu-cordon annotation (the agent
    fences a cordoned GPU, and returns it once it is uncordoned)."""
    from gpufleet.api.gpu import GPUS_ANNOTATION, parse_gpus_annotation
    from gpufleet.api.gpuhealth import GPU_CORDON_ANNOTATION, format_cordon, parse_cordon

    verb = "cordoned" if cordon else "uncordoned"
    failed = False
    for name, index in targets:
        for _attempt in range(5):
            try:
                node = await client.get("nodes", name, raw=True)
                meta = node.get("metadata") or {}
                ann = meta.get("annotations") or {}
                devices = parse_gpus_annotation(ann.get(GPUS_ANNOTATION) or "[]") or ()
                if index not in {d.index for d in devices}:
                    err(f"error: node {name} has no GPU {index} (it has {len(devices)}: "
                        f"{', '.join(str(d.index) for d in devices) or 'none'})")
                    failed = True
                    break
                current = parse_cordon(ann.get(GPU_CORDON_ANNOTATION))
                if (index in current) == cordon:
                    emit(f"node/{name} gpu {index} already {verb}")
                    break
                wanted = current | {index} if cordon else current - {index}
                value = format_cordon(wanted) or None
                await client.patch("nodes", name, {"metadata": {"resourceVersion": meta.get("resourceVersion"),
                                                                "annotations": {GPU_CORDON_ANNOTATION: value}}})
            except ApiError as e:
                if e.code == 409:
                    continue  # the agent wrote the node meanwhile: read it again
                err(api_error_message(e))
                failed = True
                break
            emit(f"node/{name} gpu {index} {verb}")
            break
    return 1 if failed else 0


# -- drain ------------------------------------------------------------------------------------


@dataclass
class DrainOptions:
    ignore_daemonsets: bool = False
    delete_emptydir_data: bool = False
    force: bool = False
    grace_period: int = -1
    # Seconds; 0 waits forever.
    timeout: float = 0.0
    retry_seconds: float = EVICTION_RETRY_SECONDS
    poll_seconds: float = POLL_SECONDS


@dataclass
class _Plan:
    evict: list[dict[str, Any]]
    warnings: dict[str, list[str]]
    errors: dict[str, list[str]]


def _controller(pod: dict[str, Any]) -> dict[str, Any] | None:
    for ref in pod["metadata"].get("ownerReferences") or []:
        if ref.get("controller"):
            return ref
    return None


def plan_drain(pods: list[dict[str, Any]], opts: DrainOptions) -> _Plan:
    """Which pods to evict, and what to warn about or refuse (kubectl's drain filters)."""
    plan = _Plan([], {}, {})
    for pod in pods:
        meta = pod["metadata"]
        ref = f"{meta.get('namespace')}/{meta['name']}"
        if MIRROR_ANNOTATION in (meta.get("annotations") or {}):
            continue
        phase = (pod.get("status") or {}).get("phase")
        finished = phase in ("Succeeded", "Failed")
        controller = _controller(pod)
        if controller is not None and controller.get("kind") == "DaemonSet" and not finished:
            if opts.ignore_daemonsets:
                plan.warnings.setdefault(_DAEMONSET_WARNING, []).append(ref)
            else:
                plan.errors.setdefault(_DAEMONSET_FATAL, []).append(ref)
            continue
        refused = False
        if controller is None and not finished:
            if opts.force:
                plan.warnings.setdefault(_UNMANAGED_WARNING, []).append(ref)
            else:
                plan.errors.setdefault(_UNMANAGED_FATAL, []).append(ref)
                refused = True
        volumes = (pod.get("spec") or {}).get("volumes") or []
        if any("emptyDir" in v for v in volumes) and not finished:
            if opts.delete_emptydir_data:
                plan.warnings.setdefault(_LOCAL_STORAGE_WARNING, []).append(ref)
            else:
                plan.errors.setdefault(_LOCAL_STORAGE_FATAL, []).append(ref)
                refused = True
        if not refused:
            plan.evict.append(pod)
    return plan


async def drain_nodes(client: Client, nodes: list[str], opts: DrainOptions,
                      emit: Callable[[str], None] = out, warn: Callable[[str], None] = err) -> int:
    failed: list[str] = []
    for name in nodes:
        if await set_schedulable(client, [name], False, emit):
            failed.append(name)
            continue
        try:
            problems = await _drain_one(client, name, opts, emit, warn)
        except ApiError as e:
            problems = [api_error_message(e)]
        if problems:
            warn(f'error: unable to drain node "{name}" due to error: [{", ".join(problems)}], continuing command...')
            failed.append(name)
        else:
            emit(f"node/{name} drained")
    if failed:
        warn("There are pending nodes to be drained:")
        for name in failed:
            warn(f" {name}")
        return 1
    return 0


async def _drain_one(client: Client, node: str, opts: DrainOptions,
                     emit: Callable[[str], None], warn: Callable[[str], None]) -> list[str]:
    pods = list(await client.list("pods", None, field_selector={"spec.nodeName": node}, raw=True))
    plan = plan_drain(pods, opts)
    if plan.errors:
        return [f"cannot delete {what}: {', '.join(refs)}" for what, refs in plan.errors.items()]
    for what, refs in plan.warnings.items():
        warn(f"Warning: {what}: {', '.join(refs)}")
    deadline = time.monotonic() + opts.timeout if opts.timeout > 0 else None
    results = await asyncio.gather(*(_evict_and_wait(client, p, opts, deadline, emit, warn) for p in plan.evict))
    return [r for r in results if r]


async def _evict_and_wait(client: Client, pod: dict[str, Any], opts: DrainOptions, deadline: float | None,
                          emit: Callable[[str], None], warn: Callable[[str], None]) -> str | None:
    """Evict one pod (retrying while a disruption budget says no) and wait until it is gone;
    an error message, or None when it went."""
    meta = pod["metadata"]
    ns, name, uid = meta.get("namespace") or "default", meta["name"], meta.get("uid")
    body: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "Eviction",
                            "metadata": {"name": name, "namespace": ns}}
    if opts.grace_period >= 0:
        body["deleteOptions"] = {"gracePeriodSeconds": opts.grace_period}
    path = f"/api/v1/namespaces/{ns}/pods/{name}/eviction"
    emit(f"evicting pod {ns}/{name}")
    while True:
        try:
            await client.raw_request("POST", path, json=body)
            break
        except NotFound:
            emit(f"pod/{name} evicted")
            return None
        except TooManyRequests as e:
            if deadline is not None and time.monotonic() + opts.retry_seconds > deadline:
                return f'error when evicting pods/"{name}" -n "{ns}": global timeout reached'
            warn(f'error when evicting pods/"{name}" -n "{ns}" (will retry after {opts.retry_seconds:g}s): '
                 f"{e.message}")
            await asyncio.sleep(opts.retry_seconds)
        except ApiError as e:
            return f'error when evicting pods/"{name}" -n "{ns}": {e.message}'
    while True:
        try:
            current = await client.get("pods", name, ns, raw=True)
        except NotFound:
            break
        if current["metadata"].get("uid") != uid:
            break
        if deadline is not None and time.monotonic() > deadline:
            return f'error when waiting for pod "{name}" in namespace "{ns}" to terminate: global timeout reached'
        await asyncio.sleep(opts.poll_seconds)
    emit(f"pod/{name} evicted")
    return None
