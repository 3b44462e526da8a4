"""networking.k8s.io/v1 through the API server: Ingress, IngressClass and NetworkPolicy
stored and validated with Kubernetes' messages, the default IngressClass, kubectl's table
columns, and the Warning that NetworkPolicy is not enforced."""

from __future__ import annotations

from typing import Any

from apiserver_helpers import TABLE_ACCEPT, Api, assert_status

from gpufleet.apiserver.admission.networking import NOT_ENFORCED_WARNING

NET = "/apis/networking.k8s.io/v1"
INGRESSES = f"{NET}/namespaces/default/ingresses"
POLICIES = f"{NET}/namespaces/default/networkpolicies"


def ingress(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": name},
            "spec": spec or {"rules": [{"host": "a.example.com", "http": {"paths": [
                {"path": "/", "pathType": "Prefix",
                 "backend": {"service": {"name": "web", "port": {"number": 80}}}}]}}]}}


def causes(reply: Any) -> dict[str, str]:
    return {c["field"]: c["message"] for c in reply.json["details"]["causes"]}


async def test_ingress_gets_the_default_class_and_prints_as_kubectl_shows(api: Api) -> None:
    classes = (await api.get(f"{NET}/ingressclasses")).json["items"]
    assert [(c["metadata"]["name"], c["spec"]["controller"],
             c["metadata"]["annotations"]["ingressclass.kubernetes.io/is-default-class"]) for c in classes] == [
        ("gpufleet", "gpufleet.io/gateway", "true")]
    made = (await api.post(INGRESSES, ingress("web"))).json
    assert made["spec"]["ingressClassName"] == "gpufleet"
    other = ingress("other", ingressClassName="nginx", tls=[{"hosts": ["b.example.com"]}], rules=[
        {"host": h, "http": {"paths": [{"path": "/", "pathType": "Exact",
                                        "backend": {"service": {"name": "web", "port": {"name": "http"}}}}]}}
        for h in ("a.example.com", "b.example.com", "c.example.com", "d.example.com")])
    assert (await api.post(INGRESSES, other)).json["spec"]["ingressClassName"] == "nginx"
    status = {"loadBalancer": {"ingress": [{"ip": "10.0.0.9"}]}}
    await api.put(f"{INGRESSES}/web/status", {**made, "status": status})
    table = (await api.get(INGRESSES, accept=TABLE_ACCEPT)).json
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Class", "Hosts", "Address", "Ports", "Age"]
    rows = {r["cells"][0]: r["cells"][1:5] for r in table["rows"]}
    assert rows == {"web": ["gpufleet", "a.example.com", "10.0.0.9", "80"],
                    "other": ["nginx", "a.example.com,b.example.com,c.example.com + 1 more...", "", "80, 443"]}
    table = (await api.get(f"{NET}/ingressclasses", accept=TABLE_ACCEPT)).json
    assert [r["cells"][:3] for r in table["rows"]] == [["gpufleet", "gpufleet.io/gateway", "<none>"]]


async def test_ingress_validation_names_the_field(api: Api) -> None:
    r = await api.post(INGRESSES, ingress("empty", ingressClassName="gpufleet"))
    assert_status(r, 422, "Invalid")
    assert causes(r) == {"spec": "Invalid value: []networking.IngressRule(nil): either `defaultBackend` or "
                                 "`rules` must be specified"}
    bad = ingress("bad", rules=[
        {"host": "10.1.2.3", "http": {"paths": [
            {"path": "relative", "pathType": "Prefix", "backend": {"service": {"name": "web", "port": {}}}},
            {"path": "/x", "pathType": "Regex", "backend": {"service": {"name": "web", "port": {"number": 70000}}}},
            {"path": "/a//b", "pathType": "Exact",
             "backend": {"service": {"name": "web", "port": {"name": "http", "number": 80}}}},
        ]}},
        {"host": "*.example.com", "http": {"paths": []}}])
    r = await api.post(INGRESSES, bad)
    assert_status(r, 422, "Invalid")
    got = causes(r)
    assert got["spec.rules[0].host"] == 'Invalid value: "10.1.2.3": must be a DNS name, not an IP address'
    assert got["spec.rules[0].http.paths[0].path"] == 'Invalid value: "relative": must be an absolute path'
    assert got["spec.rules[0].http.paths[0].backend"] == "Required value: port name or number is required"
    assert got["spec.rules[0].http.paths[1].pathType"] == (
        'Unsupported value: "Regex": supported values: "Exact", "ImplementationSpecific", "Prefix"')
    assert got["spec.rules[0].http.paths[2].path"] == "Invalid value: \"/a//b\": must not contain '//'"
    assert got["spec.rules[0].http.paths[2].backend"] == 'Invalid value: "": cannot set both port name & port number'
    assert got["spec.rules[1].http.paths"] == "Required value"
    r = await api.post(f"{NET}/ingressclasses", {"metadata": {"name": "x"}, "spec": {"controller": "nope"}})
    assert_status(r, 422, "Invalid", fields=["spec.controller"])
    assert 'must be a domain-prefixed path (such as "acme.io/foo")' in r.json["message"]


async def test_network_policy_is_stored_with_a_warning_that_it_is_not_enforced(api: Api) -> None:
    policy = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "deny"},
              "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress"],
                       "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}],
                                    "ports": [{"port": 80, "endPort": 90}]}]}}
    r = await api.post(POLICIES, policy)
    assert r.status == 201, r
    assert r.headers["warning"] == f'299 - "{NOT_ENFORCED_WARNING}"'
    assert NOT_ENFORCED_WARNING.startswith("NetworkPolicy is stored but not enforced by gpufleet: ")
    r = await api.put(f"{POLICIES}/deny", {**r.json, "spec": {**policy["spec"], "policyTypes": ["Ingress", "Egress"]}})
    assert r.status == 200 and "not enforced" in r.headers["warning"]
    table = (await api.get(POLICIES, accept=TABLE_ACCEPT)).json
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Pod-Selector", "Age"]
    assert table["rows"][0]["cells"][:2] == ["deny", "app=web"]
    bad = {**policy, "metadata": {"name": "bad"}, "spec": {"policyTypes": ["Sideways"], "ingress": [
        {"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["192.168.0.0/16"]}, "podSelector": {}}, {}],
         "ports": [{"port": "http", "endPort": 90, "protocol": "ICMP"}]}]}}
    r = await api.post(POLICIES, bad)
    assert_status(r, 422, "Invalid")
    got = causes(r)
    assert got["spec.ingress[0].from[0].ipBlock.except[0]"] == (
        'Invalid value: "192.168.0.0/16": must be a strict subset of `cidr`')
    assert got["spec.ingress[0].from[0]"] == "Forbidden: may not specify both ipBlock and another peer"
    assert got["spec.ingress[0].from[1]"] == "Required value: must specify a peer"
    assert got["spec.ingress[0].ports[0].endPort"] == "Invalid value: 90: may not be specified when `port` is non-numeric"
    assert got["spec.ingress[0].ports[0].protocol"] == 'Unsupported value: "ICMP": supported values: "TCP", "UDP", "SCTP"'
    assert got["spec.policyTypes[0]"] == 'Unsupported value: "Sideways": supported values: "Ingress", "Egress"'
