"""Audit policy matching as Kubernetes' (k8s.io/apiserver/pkg/audit/policy/checker.go), the
policy file's validation, and the log file's rotation."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from gpufleet.apiserver.audit import AuditLog, LogOptions, PolicyError, load_policy, parse_policy
from gpufleet.apiserver.auth.rbac import Attributes


def policy(*rules: dict, **top: object) -> object:
    return parse_policy({"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "rules": list(rules), **top})


def res(verb: str, resource: str, namespace: str = "", name: str = "", group: str = "",
        subresource: str = "") -> Attributes:
    return Attributes(verb=verb, group=group, resource=resource, subresource=subresource, namespace=namespace,
                      name=name)


def url(path: str, verb: str = "get") -> Attributes:
    return Attributes(verb=verb, is_resource=False, path=path)


ALICE = ("alice", ["team-a", "system:authenticated"])
NODE = ("system:node:n1", ["system:nodes", "system:authenticated"])


def level(p, who, attrs) -> str:
    return p.decide(who[0], who[1], attrs).level


def test_the_first_matching_rule_decides_and_no_match_is_none() -> None:
    p = policy({"level": "RequestResponse", "resources": [{"group": "", "resources": ["configmaps"]}]},
               {"level": "Metadata", "resources": [{"group": "", "resources": ["configmaps", "secrets"]}]})
    assert level(p, ALICE, res("get", "configmaps", "default", "c")) == "RequestResponse"
    assert level(p, ALICE, res("get", "secrets", "default", "s")) == "Metadata"
    assert level(p, ALICE, res("get", "pods", "default", "p")) == "None"
    assert not p.decide(*ALICE, res("get", "pods", "default", "p")).logged


def test_users_groups_and_verbs() -> None:
    p = policy({"level": "None", "users": ["system:kube-proxy"], "verbs": ["watch"]},
               {"level": "None", "userGroups": ["system:nodes"], "verbs": ["get"]},
               {"level": "Request", "users": ["alice"]},
               {"level": "Metadata"})
    assert level(p, ("system:kube-proxy", []), res("watch", "endpoints")) == "None"
    assert level(p, ("system:kube-proxy", []), res("list", "endpoints")) == "Metadata"
    assert level(p, NODE, res("get", "nodes", name="n1")) == "None"
    assert level(p, NODE, res("update", "nodes", name="n1")) == "Metadata"
    assert level(p, ALICE, res("list", "pods", "default")) == "Request"
    # Unauthenticated (no user): a rule naming users or groups does not match it.
    assert p.decide(None, [], res("list", "pods", "default")).level == "Metadata"


def test_resources_subresources_names_and_groups() -> None:
    p = policy({"level": "None", "resources": [{"group": "", "resources": ["pods/log", "pods/status"]}]},
               {"level": "Request", "resources": [{"group": "", "resources": ["*/scale"]}]},
               {"level": "RequestResponse", "resources": [{"group": "apps", "resources": ["deployments/*"]}]},
               {"level": "Metadata", "resources": [{"group": "", "resources": ["configmaps"],
                                                    "resourceNames": ["controller-leader"]}]},
               {"level": "Request", "resources": [{"group": "batch"}]},
               {"level": "Metadata", "resources": [{"group": "", "resources": ["*"]}]})
    assert level(p, ALICE, res("get", "pods", "d", "p", subresource="log")) == "None"
    assert level(p, ALICE, res("get", "pods", "d", "p")) == "Metadata"  # pods itself: the last rule
    assert level(p, ALICE, res("update", "replicationcontrollers", "d", "r", subresource="scale")) == "Request"
    assert level(p, ALICE, res("patch", "deployments", "d", "x", group="apps", subresource="status")) \
        == "RequestResponse"
    # As Kubernetes': resource/* is the resource and every subresource of it.
    assert level(p, ALICE, res("get", "deployments", "d", "x", group="apps")) == "RequestResponse"
    assert level(p, ALICE, res("update", "configmaps", "kube-system", "controller-leader")) == "Metadata"
    assert level(p, ALICE, res("update", "configmaps", "kube-system", "other")) == "Metadata"  # via "*"
    assert level(p, ALICE, res("create", "jobs", "d", group="batch")) == "Request"  # a group, all its kinds
    assert level(p, ALICE, res("create", "cronjobs", "d", group="batch")) == "Request"
    assert level(p, ALICE, res("get", "leases", "d", "l", group="coordination.k8s.io")) == "None"


def test_resource_names_narrow_the_match() -> None:
    p = policy({"level": "None", "resources": [{"group": "", "resources": ["configmaps"],
                                                "resourceNames": ["controller-leader"]}]},
               {"level": "Metadata"})
    assert level(p, ALICE, res("update", "configmaps", "kube-system", "controller-leader")) == "None"
    assert level(p, ALICE, res("update", "configmaps", "kube-system", "other")) == "Metadata"
    assert level(p, ALICE, res("list", "configmaps", "kube-system")) == "Metadata"


def test_namespaces_and_cluster_scope() -> None:
    p = policy({"level": "RequestResponse", "namespaces": ["prod"]},
               {"level": "Request", "namespaces": [""]},  # "" is cluster-scoped
               {"level": "Metadata"})
    assert level(p, ALICE, res("get", "pods", "prod", "p")) == "RequestResponse"
    assert level(p, ALICE, res("get", "nodes", "", "n1")) == "Request"
    assert level(p, ALICE, res("get", "pods", "dev", "p")) == "Metadata"
    # A namespaces rule applies to resource requests only.
    assert level(p, ALICE, url("/api")) == "Metadata"


def test_non_resource_urls() -> None:
    p = policy({"level": "None", "nonResourceURLs": ["/healthz*", "/version"]},
               {"level": "Metadata", "nonResourceURLs": ["/metrics"]},
               {"level": "Request", "resources": [{"group": ""}]})
    assert level(p, ALICE, url("/healthz")) == "None"
    assert level(p, ALICE, url("/healthz/etcd")) == "None"
    assert level(p, ALICE, url("/version")) == "None"
    assert level(p, ALICE, url("/metrics")) == "Metadata"
    assert level(p, ALICE, url("/openapi/v2")) == "None"  # no rule for it
    # A non-resource URL rule does not match a resource request, nor a resource rule a URL.
    assert level(p, ALICE, res("get", "pods", "d", "p")) == "Request"
    p2 = policy({"level": "Metadata", "nonResourceURLs": ["*"]})
    assert level(p2, ALICE, url("/anything")) == "Metadata"
    assert level(p2, ALICE, res("get", "pods", "d", "p")) == "None"


def test_omit_stages_are_the_union_of_policy_and_rule() -> None:
    p = policy({"level": "Metadata", "omitStages": ["ResponseStarted"]}, omitStages=["RequestReceived"])
    d = p.decide(*ALICE, res("get", "pods", "d", "p"))
    assert d.omit_stages == {"RequestReceived", "ResponseStarted"}
    p = policy({"level": "Request", "omitManagedFields": False}, omitManagedFields=True)
    assert p.decide(*ALICE, res("get", "pods")).omit_managed_fields is False
    assert policy({"level": "Request"}, omitManagedFields=True).decide(*ALICE, res("get", "pods")).omit_managed_fields


@pytest.mark.parametrize(("doc", "message"), [
    ({"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "rules": [{"level": "Everything"}]},
     'rules[0].level: Unsupported value: "Everything": supported values: "None", "Metadata", "Request", '
     '"RequestResponse"'),
    ({"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "rules": [{"level": "None"}, {"level": "Metadata",
                                                                    "omitStages": ["Sometimes"]}]},
     'rules[1].omitStages[0]: Unsupported value: "Sometimes"'),
    ({"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "rules": [
        {"level": "Metadata", "resources": [{"group": "", "resources": ["pods"]}], "nonResourceURLs": ["/x"]}]},
     "rules[0].nonResourceURLs: Invalid value: rules cannot apply to both regular resources and non-resource URLs"),
    ({"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "rules": [{"level": "Metadata",
                                                                    "nonResourceURLs": ["metrics"]}]},
     'rules[0].nonResourceURLs[0]: Invalid value: "metrics": must start with "/"'),
    ({"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "rules": [{"level": "Metadata", "users": "alice"}]},
     "rules[0].users: Invalid value: must be a list of strings"),
    ({"apiVersion": "audit.k8s.io/v1beta9", "kind": "Policy", "rules": [{"level": "Metadata"}]},
     'apiVersion: Unsupported value: "audit.k8s.io/v1beta9"'),
    ({"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "rules": []}, "rules: Required value"),
    ({"apiVersion": "audit.k8s.io/v1", "kind": "PolicyList", "rules": [{"level": "Metadata"}]},
     'kind: Invalid value: "PolicyList": must be "Policy"'),
])
def test_a_bad_policy_names_the_field(doc: dict, message: str) -> None:
    with pytest.raises(PolicyError) as err:
        parse_policy(doc)
    assert message in str(err.value)


def test_a_policy_file_in_yaml(tmp_path: Path) -> None:
    f = tmp_path / "policy.yaml"
    f.write_text("""
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: None
    users: ["system:kube-proxy"]
    verbs: ["watch"]
    resources:
      - group: ""
        resources: ["endpoints", "services"]
  - level: Metadata
    resources:
      - group: ""
        resources: ["secrets", "configmaps"]
  - level: Request
""")
    p = load_policy(f)
    assert level(p, ("system:kube-proxy", []), res("watch", "services")) == "None"
    assert level(p, ALICE, res("get", "secrets", "d", "s")) == "Metadata"
    assert level(p, ALICE, res("create", "pods", "d")) == "Request"
    (tmp_path / "bad.yaml").write_text("rules: [level: Metadata")
    with pytest.raises(PolicyError, match="bad.yaml is not YAML"):
        load_policy(tmp_path / "bad.yaml")


def test_the_log_file_is_private_and_rotates_by_size(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    log = AuditLog(str(path), LogOptions(max_size_mb=1, max_backups=2))
    line = json.dumps({"kind": "Event", "pad": "x" * 1000}).encode()
    for _ in range(3500):  # about 3.5 MiB: three rotations, two backups kept
        assert log.write(line)
    log.close()
    backups = sorted(tmp_path.glob("audit-*.log"))
    assert len(backups) == 2
    for f in [path, *backups]:
        assert stat.S_IMODE(f.stat().st_mode) == 0o600
        assert f.stat().st_size <= 1024 * 1024
        assert all(json.loads(x)["kind"] == "Event" for x in f.read_text().splitlines())
