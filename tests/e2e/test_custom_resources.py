"""Custom resources end to end: a CRD applied with the real kubectl, its objects through
kubectl, the official Python client's CustomObjectsApi and a kopf operator, on `gpufleet up`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from e2e_helpers import Cluster, Kubectl, kubectl_binary, table, wait_for, write
from kubernetes import client, config
from kubernetes.client.rest import ApiException

pytestmark = pytest.mark.e2e

CRD_YAML = """\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, shortNames: [wd]}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    additionalPrinterColumns:
    - {name: Size, type: integer, jsonPath: .spec.size}
    - {name: Color, type: string, jsonPath: .spec.color}
    - {name: Phase, type: string, jsonPath: .status.phase}
    - {name: Age, type: date, jsonPath: .metadata.creationTimestamp}
    schema:
      openAPIV3Schema:
        type: object
        description: A widget of the example shop.
        properties:
          spec:
            type: object
            description: What the widget should be.
            required: [color]
            properties:
              size: {type: integer, minimum: 1, maximum: 10, default: 3, description: How many parts it has.}
              color: {type: string, enum: [red, blue], description: The colour it is painted.}
          status:
            type: object
            x-kubernetes-preserve-unknown-fields: true
            properties:
              phase: {type: string}
"""

# The Kubeflow training operator's CRD header (its 500 KB schema cut to the top level).
PYTORCHJOB_CRD_YAML = """\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  annotations:
    controller-gen.kubebuilder.io/version: v0.6.0
  creationTimestamp: null
  name: pytorchjobs.kubeflow.org
spec:
  group: kubeflow.org
  names: {kind: PyTorchJob, listKind: PyTorchJobList, plural: pytorchjobs, singular: pytorchjob}
  scope: Namespaced
  versions:
  - additionalPrinterColumns:
    - {jsonPath: '.status.conditions[-1:].type', name: State, type: string}
    - {jsonPath: .metadata.creationTimestamp, name: Age, type: date}
    name: v1
    schema:
      openAPIV3Schema:
        description: PyTorchJob Represents a PyTorchJob resource.
        type: object
        properties:
          apiVersion: {type: string}
          kind: {type: string}
          metadata: {type: object}
          spec: {type: object, x-kubernetes-preserve-unknown-fields: true}
          status: {type: object, x-kubernetes-preserve-unknown-fields: true}
        required: [spec]
    served: true
    storage: true
    subresources: {status: {}}
status:
  acceptedNames: {kind: "", plural: ""}
  conditions: []
  storedVersions: []
"""

OPERATOR = '''\
import kopf
import kubernetes


@kopf.on.create("example.com", "v1", "widgets")
def configure(body, spec, name, namespace, patch, logger, **_):
    """Gives each new widget a ConfigMap of its colour and marks it Configured."""
    kubernetes.config.load_kube_config()
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-paint"},
                  "data": {"color": spec["color"], "size": str(spec["size"])}}
    kopf.adopt(config_map)
    kubernetes.client.CoreV1Api().create_namespaced_config_map(namespace, config_map)
    patch.status["phase"] = "Configured"
    kopf.info(body, reason="Painted", message=f"painted {spec['color']}")
    return {"configMap": f"{name}-paint"}
'''


def widget_yaml(name: str, color: str = "red", size: str = "4") -> str:
    return f"apiVersion: example.com/v1\nkind: Widget\nmetadata: {{name: {name}}}\nspec: {{color: {color}, size: {size}}}\n"


@pytest.fixture(scope="module")
def crd(kubectl: Kubectl, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("crd")
    path = write(root, "crd.yaml", CRD_YAML)
    assert kubectl("apply", "-f", path).ok().stdout.strip() == \
        "customresourcedefinition.apiextensions.k8s.io/widgets.example.com created"
    kubectl("wait", "--for=condition=Established", "crd/widgets.example.com", "--timeout=10s").ok()
    return root


@pytest.fixture(scope="module")
def custom(cluster: Cluster, crd: Path) -> Iterator[client.CustomObjectsApi]:
    configuration = client.Configuration()
    config.load_kube_config(config_file=cluster.kubeconfig, client_configuration=configuration)
    with client.ApiClient(configuration) as api_client:
        yield client.CustomObjectsApi(api_client)


def test_kubectl_applies_gets_and_explains_the_custom_kind(kubectl: Kubectl, crd: Path) -> None:
    crds = table(kubectl("get", "crd").ok().stdout)
    assert [r["NAME"] for r in crds] == ["widgets.example.com"] and list(crds[0]) == ["NAME", "CREATED AT"]
    path = write(crd, "w1.yaml", widget_yaml("w1"))
    assert kubectl("apply", "-f", path).ok().stdout.strip() == "widget.example.com/w1 created"
    rows = table(kubectl("get", "widgets").ok().stdout)
    assert [{k: v for k, v in r.items() if k != "AGE"} for r in rows] == [
        {"NAME": "w1", "SIZE": "4", "COLOR": "red", "PHASE": ""}]  # a null cell prints blank
    assert table(kubectl("get", "wd", "w1").ok().stdout)[0]["COLOR"] == "red"
    # A second apply is a JSON merge patch (no strategic merge for a custom kind).
    write(crd, "w1.yaml", widget_yaml("w1", color="blue"))
    assert kubectl("apply", "-f", path).ok().stdout.strip() == "widget.example.com/w1 configured"
    assert kubectl("apply", "--server-side", "-f", path).ok().stdout.strip() == "widget.example.com/w1 serverside-applied"
    assert kubectl("get", "widget", "w1", "-o", "jsonpath={.spec.color}").ok().stdout == "blue"
    defaulted = write(crd, "w2.yaml", "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w2}\nspec: {color: red}\n")
    kubectl("create", "-f", defaulted).ok()
    assert kubectl("get", "widget", "w2", "-o", "jsonpath={.spec.size}").ok().stdout == "3"
    explained = kubectl("explain", "widgets.spec").ok().stdout
    assert "KIND:       Widget" in explained and "What the widget should be." in explained
    assert "color\t<string> -required-" in explained and "The colour it is painted." in explained


def test_kubectl_refuses_invalid_objects_with_the_schemas_message(kubectl: Kubectl, crd: Path) -> None:
    bad = write(crd, "bad.yaml", widget_yaml("bad", size='"many"'))
    refused = kubectl("apply", "-f", bad).failed()
    assert 'The Widget "bad" is invalid: spec.size: Invalid value: "string": spec.size in body must be of type ' \
           'integer: "string"' in refused.stderr
    unknown = write(crd, "unknown.yaml", widget_yaml("odd").replace("size: 4}", "size: 4, shade: dark}"))
    strict = kubectl("apply", "-f", unknown).failed()
    assert 'strict decoding error: unknown field "spec.shade"' in strict.stderr
    warned = kubectl("apply", "--validate=warn", "-f", unknown).ok()
    assert 'Warning: unknown field "spec.shade"' in warned.stderr
    assert kubectl("get", "widget", "odd", "-o", "jsonpath={.spec}").ok().stdout == '{"color":"red","size":4}'


def test_kubectl_1_27_applies_through_openapi_v2(kubectl_factory: Callable[[str], Kubectl], crd: Path) -> None:
    old = kubectl_factory(kubectl_binary("1.27"))
    path = write(crd, "w27.yaml", widget_yaml("w27", color="blue", size="2"))
    assert old("apply", "-f", path).ok().stdout.strip() == "widget.example.com/w27 created"
    assert table(old("get", "widget", "w27").ok().stdout)[0]["SIZE"] == "2"


def test_the_python_clients_custom_objects_api(custom: client.CustomObjectsApi) -> None:
    group, version, plural = "example.com", "v1", "widgets"
    body = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "py"},
            "spec": {"color": "red"}}
    made = custom.create_namespaced_custom_object(group, version, "default", plural, body)
    assert made["spec"] == {"color": "red", "size": 3}
    got = custom.get_namespaced_custom_object(group, version, "default", plural, "py")
    assert got["metadata"]["uid"] == made["metadata"]["uid"]
    listed = custom.list_namespaced_custom_object(group, version, "default", plural)
    assert "py" in [o["metadata"]["name"] for o in listed["items"]]
    patched = custom.patch_namespaced_custom_object(group, version, "default", plural, "py", {"spec": {"size": 7}})
    assert patched["spec"]["size"] == 7 and patched["metadata"]["generation"] == 2
    status = custom.patch_namespaced_custom_object_status(group, version, "default", plural, "py",
                                                          {"status": {"phase": "Painted"}})
    assert status["status"] == {"phase": "Painted"}
    with pytest.raises(ApiException) as err:
        custom.patch_namespaced_custom_object(group, version, "default", plural, "py", {"spec": {"size": 70}})
    assert err.value.status == 422
    assert "spec.size in body should be less than or equal to 10" in json.loads(err.value.body)["message"]
    custom.delete_namespaced_custom_object(group, version, "default", plural, "py")
    with pytest.raises(ApiException) as gone:
        custom.get_namespaced_custom_object(group, version, "default", plural, "py")
    assert gone.value.status == 404


def test_a_kopf_operator_reconciles_the_custom_kind(cluster: Cluster, kubectl: Kubectl, crd: Path) -> None:
    operator = write(crd, "operator.py", textwrap.dedent(OPERATOR))
    env = dict(os.environ, KUBECONFIG=cluster.kubeconfig, HOME=str(crd))
    log_path = crd / "kopf.log"
    with open(log_path, "w") as log:
        # --standalone: one operator, no peering objects (kopf.zalando.org CRDs) needed.
        proc = subprocess.Popen([sys.executable, "-m", "kopf", "run", "--standalone", "--namespace", "default",
                                 operator], stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        path = write(crd, "k1.yaml", widget_yaml("k1", color="blue", size="5"))
        kubectl("apply", "-f", path).ok()

        def configured() -> bool:
            assert proc.poll() is None, log_path.read_text()
            return kubectl("get", "widget", "k1", "-o", "jsonpath={.status.phase}").ok().stdout == "Configured"

        wait_for(configured, timeout=30, what=f"kopf to configure the widget:\n{log_path.read_text()}")
        paint = json.loads(kubectl("get", "configmap", "k1-paint", "-o", "json").ok().stdout)
        assert paint["data"] == {"color": "blue", "size": "5"}
        owner = paint["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["apiVersion"]) == ("Widget", "k1", "example.com/v1")
        status = json.loads(kubectl("get", "widget", "k1", "-o", "jsonpath={.status}").ok().stdout)
        assert status["configure"] == {"configMap": "k1-paint"}
        assert table(kubectl("get", "widget", "k1").ok().stdout)[0]["PHASE"] == "Configured"

        def painted() -> list[dict]:
            events = json.loads(kubectl("get", "events", "--field-selector", "involvedObject.name=k1",
                                        "-o", "json").ok().stdout)["items"]
            return [e for e in events if e["reason"] == "Painted"]

        wait_for(painted, timeout=20, what=f"kopf's event:\n{log_path.read_text()}")
        event = painted()[0]
        assert event["message"] == "painted blue" and event["involvedObject"]["kind"] == "Widget"
        assert event["source"]["component"] == "kopf"
        # The garbage collector follows the owner reference to the custom kind.
        kubectl("delete", "widget", "k1", "--wait=false").ok()
        wait_for(lambda: kubectl("get", "configmap", "k1-paint").returncode != 0, timeout=20,
                 what="the garbage collector to delete the widget's ConfigMap")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_the_upstream_pytorchjob_crd_changes_nothing(kubectl: Kubectl, crd: Path) -> None:
    before = kubectl("api-resources", "--api-group=kubeflow.org").ok().stdout
    path = write(crd, "pytorchjobs-crd.yaml", PYTORCHJOB_CRD_YAML)
    assert kubectl("apply", "-f", path).ok().stdout.strip() == \
        "customresourcedefinition.apiextensions.k8s.io/pytorchjobs.kubeflow.org created"
    established = kubectl("get", "crd", "pytorchjobs.kubeflow.org", "-o",
                          'jsonpath={.status.conditions[?(@.type=="Established")].status}').ok().stdout
    assert established == "True"
    assert kubectl("api-resources", "--api-group=kubeflow.org").ok().stdout == before
    # Still the built-in kind, with its own validation (the CRD's schema would take any spec).
    job = write(crd, "job.yaml", "apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nmetadata: {name: j}\n"
                                 "spec: {pytorchReplicaSpecs: {}}\n")
    assert "is invalid" in kubectl("apply", "-f", job).failed().stderr


def test_deleting_the_crd_deletes_its_objects(kubectl: Kubectl, crd: Path) -> None:
    assert kubectl("get", "widgets", "-o", "name").ok().stdout.split()
    deleted = kubectl("delete", "crd", "widgets.example.com").ok()
    assert deleted.stdout.strip() == 'customresourcedefinition.apiextensions.k8s.io "widgets.example.com" deleted'
    assert [r["NAME"] for r in table(kubectl("get", "crd").ok().stdout)] == ["pytorchjobs.kubeflow.org"]
    missing = kubectl("get", "--raw", "/apis/example.com/v1/namespaces/default/widgets").failed()
    assert "NotFound" in missing.stderr or "not found" in missing.stderr.lower()
    # Re-declaring the kind finds none of the old objects.
    kubectl("apply", "-f", str(crd / "crd.yaml")).ok()
    kubectl("wait", "--for=condition=Established", "crd/widgets.example.com", "--timeout=10s").ok()
    assert kubectl("get", "--raw", "/apis/example.com/v1/namespaces/default/widgets").ok().stdout.count('"name"') == 0
