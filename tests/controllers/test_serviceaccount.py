"""The serviceaccount and root-ca-cert-publisher controllers against a real control plane."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from gpufleet.cli.controlplane import ControlPlane
from gpufleet.client.api import Client
from gpufleet.client.errors import NotFound
from gpufleet.controllers.serviceaccount import DESCRIPTION, DESCRIPTION_ANNOTATION

DEADLINE = 20.0
CONTROLLERS = ("serviceaccount", "root-ca-cert-publisher")


async def eventually(check: Callable[[], Awaitable[Any]], what: str) -> Any:
    loop = asyncio.get_running_loop()
    end = loop.time() + DEADLINE
    while True:
        try:
            result = await check()
        except NotFound:
            result = None
        if result:
            return result
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def namespace(client: Client, name: str) -> None:
    await client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}, raw=True)


async def root_ca(client: Client, ns: str) -> dict[str, Any]:
    return await client.get("configmaps", "kube-root-ca.crt", ns, raw=True)


async def test_every_namespace_has_a_default_service_account(cp: ControlPlane, client: Client, controllers) -> None:
    await controllers(enabled=CONTROLLERS, root_ca=cp.ca_pem)
    await namespace(client, "team")
    for ns in ("default", "kube-system", "team"):
        await eventually(lambda ns=ns: client.get("serviceaccounts", "default", ns, raw=True), f"{ns}/default")
    first = await client.get("serviceaccounts", "default", "team", raw=True)
    await client.delete("serviceaccounts", "default", "team")

    async def replaced() -> bool:
        again = await client.get("serviceaccounts", "default", "team", raw=True)
        return again["metadata"]["uid"] != first["metadata"]["uid"]

    await eventually(replaced, "the deleted default service account to be made again")


async def test_the_cluster_ca_is_published_in_every_namespace(cp: ControlPlane, client: Client, controllers) -> None:
    assert cp.ca_pem is not None
    ca = cp.ca_pem.decode()
    await controllers(enabled=CONTROLLERS, root_ca=cp.ca_pem)
    await namespace(client, "team")
    cm = await eventually(lambda: root_ca(client, "team"), "kube-root-ca.crt in team")
    assert cm["data"] == {"ca.crt": ca}
    assert cm["metadata"]["annotations"] == {DESCRIPTION_ANNOTATION: DESCRIPTION}
    assert (await root_ca(client, "default"))["data"] == {"ca.crt": ca}

    # Edited: put back. Its annotation dropped: put back. Deleted: made again.
    cm["data"] = {"ca.crt": "not a CA", "extra": "x"}
    cm["metadata"]["annotations"] = {"mine": "kept"}
    await client.update(cm, raw=True)

    async def restored() -> bool:
        now = await root_ca(client, "team")
        return now["data"] == {"ca.crt": ca} and now["metadata"]["annotations"] == {
            "mine": "kept", DESCRIPTION_ANNOTATION: DESCRIPTION}

    await eventually(restored, "the edited kube-root-ca.crt to be put back")
    await client.delete("configmaps", "kube-root-ca.crt", "team")
    await eventually(lambda: root_ca(client, "team"), "the deleted kube-root-ca.crt to be made again")


async def test_a_new_ca_reaches_every_namespace(cp: ControlPlane, client: Client, controllers) -> None:
    manager = await controllers(enabled=CONTROLLERS, root_ca=b"-----BEGIN CERTIFICATE-----\nold\n")
    await eventually(lambda: root_ca(client, "default"), "kube-root-ca.crt")
    await manager.stop()
    assert cp.ca_pem is not None
    await controllers(enabled=CONTROLLERS, root_ca=cp.ca_pem)

    async def updated() -> bool:
        return (await root_ca(client, "default"))["data"]["ca.crt"] == cp.ca_pem.decode()

    await eventually(updated, "kube-root-ca.crt to carry the new CA")


async def test_a_namespace_being_deleted_is_left_alone(cp: ControlPlane, client: Client, controllers,
                                                      monkeypatch) -> None:
    await namespace(client, "leaving")
    # Held by a finalizer of its own, the namespace stays Terminating while the controllers run.
    await client.create({"apiVersion": "v1", "kind": "ConfigMap",
                         "metadata": {"name": "held", "namespace": "leaving", "finalizers": ["example.com/hold"]}},
                        raw=True)
    await client.delete("namespaces", "leaving")
    manager = await controllers(enabled=CONTROLLERS, root_ca=cp.ca_pem)
    await eventually(lambda: root_ca(client, "default"), "kube-root-ca.crt in default")
    await eventually(lambda: client.get("serviceaccounts", "default", "default", raw=True), "default/default")
    writes: list[tuple[str, str]] = []
    for name in CONTROLLERS:
        controller = manager.controller(name)

        async def record(obj: dict[str, Any], namespace: str | None = None, **kw: Any) -> Any:
            writes.append((obj["kind"], namespace or ""))
            raise AssertionError("no write expected")

        monkeypatch.setattr(controller.client, "create", record)
        monkeypatch.setattr(controller.client, "update", record)
        informer = controller.ns_informer

        async def cached(informer: Any = informer) -> bool:
            return informer.get("leaving") is not None

        await eventually(cached, "the namespace in the cache")
        assert await controller.reconcile("leaving") is None
    assert writes == []
    assert list(await client.list("serviceaccounts", "leaving", raw=True)) == []
    assert [c["metadata"]["name"] for c in await client.list("configmaps", "leaving", raw=True)] == ["held"]
