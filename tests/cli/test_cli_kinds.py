"""Kinds the CLI's own registry lacks are found through the server's discovery documents."""

import json

import pytest

from gpufleet.api.registry import REGISTRY, Registry, ResourceType
from gpufleet.apiserver import discovery
from gpufleet.cli.kinds import KindResolver
from gpufleet.cli.output import CliError
from gpufleet.utils.http import RawResponse

PYTORCHJOB = ResourceType("kubeflow.org", "v1", "PyTorchJob", "pytorchjobs", True, "x:Y", ("ptj",), ("kubeflow",),
                          subresources=("status", "scale"))


class FakeClient:
    """Answers discovery requests from a server-side registry, aggregated or legacy."""

    def __init__(self, server_registry: Registry, aggregated: bool) -> None:
        self.registry = server_registry
        self.aggregated = aggregated
        self.paths: list[str] = []

    async def raw_request(self, method, path, *, headers=None, **_):
        self.paths.append(path)
        parts = [p for p in path.split("/") if p]
        if self.aggregated and path in ("/api", "/apis"):
            body = discovery.aggregated(self.registry, "v2", core=path == "/api")
        elif path == "/api":
            body = discovery.api_versions()
        elif path == "/apis":
            body = discovery.api_group_list(self.registry)
        elif parts[0] == "api":
            body = discovery.api_resource_list(self.registry, "", parts[1])
        else:
            body = discovery.api_resource_list(self.registry, parts[1], parts[2])
        return RawResponse(200, {"content-type": "application/json"}, json.dumps(body).encode())


@pytest.mark.parametrize("aggregated", [True, False])
async def test_unknown_kind_comes_from_discovery_with_its_subresources(aggregated):
    server = Registry(REGISTRY.all() + [PYTORCHJOB])
    client = FakeClient(server, aggregated)
    resolver = KindResolver(client, registry=Registry(REGISTRY.all()))

    # Built-in kinds need no request at all.
    assert (await resolver.resolve("deploy")).key == "deployments.apps"
    assert client.paths == []

    for name in ("pytorchjobs", "ptj", "PyTorchJob", "pytorchjobs.kubeflow.org"):
        rt = await resolver.resolve(name)
        assert (rt.group, rt.version, rt.kind, rt.plural, rt.namespaced) == (
            "kubeflow.org", "v1", "PyTorchJob", "pytorchjobs", True)
        assert "scale" in rt.subresources
        assert rt.path("ns", "j", "scale") == "/apis/kubeflow.org/v1/namespaces/ns/pytorchjobs/j/scale"
    assert (await resolver.for_manifest("kubeflow.org/v1", "PyTorchJob")).plural == "pytorchjobs"
    assert await resolver.for_manifest("kubeflow.org/v1", "TFJob") is None
    with pytest.raises(CliError, match='resource type "gizmos"'):
        await resolver.resolve("gizmos")


async def test_category_all_is_the_registry_order():
    resolver = KindResolver(FakeClient(REGISTRY, True))
    kinds = [rt.plural for rt in await resolver.category("all")]
    assert kinds[:2] == ["pods", "services"]
    assert "deployments" in kinds and "namespaces" not in kinds
