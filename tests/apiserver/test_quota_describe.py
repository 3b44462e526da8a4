"""`gpufleet describe quota` / `describe limitrange`: kubectl's Used/Hard and limits tables."""

from __future__ import annotations

import pytest
from apiserver_helpers import PODS, Api

from gpufleet.api.registry import REGISTRY
from gpufleet.cli.commands.describe import describe_object
from gpufleet.cli.output import Session
from gpufleet.client.api import Client
from gpufleet.client.transport import LocalTransport

pytestmark = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)


async def test_describe_quota_and_limitrange(api: Api) -> None:
    await api.create("/api/v1/namespaces/default/resourcequotas", {
        "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "team-a"},
        "spec": {"hard": {"requests.nvidia.com/gpu": "8", "pods": "10", "limits.memory": "64Gi"},
                 "scopes": ["NotBestEffort"]}})
    await api.create("/api/v1/namespaces/default/limitranges", {
        "apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "limits"},
        "spec": {"limits": [{"type": "Container", "max": {"nvidia.com/gpu": "4"},
                             "default": {"memory": "8Gi"}, "defaultRequest": {"memory": "4Gi"}}]}})
    await api.create(PODS, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                            "spec": {"containers": [{"name": "main", "image": "trainer:1", "resources": {
                                "limits": {"nvidia.com/gpu": "2"}}}]}})
    session = Session(client=Client(LocalTransport(api.server)), namespace="default", namespace_explicit=False,
                      server="in-process")
    rq = await api.must_get("/api/v1/namespaces/default/resourcequotas/team-a")
    text = await describe_object(session, REGISTRY.by_key("resourcequotas"), rq)
    lines = text.splitlines()
    assert lines[0].split() == ["Name:", "team-a"]
    assert lines[2].split() == ["Scopes:", "NotBestEffort"]
    assert lines[3].startswith(" * Matches all pods that have at least one resource requirement set.")
    table = lines[lines.index(next(x for x in lines if x.startswith("Resource"))):]
    assert [row.split() for row in table[:5]] == [
        ["Resource", "Used", "Hard"], ["--------", "----", "----"],
        ["limits.memory", "8Gi", "64Gi"], ["pods", "1", "10"], ["requests.nvidia.com/gpu", "2", "8"]]

    lr = await api.must_get("/api/v1/namespaces/default/limitranges/limits")
    text = await describe_object(session, REGISTRY.by_key("limitranges"), lr)
    rows = [line.split("  ") for line in text.splitlines()]
    cells = [[c.strip() for c in row if c.strip()] for row in rows]
    assert ["Container", "memory", "-", "-", "4Gi", "8Gi", "-"] in cells
    assert ["Container", "nvidia.com/gpu", "-", "4", "4", "4", "-"] in cells
