"""Field ownership (metadata.managedFields) as kube-apiserver records it, as pure functions.

The first three tests are the end-to-end expectations of tests/e2e (a real cluster's
behaviour with kubectl and the Python client) reduced to calls of the functions the API
server makes for each request.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.api.k8s import ConfigMap, ObjectMeta
from gpufleet.apiserver.managedfields import (
    LAST_APPLIED_ANNOTATION,
    MAX_FIELD_PATH_DEPTH,
    ApplyConflict,
    ManagedFieldsError,
    accepted_managed_fields,
    apply,
    field_manager_errors,
    field_set,
    from_fields_v1,
    is_reset,
    manager_from_user_agent,
    path_string,
    record_update,
    to_fields_v1,
)

T0, T1, T2, T3 = (f"2024-05-01T10:00:0{i}Z" for i in range(4))


def configmap(name: str = "owned", **data: str) -> dict[str, Any]:
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}
    if data:  # an empty `data: {}` in a configuration would own the map itself
        body["data"] = data
    return body


def deployment(name: str = "web", image: str = "nginx:1.25", replicas: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [
                        {"name": "main", "image": image, "ports": [{"containerPort": 8080, "name": "http"}]}
                    ]
                },
            },
        },
    }


def apply_cm(live: dict | None, config: dict, manager: str, *, force: bool = False, now: str = T1) -> dict:
    return apply(live, config, manager=manager, kind="ConfigMap", api_version="v1", force=force, now=now)


def entries(obj: dict) -> dict[tuple[str, str], dict[str, Any]]:
    return {(e["manager"], e["operation"]): e for e in obj["metadata"].get("managedFields", [])}


def owned(obj: dict, manager: str, operation: str = "Apply") -> set[str]:
    entry = entries(obj).get((manager, operation))
    return {path_string(p) for p in from_fields_v1(entry["fieldsV1"])} if entry else set()


# --------------------------------------------------------------------------- the e2e expectations


def test_server_side_apply_conflicts_between_managers() -> None:
    live = apply_cm(None, configmap(a="1"), "alice", now=T0)
    with pytest.raises(ApplyConflict) as raised:
        apply_cm(live, configmap(a="2"), "bob")
    assert str(raised.value) == 'Apply failed with 1 conflict: conflict with "alice": .data.a'
    assert raised.value.conflicts == [("alice", ".data.a")]
    assert raised.value.causes == [
        {"reason": "FieldManagerConflict", "message": 'conflict with "alice"', "field": ".data.a"}
    ]

    forced = apply_cm(live, configmap(a="2"), "bob", force=True)
    assert forced["data"] == {"a": "2"}
    # Force moves the field: alice owned nothing else, so her entry is gone.
    assert set(entries(forced)) == {("bob", "Apply")}
    assert owned(forced, "bob") == {".data.a"}


def test_server_side_apply_removes_fields_the_manager_dropped() -> None:
    live = apply_cm(None, configmap("shrink", a="1", b="2"), "kubectl", now=T0)
    assert owned(live, "kubectl") == {".data.a", ".data.b"}
    shrunk = apply_cm(live, configmap("shrink", a="1"), "kubectl")
    assert shrunk["data"] == {"a": "1"}
    assert owned(shrunk, "kubectl") == {".data.a"}


def test_writes_record_managed_fields() -> None:
    created = apply(
        None,
        deployment("py-owned"),
        manager="e2e-tests",
        kind="Deployment",
        api_version="apps/v1",
        force=False,
        now=T0,
    )
    assert created["metadata"]["managedFields"], "the apply response carries managedFields too"
    patched = copy.deepcopy(created)
    patched["metadata"]["labels"]["extra"] = "1"
    live = record_update(
        created,
        patched,
        manager="e2e-patcher",
        kind="Deployment",
        api_version="apps/v1",
        now=T1,
        ignore_status=True,
    )
    assert set(entries(live)) == {("e2e-tests", "Apply"), ("e2e-patcher", "Update")}
    assert owned(live, "e2e-patcher", "Update") == {".metadata.labels.extra"}
    update = entries(live)[("e2e-patcher", "Update")]
    assert update == {
        "manager": "e2e-patcher",
        "operation": "Update",
        "apiVersion": "apps/v1",
        "time": T1,
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:metadata": {"f:labels": {"f:extra": {}}}},
    }
    # Apply entries come first, as Kubernetes sorts them.
    assert [e["operation"] for e in live["metadata"]["managedFields"]] == ["Apply", "Update"]


# --------------------------------------------------------------------------- fieldsV1


def test_fields_v1_has_kubernetes_shape() -> None:
    fields = field_set(deployment(), "Deployment")
    assert to_fields_v1(fields - {("f:apiVersion",), ("f:kind",), ("f:metadata", "f:name")}) == {
        "f:metadata": {"f:labels": {"f:app": {}}},
        "f:spec": {
            "f:replicas": {},
            "f:selector": {},
            "f:template": {
                "f:metadata": {"f:labels": {"f:app": {}}},
                "f:spec": {
                    "f:containers": {
                        'k:{"name":"main"}': {
                            ".": {},
                            "f:image": {},
                            "f:name": {},
                            "f:ports": {
                                'k:{"containerPort":8080,"protocol":"TCP"}': {
                                    ".": {},
                                    "f:containerPort": {},
                                    "f:name": {},
                                }
                            },
                        }
                    }
                },
            },
        },
    }


def test_fields_v1_round_trip() -> None:
    fields_v1 = {
        "f:metadata": {
            "f:finalizers": {".": {}, 'v:"example.com/guard"': {}},
            "f:labels": {".": {}, "f:app": {}},
        },
        "f:spec": {
            "f:containers": {
                'k:{"name":"web"}': {
                    ".": {},
                    "f:env": {'k:{"name":"A"}': {".": {}, "f:name": {}, "f:value": {}}},
                    "f:image": {},
                    "f:name": {},
                }
            },
            "f:tolerations": {},
            "f:weird": {"i:0": {}},
        },
    }
    fields = from_fields_v1(fields_v1)
    assert ("f:metadata", "f:labels") in fields  # "." makes the map itself a member
    assert ("f:spec", "f:containers") not in fields
    assert to_fields_v1(fields) == fields_v1
    assert json.dumps(to_fields_v1(fields)) == json.dumps(fields_v1)  # order too
    assert from_fields_v1(to_fields_v1(fields)) == fields


def test_fields_v1_keys_are_normalized_and_validated() -> None:
    a = from_fields_v1({"f:ports": {'k:{"protocol":"TCP","containerPort":80}': {}}})
    b = from_fields_v1({"f:ports": {'k:{"containerPort":80.0, "protocol":"TCP"}': {}}})
    assert a == b == {("f:ports", 'k:{"containerPort":80,"protocol":"TCP"}')}
    for bad in ({"x:y": {}}, {"f:a": []}, {"f:a": {"k:[1]": {}}}, {"f:a": {"i:one": {}}}, []):
        with pytest.raises(ManagedFieldsError):
            from_fields_v1(bad)


def test_path_strings_match_kubernetes() -> None:
    assert path_string(("f:data", "f:a")) == ".data.a"
    assert (
        path_string(("f:spec", "f:containers", 'k:{"name":"web"}', "f:image"))
        == '.spec.containers[name="web"].image'
    )
    assert (
        path_string(("f:ports", 'k:{"containerPort":80,"protocol":"TCP"}'))
        == '.ports[containerPort=80,protocol="TCP"]'
    )
    assert path_string(("f:metadata", "f:finalizers", 'v:"a"')) == '.metadata.finalizers[="a"]'


# --------------------------------------------------------------------------- field sets


def test_containers_are_owned_by_name_and_atomic_lists_whole() -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "finalizers": ["a", "b"]},
        "spec": {
            "containers": [
                {"name": "web", "image": "nginx", "args": ["-v"], "env": [{"name": "X", "value": "1"}]},
                {"name": "side", "image": "busybox"},
            ],
            "tolerations": [{"key": "gpu", "operator": "Exists"}],
            "nodeSelector": {"gpu": "h100"},
        },
    }
    paths = {path_string(p) for p in field_set(pod, "Pod")}
    assert {
        '.spec.containers[name="web"]',
        '.spec.containers[name="web"].image',
        '.spec.containers[name="web"].args',
        '.spec.containers[name="web"].env[name="X"]',
        '.spec.containers[name="web"].env[name="X"].value',
        '.spec.containers[name="side"].image',
        ".spec.tolerations",
        ".spec.nodeSelector.gpu",
        '.metadata.finalizers[="a"]',
        '.metadata.finalizers[="b"]',
    } <= paths
    assert not any(
        p.startswith(".spec.tolerations[") or p.startswith('.spec.containers[name="web"].args[')
        for p in paths
    )
    # Kinds without a schema: objects are granular, lists atomic.
    custom = {"spec": {"replicas": {"worker": {"count": 2}}, "items": [{"a": 1}]}}
    assert field_set(custom, "PyTorchJob") == {
        ("f:spec", "f:replicas", "f:worker", "f:count"),
        ("f:spec", "f:items"),
    }


def test_apply_merges_containers_by_name_and_keeps_other_managers_items() -> None:
    live = apply(
        None, deployment(), manager="ci", kind="Deployment", api_version="apps/v1", force=False, now=T0
    )
    sidecar = copy.deepcopy(live)
    sidecar["spec"]["template"]["spec"]["containers"].append({"name": "proxy", "image": "envoy"})
    live = record_update(live, sidecar, manager="injector", kind="Deployment", api_version="apps/v1", now=T1)
    assert owned(live, "injector", "Update") == {
        '.spec.template.spec.containers[name="proxy"]',
        '.spec.template.spec.containers[name="proxy"].image',
        '.spec.template.spec.containers[name="proxy"].name',
    }
    # ci changes its image and drops the port: its container merges by name, the sidecar stays.
    config = deployment(image="nginx:1.27")
    del config["spec"]["template"]["spec"]["containers"][0]["ports"]
    out = apply(live, config, manager="ci", kind="Deployment", api_version="apps/v1", force=False, now=T2)
    containers = out["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["main", "proxy"]
    assert containers[0] == {"name": "main", "image": "nginx:1.27"}
    assert containers[1] == {"name": "proxy", "image": "envoy"}


def test_apply_config_dropping_a_container_removes_it() -> None:
    two = deployment()
    two["spec"]["template"]["spec"]["containers"].append({"name": "extra", "image": "busybox"})
    live = apply(None, two, manager="ci", kind="Deployment", api_version="apps/v1", force=False, now=T0)
    out = apply(
        live, deployment(), manager="ci", kind="Deployment", api_version="apps/v1", force=False, now=T1
    )
    assert [c["name"] for c in out["spec"]["template"]["spec"]["containers"]] == ["main"]


def test_apply_keeps_other_managers_items_in_place_and_follows_its_own_order() -> None:
    def pod(*names: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": n, "image": "i"} for n in names]},
        }

    live = apply(None, pod("a", "c"), manager="ci", kind="Pod", api_version="v1", force=False, now=T0)
    live = apply(live, pod("a", "b", "c"), manager="other", kind="Pod", api_version="v1", force=False, now=T1)
    assert [c["name"] for c in live["spec"]["containers"]] == ["a", "b", "c"]
    out = apply(live, pod("c", "a"), manager="ci", kind="Pod", api_version="v1", force=False, now=T2)
    assert [c["name"] for c in out["spec"]["containers"]] == ["b", "c", "a"]


# --------------------------------------------------------------------------- conflicts and sharing


def test_several_conflicts_are_grouped_by_manager() -> None:
    live = apply_cm(None, configmap(a="1", b="1"), "alice", now=T0)
    edited = copy.deepcopy(live)
    edited["data"]["c"] = "1"
    live = record_update(live, edited, manager="kubectl-edit", kind="ConfigMap", api_version="v1", now=T1)
    with pytest.raises(ApplyConflict) as raised:
        apply_cm(live, configmap(a="2", b="2", c="2"), "bob", now=T2)
    assert str(raised.value) == (
        'Apply failed with 3 conflicts: conflicts with "alice":\n- .data.a\n- .data.b\n'
        'conflicts with "kubectl-edit" using v1:\n- .data.c'
    )
    assert raised.value.conflicts == [("alice", ".data.a"), ("alice", ".data.b"), ("kubectl-edit", ".data.c")]
    assert raised.value.causes[2]["message"] == 'conflict with "kubectl-edit" using v1'

    with pytest.raises(ApplyConflict) as one:
        apply_cm(live, configmap(c="2"), "bob", now=T2)
    assert str(one.value) == 'Apply failed with 1 conflict: conflict with "kubectl-edit" using v1: .data.c'


def test_same_value_from_two_managers_is_shared_not_a_conflict() -> None:
    live = apply_cm(None, configmap(a="1", b="x"), "alice", now=T0)
    both = apply_cm(live, configmap(a="1"), "bob")
    assert owned(both, "alice") == {".data.a", ".data.b"}
    assert owned(both, "bob") == {".data.a"}
    # alice stops applying a: bob still owns it, so it stays (and b, hers alone, goes).
    after = apply_cm(both, configmap(), "alice", now=T2)
    assert after["data"] == {"a": "1"}
    assert set(entries(after)) == {("bob", "Apply")}
    # Now bob alone owns a and may change it freely.
    assert apply_cm(after, configmap(a="2"), "bob", now=T3)["data"] == {"a": "2"}


def test_force_transfers_only_the_conflicting_fields() -> None:
    live = apply_cm(None, configmap(a="1", b="1"), "alice", now=T0)
    forced = apply_cm(live, configmap(a="2"), "bob", force=True)
    assert forced["data"] == {"a": "2", "b": "1"}
    assert owned(forced, "alice") == {".data.b"}
    assert owned(forced, "bob") == {".data.a"}
    # alice re-applying her old value now conflicts with bob.
    with pytest.raises(ApplyConflict, match='conflict with "bob": .data.a'):
        apply_cm(forced, configmap(a="1", b="1"), "alice", now=T2)


def test_update_takes_changed_fields_from_appliers_without_conflict() -> None:
    live = apply_cm(None, configmap(a="1", b="1"), "alice", now=T0)
    edited = copy.deepcopy(live)
    edited["data"]["a"] = "9"
    out = record_update(live, edited, manager="kubectl-edit", kind="ConfigMap", api_version="v1", now=T1)
    assert owned(out, "alice") == {".data.b"}
    assert owned(out, "kubectl-edit", "Update") == {".data.a"}
    # A field removed by an update leaves every manager.
    removed = copy.deepcopy(out)
    del removed["data"]["b"]
    out2 = record_update(out, removed, manager="kubectl-edit", kind="ConfigMap", api_version="v1", now=T2)
    assert ("alice", "Apply") not in entries(out2)
    # Only removals: the editor's entry keeps its time.
    assert entries(out2)[("kubectl-edit", "Update")]["time"] == T1


def test_a_field_both_managers_applied_survives_either_dropping_it() -> None:
    live = apply_cm(None, configmap(a="1"), "alice", now=T0)
    live = apply_cm(live, configmap(a="1"), "bob")
    after = apply_cm(live, configmap(), "bob", now=T2)
    assert after["data"] == {"a": "1"}
    assert owned(after, "alice") == {".data.a"}
    assert ("bob", "Apply") not in entries(after)


# --------------------------------------------------------------------------- updates


def test_create_records_every_field_for_the_creator() -> None:
    body = deployment()
    body["metadata"].update(uid="u", resourceVersion="1", creationTimestamp=T0, namespace="default")
    out = record_update(
        None, body, manager="kubectl-create", kind="Deployment", api_version="apps/v1", now=T0
    )
    (entry,) = out["metadata"]["managedFields"]
    assert entry["manager"] == "kubectl-create" and entry["operation"] == "Update" and entry["time"] == T0
    fv1 = entry["fieldsV1"]
    # New maps and list items are owned themselves ("."); the struct fields that Kubernetes'
    # empty Deployment already has (metadata, spec, template) are not.
    assert fv1["f:metadata"] == {"f:labels": {".": {}, "f:app": {}}}
    assert "." not in fv1["f:spec"] and "." not in fv1["f:spec"]["f:template"]
    assert fv1["f:spec"]["f:selector"] == {}
    container = fv1["f:spec"]["f:template"]["f:spec"]["f:containers"]['k:{"name":"main"}']
    assert "." in container and "f:image" in container
    assert body["metadata"].get("managedFields") is None  # inputs are not mutated


def test_no_op_update_changes_nothing_and_time_moves_only_on_change() -> None:
    live = record_update(None, configmap(a="1"), manager="m", kind="ConfigMap", api_version="v1", now=T0)
    same = record_update(live, copy.deepcopy(live), manager="m", kind="ConfigMap", api_version="v1", now=T1)
    assert same == live
    other = record_update(
        live, copy.deepcopy(live), manager="other", kind="ConfigMap", api_version="v1", now=T1
    )
    assert set(entries(other)) == {("m", "Update")}
    changed = copy.deepcopy(live)
    changed["data"]["b"] = "2"
    out = record_update(live, changed, manager="m", kind="ConfigMap", api_version="v1", now=T2)
    (entry,) = out["metadata"]["managedFields"]
    assert entry["time"] == T2
    # One entry per manager, merged; creating `data` made the map itself the creator's.
    assert owned(out, "m", "Update") == {".data", ".data.a", ".data.b"}


def test_entries_are_kept_per_manager_operation_version_and_subresource() -> None:
    live = apply_cm(None, configmap(a="1"), "m", now=T0)
    changed = copy.deepcopy(live)
    changed["data"]["b"] = "2"
    out = record_update(live, changed, manager="m", kind="ConfigMap", api_version="v1", now=T1)
    status = copy.deepcopy(out)
    status["status"] = {"phase": "x"}
    out = record_update(
        out, status, manager="m", kind="ConfigMap", api_version="v1", now=T2, subresource="status"
    )
    got = [(e["manager"], e["operation"], e.get("subresource", "")) for e in out["metadata"]["managedFields"]]
    assert got == [("m", "Apply", ""), ("m", "Update", ""), ("m", "Update", "status")]


def test_reset_and_client_sent_managed_fields() -> None:
    live = apply_cm(None, configmap(a="1"), "alice", now=T0)
    for reset in ([], [{}]):
        sent = copy.deepcopy(live)
        sent["metadata"]["managedFields"] = reset
        out = record_update(live, sent, manager="m", kind="ConfigMap", api_version="v1", now=T1)
        assert "managedFields" not in out["metadata"]
    # Garbage from the client is ignored: the live entries stay.
    sent = copy.deepcopy(live)
    sent["metadata"]["managedFields"] = [{"manager": "x", "operation": "Delete"}]
    assert record_update(live, sent, manager="m", kind="ConfigMap", api_version="v1", now=T1) == live
    # Through a subresource the client's entries never count.
    sent["metadata"]["managedFields"] = []
    out = record_update(
        live, sent, manager="m", kind="ConfigMap", api_version="v1", now=T1, subresource="status"
    )
    assert out["metadata"]["managedFields"] == live["metadata"]["managedFields"]
    assert (
        is_reset([{"manager": ""}]) and not is_reset(None) and not is_reset(live["metadata"]["managedFields"])
    )


def test_what_an_update_keeps_of_client_sent_managed_fields() -> None:
    live = apply_cm(None, configmap(a="1"), "alice", now=T0)
    stored = live["metadata"]["managedFields"]
    assert accepted_managed_fields(None, live) == stored
    assert accepted_managed_fields([{}], live) == [] and accepted_managed_fields([], live) == []
    assert accepted_managed_fields([{}], live, subresource="status") == stored
    deep: dict[str, Any] = {}
    for _ in range(MAX_FIELD_PATH_DEPTH + 1):
        deep = {"f:a": deep}
    garbage = [
        {
            "manager": "x",
            "operation": "Update",
            "apiVersion": "v1",
            "fieldsType": "FieldsV1",
            "fieldsV1": deep,
        }
    ]
    assert accepted_managed_fields(garbage, live) == stored
    assert accepted_managed_fields(garbage, None) is None
    mine = [{**stored[0], "manager": "mine"}]
    assert accepted_managed_fields(mine, live) == mine  # Kubernetes lets clients rewrite them


def test_untracked_objects_stay_untracked_until_an_apply() -> None:
    old = configmap(a="1")
    new = configmap(a="2")
    assert (
        "managedFields"
        not in record_update(old, new, manager="m", kind="ConfigMap", api_version="v1", now=T1)["metadata"]
    )
    # The first apply finds someone else's fields: they belong to before-first-apply.
    with pytest.raises(ApplyConflict, match='conflict with "before-first-apply" using v1: .data.a'):
        apply_cm(old, configmap(a="3"), "alice")
    out = apply_cm(old, configmap(a="1", b="2"), "alice")
    assert owned(out, "before-first-apply", "Update") == {".data", ".data.a"}
    assert owned(out, "alice") == {".data.a", ".data.b"}


def test_update_ignores_status_where_the_endpoint_does() -> None:
    live = record_update(None, deployment(), manager="c", kind="Deployment", api_version="apps/v1", now=T0)
    new = copy.deepcopy(live)
    new["status"] = {"replicas": 1}
    new["spec"]["replicas"] = 3
    out = record_update(
        live, new, manager="scaler", kind="Deployment", api_version="apps/v1", now=T1, ignore_status=True
    )
    assert owned(out, "scaler", "Update") == {".spec.replicas"}
    out = record_update(
        live, new, manager="ctl", kind="Deployment", api_version="apps/v1", now=T1, subresource="status"
    )
    assert owned(out, "ctl", "Update") == {".status.replicas"}


def test_update_entries_are_capped() -> None:
    live = record_update(None, configmap(a="0"), manager="m0", kind="ConfigMap", api_version="v1", now=T0)
    for i in range(1, 12):
        new = copy.deepcopy(live)
        new["data"][f"k{i}"] = "x"
        live = record_update(
            live, new, manager=f"m{i}", kind="ConfigMap", api_version="v1", now=f"2024-05-01T10:00:{i:02d}Z"
        )
    managers = [e["manager"] for e in live["metadata"]["managedFields"]]
    assert len(managers) == 10 and "ancient-changes" in managers and "m0" not in managers
    assert owned(live, "ancient-changes", "Update") == {".data", ".data.a", ".data.k1", ".data.k2"}


# --------------------------------------------------------------------------- apply details


def test_no_op_apply_returns_live_unchanged() -> None:
    live = apply_cm(None, configmap(a="1"), "alice", now=T0)
    again = apply_cm(live, configmap(a="1"), "alice", now=T2)
    assert again == live and again is not live


def test_apply_refuses_managed_fields_and_other_versions() -> None:
    body = configmap(a="1")
    body["metadata"]["managedFields"] = []
    with pytest.raises(ManagedFieldsError, match="metadata.managedFields must be nil"):
        apply_cm(None, body, "m")
    with pytest.raises(ManagedFieldsError, match="Specified patch version: v2, expected: v1"):
        apply_cm(None, {**configmap(a="1"), "apiVersion": "v2"}, "m")


def test_null_in_config_removes_and_conflicts_like_a_value() -> None:
    live = apply_cm(None, configmap(a="1", b="1"), "alice", now=T0)
    with pytest.raises(ApplyConflict):
        apply(
            live,
            {**configmap(), "data": {"a": None}},
            manager="bob",
            kind="ConfigMap",
            api_version="v1",
            force=False,
            now=T1,
        )
    out = apply(
        live,
        {**configmap(), "data": {"a": None}},
        manager="bob",
        kind="ConfigMap",
        api_version="v1",
        force=True,
        now=T1,
    )
    assert out["data"] == {"b": "1"}


def test_kubectl_takes_over_client_side_apply_fields() -> None:
    last = json.dumps(configmap(a="1"))
    body = configmap(a="1")
    body["metadata"]["annotations"] = {LAST_APPLIED_ANNOTATION: last}
    live = record_update(
        None, body, manager="kubectl-client-side-apply", kind="ConfigMap", api_version="v1", now=T0
    )
    out = apply_cm(live, configmap(a="2"), "kubectl")
    assert out["data"] == {"a": "2"}
    assert owned(out, "kubectl") == {".data.a"}
    assert json.loads(out["metadata"]["annotations"][LAST_APPLIED_ANNOTATION]) == configmap(a="2")
    # Any other manager still conflicts.
    with pytest.raises(ApplyConflict, match="kubectl-client-side-apply"):
        apply_cm(live, configmap(a="2"), "bob")


def test_apply_through_status_owns_status_only() -> None:
    live = record_update(None, deployment(), manager="c", kind="Deployment", api_version="apps/v1", now=T0)
    config = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "status": {"replicas": 2},
    }
    out = apply(
        live,
        config,
        manager="ctl",
        kind="Deployment",
        api_version="apps/v1",
        force=False,
        now=T1,
        subresource="status",
    )
    (entry,) = [e for e in out["metadata"]["managedFields"] if e["manager"] == "ctl"]
    assert entry["subresource"] == "status" and entry["fieldsV1"] == {"f:status": {"f:replicas": {}}}


# --------------------------------------------------------------------------- manager names and the model


@pytest.mark.parametrize(
    ("agent", "manager"),
    [
        ("kubectl/v1.32.0 (linux/amd64) kubernetes/70d3cc9", "kubectl"),
        ("OpenAPI-Generator/31.0.0/python", "OpenAPI-Generator"),
        ("python-requests/2.32.3", "python-requests"),
        ("", ""),
        (None, ""),
        ("bad\x07agent/1", "badagent"),
        ("x" * 200, "x" * 128),
    ],
)
def test_manager_from_user_agent(agent: str | None, manager: str) -> None:
    assert manager_from_user_agent(agent) == manager


def test_field_manager_errors() -> None:
    assert field_manager_errors("kubectl", apply=True) == []
    assert field_manager_errors("", apply=False) == []
    assert field_manager_errors("", apply=True)[0]["message"] == "Required value: is required for apply patch"
    assert field_manager_errors("y" * 129, apply=False)[0]["reason"] == "FieldValueTooLong"
    assert (
        "invalid character U+0007 (at position 1)" in field_manager_errors("a\x07", apply=False)[0]["message"]
    )


def test_generated_model_keeps_fields_v1() -> None:
    obj = apply_cm(None, configmap(a="1"), "alice", now=T0)
    meta = ObjectMeta.model_validate(obj["metadata"]).to_dict()
    assert meta["managedFields"][0]["fieldsV1"] == {"f:data": {"f:a": {}}}
    assert meta["managedFields"][0]["time"] == T0
    assert (
        ConfigMap.model_validate(obj).to_dict()["metadata"]["managedFields"]
        == obj["metadata"]["managedFields"]
    )


# --------------------------------------------------------------------------- properties

_names = st.text(alphabet="abcdefgh", min_size=1, max_size=3)
_scalars = st.one_of(st.text(max_size=4), st.integers(-5, 5), st.booleans())
_containers = st.lists(
    st.fixed_dictionaries(
        {"name": _names, "image": _scalars},
        optional={"args": st.lists(_scalars, max_size=2), "env": st.just([{"name": "A", "value": "1"}])},
    ),
    # An empty list owns nothing, so applying [] removes the list rather than emptying it.
    min_size=1,
    max_size=3,
    unique_by=lambda c: c["name"],
)


def _pod(data: st.DataObject) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "labels": data.draw(st.dictionaries(_names, st.text(max_size=3), max_size=3)),
        },
        "spec": {
            "containers": data.draw(_containers),
            "nodeSelector": data.draw(st.dictionaries(_names, _names)),
        },
    }


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_one_manager_converges_on_its_latest_configuration(data: st.DataObject) -> None:
    first, second = _pod(data), _pod(data)
    live = apply(None, first, manager="m", kind="Pod", api_version="v1", force=False, now=T0)
    out = apply(live, second, manager="m", kind="Pod", api_version="v1", force=False, now=T1)
    without = {k: v for k, v in out.items() if k != "metadata"}
    assert without == {k: v for k, v in second.items() if k != "metadata"}
    assert out["metadata"].get("labels", {}) == second["metadata"]["labels"]
    assert apply(out, second, manager="m", kind="Pod", api_version="v1", force=False, now=T2) == out
    fields = field_set(out, "Pod")
    assert from_fields_v1(to_fields_v1(fields)) == fields
