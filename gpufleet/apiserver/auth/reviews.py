"""The review APIs: who am I (SelfSubjectReview), may I (SelfSubjectAccessReview), may they
(SubjectAccessReview), and the node join exchange (NodeTokenRequest).

They are served as extra groups of the ApiServer, after authentication and authorization
ran on the request itself like on any other.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import orjson

from gpufleet.apiserver.admission import UserInfo
from gpufleet.apiserver.auth.rbac import Attributes, Decision
from gpufleet.apiserver.auth.tokens import (
    LOOPBACK_USER,
    NODE_LABEL,
    NODE_USER_PREFIX,
    NODES_GROUP,
    SUPERUSER_GROUP,
    TOKEN_NAMESPACE,
    new_token,
    node_name_of,
    node_token_id,
    secret_name,
    token_secret,
)
from gpufleet.apiserver.errors import ApiException, already_exists, bad_request, method_not_allowed
from gpufleet.apiserver.requestinfo import RequestInfo
from gpufleet.utils.http import RawRequest, RawResponse

if TYPE_CHECKING:
    from gpufleet.apiserver.server import ApiServer

AUTHZ_GROUP, AUTHN_GROUP, BOOTSTRAP_GROUP = "authorization.k8s.io", "authentication.k8s.io", "bootstrap.gpufleet.io"
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

Decide = Callable[[UserInfo, Attributes], Awaitable[Decision]]
Authenticate = Callable[[RawRequest], Awaitable[UserInfo | None]]
Rules = Callable[[UserInfo, str], Awaitable[list[dict[str, Any]]]]


def _resource(group: str, plural: str, kind: str, namespaced: bool = False) -> dict[str, Any]:
    return {"resource": plural, "responseKind": {"group": group, "version": "v1", "kind": kind},
            "scope": "Namespaced" if namespaced else "Cluster", "singularResource": kind.lower(),
            "verbs": ["create"]}


def _group(name: str, resources: list[dict[str, Any]]) -> dict[str, Any]:
    return {"metadata": {"name": name, "creationTimestamp": None},
            "versions": [{"version": "v1", "freshness": "Current", "resources": resources}]}


DISCOVERY = [
    _group(AUTHN_GROUP, [_resource(AUTHN_GROUP, "selfsubjectreviews", "SelfSubjectReview")]),
    _group(AUTHZ_GROUP, [_resource(AUTHZ_GROUP, "selfsubjectaccessreviews", "SelfSubjectAccessReview"),
                         _resource(AUTHZ_GROUP, "selfsubjectrulesreviews", "SelfSubjectRulesReview"),
                         _resource(AUTHZ_GROUP, "subjectaccessreviews", "SubjectAccessReview"),
                         _resource(AUTHZ_GROUP, "localsubjectaccessreviews", "LocalSubjectAccessReview",
                                   namespaced=True)]),
    _group(BOOTSTRAP_GROUP, [_resource(BOOTSTRAP_GROUP, "nodetokenrequests", "NodeTokenRequest"),
                             _resource(BOOTSTRAP_GROUP, "nodecertificaterequests", "NodeCertificateRequest")]),
]


def _json(status: int, obj: Any) -> RawResponse:
    return RawResponse(status, {"content-type": "application/json"}, orjson.dumps(obj))


# Protobuf field numbers of the review messages (k8s.io/api/authorization/v1/generated.proto);
# kubectl sends its access reviews as protobuf.
_PB_MAGIC = b"k8s\x00"
_PB_SCHEMA: dict[str, dict[int, tuple[str, str]]] = {
    "Review": {2: ("spec", "Spec")},
    "RulesReview": {2: ("spec", "RulesSpec")},
    "RulesSpec": {1: ("namespace", "string")},
    "TypeMeta": {1: ("apiVersion", "string"), 2: ("kind", "string")},
    "Spec": {1: ("resourceAttributes", "ResourceAttributes"), 2: ("nonResourceAttributes", "NonResource"),
             3: ("user", "string"), 4: ("groups", "[]string"), 6: ("uid", "string")},
    "ResourceAttributes": {1: ("namespace", "string"), 2: ("verb", "string"), 3: ("group", "string"),
                           4: ("version", "string"), 5: ("resource", "string"), 6: ("subresource", "string"),
                           7: ("name", "string")},
    "NonResource": {1: ("path", "string"), 2: ("verb", "string")},
}


def _pb_fields(buf: bytes):
    pos = 0
    while pos < len(buf):
        key, pos = _pb_varint(buf, pos)
        num, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _pb_varint(buf, pos)
            yield num, value
        elif wire == 2:
            size, pos = _pb_varint(buf, pos)
            if pos + size > len(buf):
                raise bad_request("the body of the request could not be decoded as protobuf: truncated field")
            yield num, buf[pos:pos + size]
            pos += size
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            raise bad_request(f"the body of the request could not be decoded as protobuf: wire type {wire}")


def _pb_varint(buf: bytes, pos: int) -> tuple[int, int]:
    out = shift = 0
    while pos < len(buf) and shift < 70:
        b = buf[pos]
        pos += 1
        out |= (b & 0x7F) << shift
        if b < 0x80:
            return out, pos
        shift += 7
    raise bad_request("the body of the request could not be decoded as protobuf: bad varint")


def _pb_message(buf: bytes, message: str) -> dict[str, Any]:
    schema = _PB_SCHEMA[message]
    out: dict[str, Any] = {}
    for num, value in _pb_fields(buf):
        if num not in schema or not isinstance(value, bytes):
            continue
        name, kind = schema[num]
        if kind == "string":
            out[name] = value.decode("utf-8", errors="replace")
        elif kind == "[]string":
            out.setdefault(name, []).append(value.decode("utf-8", errors="replace"))
        else:
            out[name] = _pb_message(value, kind)
    return out


def _pb_review(body: bytes) -> dict[str, Any]:
    """A review sent as Kubernetes protobuf (runtime.Unknown around the message) as JSON."""
    raw, kind = b"", ""
    for num, value in _pb_fields(body[len(_PB_MAGIC):]):
        if num == 1 and isinstance(value, bytes):
            kind = _pb_message(value, "TypeMeta").get("kind", "")
        elif num == 2 and isinstance(value, bytes):
            raw = value
    return _pb_message(raw, "RulesReview" if kind == "SelfSubjectRulesReview" else "Review")


def _body(req: RawRequest) -> dict[str, Any]:
    if req.body.startswith(_PB_MAGIC):
        return _pb_review(req.body)
    try:
        body = orjson.loads(req.body or b"{}")
    except orjson.JSONDecodeError as e:
        raise bad_request(f"the body of the request could not be decoded as JSON: {e}") from None
    if not isinstance(body, dict):
        raise bad_request("the body of the request must be a JSON object")
    return body


def _field_selector(given: Any) -> str:
    """resourceAttributes.fieldSelector (``rawSelector``, or ``requirements`` of single-value
    ``In``) as the text a request's ?fieldSelector= would carry."""
    if not isinstance(given, dict):
        return ""
    if isinstance(given.get("rawSelector"), str):
        return given["rawSelector"]
    terms = []
    for r in given.get("requirements") or []:
        if not isinstance(r, dict):
            continue
        values = r.get("values")
        if r.get("operator") == "In" and isinstance(values, list) and len(values) == 1:
            terms.append(f"{r.get('key')}={values[0]}")
        elif r.get("operator") == "NotIn" and isinstance(values, list) and len(values) == 1:
            terms.append(f"{r.get('key')}!={values[0]}")
    return ",".join(terms)


def attributes_from_spec(spec: dict[str, Any], namespace: str = "") -> Attributes:
    """An access review's spec as authorizer attributes; a 400 names a missing field."""
    ra = spec.get("resourceAttributes")
    nra = spec.get("nonResourceAttributes")
    if isinstance(ra, dict):
        ns = namespace or ra.get("namespace") or ""
        resource, name = ra.get("resource") or "", ra.get("name") or ""
        if resource == "namespaces" and name and not ns:
            ns = name
        return Attributes(verb=ra.get("verb") or "", group=ra.get("group") or "", resource=resource,
                          subresource=ra.get("subresource") or "", namespace=ns, name=name,
                          field_selector=_field_selector(ra.get("fieldSelector")))
    if isinstance(nra, dict):
        return Attributes(verb=nra.get("verb") or "", is_resource=False, path=nra.get("path") or "")
    raise bad_request("spec.resourceAttributes: Required value: exactly one of resourceAttributes or "
                      "nonResourceAttributes must be given")


class Reviews:
    def __init__(self, authenticate: Authenticate, decide: Decide, rules: Rules,
                 node_certificate: Callable[[ApiServer, RawRequest, UserInfo], Awaitable[RawResponse]] | None = None,
                 join_policy: Callable[[ApiServer, str, UserInfo], Awaitable[None]] | None = None) -> None:
        self.authenticate = authenticate
        self.decide = decide
        self.rules = rules
        # NodeCertificateRequest (nodecreds.py), and what may refuse a join (nodejoin.py).
        self.node_certificate = node_certificate
        self.join_policy = join_policy

    def install(self, api: ApiServer) -> None:
        api.extra_groups[(AUTHN_GROUP, "v1")] = self.authentication
        api.extra_groups[(AUTHZ_GROUP, "v1")] = self.authorization
        api.extra_groups[(BOOTSTRAP_GROUP, "v1")] = lambda req, info: self.bootstrap(api, req, info)
        names = {d["metadata"]["name"] for d in api.extra_discovery}
        api.extra_discovery.extend(d for d in DISCOVERY if d["metadata"]["name"] not in names)

    async def _user(self, req: RawRequest) -> UserInfo:
        user = await self.authenticate(req)
        if user is None:
            raise ApiException(401, "Unauthorized", "Unauthorized")
        return user

    async def authentication(self, req: RawRequest, info: RequestInfo) -> RawResponse:
        if info.resource != "selfsubjectreviews" or info.name or info.subresource:
            raise ApiException(404, "NotFound", "the server could not find the requested resource")
        if info.verb != "create":
            raise method_not_allowed()
        user = await self._user(req)
        user_info: dict[str, Any] = {"username": user.name}
        if user.uid:
            user_info["uid"] = user.uid
        user_info["groups"] = list(user.groups)
        if user.extra:
            user_info["extra"] = user.extra
        return _json(201, {"apiVersion": f"{AUTHN_GROUP}/v1", "kind": "SelfSubjectReview",
                           "metadata": {"creationTimestamp": None}, "status": {"userInfo": user_info}})

    async def authorization(self, req: RawRequest, info: RequestInfo) -> RawResponse:
        if info.resource == "selfsubjectrulesreviews" and not info.name and not info.namespace:
            if info.verb != "create":
                raise method_not_allowed()
            return await self.rules_review(req)
        kinds = {"selfsubjectaccessreviews": "SelfSubjectAccessReview",
                 "subjectaccessreviews": "SubjectAccessReview",
                 "localsubjectaccessreviews": "LocalSubjectAccessReview"}
        kind = kinds.get(info.resource)
        if kind is None or info.name or info.subresource or (info.namespace and kind != "LocalSubjectAccessReview"):
            raise ApiException(404, "NotFound", "the server could not find the requested resource")
        if info.verb != "create":
            raise method_not_allowed()
        body = _body(req)
        spec = body.get("spec") if isinstance(body.get("spec"), dict) else {}
        if kind == "SelfSubjectAccessReview":
            subject = await self._user(req)
        else:
            if not spec.get("user") and not spec.get("groups"):
                raise bad_request("spec.user: Required value: at least one of user or groups must be specified")
            subject = UserInfo(name=spec.get("user") or "", groups=list(spec.get("groups") or []))
        attrs = attributes_from_spec(spec, info.namespace)
        decision = await self.decide(subject, attrs)
        status: dict[str, Any] = {"allowed": decision.allowed}
        if decision.reason:
            status["reason"] = decision.reason
        return _json(201, {"apiVersion": f"{AUTHZ_GROUP}/v1", "kind": kind,
                           "metadata": {**(body.get("metadata") or {}), "creationTimestamp": None},
                           "spec": spec, "status": status})

    async def rules_review(self, req: RawRequest) -> RawResponse:
        """What the caller may do in a namespace (`kubectl auth can-i --list`)."""
        user = await self._user(req)
        body = _body(req)
        spec = body.get("spec") if isinstance(body.get("spec"), dict) else {}
        resource_rules, non_resource_rules = [], []
        for rule in await self.rules(user, spec.get("namespace") or ""):
            if rule.get("nonResourceURLs"):
                non_resource_rules.append({"verbs": rule.get("verbs") or [],
                                           "nonResourceURLs": rule["nonResourceURLs"]})
            else:
                resource_rules.append({k: rule[k] for k in ("verbs", "apiGroups", "resources", "resourceNames")
                                       if rule.get(k) or k == "verbs"})
        return _json(201, {"apiVersion": f"{AUTHZ_GROUP}/v1", "kind": "SelfSubjectRulesReview",
                           "metadata": {"creationTimestamp": None}, "spec": spec,
                           "status": {"resourceRules": resource_rules, "nonResourceRules": non_resource_rules,
                                      # A node's reads of secrets and config maps depend on its pods
                                      # (the Node authorizer) and cannot be listed as rules.
                                      "incomplete": node_name_of(user) is not None}})

    async def bootstrap(self, api: ApiServer, req: RawRequest, info: RequestInfo) -> RawResponse:
        if info.resource == "nodecertificaterequests" and self.node_certificate is not None:
            if info.name or info.subresource:
                raise ApiException(404, "NotFound", "the server could not find the requested resource")
            if info.verb != "create":
                raise method_not_allowed()
            return await self.node_certificate(api, req, await self._user(req))
        return await self.node_token(api, req, info)

    async def node_token(self, api: ApiServer, req: RawRequest, info: RequestInfo) -> RawResponse:
        """Trade the join token for a token of one node: the first join of a name binds it.
        A second join under a taken name is refused (409) unless an admin asks, so holding
        the join token never lets an agent act as a node that already joined."""
        if info.resource != "nodetokenrequests" or info.name or info.subresource:
            raise ApiException(404, "NotFound", "the server could not find the requested resource")
        if info.verb != "create":
            raise method_not_allowed()
        user = await self._user(req)
        body = _body(req)
        node = ((body.get("metadata") or {}).get("name")) or ""
        if not node or len(node) > 253 or not _DNS1123_SUBDOMAIN.match(node):
            raise ApiException(
                422, "Invalid",
                f'NodeTokenRequest.{BOOTSTRAP_GROUP} "{node}" is invalid: metadata.name: Invalid value: "{node}": '
                "a node name must be a lowercase RFC 1123 subdomain",
                {"name": node, "group": BOOTSTRAP_GROUP, "kind": "NodeTokenRequest",
                 "causes": [{"reason": "FieldValueInvalid", "field": "metadata.name",
                             "message": "a node name must be a lowercase RFC 1123 subdomain"}]})
        if self.join_policy is not None:
            await self.join_policy(api, node, user)
        secrets_rt = api.registry.by_key("secrets")
        assert secrets_rt is not None
        system = UserInfo(LOOPBACK_USER, [SUPERUSER_GROUP])
        name = secret_name(node_token_id(node))
        token_id, token = new_token(node_token_id(node))
        node_user = NODE_USER_PREFIX + node
        secret = token_secret(token, node_user, [NODES_GROUP], labels={NODE_LABEL: node[:63]},
                              description=f"node token of {node}, issued to {user.name}")
        try:
            await api.create_object(secrets_rt, TOKEN_NAMESPACE, secret, user=system)
        except ApiException as e:
            if e.code != 409:
                raise
            if SUPERUSER_GROUP not in user.groups:
                err = already_exists(secrets_rt, name)
                err.message = (f'nodetokenrequests.{BOOTSTRAP_GROUP} "{node}" already exists: node {node} already '
                               f"joined; to let it join again, delete secret {TOKEN_NAMESPACE}/{name}")
                err.details = {"name": node, "group": BOOTSTRAP_GROUP, "kind": "nodetokenrequests"}
                raise err from None
            current = await api.get_object(secrets_rt, TOKEN_NAMESPACE, name)
            secret["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            await api.update_object(secrets_rt, TOKEN_NAMESPACE, name, secret, user=system)
        return _json(201, {"apiVersion": f"{BOOTSTRAP_GROUP}/v1", "kind": "NodeTokenRequest",
                           "metadata": {"name": node},
                           "status": {"token": token, "user": node_user, "groups": [NODES_GROUP]}})
