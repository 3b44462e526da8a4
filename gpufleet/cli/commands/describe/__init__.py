"""`gpufleet describe`: one object in prose, ending with its Events, which is where the
scheduler and controllers explain themselves (why a pod is Pending, why a job restarted).

The command and the table of describers live here; the describers by kind family in
workloads.py, apps.py, cluster.py, networking.py (with custom resources) and storage.py, the
pieces they share in _blocks.py."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from gpufleet.api.registry import ResourceType
from gpufleet.cli.commands.describe._blocks import _describe_generic, _events
from gpufleet.cli.commands.describe.apps import (
    _describe_cron_job,
    _describe_daemon_set,
    _describe_stateful_set,
)
from gpufleet.cli.commands.describe.cluster import (
    _describe_configmap,
    _describe_limitrange,
    _describe_namespace,
    _describe_node,
    _describe_quota,
    _describe_service,
    pod_resources,
)
from gpufleet.cli.commands.describe.networking import (
    _describe_custom,
    _describe_endpoint_slice,
    _describe_ingress,
    is_custom,
)
from gpufleet.cli.commands.describe.storage import _describe_pv, _describe_pvc, _describe_storage_class
from gpufleet.cli.commands.describe.workloads import (
    POD_GROUP_LABEL,
    _describe_deployment,
    _describe_job,
    _describe_pod,
    _describe_podgroup,
    _describe_replicaset,
    _describe_training_job,
    _describe_volcano_job,
    _describe_volcano_podgroup,
    _gang_status,
    qos_class,
)
from gpufleet.cli.describe_text import Doc
from gpufleet.cli.output import (
    CliError,
    ContextOpt,
    KubeconfigOpt,
    NamespaceOpt,
    Session,
    api_error_message,
    connect,
    err,
    meta,
    out,
    run,
)
from gpufleet.client.errors import NotFound

# Names other modules and tests import from here.
__all__ = ["POD_GROUP_LABEL", "_gang_status", "describe_object", "pod_resources", "qos_class", "register"]


def register(app: typer.Typer) -> None:
    @app.command()
    def describe(
        args: Annotated[list[str], typer.Argument(
            help="KIND [NAME...] or KIND/NAME; a NAME that matches no object is used as a name prefix.",
            show_default=False)],
        selector: Annotated[str | None, typer.Option("--selector", "-l", help="Label selector.")] = None,
        all_namespaces: Annotated[bool, typer.Option("--all-namespaces", "-A")] = False,
        kubeconfig: KubeconfigOpt = None,
        context: ContextOpt = None,
        namespace: NamespaceOpt = None,
    ) -> None:
        """Describe objects in detail, with their recent Events."""
        run(lambda: _describe(args, selector, all_namespaces, kubeconfig, context, namespace))


async def _describe(args: list[str], selector: str | None, all_namespaces: bool, kubeconfig: Path | None,
                    context: str | None, namespace: str | None) -> int:
    if not args:
        raise CliError("error: you must specify the type of resource to describe, e.g. `gpufleet describe pod web-0`")
    async with connect(kubeconfig, namespace, context) as session:
        if "/" in args[0]:
            kind, _, first = args[0].partition("/")
            names = [first] + [a.partition("/")[2] or a for a in args[1:]]
        else:
            kind, names = args[0], args[1:]
        rt = await session.kinds.resolve(kind)
        ns = None if (all_namespaces or not rt.namespaced) else session.namespace
        objs: list[dict] = []
        failed = False
        if names:
            # A name always means one namespace, even with -A.
            name_ns = session.namespace if rt.namespaced else None
            for name in names:
                found = await _find(session, rt, name_ns, name)
                if not found:
                    failed = True
                objs += found
        else:
            resp = await session.client.raw_request(
                "GET", rt.path(ns), params={"labelSelector": selector or None})
            objs = json.loads(resp.body).get("items") or []
            if not objs:
                where = f" in {ns} namespace." if ns else ""
                err(f"No resources found{where}")
        for i, obj in enumerate(objs):
            if i:
                out()
                out()
            out(await describe_object(session, rt, obj))
        return 1 if failed else 0


async def _find(session: Session, rt: ResourceType, ns: str | None, name: str) -> list[dict]:
    """The named object, or else every object whose name starts with it (kubectl's prefix
    match: `describe pod web` finds web-7d4b9-x2k); reports NotFound when neither."""
    try:
        resp = await session.client.raw_request("GET", rt.path(ns, name))
        return [json.loads(resp.body)]
    except NotFound as e:
        not_found = e
    resp = await session.client.raw_request("GET", rt.path(ns))
    items = [i for i in json.loads(resp.body).get("items") or [] if meta(i).get("name", "").startswith(name)]
    if not items:
        err(api_error_message(not_found))
    return items


async def describe_object(session: Session, rt: ResourceType, obj: dict[str, Any]) -> str:
    describer = _DESCRIBERS.get((rt.group, rt.kind)) or (_describe_custom if is_custom(rt) else _describe_generic)
    doc = Doc()
    await describer(session, rt, obj, doc)
    await _events(session, rt, obj, doc)
    return doc.render()




_Describer = Callable[[Session, ResourceType, dict[str, Any], Doc], Awaitable[None]]
_DESCRIBERS: dict[tuple[str, str], _Describer] = {
    ("", "Pod"): _describe_pod,
    ("apps", "Deployment"): _describe_deployment,
    ("apps", "ReplicaSet"): _describe_replicaset,
    ("batch", "Job"): _describe_job,
    ("apps", "StatefulSet"): _describe_stateful_set,
    ("apps", "DaemonSet"): _describe_daemon_set,
    ("batch", "CronJob"): _describe_cron_job,
    ("networking.k8s.io", "Ingress"): _describe_ingress,
    ("discovery.k8s.io", "EndpointSlice"): _describe_endpoint_slice,
    ("", "Service"): _describe_service,
    ("", "Node"): _describe_node,
    ("", "Namespace"): _describe_namespace,
    ("", "ConfigMap"): _describe_configmap,
    ("", "ResourceQuota"): _describe_quota,
    ("", "LimitRange"): _describe_limitrange,
    ("", "PersistentVolumeClaim"): _describe_pvc,
    ("", "PersistentVolume"): _describe_pv,
    ("storage.k8s.io", "StorageClass"): _describe_storage_class,
    ("scheduling.x-k8s.io", "PodGroup"): _describe_podgroup,
    ("kubeflow.org", "PyTorchJob"): _describe_training_job,
    ("batch.volcano.sh", "Job"): _describe_volcano_job,
    ("scheduling.volcano.sh", "PodGroup"): _describe_volcano_podgroup,
    ("ray.io", "RayCluster"): _describe_training_job,
}
