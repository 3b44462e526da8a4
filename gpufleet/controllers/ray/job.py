"""A RayJob's sync as a pure decision: ``decide_job(observed, now) -> Actions``.

As KubeRay moves ``status.jobDeploymentStatus``: "" -> Initializing (the job id and the
RayCluster's name chosen, the cluster created from ``rayClusterSpec``, or the one
``clusterSelector`` names used) -> Running once the cluster is ready (the submitter Job
created: ``submitterPodTemplate``, or the default one running ``ray job submit`` against
the head's dashboard) -> Complete when Ray reports SUCCEEDED, Failed when it reports
FAILED or STOPPED (reason AppFailed), either only once the submitter Job has finished too, when the submitter Job failed (SubmissionFailed) or
after ``activeDeadlineSeconds`` (DeadlineExceeded). ``status.jobStatus`` is Ray's, read
from the dashboard's job API; when the dashboard cannot be read, a submitter that
completed (``ray job submit`` waits for the job and exits non-zero when it failed) stands
for SUCCEEDED. With ``shutdownAfterJobFinishes`` the cluster (and the submitter) are
deleted ``ttlSecondsAfterFinished`` after the end. ``spec.suspend`` (a queue holding the job
back): Suspending while the cluster and submitter are deleted, then Suspended; resumed, the
job starts over from Initializing."""

from __future__ import annotations

import copy
import json
import shlex
from dataclasses import dataclass
from typing import Any

import yaml

from gpufleet.api import ray as api
from gpufleet.api.k8s import Job as BatchJob
from gpufleet.client import objects
from gpufleet.controllers._common import is_being_deleted, owner_reference, status_dict, timestamp
from gpufleet.controllers.actions import Actions, Create, Delete, Instant
from gpufleet.controllers.ray import pods as rp

ORIGIN_KIND_LABEL = "ray.io/originated-from-crd"
ORIGIN_NAME_LABEL = "ray.io/originated-from-cr-name"
SUBMISSION_ID_ENV = "RAY_JOB_SUBMISSION_ID"
DASHBOARD_ENV = "RAY_DASHBOARD_ADDRESS"
# The default submitter's resources, as KubeRay's (and so a queue's submitter pod set).
SUBMITTER_RESOURCES = {"requests": {"cpu": "500m", "memory": "200Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}
# How often a running job's status is read from the dashboard.
POLL_SECONDS = 2.0


@dataclass(frozen=True)
class JobObserved:
    job: api.RayJob
    cluster: dict[str, Any] | None  # the RayCluster (wire dict), when cached
    submitter: dict[str, Any] | None  # the submitter batch/v1 Job (wire dict), when cached
    dashboard: str | None  # host:port of the head's dashboard, once known
    ray_job: dict[str, Any] | None  # the dashboard's answer about the job, when read


def job_id(job: Any) -> str:
    spec = job.spec
    return (spec.job_id if spec is not None and spec.job_id else None) or \
        f"{objects.name_of(job)}-{objects.uid_of(job).replace('-', '')[:5]}"


def cluster_name(job: Any) -> str:
    st = status_dict(job)
    if st.get("rayClusterName"):
        return st["rayClusterName"]
    selector = job.spec.cluster_selector if job.spec is not None else None
    if selector and selector.get(rp.CLUSTER_LABEL):
        return selector[rp.CLUSTER_LABEL]
    return f"{objects.name_of(job)}-{objects.uid_of(job).replace('-', '')[-5:]}"


def uses_own_cluster(job: Any) -> bool:
    return job.spec is not None and job.spec.ray_cluster_spec is not None


def cluster_body(job: Any) -> dict[str, Any]:
    spec = job.spec.ray_cluster_spec.to_dict()
    return {"apiVersion": api.API_VERSION, "kind": api.CLUSTER_KIND,
            "metadata": {"name": cluster_name(job), "namespace": objects.namespace_of(job),
                         "labels": {ORIGIN_KIND_LABEL: api.JOB_KIND, ORIGIN_NAME_LABEL: objects.name_of(job)},
                         "ownerReferences": [owner_reference(job, api.API_VERSION, api.JOB_KIND)]},
            "spec": spec}


def submit_command(job: Any) -> list[str]:
    """KubeRay's default submitter command: `ray job submit` to the head's dashboard, waiting
    for the job (its output is the submitter's log)."""
    spec = job.spec
    words = ["ray", "job", "submit", "--address", f"http://${{{DASHBOARD_ENV}}}",
             "--submission-id", f"${{{SUBMISSION_ID_ENV}}}"]
    if spec.runtime_env_yaml:
        words += ["--runtime-env-json", shlex.quote(json.dumps(yaml.safe_load(spec.runtime_env_yaml)))]
    if spec.metadata:
        words += ["--metadata-json", shlex.quote(json.dumps(spec.metadata))]
    for flag, value in (("--entrypoint-num-cpus", spec.entrypoint_num_cpus),
                        ("--entrypoint-num-gpus", spec.entrypoint_num_gpus)):
        if value:
            words += [flag, str(value)]
    if spec.entrypoint_resources:
        words += ["--entrypoint-resources", shlex.quote(spec.entrypoint_resources)]
    line = " ".join(words) + " -- " + (spec.entrypoint or "")
    return ["/bin/bash", "-c", "--", line]


def submitter_body(job: Any, cluster: dict[str, Any], dashboard: str) -> dict[str, Any]:
    spec = job.spec
    env = [{"name": DASHBOARD_ENV, "value": dashboard}, {"name": SUBMISSION_ID_ENV, "value": job_id(job)},
           {"name": "PYTHONUNBUFFERED", "value": "1"}]
    if spec.submitter_pod_template is not None:
        template = spec.submitter_pod_template.to_dict()
    else:
        head = (((cluster.get("spec") or {}).get("headGroupSpec") or {}).get("template") or {})
        head_container = ((head.get("spec") or {}).get("containers") or [{}])[0]
        container: dict[str, Any] = {
            "name": "ray-job-submitter", "image": head_container.get("image", ""),
            "command": submit_command(job),
            "resources": copy.deepcopy(SUBMITTER_RESOURCES),
        }
        if head_container.get("securityContext"):
            container["securityContext"] = head_container["securityContext"]
        template = {"spec": {"containers": [container]}}
    pspec = template.setdefault("spec", {})
    pspec["restartPolicy"] = "Never"
    for c in pspec.get("containers") or []:
        have = {e.get("name") for e in c.get("env") or []}
        c["env"] = [*(c.get("env") or []), *(e for e in env if e["name"] not in have)]
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": objects.name_of(job), "namespace": objects.namespace_of(job),
                         "labels": {ORIGIN_KIND_LABEL: api.JOB_KIND, ORIGIN_NAME_LABEL: objects.name_of(job)},
                         "ownerReferences": [owner_reference(job, api.API_VERSION, api.JOB_KIND)]},
            "spec": {"backoffLimit": 2, "template": template}}


def _job_condition(job: dict[str, Any] | None, type_: str) -> bool:
    conds = ((job or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == type_ and c.get("status") == "True" for c in conds)


def _suspend(o: JobObserved, st: dict[str, Any], old: dict[str, Any], a: Actions, deployment: str) -> Actions:
    """``spec.suspend`` (set by a queue that has not admitted the job, or took it back): as
    KubeRay, a job that started goes Suspending while its cluster and submitter are deleted,
    then Suspended; one that never started is Suspended at once. Setting suspend back to
    false makes it start over with a new cluster."""
    job = o.job
    ns = objects.namespace_of(job)
    if deployment in (api.DEPLOYMENT_NEW, api.DEPLOYMENT_SUSPENDED):
        st["jobDeploymentStatus"] = api.DEPLOYMENT_SUSPENDED
    else:
        st["jobDeploymentStatus"] = api.DEPLOYMENT_SUSPENDING
        alive = False
        for kind, child in ((api.RayCluster, o.cluster if uses_own_cluster(job) else None),
                            (BatchJob, o.submitter)):
            if child is None:
                continue
            alive = True
            if not is_being_deleted(child):
                a.deletes.append(Delete(kind, objects.name_of(child), ns, uid=objects.uid_of(child),
                                        propagation_policy="Foreground", must=False))
        if not alive:
            st["jobDeploymentStatus"] = api.DEPLOYMENT_SUSPENDED
            st.pop("rayClusterStatus", None)
            a.event("Normal", "Suspended", "The RayJob is suspended: its RayCluster and submitter are gone.")
        else:
            a.requeue(1.0)
    return _with_status(a, job, st, old)


def decide_job(o: JobObserved, now: Instant) -> Actions:
    a = Actions()
    job = o.job
    if job.spec is None or is_being_deleted(job):
        return a
    old = dict(status_dict(job))
    st = dict(old)
    ns = objects.namespace_of(job)
    deployment = st.get("jobDeploymentStatus") or api.DEPLOYMENT_NEW
    finished = deployment in (api.DEPLOYMENT_COMPLETE, api.DEPLOYMENT_FAILED)

    if finished:
        end = timestamp(st.get("endTime")) or now.wall
        ttl = job.spec.ttl_seconds_after_finished or 0
        if job.spec.shutdown_after_job_finishes and uses_own_cluster(job):
            if now.wall >= end + ttl:
                if o.cluster is not None and not is_being_deleted(o.cluster):
                    a.deletes.append(Delete(api.RayCluster, objects.name_of(o.cluster), ns,
                                            uid=objects.uid_of(o.cluster), propagation_policy="Background",
                                            must=False, success_reason="DeletedRayCluster"))
                if o.submitter is not None and not is_being_deleted(o.submitter):
                    a.deletes.append(Delete(BatchJob, objects.name_of(o.submitter), ns,
                                            uid=objects.uid_of(o.submitter), propagation_policy="Background",
                                            must=False))
            else:
                a.requeue(end + ttl - now.wall)
        return a

    if job.spec.suspend or deployment == api.DEPLOYMENT_SUSPENDING:
        return _suspend(o, st, old, a, deployment)
    if deployment == api.DEPLOYMENT_SUSPENDED:  # resumed: starts again with a new cluster
        for field_name in ("startTime", "endTime", "dashboardURL", "rayClusterStatus", "reason", "message"):
            st.pop(field_name, None)
        deployment = api.DEPLOYMENT_NEW
    if deployment == api.DEPLOYMENT_NEW:
        st.update(jobId=job_id(job), rayClusterName=cluster_name(job), startTime=now.text,
                  jobStatus=st.get("jobStatus") or "", jobDeploymentStatus=api.DEPLOYMENT_INITIALIZING)
        deployment = api.DEPLOYMENT_INITIALIZING
    st.setdefault("jobId", job_id(job))
    st.setdefault("rayClusterName", cluster_name(job))

    def fail(reason: str, message: str) -> None:
        st.update(jobDeploymentStatus=api.DEPLOYMENT_FAILED, reason=reason, message=message, endTime=now.text)
        a.event("Warning", reason, message)

    deadline = job.spec.active_deadline_seconds
    start = timestamp(st.get("startTime"))
    if deadline and start is not None and now.wall >= start + deadline:
        fail("DeadlineExceeded", f"The RayJob has passed the activeDeadlineSeconds ({deadline}s).")
    elif deployment == api.DEPLOYMENT_INITIALIZING:
        if o.cluster is None:
            if uses_own_cluster(job):
                a.creates.append(Create(cluster_body(job), on_exists="ignore", success_reason="CreatedRayCluster"))
        elif (o.cluster.get("status") or {}).get("state") == api.READY and o.dashboard:
            st["dashboardURL"] = o.dashboard
            if o.submitter is None:
                a.creates.append(Create(submitter_body(job, o.cluster, o.dashboard), on_exists="ignore",
                                        success_reason="CreatedSubmitterJob"))
            st["jobDeploymentStatus"] = api.DEPLOYMENT_RUNNING
            st.setdefault("jobStatus", "")
    else:  # Running
        ray_status = (o.ray_job or {}).get("status")
        if ray_status:
            st["jobStatus"] = ray_status
            if o.ray_job and o.ray_job.get("message"):
                st["message"] = o.ray_job["message"]
        # As KubeRay (since 1.1), a job with a submitter ends only once the submitter has
        # finished too, so its log (the job's output, tailed by ``ray job submit``) is whole.
        submitter_done = o.submitter is None or any(
            _job_condition(o.submitter, c) for c in ("Complete", "Failed"))
        if _job_condition(o.submitter, "Failed") and ray_status not in api.TERMINAL_JOB_STATUSES:
            st["failed"] = 1
            fail("SubmissionFailed", "The submitter Job failed: see its logs (gpufleet logs job/"
                                     f"{objects.name_of(job)}).")
        elif ray_status in api.TERMINAL_JOB_STATUSES and not submitter_done:
            a.requeue(POLL_SECONDS)
        elif ray_status == api.JOB_SUCCEEDED or (ray_status is None and _job_condition(o.submitter, "Complete")):
            st.update(jobStatus=api.JOB_SUCCEEDED, jobDeploymentStatus=api.DEPLOYMENT_COMPLETE, endTime=now.text,
                      succeeded=1)
            a.event("Normal", "Completed", f"The Ray job {st['jobId']} succeeded.")
        elif ray_status in (api.JOB_FAILED, api.JOB_STOPPED):
            st["failed"] = 1
            fail("AppFailed", f"The Ray job {st['jobId']} ended {ray_status}.")
        else:
            a.requeue(POLL_SECONDS)
    if o.cluster is not None and o.cluster.get("status"):
        st["rayClusterStatus"] = o.cluster["status"]
    if deadline and start is not None and st.get("jobDeploymentStatus") not in (
            api.DEPLOYMENT_COMPLETE, api.DEPLOYMENT_FAILED):
        a.requeue(max(0.0, start + deadline - now.wall))
    if st.get("jobDeploymentStatus") in (api.DEPLOYMENT_COMPLETE, api.DEPLOYMENT_FAILED):
        a.requeue(0.0)  # the clean-up after the end
    return _with_status(a, job, st, old)


def _with_status(a: Actions, job: Any, st: dict[str, Any], old: dict[str, Any]) -> Actions:
    """The status written back, with the generation observed, when it changed."""
    gen = objects.meta(job, "generation")
    if gen is not None:
        st["observedGeneration"] = gen
    if st != old:
        a.status = st
    return a
