import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpufleet.apiserver.patch as patch_module
from gpufleet.apiserver.patch import (
    APPLY_PATCH,
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_MERGE_PATCH,
    PatchError,
    UnsupportedPatchType,
    apply_patch,
    create_merge_patch,
    json_merge_patch,
    json_patch,
    strategic_merge_patch,
    supports_strategic_merge,
)

NGINX_PORTS = [{"containerPort": 80, "protocol": "TCP"}]


def deployment(*containers, **extra_meta):
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "web",
            "namespace": "default",
            "labels": {"app": "web", "tier": "fe"},
            **extra_meta,
        },
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": list(containers) or [nginx()]},
            },
        },
    }


def nginx(image="nginx:1.25", **extra):
    return {"name": "nginx", "image": image, "ports": copy.deepcopy(NGINX_PORTS), **extra}


def containers_of(obj):
    return obj["spec"]["template"]["spec"]["containers"]


def smp(target, patch, kind="Deployment"):
    before_target, before_patch = copy.deepcopy(target), copy.deepcopy(patch)
    result = strategic_merge_patch(target, patch, kind)
    assert target == before_target and patch == before_patch, "inputs must not be mutated"
    return result


# --------------------------------------------------------------------------- strategic merge


def test_kubectl_second_apply_keeps_container_ports():
    # The exact body of kubectl-protocol.md section 3: a changed image on the second apply.
    live = deployment()
    body = {
        "metadata": {
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": '{"kind":"Deployment"}'}
        },
        "spec": {
            "minReadySeconds": 1,
            "template": {
                "spec": {
                    "$setElementOrder/containers": [{"name": "nginx"}],
                    "containers": [{"image": "nginx:1.26", "name": "nginx"}],
                }
            },
        },
    }
    result = apply_patch(live, json.dumps(body).encode(), STRATEGIC_MERGE_PATCH, "Deployment")
    assert containers_of(result) == [nginx("nginx:1.26")]
    assert result["spec"]["minReadySeconds"] == 1
    assert result["spec"]["replicas"] == 2
    assert result["metadata"]["annotations"] == body["metadata"]["annotations"]
    assert result["metadata"]["labels"] == {"app": "web", "tier": "fe"}
    assert "$setElementOrder/containers" not in json.dumps(result)


def test_merge_patch_replaces_containers_but_strategic_merges():
    live = deployment()
    patch = {"spec": {"template": {"spec": {"containers": [{"name": "nginx", "image": "nginx:1.26"}]}}}}
    merged = json_merge_patch(live, patch)
    assert containers_of(merged) == [{"name": "nginx", "image": "nginx:1.26"}]  # ports are lost
    strategic = smp(live, patch)
    assert containers_of(strategic) == [nginx("nginx:1.26")]


def test_add_container_without_order_goes_first_like_kubernetes():
    live = deployment()
    sidecar = {"name": "log-tailer", "image": "tailer:1"}
    result = smp(live, {"spec": {"template": {"spec": {"containers": [sidecar]}}}})
    assert [c["name"] for c in containers_of(result)] == ["log-tailer", "nginx"]
    assert containers_of(result)[1] == nginx()


def test_add_container_with_set_element_order():
    live = deployment()
    patch = {
        "spec": {
            "template": {
                "spec": {
                    "$setElementOrder/containers": [{"name": "nginx"}, {"name": "log-tailer"}],
                    "containers": [{"name": "log-tailer", "image": "tailer:1"}],
                }
            }
        }
    }
    result = smp(live, patch)
    assert containers_of(result) == [nginx(), {"name": "log-tailer", "image": "tailer:1"}]


def test_set_element_order_alone_reorders():
    live = deployment(nginx(), {"name": "b", "image": "b"}, {"name": "c", "image": "c"})
    order = [{"name": "c"}, {"name": "nginx"}, {"name": "b"}]
    result = smp(live, {"spec": {"template": {"spec": {"$setElementOrder/containers": order}}}})
    assert [c["name"] for c in containers_of(result)] == ["c", "nginx", "b"]


def test_delete_container_with_patch_delete():
    live = deployment(nginx(), {"name": "sidecar", "image": "s"})
    patch = {
        "spec": {
            "template": {
                "spec": {
                    "$setElementOrder/containers": [{"name": "nginx"}],
                    "containers": [{"$patch": "delete", "name": "sidecar"}],
                }
            }
        }
    }
    result = smp(live, patch)
    assert containers_of(result) == [nginx()]


def test_delete_item_without_merge_key_is_an_error():
    with pytest.raises(PatchError, match="merge key 'name'"):
        smp(deployment(), {"spec": {"template": {"spec": {"containers": [{"$patch": "delete"}]}}}})


def test_patch_item_without_merge_key_is_an_error():
    with pytest.raises(PatchError, match="merge key 'name'"):
        smp(deployment(), {"spec": {"template": {"spec": {"containers": [{"image": "x"}]}}}})


def test_replace_whole_list():
    live = deployment(nginx(), {"name": "sidecar", "image": "s"})
    patch = {
        "spec": {
            "template": {"spec": {"containers": [{"name": "only", "image": "o"}, {"$patch": "replace"}]}}
        }
    }
    assert containers_of(smp(live, patch)) == [{"name": "only", "image": "o"}]


def test_env_merges_by_name():
    live = deployment(nginx(env=[{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]))
    patch = {
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "nginx",
                            "$setElementOrder/env": [{"name": "A"}, {"name": "B"}, {"name": "C"}],
                            "env": [{"name": "B", "value": "20"}, {"name": "C", "value": "3"}],
                        }
                    ]
                }
            }
        }
    }
    env = containers_of(smp(live, patch))[0]["env"]
    assert env == [{"name": "A", "value": "1"}, {"name": "B", "value": "20"}, {"name": "C", "value": "3"}]


def test_env_entry_value_from_replaced_by_null():
    live = deployment(nginx(env=[{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]))
    patch = {
        "spec": {
            "template": {
                "spec": {
                    "containers": [{"name": "nginx", "env": [{"name": "A", "value": "x", "valueFrom": None}]}]
                }
            }
        }
    }
    assert containers_of(smp(live, patch))[0]["env"] == [{"name": "A", "value": "x"}]


def test_container_ports_merge_by_container_port():
    live = deployment()
    patch = {
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "nginx",
                            "ports": [{"containerPort": 80, "name": "http"}, {"containerPort": 443}],
                        }
                    ]
                }
            }
        }
    }
    ports = containers_of(smp(live, patch))[0]["ports"]
    assert ports == [{"containerPort": 80, "protocol": "TCP", "name": "http"}, {"containerPort": 443}]


def test_null_deletes_a_label():
    live = deployment()
    result = smp(live, {"metadata": {"labels": {"tier": None, "new": "x"}}})
    assert result["metadata"]["labels"] == {"app": "web", "new": "x"}
    # Deleting what is not there is fine, and nulls inside new values are dropped.
    result = smp(live, {"metadata": {"annotations": {"gone": None, "a": "b"}}, "spec": {"paused": None}})
    assert result["metadata"]["annotations"] == {"a": "b"}
    assert "paused" not in result["spec"]


def test_retain_keys_switches_deployment_strategy():
    live = deployment()
    live["spec"]["strategy"] = {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"},
    }
    patch = {"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate", "rollingUpdate": None}}}
    assert smp(live, patch)["spec"]["strategy"] == {"type": "Recreate"}


def test_retain_keys_on_volume_source():
    live = {"spec": {"volumes": [{"name": "data", "emptyDir": {}}]}}
    patch = {
        "spec": {
            "volumes": [{"name": "data", "$retainKeys": ["name", "hostPath"], "hostPath": {"path": "/d"}}]
        }
    }
    assert smp(live, patch, "Pod")["spec"]["volumes"] == [{"name": "data", "hostPath": {"path": "/d"}}]


def test_retain_keys_must_list_the_keys_the_patch_sets():
    live = deployment()
    with pytest.raises(PatchError, match="retainKeys"):
        smp(live, {"spec": {"strategy": {"$retainKeys": ["type"], "rollingUpdate": {"maxSurge": 1}}}})
    with pytest.raises(PatchError, match="retainKeys"):
        smp(live, {"spec": {"strategy": {"$retainKeys": "type"}}})


def test_finalizers_merge_as_a_set_and_delete_from_primitive_list():
    live = deployment(finalizers=["a.example.com/keep", "b.example.com/cleanup"])
    added = smp(live, {"metadata": {"finalizers": ["b.example.com/cleanup", "c.example.com/new"]}})
    # A union without duplicates; the new value follows the one the patch lists before it.
    assert added["metadata"]["finalizers"] == [
        "a.example.com/keep",
        "b.example.com/cleanup",
        "c.example.com/new",
    ]
    removed = smp(live, {"metadata": {"$deleteFromPrimitiveList/finalizers": ["b.example.com/cleanup"]}})
    assert removed["metadata"]["finalizers"] == ["a.example.com/keep"]
    # What kubectl apply sends when the manifest drops one finalizer and adds another.
    both = smp(
        live,
        {
            "metadata": {
                "$setElementOrder/finalizers": ["c.example.com/new", "a.example.com/keep"],
                "$deleteFromPrimitiveList/finalizers": ["b.example.com/cleanup"],
                "finalizers": ["c.example.com/new"],
            }
        },
    )
    assert both["metadata"]["finalizers"] == ["c.example.com/new", "a.example.com/keep"]
    # An empty list in a merge patch of a merging list changes nothing, as in Kubernetes...
    assert (
        smp(live, {"metadata": {"finalizers": []}})["metadata"]["finalizers"]
        == live["metadata"]["finalizers"]
    )
    # ...null removes the field.
    assert "finalizers" not in smp(live, {"metadata": {"finalizers": None}})["metadata"]


def test_finalizer_order_without_set_element_order():
    live = deployment(finalizers=["a", "b"])
    assert smp(live, {"metadata": {"finalizers": ["c"]}})["metadata"]["finalizers"] == ["c", "a", "b"]


def test_owner_references_merge_by_uid():
    live = deployment(ownerReferences=[{"uid": "1", "kind": "X", "name": "x"}])
    result = smp(
        live,
        {
            "metadata": {
                "ownerReferences": [{"uid": "1", "controller": True}, {"uid": "2", "kind": "Y", "name": "y"}]
            }
        },
    )
    assert result["metadata"]["ownerReferences"] == [
        {"uid": "1", "kind": "X", "name": "x", "controller": True},
        {"uid": "2", "kind": "Y", "name": "y"},
    ]


def test_status_conditions_merge_by_type():
    live = {
        "status": {
            "conditions": [{"type": "Available", "status": "True"}, {"type": "Progressing", "status": "True"}]
        }
    }
    patch = {"status": {"conditions": [{"type": "Progressing", "status": "False", "reason": "Stuck"}]}}
    for kind in ("Deployment", "ReplicaSet", "Job", "Pod", "Node", "HorizontalPodAutoscaler"):
        conditions = smp(live, patch, kind)["status"]["conditions"]
        assert conditions == [
            {"type": "Available", "status": "True"},
            {"type": "Progressing", "status": "False", "reason": "Stuck"},
        ], kind


def test_node_addresses_merge_by_type_but_taints_replace():
    live = {
        "spec": {"taints": [{"key": "a", "effect": "NoSchedule"}], "podCIDRs": ["10.0.0.0/24"]},
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": "10.0.0.1"},
                {"type": "Hostname", "address": "n1"},
            ]
        },
    }
    patch = {
        "spec": {"taints": [{"key": "b", "effect": "NoExecute"}], "podCIDRs": ["fd00::/64"]},
        "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.2"}]},
    }
    result = smp(live, patch, "Node")
    assert result["spec"]["taints"] == [{"key": "b", "effect": "NoExecute"}]
    assert result["spec"]["podCIDRs"] == ["fd00::/64", "10.0.0.0/24"]
    assert result["status"]["addresses"] == [
        {"type": "InternalIP", "address": "10.0.0.2"},
        {"type": "Hostname", "address": "n1"},
    ]


def test_tolerations_are_atomic():
    live = {"spec": {"tolerations": [{"key": "a", "operator": "Exists"}], "containers": [nginx()]}}
    result = smp(live, {"spec": {"tolerations": [{"key": "b", "operator": "Exists"}]}}, "Pod")
    assert result["spec"]["tolerations"] == [{"key": "b", "operator": "Exists"}]


def test_service_ports_merge_by_port_not_container_port():
    live = {"spec": {"ports": [{"port": 80, "targetPort": 8080}, {"port": 443, "targetPort": 8443}]}}
    result = smp(live, {"spec": {"ports": [{"port": 80, "targetPort": 9090}]}}, "Service")
    assert result["spec"]["ports"] == [{"port": 80, "targetPort": 9090}, {"port": 443, "targetPort": 8443}]


def test_pod_spec_containers_and_volumes():
    live = {
        "spec": {
            "containers": [nginx(volumeMounts=[{"mountPath": "/a", "name": "a"}])],
            "volumes": [{"name": "a", "emptyDir": {}}],
        }
    }
    patch = {
        "spec": {
            "containers": [{"name": "nginx", "volumeMounts": [{"mountPath": "/b", "name": "b"}]}],
            "volumes": [{"name": "b", "emptyDir": {}}],
        }
    }
    result = smp(live, patch, "Pod")
    assert result["spec"]["containers"][0]["volumeMounts"] == [
        {"mountPath": "/b", "name": "b"},
        {"mountPath": "/a", "name": "a"},
    ]
    assert [v["name"] for v in result["spec"]["volumes"]] == ["b", "a"]
    assert result["spec"]["containers"][0]["ports"] == NGINX_PORTS


@pytest.mark.parametrize("kind", ["Job", "ReplicaSet", "StatefulSet", "DaemonSet"])
def test_template_containers_merge_for_every_workload(kind):
    patch = {"spec": {"template": {"spec": {"containers": [{"name": "nginx", "image": "nginx:2"}]}}}}
    assert containers_of(smp(deployment(), patch, kind)) == [nginx("nginx:2")]


def test_cronjob_job_template():
    live = {"spec": {"jobTemplate": {"spec": {"template": {"spec": {"containers": [nginx()]}}}}}}
    patch = {
        "spec": {
            "jobTemplate": {"spec": {"template": {"spec": {"containers": [{"name": "nginx", "image": "x"}]}}}}
        }
    }
    result = smp(live, patch, "CronJob")
    assert result["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"] == [nginx("x")]


def test_map_directives():
    live = deployment()
    replaced = smp(live, {"spec": {"selector": {"$patch": "replace", "matchLabels": {"x": "y"}}}})
    assert replaced["spec"]["selector"] == {"matchLabels": {"x": "y"}}
    deleted = smp(live, {"spec": {"template": {"metadata": {"$patch": "delete"}}}})
    assert deleted["spec"]["template"]["metadata"] == {}
    merged = smp(live, {"metadata": {"$patch": "merge", "labels": {"x": "y"}}})
    assert merged["metadata"]["labels"] == {"app": "web", "tier": "fe", "x": "y"}
    with pytest.raises(PatchError, match="unknown \\$patch directive"):
        smp(live, {"metadata": {"$patch": "explode"}})
    with pytest.raises(PatchError, match="unknown \\$patch directive"):
        smp(live, {"spec": {"template": {"spec": {"containers": [{"name": "nginx", "$patch": "explode"}]}}}})


def test_directives_in_new_values_are_processed_not_stored():
    live = {"metadata": {"name": "p"}}
    patch = {
        "spec": {
            "$setElementOrder/containers": [{"name": "a"}],
            "containers": [
                {
                    "name": "a",
                    "image": "a",
                    "env": [{"name": "X", "value": "1"}, {"name": "Y", "$patch": "delete"}],
                }
            ],
        }
    }
    result = smp(live, patch, "Pod")
    assert result["spec"] == {
        "containers": [{"name": "a", "image": "a", "env": [{"name": "X", "value": "1"}]}]
    }


def test_unknown_kind_falls_back_to_merge_patch():
    live = {"spec": {"replicaSpecs": {"Worker": {"template": {"spec": {"containers": [nginx()]}}}}}}
    patch = {
        "spec": {
            "replicaSpecs": {
                "Worker": {"template": {"spec": {"containers": [{"name": "nginx", "image": "x"}]}}}
            }
        }
    }
    assert not supports_strategic_merge("PyTorchJob")
    assert supports_strategic_merge("Deployment")
    result = smp(live, patch, "PyTorchJob")
    assert result == json_merge_patch(live, patch)
    assert result["spec"]["replicaSpecs"]["Worker"]["template"]["spec"]["containers"] == [
        {"name": "nginx", "image": "x"}
    ]


def test_strategic_rejects_non_objects():
    with pytest.raises(PatchError):
        strategic_merge_patch({}, [], "Pod")  # type: ignore[arg-type]
    with pytest.raises(PatchError):
        strategic_merge_patch([], {}, "Pod")  # type: ignore[arg-type]
    with pytest.raises(PatchError, match="list items must be objects"):
        smp(deployment(), {"spec": {"template": {"spec": {"containers": ["nginx"]}}}})
    with pytest.raises(PatchError, match="set of scalars"):
        smp(deployment(), {"metadata": {"finalizers": [{"a": 1}]}})


def test_result_shares_nothing_with_inputs():
    live = deployment()
    patch = {
        "metadata": {"labels": {"new": "x"}},
        "spec": {"template": {"spec": {"tolerations": [{"key": "a"}]}}},
    }
    result = smp(live, patch)
    result["spec"]["template"]["spec"]["tolerations"][0]["key"] = "changed"
    result["spec"]["selector"]["matchLabels"]["app"] = "changed"
    assert patch["spec"]["template"]["spec"]["tolerations"][0]["key"] == "a"
    assert live["spec"]["selector"]["matchLabels"]["app"] == "web"


def test_strategic_is_deterministic():
    live = deployment(nginx(), {"name": "b", "image": "b"}, finalizers=["x", "y"])
    patch = {
        "metadata": {"finalizers": ["z"], "$deleteFromPrimitiveList/finalizers": ["x"]},
        "spec": {
            "template": {
                "spec": {"containers": [{"name": "c", "image": "c"}, {"name": "b", "$patch": "delete"}]}
            }
        },
    }
    first = smp(live, patch)
    assert all(smp(live, patch) == first for _ in range(3))
    assert first["metadata"]["finalizers"] == ["z", "y"]
    assert [c["name"] for c in containers_of(first)] == ["c", "nginx"]


# --------------------------------------------------------------------------- JSON merge patch


def test_json_merge_patch_rfc7386_examples():
    # A selection of the test cases of RFC 7386, appendix A.
    cases = [
        ({"a": "b"}, {"a": "c"}, {"a": "c"}),
        ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
        ({"a": "b"}, {"a": None}, {}),
        ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
        ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
        ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
        ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
        ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
        (["a", "b"], ["c", "d"], ["c", "d"]),
        ({"a": "b"}, ["c"], ["c"]),
        ({"a": "foo"}, None, None),
        ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
        ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
        ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
    ]
    for target, patch, expected in cases:
        assert json_merge_patch(target, patch) == expected


# --------------------------------------------------------------------------- JSON patch


def test_json_patch_operations():
    live = deployment()
    ops = [
        {"op": "test", "path": "/spec/replicas", "value": 2},
        {"op": "replace", "path": "/spec/replicas", "value": 3},
        {"op": "add", "path": "/metadata/labels/new", "value": "x"},
        {"op": "remove", "path": "/metadata/labels/tier"},
        {"op": "copy", "from": "/metadata/labels/app", "path": "/metadata/labels/copied"},
        {"op": "move", "from": "/metadata/labels/new", "path": "/metadata/labels/moved"},
        {"op": "add", "path": "/spec/template/spec/containers/-", "value": {"name": "b", "image": "b"}},
    ]
    before = copy.deepcopy(ops)
    result = json_patch(live, ops)
    assert result["spec"]["replicas"] == 3
    assert result["metadata"]["labels"] == {"app": "web", "copied": "web", "moved": "x"}
    assert [c["name"] for c in containers_of(result)] == ["nginx", "b"]
    assert live == deployment() and ops == before
    result["spec"]["template"]["spec"]["containers"][1]["name"] = "changed"
    assert ops[-1]["value"]["name"] == "b"


def test_json_patch_replace_of_a_missing_key_sets_it_as_kubernetes_does():
    # evanphx/json-patch v4, which the Kubernetes API server applies JSON patches with: a
    # replace of a key the object lacks sets it (Ray's autoscaler relies on it); a missing
    # parent or list index is still an error.
    result = json_patch(deployment(), [{"op": "replace", "path": "/spec/paused", "value": True}])
    assert result["spec"]["paused"] is True
    with pytest.raises(PatchError, match="operation 0"):
        json_patch(deployment(), [{"op": "replace", "path": "/spec/template/spec/containers/5", "value": {}}])


@pytest.mark.parametrize(
    ("ops", "fragment"),
    [
        (
            [{"op": "test", "path": "/spec/replicas", "value": 5}],
            "operation 0 ('test' at '/spec/replicas') failed",
        ),
        ([{"op": "replace", "path": "/spec/nope/deeper", "value": 1}], "operation 0"),
        ([{"op": "remove", "path": "/metadata/labels/missing"}], "operation 0"),
        (
            [{"op": "add", "path": "/spec/replicas", "value": 1}, {"op": "frobnicate", "path": "/a"}],
            "operation 1",
        ),
        ([{"path": "/a"}], "operation 0"),
        ([{"op": "add", "value": 1}], "operation 0"),
        ([{"op": "move", "path": "/a"}], "operation 0"),
        (["add"], "operation 0 must be an object"),
        ({"op": "add"}, "must be a list"),
    ],
)
def test_json_patch_errors(ops, fragment):
    with pytest.raises(PatchError) as info:
        json_patch(deployment(), ops)
    assert fragment in str(info.value)


def test_json_patch_too_many_operations():
    with pytest.raises(PatchError, match="at most 10000"):
        json_patch({}, [{"op": "add", "path": "/a", "value": 1}] * 10_001)


# --------------------------------------------------------------------------- apply_patch dispatch


def test_apply_patch_dispatch():
    live = deployment()
    merge = apply_patch(
        live, b'{"spec":{"replicas":5}}', "application/merge-patch+json; charset=utf-8", "Deployment"
    )
    assert merge["spec"]["replicas"] == 5
    jp = apply_patch(live, b'[{"op":"replace","path":"/spec/replicas","value":4}]', JSON_PATCH, "Deployment")
    assert jp["spec"]["replicas"] == 4
    label = apply_patch(live, '{"metadata":{"labels":{"app":null}}}', MERGE_PATCH, "Deployment")
    assert label["metadata"]["labels"] == {"tier": "fe"}


def test_server_side_apply_yaml_and_json_bodies():
    body = b"""
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  annotations:
    built: 2024-01-01
spec:
  template:
    spec:
      containers:
      - name: nginx
        image: nginx:1.27
"""
    live = deployment()
    result = apply_patch(live, body, APPLY_PATCH, "Deployment")
    assert containers_of(result) == [nginx("nginx:1.27")]
    assert result["metadata"]["annotations"] == {"built": "2024-01-01"}  # a string, not a date
    assert result["spec"]["replicas"] == 2  # not owned by the config, kept
    created = apply_patch(
        {}, json.dumps({"kind": "Pod", "metadata": {"name": "p"}}).encode(), APPLY_PATCH, "Pod"
    )
    assert created == {"kind": "Pod", "metadata": {"name": "p"}}


@pytest.mark.parametrize(
    ("body", "content_type", "status"),
    [
        (b"{not json", MERGE_PATCH, 400),
        (b"[1, 2]", MERGE_PATCH, 400),
        (b'"text"', STRATEGIC_MERGE_PATCH, 400),
        (b"null", STRATEGIC_MERGE_PATCH, 400),
        (b"", MERGE_PATCH, 400),
        (b"\xff\xfe", MERGE_PATCH, 400),
        (b'{"a": NaN}', MERGE_PATCH, 400),
        (b'{"a": 1e999}', MERGE_PATCH, 400),
        (b'{"a": Infinity}', STRATEGIC_MERGE_PATCH, 400),
        (b'{"a": 1}', JSON_PATCH, 400),
        (b'[{"op": "test", "path": "/spec/replicas", "value": 9}]', JSON_PATCH, 422),
        (b'[{"op": "remove", "path": ""}]', JSON_PATCH, 422),
        (b"- a\n- b", APPLY_PATCH, 400),
        (b"a: [", APPLY_PATCH, 400),
        (b"a: !!python/object:os.system x", APPLY_PATCH, 400),
        (b"a: .nan", APPLY_PATCH, 400),
        (b"a: !!binary aGVsbG8=", APPLY_PATCH, 400),
        (b"---\na: 1\n---\nb: 2", APPLY_PATCH, 400),
        (b'{"spec": {"template": {"spec": {"containers": [{"image": "x"}]}}}}', STRATEGIC_MERGE_PATCH, 422),
        (b"[" * 100_000 + b"]" * 100_000, MERGE_PATCH, 400),
    ],
)
def test_apply_patch_errors(body, content_type, status):
    with pytest.raises(PatchError) as info:
        apply_patch(deployment(), body, content_type, "Deployment")
    assert info.value.status_code == status


def test_apply_patch_billion_laughs_is_bounded(monkeypatch):
    monkeypatch.setattr(patch_module, "MAX_YAML_NODES", 10_000)
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    with pytest.raises(PatchError, match="expands"):
        apply_patch({}, "\n".join(lines).encode(), APPLY_PATCH, "Pod")


def test_apply_patch_unsupported_type():
    for content_type in ("application/json", "text/plain", "", None):
        with pytest.raises(UnsupportedPatchType) as info:
            apply_patch({}, b"{}", content_type, "Pod")  # type: ignore[arg-type]
        assert info.value.status_code == 415


# --------------------------------------------------------------------------- properties

_scalars = st.one_of(
    st.booleans(),
    st.integers(-1000, 1000),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=5),
)
_keys = st.text(alphabet="abcxyz", min_size=1, max_size=3)
# Objects without null values (RFC 7386 cannot express "set to null"); lists may hold anything.
_json_objects = st.recursive(
    st.dictionaries(_keys, _scalars, max_size=4),
    lambda children: st.dictionaries(
        _keys,
        st.one_of(_scalars, children, st.lists(st.one_of(_scalars, st.none(), children), max_size=3)),
        max_size=4,
    ),
    max_leaves=20,
)


@given(_json_objects, _json_objects)
def test_merge_patch_of_a_diff_turns_one_object_into_the_other(original, modified):
    before = copy.deepcopy(original)
    patch = create_merge_patch(original, modified)
    assert json_merge_patch(original, patch) == modified
    assert original == before
    assert create_merge_patch(modified, modified) == {}


@given(_json_objects, _json_objects)
def test_strategic_equals_merge_patch_when_no_list_merges(original, patch):
    # Without merge-keyed lists or directives, a strategic merge patch is a JSON merge patch.
    assert strategic_merge_patch(original, patch, "ConfigMap") == json_merge_patch(original, patch)


_smp_keys = st.sampled_from(
    [
        "metadata", "spec", "template", "containers", "name", "image", "ports", "containerPort", "env",
        "value", "finalizers", "labels", "conditions", "type", "$patch", "$retainKeys",
        "$setElementOrder/containers", "$setElementOrder/env", "$setElementOrder/finalizers",
        "$deleteFromPrimitiveList/finalizers", "$setElementOrder/", "$deleteFromPrimitiveList/", "status",
    ]
)  # fmt: skip
_smp_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from(["a", "b", "replace", "delete", "merge", "nginx"]),
)
_smp_values = st.recursive(
    _smp_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(_smp_keys, children, max_size=5)
    ),
    max_leaves=25,
)
_smp_objects = st.dictionaries(_smp_keys, _smp_values, max_size=5)


@settings(max_examples=100)
@given(_smp_objects, _smp_objects, st.sampled_from(["Pod", "Deployment", "Node", "Service", "PyTorchJob"]))
def test_strategic_patch_raises_only_patch_error_and_never_mutates(target, patch, kind):
    before_target, before_patch = copy.deepcopy(target), copy.deepcopy(patch)
    try:
        first = strategic_merge_patch(target, patch, kind)
    except PatchError:
        first = None
    assert target == before_target and patch == before_patch
    if first is not None:
        assert strategic_merge_patch(target, patch, kind) == first


_json_patch_ops = st.lists(
    st.fixed_dictionaries(
        {"op": st.sampled_from(["add", "remove", "replace", "move", "copy", "test", "x"])},
        optional={
            "path": st.sampled_from(["", "/", "/spec", "/spec/containers/0", "/a/-", "/~2", 5]),
            "from": st.sampled_from(["", "/spec", "/metadata", "/x"]),
            "value": _smp_values,
        },
    ),
    max_size=4,
)
_bodies = st.one_of(
    st.binary(max_size=40),
    _smp_values.map(lambda v: json.dumps(v).encode()),
    _json_patch_ops.map(lambda v: json.dumps(v).encode()),
    st.text(alphabet=":-[]{}&*!|>'\"% \nab1", max_size=30).map(str.encode),
)
_content_types = st.sampled_from(
    [JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH, APPLY_PATCH, "application/json"]
)


@settings(max_examples=100)
@given(_smp_objects, _bodies, _content_types, st.sampled_from(["Pod", "Deployment", "PyTorchJob"]))
def test_apply_patch_raises_only_patch_error(target, body, content_type, kind):
    before = copy.deepcopy(target)
    try:
        result = apply_patch(target, body, content_type, kind)
    except PatchError:
        pass
    else:
        assert isinstance(result, dict)
    assert target == before


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=4),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=4),
    max_leaves=20)


@settings(max_examples=200)
@given(value=_JSON)
def test_copy_json_is_an_equal_deep_copy_that_shares_nothing(value):
    from gpufleet.apiserver.patch.common import copy_json

    def same(a, b):  # equality that tells NaN, -0.0, int from float and True from 1
        if isinstance(a, dict):
            return type(b) is dict and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if isinstance(a, list):
            return type(b) is list and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
        if isinstance(a, float):
            return type(b) is float and (a == b or (a != a and b != b)) and str(a) == str(b)
        return type(a) is type(b) and a == b

    def containers(v):
        if isinstance(v, dict | list):
            yield v
            for child in (v.values() if isinstance(v, dict) else v):
                yield from containers(child)

    out = copy_json(value)
    assert same(value, out)
    ids = {id(c) for c in containers(value)}
    assert not any(id(c) in ids for c in containers(out))
    # What orjson cannot take is copied by hand: keys that are not strings.
    assert same({1: [value]}, copy_json({1: [value]}))
