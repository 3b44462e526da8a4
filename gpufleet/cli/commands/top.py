"""`gpufleet top nodes|pods`: cpu, memory and GPU use from the metrics.k8s.io API (what
`kubectl top` reads), with the nodes' allocatable resources for percentages."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path
from typing import Annotated, Any

import typer

from gpufleet.api.quantity import parse_quantity
from gpufleet.cli.output import (
    CliError,
    ContextOpt,
    KubeconfigOpt,
    NamespaceOpt,
    connect,
    format_table,
    out,
    run,
)
from gpufleet.client.errors import NotFound

METRICS = "/apis/metrics.k8s.io/v1beta1"
GPU_METRICS_ANNOTATION = "gpufleet.io/gpu-metrics"


def register(app: typer.Typer) -> None:
    @app.command()
    def top(
        what: Annotated[str, typer.Argument(help="nodes or pods", show_default=False)],
        name: Annotated[str | None, typer.Argument(help="Only this node or pod.", show_default=False)] = None,
        selector: Annotated[str | None, typer.Option("--selector", "-l", help="Label selector.")] = None,
        all_namespaces: Annotated[bool, typer.Option("--all-namespaces", "-A", help="Pods of every namespace.")]
        = False,
        kubeconfig: KubeconfigOpt = None,
        context: ContextOpt = None,
        namespace: NamespaceOpt = None,
    ) -> None:
        """Show cpu, memory and GPU use of nodes or pods."""
        kind = {"node": "nodes", "nodes": "nodes", "no": "nodes", "pod": "pods", "pods": "pods", "po": "pods"}.get(what)
        if kind is None:
            raise typer.BadParameter(f"{what!r}: choose nodes or pods", param_hint="WHAT")
        run(lambda: _top(kind, name, selector, all_namespaces, kubeconfig, context, namespace))


def _millis(q: Any) -> int:
    return int(parse_quantity(q or 0) * 1000)


def _mib(q: Any) -> int:
    return int(parse_quantity(q or 0) / (1024 * 1024))


def _pct(part: Fraction | int, whole: Fraction | int) -> str:
    return f"{int(part * 100 / whole)}%" if whole else "<unknown>"


def _gpus(meta: dict[str, Any]) -> list[dict[str, Any]]:
    text = (meta.get("annotations") or {}).get(GPU_METRICS_ANNOTATION)
    try:
        value = json.loads(text) if text else []
    except ValueError:
        return []
    return value if isinstance(value, list) else []


def _gpu_cells(gpus: list[dict[str, Any]]) -> tuple[str, str, str]:
    if not gpus:
        return "0", "<none>", "<none>"
    util = sum(float(g.get("utilization") or 0) for g in gpus) / len(gpus)
    used = sum(int(g.get("memoryUsedMiB") or 0) for g in gpus)
    total = sum(int(g.get("memoryTotalMiB") or 0) for g in gpus)
    return str(len(gpus)), f"{int(round(util))}%", f"{used}Mi" + (f"/{total}Mi" if total else "")


async def _get(session, path: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    try:
        resp = await session.client.raw_request("GET", path, params=params)
    except NotFound:
        raise CliError("error: Metrics API not available") from None
    return json.loads(resp.body)


async def _top(kind: str, name: str | None, selector: str | None, all_namespaces: bool, kubeconfig: Path | None,
               context: str | None, namespace: str | None) -> int:
    async with connect(kubeconfig, namespace, context) as session:
        params = {"labelSelector": selector} if selector else None
        if kind == "nodes":
            data = await _get(session, f"{METRICS}/nodes" + (f"/{name}" if name else ""), params)
            items = [data] if name else data.get("items") or []
            nodes = await session.client.list("nodes", raw=True)
            allocatable = {n["metadata"]["name"]: (n.get("status") or {}).get("allocatable") or {} for n in nodes}
            rows = []
            for item in sorted(items, key=lambda i: i["metadata"]["name"]):
                n = item["metadata"]["name"]
                usage = item.get("usage") or {}
                alloc = allocatable.get(n, {})
                cpu, mem = _millis(usage.get("cpu")), _mib(usage.get("memory"))
                count, util, gmem = _gpu_cells(_gpus(item["metadata"]))
                rows.append([n, f"{cpu}m", _pct(cpu, _millis(alloc.get("cpu"))), f"{mem}Mi",
                             _pct(mem, _mib(alloc.get("memory"))), count, util, gmem])
            if not rows:
                raise CliError("error: metrics not available yet")
            for line in format_table(["NAME", "CPU(cores)", "CPU(%)", "MEMORY(bytes)", "MEMORY(%)", "GPUS",
                                      "GPU-UTIL(%)", "GPU-MEMORY"], rows):
                out(line)
            return 0
        ns_path = "" if all_namespaces else f"/namespaces/{session.namespace}"
        data = await _get(session, f"{METRICS}{ns_path}/pods" + (f"/{name}" if name and not all_namespaces else ""),
                          params)
        items = [data] if name and not all_namespaces else data.get("items") or []
        if name and all_namespaces:
            items = [i for i in items if i["metadata"]["name"] == name]
        rows = []
        for item in sorted(items, key=lambda i: (i["metadata"].get("namespace", ""), i["metadata"]["name"])):
            containers = item.get("containers") or []
            cpu = sum(_millis((c.get("usage") or {}).get("cpu")) for c in containers)
            mem = sum(_mib((c.get("usage") or {}).get("memory")) for c in containers)
            count, util, gmem = _gpu_cells(_gpus(item["metadata"]))
            row = [item["metadata"]["name"], f"{cpu}m", f"{mem}Mi", count, util, gmem]
            if all_namespaces:
                row.insert(0, item["metadata"].get("namespace", ""))
            rows.append(row)
        if not rows:
            where = "any namespace" if all_namespaces else f"{session.namespace} namespace"
            raise CliError(f"No resources found in {where}.")
        headers = ["NAME", "CPU(cores)", "MEMORY(bytes)", "GPUS", "GPU-UTIL(%)", "GPU-MEMORY"]
        if all_namespaces:
            headers.insert(0, "NAMESPACE")
        for line in format_table(headers, rows):
            out(line)
    return 0
