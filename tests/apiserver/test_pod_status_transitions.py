"""pods/status updates may not bring back a container that finished for good, as
kube-apiserver's ValidatePodStatusUpdate (ValidateContainerStateTransition) refuses them."""

from __future__ import annotations

import pytest
from apiserver_helpers import Api, assert_status, binding, pod

PODS = "/api/v1/namespaces/default/pods"


def terminated(code: int) -> dict:
    return {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}}


def statuses(state: dict) -> list[dict]:
    return [{"name": "main", "ready": False, "restartCount": 0, "image": "busybox:1.36", "imageID": "",
             "state": state}]


async def put_status(api: Api, name: str, phase: str, state: dict):
    current = await api.must_get(f"{PODS}/{name}")
    current["status"] = {**current.get("status", {}), "phase": phase, "containerStatuses": statuses(state)}
    return await api.put(f"{PODS}/{name}/status", current)


@pytest.mark.parametrize(("policy", "code", "refused"), [
    ("Never", 0, True), ("Never", 1, True),
    ("OnFailure", 0, True), ("OnFailure", 1, False),   # a failed container is restarted
    ("Always", 0, False), ("Always", 1, False),
])
async def test_a_terminated_container_stays_terminated_unless_it_restarts(api: Api, policy, code, refused) -> None:
    await api.create(PODS, pod("p", restartPolicy=policy))
    assert (await api.post(f"{PODS}/p/binding", binding("p", "n1"))).status == 201
    assert (await put_status(api, "p", "Running", {"running": {"startedAt": "2026-01-01T00:00:00Z"}})).status == 200
    phase = "Running" if policy == "Always" else ("Succeeded" if code == 0 else "Failed")
    assert (await put_status(api, "p", phase, terminated(code))).status == 200
    r = await put_status(api, "p", "Running", {"running": {"startedAt": "2026-01-01T00:00:05Z"}})
    if refused:
        s = assert_status(r, 422, "Invalid", name="p", kind="Pod", fields=["status.containerStatuses[0].state"])
        assert "may not be transitioned to non-terminated state" in s["message"], s
        assert (await api.must_get(f"{PODS}/p"))["status"]["phase"] == phase
    else:
        assert r.status == 200, r
    # Waiting is not terminated either.
    if refused:
        r = await put_status(api, "p", "Pending", {"waiting": {"reason": "ContainerCreating"}})
        assert_status(r, 422, "Invalid", fields=["status.containerStatuses[0].state"])


async def test_a_main_resource_update_of_a_finished_pod_is_not_refused(api: Api) -> None:
    await api.create(PODS, pod("p", restartPolicy="Never"))
    assert (await api.post(f"{PODS}/p/binding", binding("p", "n1"))).status == 201
    assert (await put_status(api, "p", "Failed", terminated(137))).status == 200
    current = await api.must_get(f"{PODS}/p")
    current["metadata"].setdefault("labels", {})["seen"] = "yes"
    r = await api.put(f"{PODS}/p", current)
    assert r.status == 200, r
