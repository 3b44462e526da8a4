"""Encryption at rest (store/encryption.py) on both backends: what reaches the database
holds no plaintext, reads/lists/watches see plain objects, rotation reads old keys, and a
store without the key refuses those objects alone, with a clear error."""

from __future__ import annotations

import asyncio
import base64
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from gpufleet.store.base import Store, TransformError
from gpufleet.store.encryption import (
    EncryptionConfigError,
    ValueCodec,
    load_encryption_config,
    parse_encryption_config,
)

MakeStore = Callable[..., Awaitable[Store]]

PLAINTEXT = "hunter2-distinctive-value-7f3a"
KEY1 = base64.b64encode(b"k" * 32).decode()
KEY2 = base64.b64encode(b"n" * 32).decode()


def config(*providers: dict[str, Any], resources: tuple[str, ...] = ("secrets",)) -> ValueCodec:
    return parse_encryption_config({"apiVersion": "apiserver.config.k8s.io/v1", "kind": "EncryptionConfiguration",
                                    "resources": [{"resources": list(resources), "providers": list(providers)}]})


def aescbc(*keys: tuple[str, str]) -> dict[str, Any]:
    return {"aescbc": {"keys": [{"name": n, "secret": s} for n, s in keys]}}


def secret(name: str, value: str = PLAINTEXT) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": "default"},
            "data": {"password": base64.b64encode(value.encode()).decode()}, "stringData": None,
            "note": value}


def raw_rows(url: str) -> list[str]:
    """Every object and event value as the database holds it."""
    if url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as db:
            return [r[0] for r in db.execute("SELECT value FROM objects UNION ALL SELECT value FROM events")] + \
                [r[0] for r in db.execute("SELECT prev_value FROM events WHERE prev_value IS NOT NULL")]
    with psycopg.connect(url) as db:
        rows = db.execute("SELECT value::text FROM objects UNION ALL SELECT value::text FROM events "
                          "UNION ALL SELECT prev_value::text FROM events WHERE prev_value IS NOT NULL").fetchall()
        return [r[0] for r in rows]


async def test_stored_values_hold_no_plaintext_and_read_back_plain(store_url: str, make_store: MakeStore) -> None:
    codec = config(aescbc(("key1", KEY1)), {"identity": {}})
    store = await make_store(codec=codec)
    w = await store.watch("secrets", None, await store.revision())
    created = await store.create("secrets", "default", "s1", secret("s1"))
    await store.update("secrets", "default", "s1", {**created, "note": PLAINTEXT + "-2"})
    await store.create("configmaps", "default", "cm", {"metadata": {"name": "cm"}, "data": {"k": "plain-cm"}})

    rows = raw_rows(store_url)
    encoded = base64.b64encode(PLAINTEXT.encode()).decode()
    secret_rows = [r for r in rows if "k8s:enc:" in r]
    assert len(secret_rows) == 4  # the object, the ADDED event, the MODIFIED event and its prev
    assert all(r.startswith('"k8s:enc:aescbc:v1:key1:') for r in secret_rows)
    assert not [r for r in rows if PLAINTEXT in r or encoded in r]
    assert any("plain-cm" in r for r in rows)  # resources not listed stay as they were

    got = await store.get("secrets", "default", "s1")
    assert got["note"] == PLAINTEXT + "-2" and got["data"]["password"] == encoded
    assert [o["note"] for o in (await store.list("secrets", "default")).items] == [PLAINTEXT + "-2"]
    events = [await anext(aiter(w)) for _ in range(2)]
    assert [(e.type, e.object["note"]) for e in events] == [("ADDED", PLAINTEXT), ("MODIFIED", PLAINTEXT + "-2")]
    assert events[1].prev is not None and events[1].prev["note"] == PLAINTEXT
    await w.close()
    replay = await store.watch("secrets", None, 0)
    assert (await anext(aiter(replay))).object["note"] == PLAINTEXT
    await replay.close()
    deleted = await store.delete("secrets", "default", "s1")
    assert deleted["note"] == PLAINTEXT + "-2"


async def test_encrypted_pods_are_still_listed_by_node(make_store: MakeStore) -> None:
    """The node index cannot read an encrypted pod: such lists fall back to every pod (the
    API server filters), and writing encrypted pods does not trip over the index."""
    store = await make_store(codec=config(aescbc(("key1", KEY1)), {"identity": {}}, resources=("pods",)))
    for i in range(4):
        await store.create("pods", "default", f"p{i}", {"metadata": {"name": f"p{i}", "namespace": "default"},
                                                       "spec": {"nodeName": f"n{i % 2}"}})
    listed = (await store.list("pods", node="n1")).items
    assert sorted(o["metadata"]["name"] for o in listed) == ["p0", "p1", "p2", "p3"]
    assert all(o["spec"]["nodeName"] for o in listed)


async def test_aesgcm_binds_the_value_to_its_key(store_url: str, make_store: MakeStore) -> None:
    store = await make_store(codec=config({"aesgcm": {"keys": [{"name": "g", "secret": KEY1}]}}))
    await store.create("secrets", "default", "a", secret("a"))
    await store.create("secrets", "default", "b", secret("b", "other"))
    assert all(PLAINTEXT not in r for r in raw_rows(store_url))
    assert (await store.get("secrets", "default", "a"))["note"] == PLAINTEXT
    # A value copied onto another object's row does not decrypt there.
    if store_url.startswith("sqlite"):
        with sqlite3.connect(store_url.removeprefix("sqlite:///")) as db:
            db.execute("UPDATE objects SET value = (SELECT value FROM objects WHERE name = 'a') WHERE name = 'b'")
    else:
        with psycopg.connect(store_url) as db:
            db.execute("UPDATE objects SET value = (SELECT value FROM objects WHERE name = 'a') WHERE name = 'b'")
    with pytest.raises(TransformError, match="authentication failed"):
        await store.get("secrets", "default", "b")


async def test_rotation_reads_old_keys_and_writes_with_the_first(store_url: str, make_store: MakeStore) -> None:
    old = await make_store(codec=config(aescbc(("key1", KEY1)), {"identity": {}}))
    plain = await make_store()  # before encryption was on
    await plain.create("secrets", "default", "before", secret("before"))
    await old.create("secrets", "default", "s1", secret("s1"))
    await old.close()
    await plain.close()

    new = await make_store(codec=config(aescbc(("key2", KEY2), ("key1", KEY1)), {"identity": {}}))
    s1 = await new.get("secrets", "default", "s1")
    assert s1["note"] == PLAINTEXT
    assert new.is_stale("secrets", "default", "s1", int(s1["metadata"]["resourceVersion"]))
    before = await new.get("secrets", "default", "before")
    assert new.is_stale("secrets", "default", "before", int(before["metadata"]["resourceVersion"]))
    rewritten = await new.update("secrets", "default", "s1", s1)
    assert not new.is_stale("secrets", "default", "s1", int(rewritten["metadata"]["resourceVersion"]))
    objects = [r for r in raw_rows(store_url) if "key2" in r]
    assert objects and all(r.startswith('"k8s:enc:aescbc:v1:key2:') for r in objects)


async def test_a_store_without_the_key_refuses_those_objects_only(store_url: str, make_store: MakeStore) -> None:
    keyed = await make_store(codec=config(aescbc(("key1", KEY1)), {"identity": {}}))
    await keyed.create("secrets", "default", "s1", secret("s1"))
    keyless = await make_store()
    with pytest.raises(TransformError) as info:
        await keyless.get("secrets", "default", "s1")
    message = str(info.value)
    assert 'unable to transform key "/registry/secrets/default/s1"' in message
    assert "aescbc key 'key1'" in message and "--encryption-provider-config" in message
    assert PLAINTEXT not in message
    with pytest.raises(TransformError):
        await keyless.list("secrets")
    replay = await keyless.watch("secrets", None, 0)
    with pytest.raises(TransformError):
        await anext(aiter(replay))
    # Everything else keeps working, watches included: the event pump is not held up by an
    # event it cannot read, and a watch of secrets that meets one ends with the error.
    cms = await keyless.watch("configmaps", None, await keyless.revision())
    live = await keyless.watch("secrets", None, await keyless.revision())
    await keyed.create("secrets", "default", "s2", secret("s2"))
    await keyed.create("configmaps", "default", "cm", {"metadata": {"name": "cm"}})
    ev = await asyncio.wait_for(anext(aiter(cms)), 30)
    assert ev.object["metadata"]["name"] == "cm"
    with pytest.raises(TransformError):
        await asyncio.wait_for(anext(aiter(live)), 30)
    await cms.close()
    # With the key (and another first), it reads them again.
    rotated = await make_store(codec=config(aescbc(("key2", KEY2), ("key1", KEY1))))
    assert (await rotated.get("secrets", "default", "s2"))["note"] == PLAINTEXT


async def test_without_identity_unencrypted_values_are_refused(make_store: MakeStore) -> None:
    plain = await make_store()
    await plain.create("secrets", "default", "old", secret("old"))
    strict: Store = await make_store(codec=config(aescbc(("key1", KEY1))))
    with pytest.raises(TransformError, match=r"stored unencrypted.*identity: \{\}"):
        await strict.get("secrets", "default", "old")


@pytest.mark.parametrize(("providers", "field", "words"), [
    ([{"rot13": {}}], "resources[0].providers[0].rot13", "unknown provider"),
    ([aescbc(("k", base64.b64encode(b"short").decode()))], "resources[0].providers[0].aescbc.keys[0].secret",
     "got 5, expected one of [16, 24, 32]"),
    ([aescbc(("k", "not base64!"))], "resources[0].providers[0].aescbc.keys[0].secret", "not valid base64"),
    ([aescbc(("a:b", KEY1))], "resources[0].providers[0].aescbc.keys[0].name", "must not contain ':'"),
    ([aescbc(("k", KEY1), ("k", KEY2))], "resources[0].providers[0].aescbc.keys[1].name", "Duplicate value"),
    ([{"aescbc": {"keys": []}}], "resources[0].providers[0].aescbc.keys", "mandatory"),
    ([{"identity": {}}, {"secretbox": {"keys": [{"name": "k", "secret": KEY1}]}}],
     "resources[0].providers[1].secretbox", "not supported by gpufleet; use aescbc or aesgcm"),
    ([{"identity": {}, **aescbc(("k", KEY1))}], "resources[0].providers[0]", "more than one provider"),
    ([], "resources[0].providers", "at least one provider"),
])
def test_bad_configs_name_the_field(providers: list[Any], field: str, words: str) -> None:
    with pytest.raises(EncryptionConfigError) as info:
        config(*providers)
    assert f": {field}: " in str(info.value) and words in str(info.value)


def test_config_file_kind_and_yaml(tmp_path: Path) -> None:
    path = tmp_path / "enc.yaml"
    path.write_text("apiVersion: v1\nkind: EncryptionConfig\nresources: []\n")
    with pytest.raises(EncryptionConfigError, match=f"{path}: apiVersion/kind: must be apiserver.config.k8s.io/v1"):
        load_encryption_config(path)
    path.write_text(f"apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n"
                    f"  - resources: [secrets, '*.apps']\n    providers:\n      - aescbc:\n          keys:\n"
                    f"            - name: key1\n              secret: {KEY1}\n      - identity: {{}}\n")
    codec = load_encryption_config(path)
    assert codec.encode("deployments.apps", "d", "n", {"metadata": {}}).startswith('"k8s:enc:aescbc:v1:key1:')
    assert codec.encode("pods", "d", "n", {"metadata": {}}) == '{"metadata":{}}'
