"""`gpufleet describe` of StatefulSet, DaemonSet, CronJob, Ingress and EndpointSlice against a
real API server (in process): kubectl's fields and wording, the Ingress backends' endpoints
read from their EndpointSlices, and the Events that end each description."""

from __future__ import annotations

import re

import pytest
import yaml
from apiserver_helpers import Api

from gpufleet.api.registry import REGISTRY
from gpufleet.cli.commands.describe import describe_object
from gpufleet.cli.output import Session
from gpufleet.client.api import Client
from gpufleet.client.transport import LocalTransport

pytestmark = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)

NS = "default"
TEMPLATE = {"metadata": {"labels": {"app": "db"}}, "spec": {"containers": [{"name": "main", "image": "postgres:16"}]}}
OBJECTS = [
    ("statefulsets.apps", {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "db"}, "spec": {
        "replicas": 2, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}}, "template": TEMPLATE,
        "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 1}},
        "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {
            "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}]}}),
    ("daemonsets.apps", {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "exporter"}, "spec": {
        "selector": {"matchLabels": {"app": "db"}},
        "template": {**TEMPLATE, "spec": {**TEMPLATE["spec"], "nodeSelector": {"gpu": "true"}}}}}),
    ("cronjobs.batch", {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "nightly"}, "spec": {
        "schedule": "0 3 * * *", "concurrencyPolicy": "Forbid", "suspend": True,
        "jobTemplate": {"spec": {"template": {"spec": {**TEMPLATE["spec"], "restartPolicy": "Never"}}}}}}),
    ("services", {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}, "spec": {
        "selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080},
                                              {"name": "metrics", "port": 9100}]}}),
    ("endpointslices.discovery.k8s.io", {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
        "metadata": {"name": "web-abc", "labels": {"kubernetes.io/service-name": "web"}},
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}, {"name": "metrics", "port": 9100, "protocol": "TCP"}],
        "endpoints": [{"addresses": [f"10.0.0.{i}"], "conditions": {"ready": i != 4, "serving": True,
                                                                   "terminating": False},
                       "nodeName": "n1", "targetRef": {"kind": "Pod", "namespace": NS, "name": f"web-{i}"}}
                      for i in range(1, 5)]}),
    ("ingresses.networking.k8s.io", {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
                                     "metadata": {"name": "site"}, "spec": {
        "tls": [{"hosts": ["shop.example.com"], "secretName": "cert"}],
        "rules": [{"host": "shop.example.com", "http": {"paths": [
            {"path": "/", "pathType": "Prefix", "backend": {"service": {"name": "web", "port": {"number": 80}}}},
            {"path": "/gone", "pathType": "Prefix", "backend": {"service": {"name": "nope", "port": {"number": 80}}}},
        ]}}]}}),
]


def value(text: str, key: str) -> str:
    m = re.search(rf"^{re.escape(key)}:\s+(.*)$", text, re.M)
    assert m, f"{key!r} not in\n{text}"
    return m.group(1).strip()


async def test_describe_the_newer_kinds(api: Api) -> None:
    stored = {}
    for key, body in OBJECTS:
        rt = REGISTRY.by_key(key)
        stored[key] = await api.create(rt.path(NS), body)
    await api.create("/api/v1/namespaces/default/events", yaml.safe_load(f"""
        metadata: {{name: db.1}}
        involvedObject: {{apiVersion: apps/v1, kind: StatefulSet, name: db, namespace: {NS},
                         uid: {stored["statefulsets.apps"]["metadata"]["uid"]}}}
        type: Normal
        reason: SuccessfulCreate
        message: create Pod db-0 in StatefulSet db successful
        source: {{component: statefulset-controller}}"""))
    session = Session(client=Client(LocalTransport(api.server)), namespace=NS, namespace_explicit=False,
                      server="in-process")

    async def describe(key: str) -> str:
        return await describe_object(session, REGISTRY.by_key(key), stored[key])

    sts = await describe("statefulsets.apps")
    assert value(sts, "Replicas") == "2 desired | 0 total" and value(sts, "Selector") == "app=db"
    assert value(sts, "Update Strategy") == "RollingUpdate" and re.search(r"^  Partition:\s+1$", sts, re.M)
    assert value(sts, "Pods Status") == "0 Running / 0 Waiting / 0 Succeeded / 0 Failed"
    claims = sts[sts.index("Volume Claims:"):]
    assert [value(claims, f"  {k}") for k in ("Name", "Capacity", "Access Modes")] == ["data", "1Gi", "[ReadWriteOnce]"]
    assert re.search(r"Normal\s+SuccessfulCreate\s+\S+\s+statefulset-controller\s+create Pod db-0", sts)

    ds = await describe("daemonsets.apps")
    assert value(ds, "Node-Selector") == "gpu=true" and value(ds, "Desired Number of Nodes Scheduled") == "0"
    assert re.search(r"^\s+Image:\s+postgres:16$", ds, re.M) and value(ds, "Events") == "<none>"

    cj = await describe("cronjobs.batch")
    assert [value(cj, k) for k in ("Schedule", "Concurrency Policy", "Suspend", "Successful Job History Limit",
                                   "Last Schedule Time", "Active Jobs")] == [
        "0 3 * * *", "Forbid", "True", "3", "<unset>", "<none>"]

    ing = await describe("ingresses.networking.k8s.io")
    assert value(ing, "Ingress Class") == "gpufleet" and value(ing, "Default backend") == "<default>"
    assert re.search(r"^TLS:\n  cert terminates shop.example.com$", ing, re.M)
    rules = [line.split() for line in ing[ing.index("Rules:"):].splitlines()[1:6]]
    assert rules == [["Host", "Path", "Backends"], ["----", "----", "--------"], ["shop.example.com"],
                     ["/", "web:80", "(10.0.0.1:8080,10.0.0.2:8080,10.0.0.3:8080", "+", "1", "more...)"],
                     ["/gone", "nope:80", "(<error:", 'services', '"nope"', "not", "found>)"]], ing

    es = await describe("endpointslices.discovery.k8s.io")
    assert value(es, "AddressType") == "IPv4"
    assert re.search(r"^  http\s+8080\s+TCP$", es, re.M)
    assert re.search(r"^  - Addresses:\s+10.0.0.4\n    Conditions:\n      Ready:\s+false$", es, re.M), es
