"""Jobs, CronJobs and native sidecars on a real node (`gpufleet up` with its local agent on
the process runtime), driven with the real kubectl:

- `kubectl logs job/x` shows that Job's pod with another Job's pod beside it, and
  `kubectl describe job` shows the selector the API server generated;
- `kubectl create cronjob`, a run that is due now (its lastScheduleTime set three minutes
  back through the status subresource, so the controller starts the most recent missed run
  without the test waiting for a minute to turn), and `kubectl create job --from=cronjob/x`;
- a Job whose pod has a native sidecar: the sidecar runs (started, ready) before the main
  container starts, is stopped after it, and the pod and the Job succeed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from test_pod_contract import BUSYBOX, Plane, running_plane, wait_until

pytestmark = pytest.mark.e2e

NS = "batch-e2e"


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    with running_plane(tmp_path_factory.mktemp("batch"), "--runtime", "process") as p:
        assert p.kubectl("create", "namespace", NS).returncode == 0
        yield p


def kubectl(plane: Plane, *args: str, input: str | None = None) -> str:
    out = plane.kubectl("-n", NS, *args, input=input)
    assert out.returncode == 0, f"kubectl {' '.join(args)}: {out.stderr}\n{plane.log.read_text()[-3000:]}"
    return out.stdout


def job_json(name: str, containers: list[dict], **pod_spec) -> str:
    return json.dumps({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": {
        "backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 5,
                                                 "containers": containers, **pod_spec}}}})


def shell(name: str, script: str, **extra) -> dict:
    return {"name": name, "image": BUSYBOX, "command": ["sh", "-c", script], **extra}


async def job_done(plane: Plane, name: str) -> dict | None:
    job = json.loads(kubectl(plane, "get", "job", name, "-o", "json"))
    conds = {c["type"]: c["status"] for c in (job.get("status") or {}).get("conditions") or []}
    assert conds.get("Failed") != "True", job
    return job if conds.get("Complete") == "True" else None


async def test_logs_of_a_job_are_its_own_pods_and_describe_shows_the_selector(plane: Plane) -> None:
    for name in ("alpha", "beta"):
        kubectl(plane, "apply", "-f", "-", input=job_json(name, [shell("main", f"echo I am {name}")]))
    for name in ("alpha", "beta"):
        await wait_until(lambda n=name: job_done(plane, n), 60, f"Job {name} complete", plane)
    assert kubectl(plane, "logs", "job/alpha").strip() == "I am alpha"
    assert kubectl(plane, "logs", "job/beta").strip() == "I am beta"
    uid = json.loads(kubectl(plane, "get", "job", "alpha", "-o", "json"))["metadata"]["uid"]
    described = kubectl(plane, "describe", "job", "alpha")
    selector = next(line for line in described.splitlines() if line.startswith("Selector:"))
    assert selector.split()[1] == f"batch.kubernetes.io/controller-uid={uid}"


async def test_a_cronjob_runs_when_due_and_a_job_can_be_made_from_it(plane: Plane) -> None:
    kubectl(plane, "create", "cronjob", "tick", f"--image={BUSYBOX}", "--schedule=* * * * *", "--",
            "sh", "-c", "echo tick")
    header = kubectl(plane, "get", "cronjob", "tick").splitlines()[0].split()
    assert header == ["NAME", "SCHEDULE", "TIMEZONE", "SUSPEND", "ACTIVE", "LAST", "SCHEDULE", "AGE"]
    # The last run was three minutes ago: the most recent missed one is due now.
    minute = int(time.time()) // 60
    last = time.strftime("%Y-%m-%dT%H:%M:00Z", time.gmtime((minute - 3) * 60))
    kubectl(plane, "patch", "cronjob", "tick", "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": {"lastScheduleTime": last}}))

    async def scheduled() -> list[dict] | None:
        jobs = json.loads(kubectl(plane, "get", "jobs", "-o", "json"))["items"]
        mine = [j for j in jobs if (j["metadata"].get("ownerReferences") or [{}])[0].get("name") == "tick"]
        return mine or None

    (job,) = await wait_until(scheduled, 30, "the CronJob's Job", plane)
    run = int(job["metadata"]["name"].rsplit("-", 1)[1])
    assert minute - 1 <= run <= minute + 1  # the minute that began last (the clock may have turned)
    assert job["metadata"]["annotations"]["batch.kubernetes.io/cronjob-scheduled-timestamp"] == \
        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(run * 60))
    await wait_until(lambda: job_done(plane, job["metadata"]["name"]), 60, "the scheduled run complete", plane)
    assert kubectl(plane, "logs", f"job/{job['metadata']['name']}").strip() == "tick"

    kubectl(plane, "create", "job", "tick-by-hand", "--from=cronjob/tick")
    manual = json.loads(kubectl(plane, "get", "job", "tick-by-hand", "-o", "json"))
    assert manual["metadata"]["annotations"]["cronjob.kubernetes.io/instantiate"] == "manual"
    (owner,) = manual["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("CronJob", "tick", True)
    assert manual["spec"]["selector"]["matchLabels"] == {
        "batch.kubernetes.io/controller-uid": manual["metadata"]["uid"]}
    await wait_until(lambda: job_done(plane, "tick-by-hand"), 60, "the manual run complete", plane)
    assert kubectl(plane, "logs", "job/tick-by-hand").strip() == "tick"
    status = json.loads(kubectl(plane, "get", "cronjob", "tick", "-o", "json"))["status"]
    # The schedule is every minute: if the clock turned meanwhile, the next run is the last one scheduled.
    runs = [int(j["metadata"]["name"].rsplit("-", 1)[1]) for j in await scheduled() or []
            if "cronjob.kubernetes.io/instantiate" not in j["metadata"].get("annotations", {})]
    assert run in runs and max(runs) <= run + 1
    assert status["lastScheduleTime"] in {time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(r * 60)) for r in runs}
    assert "lastSuccessfulTime" in status


SIDECAR = """
echo sidecar up
touch /shared/sidecar-up
trap 'if [ -f /shared/main-done ]; then echo stopped after main; fi; exit 0' TERM
while true; do sleep 0.1; done
"""
MAIN = """
if [ -f /shared/sidecar-up ]; then echo sidecar was up; fi
sleep 4
touch /shared/main-done
echo main done
"""


async def test_a_job_pod_with_a_native_sidecar_succeeds(plane: Plane) -> None:
    mount = [{"name": "shared", "mountPath": "/shared"}]
    body = job_json("with-sidecar", [shell("main", MAIN, volumeMounts=mount)],
                    # As in Kubernetes, the main container starts once the sidecar has started: without a
                    # startupProbe that is as soon as its process runs, so the probe is what orders the two.
                    initContainers=[shell("sidecar", SIDECAR, restartPolicy="Always", volumeMounts=mount,
                                          startupProbe={"exec": {"command": ["test", "-f", "/shared/sidecar-up"]},
                                                        "periodSeconds": 1})],
                    volumes=[{"name": "shared", "emptyDir": {}}])
    kubectl(plane, "apply", "-f", "-", input=body)

    async def main_running() -> dict | None:
        pods = json.loads(kubectl(plane, "get", "pods", "-l", "job-name=with-sidecar", "-o", "json"))["items"]
        if not pods:
            return None
        statuses = (pods[0].get("status") or {}).get("containerStatuses") or []
        return pods[0] if statuses and "running" in statuses[0]["state"] else None

    pod = await wait_until(main_running, 60, "the main container running", plane)
    name = pod["metadata"]["name"]
    (side,) = pod["status"]["initContainerStatuses"]
    assert side["name"] == "sidecar" and "running" in side["state"]
    assert side["started"] is True and side["ready"] is True
    assert pod["status"]["phase"] == "Running"
    conds = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
    assert conds["Initialized"] == "True"

    # The main container finishes: the sidecar is stopped after it and the pod succeeds.
    await wait_until(lambda: job_done(plane, "with-sidecar"), 60, "the Job with a sidecar complete", plane)
    pod = json.loads(kubectl(plane, "get", "pod", name, "-o", "json"))
    assert pod["status"]["phase"] == "Succeeded"
    assert "terminated" in pod["status"]["initContainerStatuses"][0]["state"]
    assert kubectl(plane, "logs", name, "-c", "main").split("\n")[:2] == ["sidecar was up", "main done"]
    assert kubectl(plane, "logs", name, "-c", "sidecar").split("\n")[:2] == ["sidecar up", "stopped after main"]
