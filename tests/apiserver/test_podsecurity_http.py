"""Pod Security admission and the spec.nodeName rule, over the real TLS listener of an
in-process control plane (no controllers), as a team's `edit` token meets them; then the
plugin's configuration (defaults, exemptions, AdmissionConfiguration files) on an
in-process server."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet.api import podsecurity as ps
from gpufleet.apiserver.admission.podsecurity import (
    ConfigError,
    PodSecurityConfig,
    load_admission_config,
    namespace_pod_warnings,
)
from gpufleet.apiserver.server import ApiServer
from gpufleet.cli.commands.token import create_token
from gpufleet.cli.controlplane import ControlPlane
from gpufleet.client import Client, HttpTransport
from gpufleet.store.base import open_store
from gpufleet.utils.http import RawRequest, RawResponse

PODS = "/api/v1/namespaces/{ns}/pods"


@pytest.fixture
async def cp(tmp_path: Path) -> AsyncIterator[ControlPlane]:
    plane = ControlPlane(store_url=f"sqlite:///{tmp_path / 'db'}", port=0, state_dir=tmp_path / "state",
                         run_controllers=False)
    await plane.start()
    yield plane
    await plane.stop()


def connect(cp: ControlPlane, token: str | None) -> Client:
    return Client(HttpTransport(cp.url, token=token, ca_data=cp.ca_pem), read_retries=1)


async def send(c: Client, method: str, path: str, body: Any = None,
               content_type: str = "application/json") -> RawResponse:
    return await c.raw_request(method, path, content=json.dumps(body) if body is not None else None,
                               headers={"content-type": content_type} if body is not None else None,
                               raise_for_status=False)


def warnings_of(resp: RawResponse) -> list[str]:
    """The texts of a response's Warning header values (RFC 7234 ``299 - "text"``)."""
    header = resp.headers.get("warning") or ""
    return [w.replace('\\"', '"') for w in re.findall(r'299 - "((?:[^"\\]|\\.)*)"', header)]


def status_of(resp: RawResponse) -> tuple[int, str, str]:
    body = json.loads(resp.body)
    return resp.status, body.get("reason", ""), body.get("message", "")


def pod(name: str, **spec: Any) -> dict[str, Any]:
    containers = spec.pop("containers", None) or [{"name": "c", "image": "busybox"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {"containers": containers, **spec}}


def privileged_container(name: str = "c") -> dict[str, Any]:
    return {"name": name, "image": "busybox", "securityContext": {"privileged": True}}


async def team(cp: ControlPlane, admin: Client, ns: str = "team-a", labels: dict[str, str] | None = None,
               user: str = "alice") -> Client:
    meta: dict[str, Any] = {"name": ns}
    if labels:
        meta["labels"] = labels
    await admin.create({"apiVersion": "v1", "kind": "Namespace", "metadata": meta}, raw=True)
    made = await create_token(admin, role="edit", namespace=ns, user=user)
    return connect(cp, made["token"])


# -- enforce: a team's edit token cannot escape to the host --------------------------------------------


ESCAPES = [
    ("hostpath", {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}, 'hostPath volumes (volume "root")'),
    ("privileged", {"containers": [privileged_container()]},
     'privileged (container "c" must not set securityContext.privileged=true)'),
    ("hostpid", {"hostPID": True}, "host namespaces (hostPID=true)"),
    ("hostnetwork", {"hostNetwork": True}, "host namespaces (hostNetwork=true)"),
]


async def test_team_edit_token_cannot_create_pods_that_escape_to_the_host(cp: ControlPlane) -> None:
    async with connect(cp, cp.admin_token) as admin, await team(cp, admin) as alice:
        for name, spec, detail in ESCAPES:
            resp = await send(alice, "POST", PODS.format(ns="team-a"), pod(name, **spec))
            assert status_of(resp) == (
                403, "Forbidden", f'pods "{name}" is forbidden: violates PodSecurity "baseline:latest": {detail}')
            assert json.loads(resp.body)["details"] == {"name": name, "kind": "pods"}
            assert resp.headers.get("warning") is None
        # All at once: Kubernetes' order, in one message.
        resp = await send(alice, "POST", PODS.format(ns="team-a"), pod(
            "x", hostPID=True, volumes=[{"name": "h", "hostPath": {"path": "/"}}], containers=[privileged_container()]))
        assert status_of(resp)[2] == (
            'pods "x" is forbidden: violates PodSecurity "baseline:latest": host namespaces (hostPID=true), '
            'hostPath volumes (volume "h"), privileged (container "c" must not set securityContext.privileged=true)')
        ok = await send(alice, "POST", PODS.format(ns="team-a"), pod("fine", volumes=[{"name": "t", "emptyDir": {}}]))
        assert ok.status == 201 and warnings_of(ok) == []
        stored = await admin.list("pods", "team-a", raw=True)
        assert [p["metadata"]["name"] for p in stored.items] == ["fine"]
        # system:masters is not exempt either (as in Kubernetes): the admin labels the namespace instead.
        resp = await send(admin, "POST", PODS.format(ns="team-a"), pod("admin-priv", hostNetwork=True))
        assert status_of(resp)[:2] == (403, "Forbidden")
        # Dry run is judged the same.
        resp = await alice.raw_request("POST", PODS.format(ns="team-a"), params={"dryRun": "All"},
                                       content=json.dumps(pod("dry", hostIPC=True)),
                                       headers={"content-type": "application/json"}, raise_for_status=False)
        assert status_of(resp)[:2] == (403, "Forbidden")


async def test_warn_only_namespace_answers_warning_headers_and_stores_the_pod(cp: ControlPlane) -> None:
    labels = {ps.ENFORCE_LABEL: "privileged", ps.WARN_LABEL: "baseline"}
    async with connect(cp, cp.admin_token) as admin, await team(cp, admin, "team-w", labels) as alice:
        resp = await send(alice, "POST", PODS.format(ns="team-w"), pod(
            "priv", hostNetwork=True, containers=[privileged_container("a"), privileged_container("b")]))
        assert resp.status == 201, resp.body
        assert warnings_of(resp) == [
            'would violate PodSecurity "baseline:latest": host namespaces (hostNetwork=true), '
            'privileged (containers "a", "b" must not set securityContext.privileged=true)']
        stored = await admin.get("pods", "priv", "team-w", raw=True)
        assert stored["spec"]["hostNetwork"] is True
        # A compliant pod answers no warning.
        assert warnings_of(await send(alice, "POST", PODS.format(ns="team-w"), pod("plain"))) == []


async def test_a_privileged_namespace_allows_what_baseline_refuses(cp: ControlPlane) -> None:
    privileged = {ps.ENFORCE_LABEL: "privileged", ps.WARN_LABEL: "privileged"}
    async with connect(cp, cp.admin_token) as admin, await team(cp, admin, "team-p", privileged) as alice:
        for name, spec, _ in ESCAPES:
            resp = await send(alice, "POST", PODS.format(ns="team-p"), pod(name, **spec))
            assert resp.status == 201 and warnings_of(resp) == [], resp.body
        # With enforce alone, the default warn level (baseline) still speaks up.
        await admin.patch("namespaces", "team-p", {"metadata": {"labels": {ps.WARN_LABEL: None}}})
        resp = await send(alice, "POST", PODS.format(ns="team-p"), pod("loud", hostPID=True))
        assert resp.status == 201
        assert warnings_of(resp) == ['would violate PodSecurity "baseline:latest": host namespaces (hostPID=true)']
        # kube-system is exempt out of the box.
        resp = await send(admin, "POST", PODS.format(ns="kube-system"), pod("sys", hostPID=True))
        assert resp.status == 201 and warnings_of(resp) == []
        # A team cannot relabel its namespace: edit does not write namespaces.
        resp = await send(alice, "PATCH", "/api/v1/namespaces/team-p",
                          {"metadata": {"labels": {ps.ENFORCE_LABEL: "privileged"}}}, "application/merge-patch+json")
        assert resp.status == 403


async def test_workload_templates_are_warned_about_never_refused(cp: ControlPlane) -> None:
    async with connect(cp, cp.admin_token) as admin, await team(cp, admin) as alice:
        deploy = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}, "spec": {
            "selector": {"matchLabels": {"app": "web"}}, "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"hostNetwork": True, "containers": [{"name": "web", "image": "nginx"}]}}}}
        resp = await send(alice, "POST", "/apis/apps/v1/namespaces/team-a/deployments", deploy)
        assert resp.status == 201, resp.body
        # Warn follows the default enforce level: the Deployment says what its pods will meet.
        assert warnings_of(resp) == ['would violate PodSecurity "baseline:latest": host namespaces (hostNetwork=true)']
        job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"}, "spec": {"template": {"spec": {
            "restartPolicy": "Never", "containers": [privileged_container()]}}}}
        resp = await send(alice, "POST", "/apis/batch/v1/namespaces/team-a/jobs", job)
        assert resp.status == 201 and warnings_of(resp) == [
            'would violate PodSecurity "baseline:latest": privileged (container "c" must not set '
            'securityContext.privileged=true)']
        template = {"spec": {"containers": [{"name": "pytorch", "image": "x",
                                             "volumeMounts": [{"name": "d", "mountPath": "/d"}]}],
                             "volumes": [{"name": "d", "hostPath": {"path": "/data"}}]}}
        ptj = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "train"}, "spec": {
            "pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": template},
                                    "Worker": {"replicas": 2, "template": {"spec": {"containers": [
                                        {"name": "pytorch", "image": "x"}]}}}}}}
        resp = await send(alice, "POST", "/apis/kubeflow.org/v1/namespaces/team-a/pytorchjobs", ptj)
        assert resp.status == 201, resp.body
        assert warnings_of(resp) == ['spec.pytorchReplicaSpecs[Master].template: would violate PodSecurity '
                                     '"baseline:latest": hostPath volumes (volume "d")']
        # Updates of the workload are warned about again; its scale subresource is not checked.
        resp = await send(alice, "PATCH", "/apis/apps/v1/namespaces/team-a/deployments/web",
                          {"spec": {"replicas": 3}}, "application/merge-patch+json")
        assert resp.status == 200 and len(warnings_of(resp)) == 1
        resp = await send(alice, "PATCH", "/apis/apps/v1/namespaces/team-a/deployments/web/scale",
                          {"spec": {"replicas": 2}}, "application/merge-patch+json")
        assert resp.status == 200 and warnings_of(resp) == []


async def test_tightening_a_namespace_warns_about_the_pods_it_would_now_refuse(cp: ControlPlane) -> None:
    async with connect(cp, cp.admin_token) as admin:
        await admin.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": "lab", "labels": {ps.ENFORCE_LABEL: "privileged"}}}, raw=True)
        for name, spec in (("a", {"hostPID": True}), ("b", {"hostPID": True}), ("c", {}),
                           ("d", {"containers": [privileged_container()]})):
            resp = await send(admin, "POST", PODS.format(ns="lab"), pod(name, **spec))
            assert resp.status == 201
        resp = await send(admin, "PATCH", "/api/v1/namespaces/lab", {"metadata": {"labels": {
            ps.ENFORCE_LABEL: "baseline"}}}, "application/merge-patch+json")
        assert resp.status == 200
        assert warnings_of(resp) == [
            'existing pods in namespace "lab" violate the new PodSecurity enforce level "baseline:latest"',
            "a (and 1 other pod): host namespaces",
            "d: privileged",
        ]
        # Loosening, or labels that keep the level, answer nothing.
        resp = await send(admin, "PATCH", "/api/v1/namespaces/lab", {"metadata": {"labels": {
            ps.ENFORCE_LABEL: "privileged"}}}, "application/merge-patch+json")
        assert resp.status == 200 and warnings_of(resp) == []


async def test_invalid_pod_security_labels_are_refused_with_kubernetes_message(cp: ControlPlane) -> None:
    async with connect(cp, cp.admin_token) as admin:
        resp = await send(admin, "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": "bad", "labels": {ps.ENFORCE_LABEL: "strict"}}})
        assert status_of(resp) == (422, "Invalid", 'Namespace "bad" is invalid: '
                                   'metadata.labels[pod-security.kubernetes.io/enforce]: Invalid value: "strict": '
                                   "must be one of privileged, baseline, restricted")
        assert json.loads(resp.body)["details"]["causes"] == [{
            "reason": "FieldValueInvalid", "field": "metadata.labels[pod-security.kubernetes.io/enforce]",
            "message": 'Invalid value: "strict": must be one of privileged, baseline, restricted'}]
        await admin.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "good"}}, raw=True)
        resp = await send(admin, "PATCH", "/api/v1/namespaces/good", {"metadata": {"labels": {
            ps.WARN_VERSION_LABEL: "1.30"}}}, "application/merge-patch+json")
        assert status_of(resp) == (422, "Invalid", 'Namespace "good" is invalid: '
                                   'metadata.labels[pod-security.kubernetes.io/warn-version]: Invalid value: "1.30": '
                                   'must be "latest" or "v1.x"')


async def test_pod_updates_are_checked_when_what_matters_changes(cp: ControlPlane) -> None:
    async with connect(cp, cp.admin_token) as admin:
        await admin.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": "up", "labels": {ps.ENFORCE_LABEL: "privileged"}}}, raw=True)
        assert (await send(admin, "POST", PODS.format(ns="up"), pod("p", hostIPC=True))).status == 201
        await admin.patch("namespaces", "up", {"metadata": {"labels": {ps.ENFORCE_LABEL: "baseline"}}})
        path = PODS.format(ns="up") + "/p"
        # Labels are not what Pod Security judges: the pod keeps running and can be labeled.
        resp = await send(admin, "PATCH", path, {"metadata": {"labels": {"a": "b"}}}, "application/merge-patch+json")
        assert resp.status == 200
        # A new image is: the pod is judged as a new one would be.
        resp = await send(admin, "PATCH", path, {"spec": {"containers": [{"name": "c", "image": "busybox:2"}]}},
                          "application/strategic-merge-patch+json")
        assert status_of(resp) == (403, "Forbidden", 'pods "p" is forbidden: violates PodSecurity "baseline:latest": '
                                                     "host namespaces (hostIPC=true)")
        # Status writes (the agent's) are never checked.
        current = await admin.get("pods", "p", "up", raw=True)
        current["status"] = {"phase": "Running"}
        assert (await send(admin, "PUT", path + "/status", current)).status == 200


# -- spec.nodeName ---------------------------------------------------------------------------------------


async def test_spec_node_name_needs_pods_binding(cp: ControlPlane) -> None:
    async with connect(cp, cp.admin_token) as admin, await team(cp, admin) as alice:
        resp = await send(alice, "POST", PODS.format(ns="team-a"), pod("pinned", nodeName="gpu-7"))
        why = ('spec.nodeName is set to "gpu-7", which skips the scheduler: only a user allowed to create resource '
               '"pods/binding" in the namespace "team-a" may choose a pod\'s node, and User "alice" cannot; leave '
               "spec.nodeName empty and choose nodes with spec.nodeSelector or spec.affinity.nodeAffinity")
        assert status_of(resp) == (403, "Forbidden", f'pods "pinned" is forbidden: {why}')
        assert json.loads(resp.body)["details"] == {"name": "pinned", "kind": "pods", "causes": [
            {"reason": "FieldValueForbidden", "field": "spec.nodeName", "message": f"Forbidden: {why}"}]}
        # Choosing nodes the scheduler's way is fine.
        resp = await send(alice, "POST", PODS.format(ns="team-a"), pod(
            "selected", nodeSelector={"kubernetes.io/hostname": "gpu-7"}))
        assert resp.status == 201
        # The namespace's admin role does not grant binding either.
        made = await create_token(admin, role="admin", namespace="team-a", user="ann")
        async with connect(cp, made["token"]) as ann:
            resp = await send(ann, "POST", PODS.format(ns="team-a"), pod("ann-pinned", nodeName="gpu-7"))
            assert status_of(resp)[:2] == (403, "Forbidden") and "spec.nodeName" in status_of(resp)[2]
        # system:masters may, and so may whoever RBAC lets bind pods.
        assert (await send(admin, "POST", PODS.format(ns="team-a"), pod("admin-pinned", nodeName="gpu-7"))).status \
            == 201
        await admin.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                            "metadata": {"name": "binder", "namespace": "team-a"},
                            "rules": [{"apiGroups": [""], "resources": ["pods/binding"], "verbs": ["create"]}]},
                           raw=True)
        await admin.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                            "metadata": {"name": "alice-binds", "namespace": "team-a"},
                            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "binder"},
                            "subjects": [{"kind": "User", "name": "alice"}]}, raw=True)
        assert (await send(alice, "POST", PODS.format(ns="team-a"), pod("pinned", nodeName="gpu-7"))).status == 201


async def test_bulk_bindings_need_pods_binding(cp: ControlPlane) -> None:
    """A List of Bindings to .../bindings binds pods as pods/{name}/binding does: edit may
    not, whoever RBAC lets create pods/binding may."""
    bindings = {"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name}, "target": {"name": "gpu-7"}}
        for name in ("a", "b")]}
    path = "/api/v1/namespaces/team-a/bindings"
    async with connect(cp, cp.admin_token) as admin, await team(cp, admin) as alice:
        for name in ("a", "b"):
            assert (await send(alice, "POST", PODS.format(ns="team-a"), pod(name))).status == 201
        resp = await send(alice, "POST", path, bindings)
        assert status_of(resp) == (403, "Forbidden", 'pods is forbidden: User "alice" cannot create resource '
                                                     '"pods/binding" in API group "" in the namespace "team-a"')
        assert not (await alice.get("pods", "a", "team-a", raw=True))["spec"].get("nodeName")
        await admin.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                            "metadata": {"name": "binder", "namespace": "team-a"},
                            "rules": [{"apiGroups": [""], "resources": ["pods/binding"], "verbs": ["create"]}]},
                           raw=True)
        await admin.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                            "metadata": {"name": "alice-binds", "namespace": "team-a"},
                            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "binder"},
                            "subjects": [{"kind": "User", "name": "alice"}]}, raw=True)
        assert (await send(alice, "POST", path, bindings)).status == 201
        for name in ("a", "b"):
            assert (await alice.get("pods", name, "team-a", raw=True))["spec"]["nodeName"] == "gpu-7"


async def test_the_rendezvous_port_annotation_is_the_control_planes_only(cp: ControlPlane) -> None:
    async with connect(cp, cp.admin_token) as admin, await team(cp, admin) as alice:
        body = pod("squat", containers=[{"name": "pytorch", "image": "x", "ports": [
            {"name": "pytorchjob-port", "containerPort": 22}]}])
        body["metadata"]["annotations"] = {"gpufleet.io/rendezvous-port": "22"}
        resp = await send(alice, "POST", PODS.format(ns="team-a"), body)
        assert status_of(resp)[:2] == (403, "Forbidden")
        assert json.loads(resp.body)["details"]["causes"][0]["field"] == \
            "metadata.annotations[gpufleet.io/rendezvous-port]"
        del body["metadata"]["annotations"]
        assert (await send(alice, "POST", PODS.format(ns="team-a"), body)).status == 201


# -- configuration ----------------------------------------------------------------------------------------


async def served(tmp_path: Path, config: PodSecurityConfig | None = None) -> tuple[ApiServer, Any]:
    store = open_store(f"sqlite:///{tmp_path / 'cfg.db'}")
    await store.start()
    server = ApiServer(store, pod_security=config)
    await server.start()

    async def call(method: str, path: str, body: Any = None, user: str | None = None) -> RawResponse:
        headers = {"content-type": "application/merge-patch+json" if method == "PATCH" else "application/json"}
        req = RawRequest(method, path, [], headers, json.dumps(body).encode() if body is not None else b"")
        if user is not None:
            from gpufleet.apiserver.admission import UserInfo

            async def as_user(_req: RawRequest) -> UserInfo:
                return UserInfo(user, ["system:authenticated", "system:masters"])
            server.authenticator = as_user
        try:
            return await server.handle(req)
        finally:
            server.authenticator = None
    return server, call


async def test_exemptions_by_user_runtime_class_and_namespace(tmp_path: Path) -> None:
    config = PodSecurityConfig(defaults=ps.Policy(enforce=ps.LevelVersion(ps.RESTRICTED)),
                               exempt_usernames=frozenset({"ci-bot"}), exempt_runtime_classes=frozenset({"kata"}),
                               exempt_namespaces=frozenset({"infra"}))
    server, call = await served(tmp_path, config)
    try:
        assert (await call("POST", PODS.format(ns="default"), pod("plain"))).status == 403
        assert (await call("POST", PODS.format(ns="default"), pod("bot", hostPID=True), user="ci-bot")).status == 201
        assert (await call("POST", PODS.format(ns="default"), pod("vm", hostPID=True,
                                                               runtimeClassName="kata"))).status == 201
        # Labeling an exempt namespace says its policy will be ignored.
        resp = await call("POST", "/api/v1/namespaces", {"metadata": {"name": "infra", "labels": {
            ps.ENFORCE_LABEL: "baseline", ps.WARN_LABEL: "baseline"}}})
        assert resp.status == 201
        assert warnings_of(resp) == ['namespace "infra" is exempt from Pod Security, and the policy '
                                     "(enforce=baseline:latest, warn=baseline:latest) will be ignored"]
        assert (await call("POST", PODS.format(ns="infra"), pod("node-exporter", hostPID=True))).status == 201
        # kube-system is not exempt once a configuration says which namespaces are.
        assert (await call("POST", PODS.format(ns="kube-system"), pod("x", hostPID=True))).status == 403
    finally:
        await server.store.close()


async def test_audit_violations_are_logged_with_kubernetes_annotations(tmp_path: Path,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gpufleet.apiserver.podsecurity")
    config = PodSecurityConfig(defaults=ps.Policy(enforce=ps.LevelVersion(ps.BASELINE),
                                                  audit=ps.LevelVersion(ps.RESTRICTED)))
    server, call = await served(tmp_path, config)
    try:
        assert (await call("POST", PODS.format(ns="default"), pod("plain"))).status == 201
        (line,) = [r.getMessage() for r in caplog.records if r.name == "gpufleet.apiserver.podsecurity"]
        assert line.startswith("PodSecurity audit: create pods default/plain by system:admin: "
                               'pod-security.kubernetes.io/audit-violations="would violate PodSecurity '
                               '"restricted:latest": allowPrivilegeEscalation != false')
        assert line.endswith('pod-security.kubernetes.io/enforce-policy="baseline:latest"')
    finally:
        await server.store.close()


def test_admission_configuration_files_as_kube_apiserver_reads_them(tmp_path: Path) -> None:
    inline = tmp_path / "admission.yaml"
    inline.write_text("""
apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: PodSecurity
  configuration:
    apiVersion: pod-security.admission.config.k8s.io/v1
    kind: PodSecurityConfiguration
    defaults:
      enforce: restricted
      enforce-version: v1.30
      warn: restricted
    exemptions:
      usernames: [ci-bot]
      runtimeClasses: [kata]
      namespaces: [kube-system, infra]
""")
    config = load_admission_config(inline)
    assert config is not None
    assert (str(config.defaults.enforce), str(config.defaults.warn), str(config.defaults.audit)) == (
        "restricted:v1.30", "restricted:latest", "privileged:latest")
    assert config.exempt_namespaces == {"kube-system", "infra"} and config.exempt_usernames == {"ci-bot"}
    assert config.exempt_runtime_classes == {"kata"}
    # The plugin's configuration may live in its own file, relative to this one.
    (tmp_path / "podsecurity.yaml").write_text("apiVersion: pod-security.admission.config.k8s.io/v1\n"
                                               "kind: PodSecurityConfiguration\ndefaults: {enforce: baseline}\n")
    by_path = tmp_path / "by-path.yaml"
    by_path.write_text("apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n"
                       "- {name: PodSecurity, path: podsecurity.yaml}\n")
    config = load_admission_config(by_path)
    assert config is not None and str(config.defaults.enforce) == "baseline:latest"
    assert config.exempt_namespaces == frozenset()
    # No PodSecurity plugin in the file: the server keeps its own defaults.
    other = tmp_path / "other.yaml"
    other.write_text("apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins: []\n")
    assert load_admission_config(other) is None
    bad = tmp_path / "bad.yaml"
    bad.write_text(inline.read_text().replace("enforce: restricted", "enforce: strict")
                   .replace("[kube-system, infra]", "[kube-system, Infra, kube-system]"))
    with pytest.raises(ConfigError) as err:
        load_admission_config(bad)
    assert str(err.value) == (
        f'{bad}: plugins[0].configuration.defaults.enforce: Invalid value: "strict": must be one of privileged, '
        'baseline, restricted; plugins[0].configuration.exemptions.namespaces[1]: Invalid value: "Infra": must be '
        'a valid namespace name; plugins[0].configuration.exemptions.namespaces[2]: Duplicate value: "kube-system"')
    typo = tmp_path / "typo.yaml"
    typo.write_text(inline.read_text().replace("runtimeClasses", "runtimeClassNames"))
    with pytest.raises(ConfigError, match='exemptions.runtimeClassNames: unknown field "runtimeClassNames"'):
        load_admission_config(typo)


def test_the_command_line_picks_the_default_level(tmp_path: Path) -> None:
    import typer

    from gpufleet.cli.commands.up import pod_security_config

    out_of_the_box = pod_security_config(None, None)
    assert out_of_the_box == PodSecurityConfig.default()
    assert (str(out_of_the_box.defaults.enforce), str(out_of_the_box.defaults.warn)) == (
        "baseline:latest", "baseline:latest")
    assert out_of_the_box.exempt_namespaces == {"kube-system"}
    assert str(pod_security_config("restricted:v1.31", None).defaults.enforce) == "restricted:v1.31"
    assert pod_security_config("privileged", None).defaults.enforce.level == ps.PRIVILEGED
    with pytest.raises(typer.BadParameter, match='"strict": must be one of privileged, baseline, restricted'):
        pod_security_config("strict", None)
    missing = tmp_path / "nope.yaml"
    with pytest.raises(typer.BadParameter, match="nope.yaml"):
        pod_security_config(None, missing)


def test_namespace_warnings_check_one_pod_per_controller_first_and_stop_at_the_limit() -> None:
    def p(name: str, owner: str | None = None, **spec: Any) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name}
        if owner:
            meta["ownerReferences"] = [{"uid": owner, "controller": True}]
        return {"metadata": meta, "spec": {"containers": [{"name": "c", "image": "x"}], "hostPID": True, **spec}}

    pods = [p("rs1-a", "1"), p("rs1-b", "1"), p("rs1-c", "1"), p("solo"), p("vm", runtimeClassName="kata")]
    lv = ps.LevelVersion(ps.BASELINE)
    assert namespace_pod_warnings("ns", lv, pods, exempt_runtime_classes=frozenset({"kata"}), max_pods=2) == [
        "new PodSecurity enforce level only checked against the first 2 of 4 existing pods",
        'existing pods in namespace "ns" violate the new PodSecurity enforce level "baseline:latest"',
        "rs1-a (and 1 other pod): host namespaces",
    ]
    assert namespace_pod_warnings("ns", lv, pods)[-1] == "rs1-a (and 4 other pods): host namespaces"
