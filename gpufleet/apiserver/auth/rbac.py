"""Role-based access control in Kubernetes' shapes (rbac.authorization.k8s.io/v1).

A request is allowed when a rule of a role bound to the user (by name or by group) matches
it: ClusterRoleBindings grant their ClusterRole everywhere, RoleBindings grant their Role or
ClusterRole inside their own namespace. Members of ``system:masters`` are allowed
everything without any binding. There is no deny rule, and no aggregation.

Bindings and roles are read from the store on each decision (a handful of small reads),
so a new binding applies to the very next request.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gpufleet.apiserver.admission import UserInfo
from gpufleet.apiserver.auth.tokens import (
    AUTHENTICATED_GROUP,
    BOOTSTRAPPERS_GROUP,
    NODES_GROUP,
    SUPERUSER_GROUP,
)
from gpufleet.apiserver.errors import ApiException
from gpufleet.apiserver.requestinfo import RequestInfo
from gpufleet.store import base as store_base

GROUP = "rbac.authorization.k8s.io"
_CLUSTER_ROLES = f"clusterroles.{GROUP}"
_CLUSTER_ROLE_BINDINGS = f"clusterrolebindings.{GROUP}"
_ROLES = f"roles.{GROUP}"
_ROLE_BINDINGS = f"rolebindings.{GROUP}"


@dataclass(frozen=True)
class Attributes:
    """What a request asks to do, as an authorizer sees it."""

    verb: str
    is_resource: bool = True
    group: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    path: str = ""
    # The request's field and label selectors, as given (``spec.nodeName=n1``); RBAC ignores them.
    field_selector: str = ""
    label_selector: str = ""

    @classmethod
    def from_request(cls, info: RequestInfo) -> Attributes:
        if not info.is_resource_request:
            return cls(verb=info.verb, is_resource=False, path=info.path)
        ns = info.namespace
        if info.resource == "namespaces" and info.name and not ns:
            # As in Kubernetes: a Namespace object is inside itself, so a RoleBinding in
            # team-a lets its subjects get the namespace team-a.
            ns = info.name
        return cls(verb=info.verb, group=info.group, resource=info.resource, subresource=info.subresource,
                   namespace=ns, name=info.name, path=info.path, field_selector=info.field_selector,
                   label_selector=info.label_selector)


def _verb_matches(rule: dict[str, Any], verb: str) -> bool:
    verbs = rule.get("verbs") or []
    return "*" in verbs or verb in verbs


def _group_matches(rule: dict[str, Any], group: str) -> bool:
    groups = rule.get("apiGroups") or []
    return "*" in groups or group in groups


def _resource_matches(rule: dict[str, Any], resource: str, subresource: str) -> bool:
    combined = f"{resource}/{subresource}" if subresource else resource
    for r in rule.get("resources") or []:
        if r == "*" or r == combined:
            return True
        if subresource and r == f"*/{subresource}":
            return True
    return False


def _name_matches(rule: dict[str, Any], name: str) -> bool:
    names = rule.get("resourceNames") or []
    return not names or name in names


def _url_matches(rule: dict[str, Any], path: str) -> bool:
    for u in rule.get("nonResourceURLs") or []:
        if u == "*" or u == path:
            return True
        if u.endswith("*") and path.startswith(u[:-1]):
            return True
    return False


def rule_allows(rule: dict[str, Any], attrs: Attributes) -> bool:
    if not _verb_matches(rule, attrs.verb):
        return False
    if attrs.is_resource:
        return (_group_matches(rule, attrs.group) and _resource_matches(rule, attrs.resource, attrs.subresource)
                and _name_matches(rule, attrs.name))
    return _url_matches(rule, attrs.path)


def subject_matches(subject: dict[str, Any], user: UserInfo, binding_namespace: str = "") -> bool:
    kind, name = subject.get("kind"), subject.get("name")
    if kind == "User":
        return name == user.name
    if kind == "Group":
        return name in user.groups
    if kind == "ServiceAccount":
        ns = subject.get("namespace") or binding_namespace
        return user.name == f"system:serviceaccount:{ns}:{name}"
    return False


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str = ""


class RbacAuthorizer:
    def __init__(self, store: store_base.Store) -> None:
        self.store = store

    async def lookup(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await self.store.get(resource, namespace, name)
        except store_base.NotFound:
            return None

    async def role_rules(self, ref: dict[str, Any], namespace: str) -> list[dict[str, Any]]:
        if ref.get("kind") == "ClusterRole":
            role = await self.lookup(_CLUSTER_ROLES, "", ref.get("name", ""))
        elif ref.get("kind") == "Role" and namespace:
            role = await self.lookup(_ROLES, namespace, ref.get("name", ""))
        else:
            role = None
        return list((role or {}).get("rules") or [])

    async def rules(self, user: UserInfo, namespace: str) -> list[dict[str, Any]]:
        """Every rule granted to ``user`` cluster-wide and, with ``namespace``, in it."""
        out: list[dict[str, Any]] = []
        for b in (await self.store.list(_CLUSTER_ROLE_BINDINGS)).items:
            if any(subject_matches(s, user) for s in b.get("subjects") or []):
                out += await self.role_rules(b.get("roleRef") or {}, "")
        if namespace:
            for b in (await self.store.list(_ROLE_BINDINGS, namespace)).items:
                if any(subject_matches(s, user, namespace) for s in b.get("subjects") or []):
                    out += await self.role_rules(b.get("roleRef") or {}, namespace)
        return out

    async def decide(self, user: UserInfo, attrs: Attributes) -> Decision:
        if SUPERUSER_GROUP in user.groups:
            return Decision(True, f'member of the group "{SUPERUSER_GROUP}"')
        bindings = (await self.store.list(_CLUSTER_ROLE_BINDINGS)).items
        for b in bindings:
            subject = _matching(b, user, "")
            if subject is None:
                continue
            ref = b.get("roleRef") or {}
            if any(rule_allows(r, attrs) for r in await self.role_rules(ref, "")):
                return Decision(True, f'RBAC: allowed by ClusterRoleBinding "{b["metadata"]["name"]}" of '
                                      f'ClusterRole "{ref.get("name")}" to {_describe(subject, "")}')
        if attrs.is_resource and attrs.namespace:
            for b in (await self.store.list(_ROLE_BINDINGS, attrs.namespace)).items:
                subject = _matching(b, user, attrs.namespace)
                if subject is None:
                    continue
                ref = b.get("roleRef") or {}
                if any(rule_allows(r, attrs) for r in await self.role_rules(ref, attrs.namespace)):
                    return Decision(True, f'RBAC: allowed by RoleBinding "{b["metadata"]["name"]}/'
                                          f'{attrs.namespace}" of {ref.get("kind")} "{ref.get("name")}" '
                                          f'to {_describe(subject, attrs.namespace)}')
        return Decision(False, "")


def _matching(binding: dict[str, Any], user: UserInfo, namespace: str) -> dict[str, Any] | None:
    for s in binding.get("subjects") or []:
        if isinstance(s, dict) and subject_matches(s, user, namespace):
            return s
    return None


def _describe(subject: dict[str, Any], binding_namespace: str) -> str:
    """The subject a binding matched, as Kubernetes' RBAC reason names it (``User "alice"``,
    ``Group "ops"``, ``ServiceAccount "bot/team"``)."""
    kind, name = subject.get("kind"), subject.get("name")
    if kind == "ServiceAccount":
        return f'{kind} "{name}/{subject.get("namespace") or binding_namespace}"'
    return f'{kind} "{name}"'


class RbacEscalationCheck:
    """Kubernetes' escalation prevention, as a validating admission plugin: writing a role or
    a binding is allowed only to a user who holds every permission it grants (in the
    binding's namespace, or cluster-wide), or who may ``escalate`` that role / ``bind`` the
    role it references. Without it a namespace admin could bind cluster-admin in the
    namespace and raise its own ResourceQuota."""

    name = "RBACEscalation"

    def __init__(self, rbac: RbacAuthorizer) -> None:
        self.rbac = rbac

    async def validate(self, ctx: Any, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        if ctx.rt.group != GROUP or ctx.operation not in ("CREATE", "UPDATE"):
            return
        user: UserInfo = ctx.user
        if SUPERUSER_GROUP in user.groups:
            return
        ns = ctx.namespace if ctx.rt.namespaced else ""
        name = (obj.get("metadata") or {}).get("name") or ctx.name
        if ctx.rt.kind in ("Role", "ClusterRole"):
            if await self._may(user, "escalate", ctx.rt.plural, ns, name):
                return
            rules = list(obj.get("rules") or [])
        else:
            ref = obj.get("roleRef") or {}
            plural = "roles" if ref.get("kind") == "Role" else "clusterroles"
            if await self._may(user, "bind", plural, ns if plural == "roles" else "", ref.get("name", "")):
                return
            rules = await self.rbac.role_rules(ref, ns)
            if not rules and not await self.rbac.lookup(
                    _ROLES if plural == "roles" else _CLUSTER_ROLES, ns if plural == "roles" else "",
                    ref.get("name", "")):
                self._deny(ctx, name, user, f'{ref.get("kind")} "{ref.get("name")}" not found')
        missing = [r for r in rules if not await self._holds(user, r, ns)]
        if missing:
            listed = "\n".join(json.dumps(r, sort_keys=True) for r in missing)
            self._deny(ctx, name, user, f"is attempting to grant RBAC permissions not currently held:\n{listed}")

    async def _may(self, user: UserInfo, verb: str, plural: str, ns: str, name: str) -> bool:
        attrs = Attributes(verb=verb, group=GROUP, resource=plural, namespace=ns, name=name)
        return (await self.rbac.decide(user, attrs)).allowed

    async def _holds(self, user: UserInfo, rule: dict[str, Any], ns: str) -> bool:
        """Every verb x group x resource (x name) of ``rule``, literally (a ``*`` in the rule is
        held only through a ``*`` of the user's)."""
        verbs = rule.get("verbs") or []
        if rule.get("nonResourceURLs"):
            checks = [Attributes(verb=v, is_resource=False, path=u) for v in verbs for u in rule["nonResourceURLs"]]
        else:
            checks = []
            for v in verbs:
                for g in rule.get("apiGroups") or []:
                    for r in rule.get("resources") or []:
                        res, _, sub = r.partition("/")
                        for n in rule.get("resourceNames") or [""]:
                            checks.append(Attributes(verb=v, group=g, resource=res, subresource=sub, namespace=ns,
                                                     name=n))
        for a in checks:
            if not (await self.rbac.decide(user, a)).allowed:
                return False
        return True

    @staticmethod
    def _deny(ctx: Any, name: str, user: UserInfo, why: str) -> None:
        raise ApiException(403, "Forbidden", f'{ctx.rt.plural}.{GROUP} "{name}" is forbidden: user "{user.name}" '
                                             f'(groups={json.dumps(user.groups)}) {why}',
                           {"name": name, "group": GROUP, "kind": ctx.rt.plural})


# ---------------------------------------------------------------------------- bootstrap policy

_READ = ["get", "list", "watch"]
_WRITE = ["create", "delete", "deletecollection", "patch", "update"]
_ALL = _READ + _WRITE


def _rule(groups: list[str], resources: list[str], verbs: list[str], names: list[str] | None = None):
    r: dict[str, Any] = {"apiGroups": groups, "resources": resources, "verbs": verbs}
    if names:
        r["resourceNames"] = names
    return r


# What a namespace's users work with (Kubernetes' edit role, plus the AI kinds gpufleet serves).
_EDITABLE: list[tuple[str, list[str]]] = [
    ("", ["pods", "pods/attach", "pods/exec", "pods/portforward", "pods/proxy", "pods/eviction", "configmaps",
          "endpoints", "persistentvolumeclaims", "replicationcontrollers", "replicationcontrollers/scale",
          "secrets", "serviceaccounts", "services", "services/proxy"]),
    ("apps", ["deployments", "deployments/scale", "deployments/rollback", "replicasets", "replicasets/scale",
              "statefulsets", "statefulsets/scale", "daemonsets"]),
    ("autoscaling", ["horizontalpodautoscalers"]),
    ("batch", ["jobs", "cronjobs"]),
    ("policy", ["poddisruptionbudgets"]),
    ("networking.k8s.io", ["ingresses", "networkpolicies"]),
    ("kubeflow.org", ["*"]),
    ("ray.io", ["*"]),
    ("scheduling.x-k8s.io", ["podgroups"]),
    ("batch.volcano.sh", ["jobs"]),
    ("scheduling.volcano.sh", ["podgroups"]),
]
# Readable by view (no secrets), besides the editable kinds.
_VIEWABLE_ONLY: list[tuple[str, list[str]]] = [
    ("", ["pods/log", "pods/status", "bindings", "events", "limitranges", "namespaces", "namespaces/status",
          "resourcequotas", "resourcequotas/status", "persistentvolumeclaims/status",
          "replicationcontrollers/status", "services/status"]),
    ("apps", ["deployments/status", "replicasets/status", "statefulsets/status", "daemonsets/status",
              "controllerrevisions"]),
    ("autoscaling", ["horizontalpodautoscalers/status"]),
    ("batch", ["jobs/status", "cronjobs/status"]),
    ("policy", ["poddisruptionbudgets/status"]),
    ("kueue.x-k8s.io", ["localqueues", "localqueues/status"]),
    ("batch.volcano.sh", ["jobs/status"]),
    ("scheduling.volcano.sh", ["queues", "queues/status", "podgroups/status"]),
    ("metrics.k8s.io", ["pods"]),
    ("discovery.k8s.io", ["endpointslices"]),
]


# What view must not read though edit may: Secrets, and the pod subresources that reach into a
# pod (exec, attach, port-forward, proxy), as Kubernetes' view role leaves them out.
_ESCALATING = frozenset({"secrets", "pods/attach", "pods/exec", "pods/portforward", "pods/proxy"})


def _view_rules() -> list[dict[str, Any]]:
    # As Kubernetes' view: no secrets, and no exec, attach, port-forward or proxying to what runs
    # in the namespace.
    rules = [_rule([g], [r for r in rs if r not in _ESCALATING and not r.endswith("/proxy")], _READ)
             for g, rs in _EDITABLE]
    rules += [_rule([g], rs, _READ) for g, rs in _VIEWABLE_ONLY]
    return rules


def _edit_rules() -> list[dict[str, Any]]:
    rules = [_rule([g], rs, _ALL) for g, rs in _EDITABLE]
    rules += [_rule([g], rs, _READ) for g, rs in _VIEWABLE_ONLY]
    rules.append(_rule([""], ["pods/log"], _READ))
    # As Kubernetes' edit role: acting as the namespace's service accounts (kubectl --as
    # system:serviceaccount:<namespace>:<name>) and asking for their tokens (kubectl create
    # token), which the workloads one may create run as anyway.
    rules.append(_rule([""], ["serviceaccounts"], ["impersonate"]))
    rules.append(_rule([""], ["serviceaccounts/token"], ["create"]))
    return rules


def _admin_rules() -> list[dict[str, Any]]:
    return _edit_rules() + [
        _rule([GROUP], ["roles", "rolebindings"], _ALL),
        _rule(["authorization.k8s.io"], ["localsubjectaccessreviews"], ["create"]),
        _rule(["kueue.x-k8s.io"], ["localqueues"], _ALL),
    ]


# Kubernetes' system:monitoring: the health endpoints and the metrics, for scrapers (bound to
# the group system:monitoring; bind the ClusterRole to a ServiceAccount or user for others).
MONITORING = "system:monitoring"
_MONITORING_URLS = ["/healthz", "/healthz/*", "/livez", "/livez/*", "/readyz", "/readyz/*", "/metrics",
                    "/metrics/slis"]

_DISCOVERY_URLS = ["/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/readyz", "/version",
                   "/version/", "/openapi", "/openapi/*"]

# The `system:node` role: what a node agent may do. NodeRestriction narrows the writes to
# the agent's own Node, Lease and pods; secrets and config maps are not here, nor listing or
# watching pods: the Node authorizer (nodeauthz.py) lets a node get the secrets and config
# maps its own pods reference, and list/watch pods only with ``spec.nodeName=<itself>``.
_NODE_RULES = [
    _rule([""], ["nodes"], [*_READ, "create", "update", "patch", "delete"]),
    _rule([""], ["nodes/status"], ["get", "update", "patch"]),
    # create: mirror pods only (NodeRestriction), the agent's GPU validation pods.
    _rule([""], ["pods"], ["get", "create", "update", "patch", "delete"]),
    _rule([""], ["pods/status"], ["get", "update", "patch"]),
    _rule(["", "events.k8s.io"], ["events"], ["create", "update", "patch"]),
    _rule([""], ["services", "endpoints", "namespaces"], _READ),
    _rule(["coordination.k8s.io"], ["leases"], [*_READ, "create", "update", "patch", "delete"]),
    # Its serving certificate for the agent's port (signed for its own name only).
    _rule(["bootstrap.gpufleet.io"], ["nodecertificaterequests"], ["create"]),
]

_AUTOUPDATE = {"rbac.authorization.kubernetes.io/autoupdate": "true"}
_BOOTSTRAP_LABELS = {"kubernetes.io/bootstrapping": "rbac-defaults"}


def _cluster_role(name: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/v1", "kind": "ClusterRole",
            "metadata": {"name": name, "labels": dict(_BOOTSTRAP_LABELS), "annotations": dict(_AUTOUPDATE)},
            "rules": rules}


def _cluster_binding(name: str, role: str, group: str) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": name, "labels": dict(_BOOTSTRAP_LABELS), "annotations": dict(_AUTOUPDATE)},
            "roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": GROUP, "kind": "Group", "name": group}]}


def bootstrap_policy() -> list[dict[str, Any]]:
    """The default ClusterRoles and ClusterRoleBindings, made (and kept up to date) at start."""
    return [
        _cluster_role("cluster-admin", [_rule(["*"], ["*"], ["*"]), {"nonResourceURLs": ["*"], "verbs": ["*"]}]),
        _cluster_role("admin", _admin_rules()),
        _cluster_role("edit", _edit_rules()),
        _cluster_role("view", _view_rules()),
        _cluster_role("system:discovery", [{"nonResourceURLs": _DISCOVERY_URLS, "verbs": ["get"]}]),
        _cluster_role(MONITORING, [{"nonResourceURLs": _MONITORING_URLS, "verbs": ["get"]}]),
        _cluster_role("system:basic-user", [
            _rule(["authorization.k8s.io"], ["selfsubjectaccessreviews", "selfsubjectrulesreviews"], ["create"]),
            _rule(["authentication.k8s.io"], ["selfsubjectreviews"], ["create"]),
        ]),
        _cluster_role("system:node", _NODE_RULES),
        # Full access to the node agents' API through nodes/{name}/proxy (bound to nobody).
        _cluster_role("system:kubelet-api-admin", [
            _rule([""], ["nodes"], _READ),
            _rule([""], ["nodes"], ["proxy"]),
            _rule([""], ["nodes/proxy", "nodes/metrics", "nodes/stats", "nodes/log"], ["*"]),
        ]),
        _cluster_role("system:node-bootstrapper", [_rule(["bootstrap.gpufleet.io"], ["nodetokenrequests"],
                                                         ["create"])]),
        _cluster_binding("cluster-admin", "cluster-admin", SUPERUSER_GROUP),
        _cluster_binding("system:discovery", "system:discovery", AUTHENTICATED_GROUP),
        _cluster_binding("system:basic-user", "system:basic-user", AUTHENTICATED_GROUP),
        _cluster_binding(MONITORING, MONITORING, MONITORING),
        _cluster_binding("system:node", "system:node", NODES_GROUP),
        _cluster_binding("system:node-bootstrapper", "system:node-bootstrapper", BOOTSTRAPPERS_GROUP),
    ]
