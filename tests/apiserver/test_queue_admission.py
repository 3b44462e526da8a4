"""The queues' admission plugin is in the standard chain: an API server as any caller builds
it (here a bare one, as the tests build it) creates a job carrying a queue name suspended,
as Kueue's webhook does, and leaves other jobs as they are."""

from __future__ import annotations

from typing import Any

from apiserver_helpers import Api

JOBS = "/apis/batch/v1/namespaces/default/jobs"


def job(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, **({"labels": labels} if labels else {})},
            "spec": {"template": {"spec": {"restartPolicy": "Never",
                                           "containers": [{"name": "main", "image": "trainer:1"}]}}}}


async def test_a_bare_api_server_creates_queued_jobs_suspended(api: Api) -> None:
    queued = await api.create(JOBS, job("queued", {"kueue.x-k8s.io/queue-name": "team-a"}))
    assert queued["spec"]["suspend"] is True
    plain = await api.create(JOBS, job("plain"))
    assert plain["spec"].get("suspend") in (None, False)
