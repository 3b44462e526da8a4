"""batch/v1 through the API server: the selector and labels a new Job gets, and CronJob's
defaults, validation (errors naming the field) and table."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from typing import Any

import pytest
from apiserver_helpers import TABLE_ACCEPT, Api

from gpufleet.apiserver.server import ApiServer
from gpufleet.store.base import open_store

JOBS = "/apis/batch/v1/namespaces/default/jobs"
CRONJOBS = "/apis/batch/v1/namespaces/default/cronjobs"
UID = "batch.kubernetes.io/controller-uid"


@pytest.fixture
async def api(sqlite_url: str) -> AsyncIterator[Api]:
    store = open_store(sqlite_url)
    await store.start()
    server = ApiServer(store)
    await server.start()
    yield Api(server)
    await store.close()


def pod_template(**labels: str) -> dict[str, Any]:
    meta = {"labels": labels} if labels else {}
    return {"metadata": meta, "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}


def job(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"template": pod_template(), **spec}}


def cronjob(name: str = "nightly", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": name},
            "spec": {"schedule": "0 3 * * *", "jobTemplate": {"spec": {"template": pod_template()}}, **spec}}


def causes(reply: Any) -> list[tuple[str, str]]:
    assert reply.status == 422, reply
    return [(c["field"], c["message"]) for c in reply.json["details"]["causes"]]


async def test_a_new_job_gets_the_selector_and_labels_of_its_uid(api: Api) -> None:
    stored = await api.create(JOBS, job("work"))
    uid = stored["metadata"]["uid"]
    assert stored["spec"]["selector"] == {"matchLabels": {UID: uid}}
    labels = stored["spec"]["template"]["metadata"]["labels"]
    assert labels == {UID: uid, "controller-uid": uid, "batch.kubernetes.io/job-name": "work", "job-name": "work"}
    # A Job without labels of its own shows its template's, as on a real cluster.
    assert stored["metadata"]["labels"] == labels
    # The selector is immutable.
    changed = copy.deepcopy(stored)
    changed["spec"]["selector"]["matchLabels"][UID] = "other"
    assert "spec.selector" in [f for f, _ in causes(await api.put(f"{JOBS}/work", changed))]


async def test_template_labels_that_name_another_uid_are_refused(api: Api) -> None:
    body = job("stolen")
    body["spec"]["template"] = pod_template(**{"controller-uid": "not-mine"})
    problems = causes(await api.post(JOBS, body))
    assert [f for f, _ in problems] == ["spec.template.metadata.labels[controller-uid]"]
    assert "must be '" in problems[0][1] and "manualSelector" in problems[0][1]


async def test_manual_selector_is_honoured_and_must_match_the_template(api: Api) -> None:
    body = job("manual", manualSelector=True, selector={"matchLabels": {"app": "x"}})
    body["spec"]["template"] = pod_template(app="x")
    stored = await api.create(JOBS, body)
    assert stored["spec"]["selector"] == {"matchLabels": {"app": "x"}}
    assert stored["spec"]["template"]["metadata"]["labels"] == {"app": "x"}
    missing = job("manual2", manualSelector=True)
    assert [f for f, _ in causes(await api.post(JOBS, missing))] == ["spec.selector"]
    mismatch = job("manual3", manualSelector=True, selector={"matchLabels": {"app": "y"}})
    mismatch["spec"]["template"] = pod_template(app="x")
    problems = causes(await api.post(JOBS, mismatch))
    assert [f for f, _ in problems] == ["spec.template.metadata.labels"]
    assert "`selector` does not match template `labels`" in problems[0][1]


async def test_a_cronjob_gets_kubernetes_defaults_and_no_generated_selector(api: Api) -> None:
    stored = await api.create(CRONJOBS, cronjob())
    spec = stored["spec"]
    assert (spec["concurrencyPolicy"], spec["suspend"], spec["successfulJobsHistoryLimit"],
            spec["failedJobsHistoryLimit"]) == ("Allow", False, 3, 1)
    assert "selector" not in spec["jobTemplate"]["spec"]
    # Its pod template gets the pod defaults; the Job fields are left for each Job.
    assert spec["jobTemplate"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 30
    assert "backoffLimit" not in spec["jobTemplate"]["spec"]
    table = (await api.get(CRONJOBS, accept=TABLE_ACCEPT)).json
    assert [c["name"] for c in table["columnDefinitions"]][:7] == [
        "Name", "Schedule", "Timezone", "Suspend", "Active", "Last Schedule", "Age"]
    assert table["rows"][0]["cells"][:6] == ["nightly", "0 3 * * *", "<none>", "False", 0, "<none>"]


@pytest.mark.parametrize(("spec", "field", "message"), [
    ({"schedule": "61 * * * *"}, "spec.schedule", "end of range (61) above maximum (59): 61"),
    ({"schedule": "* * *"}, "spec.schedule", "expected exactly 5 fields, found 3: [* * *]"),
    ({"schedule": "TZ=UTC 0 3 * * *"}, "spec.schedule", "cannot use TZ or CRON_TZ in schedule, use timeZone field"),
    ({"timeZone": "Mars/Olympus"}, "spec.timeZone", "unknown time zone Mars/Olympus"),
    ({"concurrencyPolicy": "Sometimes"}, "spec.concurrencyPolicy", '"Allow", "Forbid", "Replace"'),
    ({"startingDeadlineSeconds": -1}, "spec.startingDeadlineSeconds", "must be greater than or equal to 0"),
    ({"successfulJobsHistoryLimit": -1}, "spec.successfulJobsHistoryLimit", "must be greater than or equal to 0"),
])
async def test_a_bad_cronjob_is_refused_naming_the_field(api: Api, spec: dict[str, Any], field: str,
                                                         message: str) -> None:
    problems = causes(await api.post(CRONJOBS, cronjob(**spec)))
    assert [f for f, _ in problems] == [field]
    assert message in problems[0][1]


async def test_a_cronjob_template_may_not_choose_its_selector_nor_restart_always(api: Api) -> None:
    body = cronjob()
    body["spec"]["jobTemplate"]["spec"]["selector"] = {"matchLabels": {"a": "b"}}
    body["spec"]["jobTemplate"]["spec"]["template"] = pod_template(a="b")
    assert ("spec.jobTemplate.spec.selector" in [f for f, _ in causes(await api.post(CRONJOBS, body))])
    body = cronjob()
    body["spec"]["jobTemplate"]["spec"]["template"]["spec"]["restartPolicy"] = "Always"
    assert [f for f, _ in causes(await api.post(CRONJOBS, body))] == [
        "spec.jobTemplate.spec.template.spec.restartPolicy"]
    long = cronjob("x" * 53)
    assert [f for f, _ in causes(await api.post(CRONJOBS, long))] == ["metadata.name"]


async def test_a_job_made_from_a_cronjob_by_hand_is_accepted(api: Api) -> None:
    """What `kubectl create job --from=cronjob/x` sends: the template's spec, the manual
    instantiate annotation and a controller reference without blockOwnerDeletion."""
    cj = await api.create(CRONJOBS, cronjob())
    body = job("nightly-manual-1")
    body["metadata"]["annotations"] = {"cronjob.kubernetes.io/instantiate": "manual"}
    body["metadata"]["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "CronJob", "name": "nightly",
                                            "uid": cj["metadata"]["uid"], "controller": True}]
    body["spec"] = copy.deepcopy(cj["spec"]["jobTemplate"]["spec"])
    stored = await api.create(JOBS, body)
    assert stored["spec"]["selector"]["matchLabels"] == {UID: stored["metadata"]["uid"]}
