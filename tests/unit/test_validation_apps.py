"""Defaults and validation of StatefulSet, DaemonSet and ControllerRevision, with Kubernetes'
messages naming the fields."""

from __future__ import annotations

import copy

from gpufleet.api import k8s
from gpufleet.api.defaults import apply_defaults
from gpufleet.api.validation import validate_create, validate_update
from gpufleet.apiserver.auth.rbac import _edit_rules, _view_rules

TEMPLATE = {"metadata": {"labels": {"app": "db"}},
            "spec": {"containers": [{"name": "c", "image": "i", "volumeMounts": [{"name": "data",
                                                                                 "mountPath": "/data"}]}]}}


def sts(**spec) -> k8s.StatefulSet:
    body = {"metadata": {"name": "db", "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"app": "db"}}, "serviceName": "db",
                     "template": copy.deepcopy(TEMPLATE),
                     "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {
                         "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}],
                     **spec}}
    obj = k8s.StatefulSet.from_dict(body)
    apply_defaults(obj)
    return obj


def ds(**spec) -> k8s.DaemonSet:
    template = {"metadata": {"labels": {"app": "logs"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
    obj = k8s.DaemonSet.from_dict({"metadata": {"name": "logs", "namespace": "default"},
                                   "spec": {"selector": {"matchLabels": {"app": "logs"}}, "template": template,
                                            **spec}})
    apply_defaults(obj)
    return obj


def messages(errs) -> list[str]:
    return [e.message() for e in errs]


def test_statefulset_defaults_are_kubernetes():
    spec = sts().to_dict()["spec"]
    assert spec["replicas"] == 1 and spec["revisionHistoryLimit"] == 10
    assert spec["podManagementPolicy"] == "OrderedReady"
    assert spec["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}
    assert spec["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain", "whenScaled": "Retain"}
    assert spec["volumeClaimTemplates"][0]["spec"]["volumeMode"] == "Filesystem"
    assert spec["template"]["spec"]["restartPolicy"] == "Always"
    on_delete = sts(updateStrategy={"type": "OnDelete"}).to_dict()["spec"]["updateStrategy"]
    assert on_delete == {"type": "OnDelete"}


def test_a_valid_statefulset_mounts_its_claim_templates():
    assert validate_create(sts()) == []


def test_statefulset_errors_name_their_fields():
    bad = sts(podManagementPolicy="Random", replicas=-1, updateStrategy={"type": "Sometimes"},
              persistentVolumeClaimRetentionPolicy={"whenDeleted": "Maybe", "whenScaled": "Retain"})
    bad.spec.template.spec.restart_policy = "Never"
    assert messages(validate_create(bad)) == [
        'spec.podManagementPolicy: Unsupported value: "Random": supported values: "OrderedReady", "Parallel"',
        'spec.updateStrategy.type: Unsupported value: "Sometimes": supported values: "OnDelete", "RollingUpdate"',
        'spec.persistentVolumeClaimRetentionPolicy.whenDeleted: Unsupported value: "Maybe": supported values: '
        '"Delete", "Retain"',
        "spec.replicas: Invalid value: -1: must be greater than or equal to 0",
        'spec.template.spec.restartPolicy: Unsupported value: "Never": supported values: "Always"',
    ]
    mismatched = sts(selector={"matchLabels": {"app": "other"}})
    assert messages(validate_create(mismatched)) == [
        'spec.template.metadata.labels: Invalid value: map[string]string{"app":"db"}: '
        '`selector` does not match template `labels`']
    unmounted = sts()
    unmounted.spec.template.spec.containers[0].volume_mounts[0].name = "nope"
    assert messages(validate_create(unmounted)) == [
        'spec.template.spec.containers[0].volumeMounts[0].name: Not found: "nope"']


def test_only_some_statefulset_fields_may_change():
    old = sts()
    scaled = sts(replicas=5, updateStrategy={"type": "RollingUpdate", "rollingUpdate": {"partition": 2}})
    assert validate_update(scaled, old) == []
    renamed = sts(serviceName="other")
    assert messages(validate_update(renamed, old)) == [
        "spec: Forbidden: updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template', "
        "'updateStrategy', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden"]


def test_daemonset_defaults_and_errors():
    spec = ds().to_dict()["spec"]
    assert spec["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}
    assert spec["revisionHistoryLimit"] == 10
    assert validate_create(ds()) == []
    zero = ds(updateStrategy={"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 0}})
    assert messages(validate_create(zero)) == [
        "spec.updateStrategy.rollingUpdate.maxUnavailable: Invalid value: 0: may not be 0 when `maxSurge` is 0"]
    odd = ds(updateStrategy={"type": "Never"})
    assert messages(validate_create(odd)) == [
        'spec.updateStrategy.type: Unsupported value: "Never": supported values: "OnDelete", "RollingUpdate"']
    moved = ds(selector={"matchLabels": {"app": "logs", "tier": "x"}})
    moved.spec.template.metadata.labels["tier"] = "x"
    assert [e.field for e in validate_update(moved, ds())] == ["spec.selector"]


def test_a_controller_revision_keeps_its_data():
    rev = k8s.ControllerRevision.from_dict({"metadata": {"name": "db-1", "namespace": "default"},
                                            "data": {"spec": {}}, "revision": 1})
    changed = k8s.ControllerRevision.from_dict({**rev.to_dict(), "data": {"spec": {"x": 1}}, "revision": 2})
    assert [e.field for e in validate_update(changed, rev)] == ["data"]
    renumbered = k8s.ControllerRevision.from_dict({**rev.to_dict(), "revision": 3})
    assert validate_update(renumbered, rev) == []


def test_default_roles_cover_the_sets_and_their_revisions():
    def allowed(rules, resource: str, verb: str) -> bool:
        return any("apps" in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in rules)

    for resource in ("statefulsets", "statefulsets/scale", "daemonsets"):
        assert allowed(_edit_rules(), resource, "patch") and allowed(_view_rules(), resource, "list")
    assert allowed(_view_rules(), "controllerrevisions", "list") and allowed(_edit_rules(), "controllerrevisions",
                                                                              "get")
    assert not allowed(_edit_rules(), "controllerrevisions", "delete")
