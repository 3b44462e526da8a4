"""The namespace controller and the garbage collector over custom resources, with a real API
server in-process: kinds found through discovery, including CRDs made after they started."""

from __future__ import annotations

import json
from typing import Any

from ctrl_helpers import NS, eventually

from gpufleet.client.api import Client
from gpufleet.client.errors import NotFound

CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def crd(plural: str, kind: str, *, scope: str = "Namespaced", group: str = "example.com") -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {"group": group, "scope": scope, "names": {"plural": plural, "kind": kind},
                 "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                     "type": "object", "properties": {"spec": {"type": "object",
                                                               "x-kubernetes-preserve-unknown-fields": True}}}}}]},
    }


async def make_crd(client: Client, plural: str, kind: str, **kw: Any) -> None:
    await client.raw_request("POST", CRDS, json=crd(plural, kind, **kw))


def body_of(resp: Any) -> dict[str, Any]:
    return json.loads(resp.body)


def path(plural: str, namespace: str | None = NS, name: str = "") -> str:
    ns = f"/namespaces/{namespace}" if namespace else ""
    return f"/apis/example.com/v1{ns}/{plural}" + (f"/{name}" if name else "")


async def make(client: Client, plural: str, kind: str, name: str, namespace: str | None = NS,
               **meta: Any) -> dict[str, Any]:
    body = {"apiVersion": "example.com/v1", "kind": kind, "metadata": {"name": name, **meta}, "spec": {}}
    return body_of(await client.raw_request("POST", path(plural, namespace), json=body))


async def get(client: Client, url: str) -> dict[str, Any] | None:
    try:
        return body_of(await client.raw_request("GET", url))
    except NotFound:
        return None


def ref(owner: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": owner["metadata"]["name"],
            "uid": owner["metadata"]["uid"], **extra}


def conditions(ns: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    return {c["type"]: (c["status"], c.get("reason", ""), c.get("message", ""))
            for c in (ns.get("status") or {}).get("conditions") or []}


# -- the namespace controller --------------------------------------------------------------------


async def test_deleting_a_namespace_deletes_its_custom_resources(client: Client, controllers) -> None:
    await controllers(enabled=("namespace",))
    # The CRD comes after the controller started: discovery finds it.
    await make_crd(client, "widgets", "Widget")
    await client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}})
    await make(client, "widgets", "Widget", "w1", "team")
    await make(client, "widgets", "Widget", "w2", "team", finalizers=["example.com/hold"])
    await make(client, "widgets", "Widget", "kept", NS)
    await client.delete("namespaces", "team")

    await eventually(lambda: _gone(client, path("widgets", "team", "w1")), what="w1 deleted")

    async def reported() -> dict[str, Any] | None:
        ns = await client.get("namespaces", "team", raw=True)
        c = conditions(ns)
        return ns if c.get("NamespaceFinalizersRemaining", ("",))[0] == "True" else None

    ns = await eventually(reported, what="the namespace's conditions")
    c = conditions(ns)
    assert c["NamespaceContentRemaining"] == (
        "True", "SomeResourcesRemain", "Some resources are remaining: widgets.example.com has 1 resource instances")
    assert c["NamespaceFinalizersRemaining"] == (
        "True", "SomeFinalizersRemain",
        "Some content in the namespace has finalizers remaining: example.com/hold in 1 resource instances")
    assert c["NamespaceDeletionDiscoveryFailure"][:2] == ("False", "ResourcesDiscovered")
    assert c["NamespaceDeletionContentFailure"][:2] == ("False", "ContentDeleted")
    w2 = await get(client, path("widgets", "team", "w2"))
    assert w2 is not None and w2["metadata"].get("deletionTimestamp")

    w2["metadata"]["finalizers"] = []
    await client.raw_request("PUT", path("widgets", "team", "w2"), json=w2)
    await eventually(lambda: _ns_gone(client, "team"), what="the namespace released")
    # A namespace made again with the same name starts empty; other namespaces keep theirs.
    await client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}})
    assert body_of(await client.raw_request("GET", path("widgets", "team")))["items"] == []
    assert await get(client, path("widgets", NS, "kept")) is not None


async def _gone(client: Client, url: str) -> bool:
    return await get(client, url) is None


async def _ns_gone(client: Client, name: str) -> bool:
    try:
        await client.get("namespaces", name, raw=True)
    except NotFound:
        return True
    return False


# -- the garbage collector -----------------------------------------------------------------------


def configmap(name: str, *owners: dict[str, Any], block: bool = False) -> dict[str, Any]:
    refs = [ref(o, **({"blockOwnerDeletion": True} if block else {})) for o in owners]
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": NS,
                                                                  "ownerReferences": refs}}


async def delete(client: Client, url: str, policy: str) -> None:
    await client.raw_request("DELETE", url, json={"kind": "DeleteOptions", "apiVersion": "v1",
                                                  "propagationPolicy": policy})


async def cm_gone(client: Client, name: str) -> bool:
    return await _gone(client, f"/api/v1/namespaces/{NS}/configmaps/{name}")


async def test_custom_resources_as_owners_and_dependents(client: Client, controllers) -> None:
    await controllers(enabled=("garbagecollector",), gc_resync_period=0.2)
    # Made after the collector started: a rediscovery brings its monitor.
    await make_crd(client, "widgets", "Widget")
    w = await make(client, "widgets", "Widget", "w")
    await client.create(configmap("of-w", w))
    deploy = await client.create({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
                                  "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "d"}},
                                           "template": {"metadata": {"labels": {"app": "d"}},
                                                        "spec": {"containers": [{"name": "c", "image": "x"}]}}}},
                                 raw=True)
    await make(client, "widgets", "Widget", "of-d", ownerReferences=[ref(deploy)])

    await delete(client, path("widgets", NS, "w"), "Background")
    await eventually(lambda: cm_gone(client, "of-w"), what="the Widget's ConfigMap collected")
    await client.delete("deployments", "d", NS, propagation_policy="Background")
    await eventually(lambda: _gone(client, path("widgets", NS, "of-d")), what="the Deployment's Widget collected")

    # Foreground: the Widget waits for its blocking dependent, then goes.
    fg = await make(client, "widgets", "Widget", "fg")
    await client.create(configmap("of-fg", fg, block=True))
    await delete(client, path("widgets", NS, "fg"), "Foreground")
    await eventually(lambda: cm_gone(client, "of-fg"), what="the foreground dependent deleted")
    await eventually(lambda: _gone(client, path("widgets", NS, "fg")), what="the foreground owner released")

    # Orphan: the dependent stays, without its reference.
    orph = await make(client, "widgets", "Widget", "orph")
    await client.create(configmap("of-orph", orph))
    await delete(client, path("widgets", NS, "orph"), "Orphan")
    await eventually(lambda: _gone(client, path("widgets", NS, "orph")), what="the orphaning owner released")
    kept = await client.get("configmaps", "of-orph", NS, raw=True)
    assert not kept["metadata"].get("ownerReferences")


async def test_a_kind_whose_crd_is_deleted_loses_its_monitor(client: Client, controllers) -> None:
    await make_crd(client, "gadgets", "Gadget")
    manager = await controllers(enabled=("garbagecollector",), gc_resync_period=0.2)
    gc = manager.controller("garbagecollector")
    assert "gadgets.example.com" in gc.monitors  # found when it started
    g = await make(client, "gadgets", "Gadget", "g")
    await client.create(configmap("of-g", g))
    await client.raw_request("DELETE", f"{CRDS}/gadgets.example.com")
    # The CRD's clean-up deletes the Gadget; the collector follows.
    await eventually(lambda: cm_gone(client, "of-g"), what="the Gadget's ConfigMap collected")
    await eventually(lambda: "gadgets.example.com" not in gc.monitors, what="the monitor dropped")
    assert client.registry.by_api_version_kind("example.com/v1", "Gadget") is None
