"""What a Volcano Job's controller writes around its tasks, as wire dicts: the pods (labels,
annotations, what the env and svc plugins add), the PodGroup, and the svc plugin's headless
Service and host lists. Everything here is a function of the job and the nodes."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from gpufleet.api import volcano as vc
from gpufleet.api.podresources import pod_requests
from gpufleet.api.quantity import format_quantity
from gpufleet.client import objects
from gpufleet.controllers._common import owner_reference, pod_from_template
from gpufleet.controllers.pytorchjob.pods import fleet_address
from gpufleet.controllers.volcano.model import (
    API_VERSION,
    ENV_PLUGIN,
    JOB_NAME_KEY,
    JOB_NAMESPACE_KEY,
    JOB_RETRY_COUNT_KEY,
    JOB_VERSION_KEY,
    KIND,
    PYTORCH_PLUGIN,
    QUEUE_NAME_KEY,
    SSH_PLUGIN,
    SVC_PLUGIN,
    TASK_INDEX_KEY,
    TASK_SPEC_KEY,
    pod_name,
    podgroup_name,
    ssh_secret_name,
    svc_configmap_name,
)

__all__ = ["fleet_address", "min_resources", "pod_body", "podgroup_body", "service_body", "svc_configmap_body"]

SVC_MOUNT_PATH = "/etc/volcano"
DEFAULT_PYTORCH_PORT = 23456
SSH_MOUNT_PATH = "/root/.ssh"


def _owner(job: Any) -> dict[str, Any]:
    return owner_reference(job, API_VERSION, KIND)


def _env_name(task: str) -> str:
    return task.upper().replace("-", "_")


def host_names(job: Any, task: vc.TaskSpec) -> list[str]:
    name = objects.name_of(job)
    return [f"{pod_name(name, task.name or '', i)}.{name}" for i in range(vc.task_replicas(task))]


def pod_body(job: vc.VolcanoJob, task: vc.TaskSpec, index: int, *, version: int, retries: int,
             shared_address: str | None) -> dict[str, Any]:
    name, ns = objects.name_of(job), objects.namespace_of(job)
    task_name = task.name or ""
    labels = {JOB_NAME_KEY: name, JOB_NAMESPACE_KEY: ns, QUEUE_NAME_KEY: vc.job_queue(job),
              TASK_SPEC_KEY: task_name, TASK_INDEX_KEY: str(index)}
    annotations = {vc.GROUP_NAME_ANNOTATION: podgroup_name(job), JOB_NAME_KEY: name, TASK_SPEC_KEY: task_name,
                   TASK_INDEX_KEY: str(index), JOB_VERSION_KEY: str(version), JOB_RETRY_COUNT_KEY: str(retries),
                   QUEUE_NAME_KEY: vc.job_queue(job)}
    body = pod_from_template(task.template, namespace=ns, generate_name="", owner_ref=_owner(job), labels=labels,
                             annotations=annotations)
    meta = body["metadata"]
    meta.pop("generateName", None)
    meta["name"] = pod_name(name, task_name, index)
    spec = body["spec"]
    if job.spec is not None and job.spec.scheduler_name and not spec.get("schedulerName"):
        spec["schedulerName"] = job.spec.scheduler_name
    if job.spec is not None and job.spec.priority_class_name and not spec.get("priorityClassName"):
        spec["priorityClassName"] = job.spec.priority_class_name
    plugins = vc.plugins_of(job)
    env: list[dict[str, Any]] = []
    if ENV_PLUGIN in plugins:
        env += [{"name": "VK_TASK_INDEX", "value": str(index)}, {"name": "VC_TASK_INDEX", "value": str(index)}]
    mounts: list[dict[str, Any]] = []
    if SVC_PLUGIN in plugins:
        spec.setdefault("hostname", meta["name"])
        spec.setdefault("subdomain", name)
        for t in vc.tasks_of(job):
            env += [{"name": f"VC_{_env_name(t.name or '')}_HOSTS", "value": ",".join(host_names(job, t))},
                    {"name": f"VC_{_env_name(t.name or '')}_NUM", "value": str(vc.task_replicas(t))}]
        volume = f"{name}-svc"
        spec["volumes"] = [*(spec.get("volumes") or []),
                           {"name": volume, "configMap": {"name": svc_configmap_name(job)}}]
        mounts.append({"name": volume, "mountPath": SVC_MOUNT_PATH})
        if shared_address is not None:
            # No cluster DNS: where every pod shares one address, the host names lead there.
            names = [h for t in vc.tasks_of(job) for h in host_names(job, t)]
            names += [h.split(".", 1)[0] for h in names]
            aliases = [a for a in spec.get("hostAliases") or [] if a.get("ip") != shared_address]
            spec["hostAliases"] = [*aliases, {"ip": shared_address, "hostnames": names}]
    if PYTORCH_PLUGIN in plugins:
        env += pytorch_env(job, task_name, index, plugins[PYTORCH_PLUGIN], spec)
    if SSH_PLUGIN in plugins:
        volume = f"{name}-ssh"
        spec["volumes"] = [*(spec.get("volumes") or []), {"name": volume, "secret": {
            "secretName": ssh_secret_name(job), "defaultMode": 0o600}}]
        mounts.append({"name": volume, "mountPath": SSH_MOUNT_PATH, "readOnly": True})
    for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        own = {e.get("name") for e in c.get("env") or []}
        c["env"] = [*(c.get("env") or []), *(e for e in env if e["name"] not in own)]
        if mounts:
            c["volumeMounts"] = [*(c.get("volumeMounts") or []), *mounts]
    return body


def _plugin_args(args: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for a in args:
        key, _, value = a.lstrip("-").partition("=")
        out[key] = value
    return out


def pytorch_env(job: vc.VolcanoJob, task: str, index: int, args: list[str], spec: dict[str, Any]
                ) -> list[dict[str, Any]]:
    """Volcano's pytorch plugin (``--master=<task>``, ``--worker=<task>``, ``--port=<n>``):
    MASTER_ADDR (the master's host name), MASTER_PORT, WORLD_SIZE (master and workers) and
    RANK (0 for the master, 1 + index for a worker); the master's containers get the port."""
    opts = _plugin_args(args)
    master, worker = opts.get("master") or "master", opts.get("worker") or "worker"
    port = opts.get("port") or str(DEFAULT_PYTORCH_PORT)
    if task not in (master, worker):
        return []
    tasks = {t.name: t for t in vc.tasks_of(job)}
    world = sum(vc.task_replicas(tasks[t]) for t in (master, worker) if t in tasks)
    rank = index if task == master else index + (vc.task_replicas(tasks[master]) if master in tasks else 0)
    if task == master and port.isdigit():
        for c in spec.get("containers") or []:
            ports = c.get("ports") or []
            if not any(p.get("containerPort") == int(port) for p in ports):
                c["ports"] = [*ports, {"name": "pytorchjob-port", "containerPort": int(port), "protocol": "TCP"}]
    name = objects.name_of(job)
    return [{"name": "MASTER_ADDR", "value": f"{pod_name(name, master, 0)}.{name}"},
            {"name": "MASTER_PORT", "value": port},
            {"name": "WORLD_SIZE", "value": str(world)},
            {"name": "RANK", "value": str(rank)}]


def min_resources(job: vc.VolcanoJob) -> dict[str, str]:
    """What the job's PodGroup needs at least: the requests of minAvailable pods, each task's
    minAvailable first (in task order), then more of the tasks in order, as Volcano sums them."""
    left = vc.job_min_available(job)
    picks: list[tuple[vc.TaskSpec, int]] = []
    tasks = vc.tasks_of(job)
    for t in tasks:
        n = min(left, t.min_available if t.min_available is not None else vc.task_replicas(t))
        picks.append((t, n))
        left -= n
    for i, t in enumerate(tasks):
        if left <= 0:
            break
        more = min(left, vc.task_replicas(t) - picks[i][1])
        picks[i] = (t, picks[i][1] + more)
        left -= more
    total: dict[str, Fraction] = {}
    for t, n in picks:
        if n <= 0 or t.template is None:
            continue
        for res, amount in pod_requests(t.template).items():
            total[res] = total.get(res, Fraction(0)) + amount * n
    return {res: format_quantity(amount, "cpu" if res == "cpu" else "plain") for res, amount in sorted(total.items())
            if amount}


def podgroup_body(job: vc.VolcanoJob) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "minMember": vc.job_min_available(job),
        "minTaskMember": {t.name or "": (t.min_available if t.min_available is not None else vc.task_replicas(t))
                          for t in vc.tasks_of(job)},
        "queue": vc.job_queue(job),
        "minResources": min_resources(job),
    }
    if job.spec is not None and job.spec.priority_class_name:
        spec["priorityClassName"] = job.spec.priority_class_name
    return {
        "apiVersion": vc.SCHEDULING_API_VERSION, "kind": "PodGroup",
        "metadata": {"name": podgroup_name(job), "namespace": objects.namespace_of(job),
                     "labels": {JOB_NAME_KEY: objects.name_of(job), JOB_NAMESPACE_KEY: objects.namespace_of(job)},
                     "annotations": {JOB_NAME_KEY: objects.name_of(job)},
                     "ownerReferences": [_owner(job)]},
        "spec": spec,
    }


def service_body(job: Any) -> dict[str, Any]:
    """The svc plugin's headless Service ``<job>``, selecting the job's pods."""
    name, ns = objects.name_of(job), objects.namespace_of(job)
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": ns, "ownerReferences": [_owner(job)]},
        "spec": {"clusterIP": "None", "selector": {JOB_NAME_KEY: name, JOB_NAMESPACE_KEY: ns},
                 "publishNotReadyAddresses": True,
                 "ports": [{"name": "placeholder-volcano", "port": 1000, "protocol": "TCP", "targetPort": 1000}]},
    }


def svc_configmap_body(job: vc.VolcanoJob) -> dict[str, Any]:
    """The svc plugin's host lists: ``<task>.host`` (one host name a line) and ``<task>.num``."""
    data: dict[str, str] = {}
    for t in vc.tasks_of(job):
        data[f"{t.name}.host"] = "\n".join(host_names(job, t))
        data[f"{t.name}.num"] = str(vc.task_replicas(t))
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": svc_configmap_name(job), "namespace": objects.namespace_of(job),
                         "ownerReferences": [_owner(job)]},
            "data": data}


def ssh_secret_body(job: Any) -> dict[str, Any]:
    """The ssh plugin's key pair, shared by every pod of the job (id_rsa, id_rsa.pub,
    authorized_keys, config)."""
    import base64

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    config = "StrictHostKeyChecking no\nUserKnownHostsFile /dev/null\n"
    data = {"id_rsa": private, "id_rsa.pub": public, "authorized_keys": public, "config": config.encode()}
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": ssh_secret_name(job), "namespace": objects.namespace_of(job),
                         "ownerReferences": [_owner(job)]},
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()}}
