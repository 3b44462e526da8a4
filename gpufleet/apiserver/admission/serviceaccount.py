"""ServiceAccount admission: every pod runs as a service account, and gets its token mounted.

As Kubernetes' plugin (plugin/pkg/admission/serviceaccount), on pod create:

* a pod without ``spec.serviceAccountName`` (or the deprecated ``spec.serviceAccount``) gets
  ``default``; both fields then name it, as a v1 pod shows them;
* a pod naming a service account that does not exist is refused (403 ``pods "x" is forbidden:
  error looking up service account <ns>/<name>: serviceaccount "<name>" not found``). The
  ``default`` one is the exception: the ServiceAccount controller makes it as a namespace
  appears, and where Kubernetes waits a second for it, this plugin admits the pod as if it
  were there, with no settings of its own;
* unless ``automountServiceAccountToken`` says false (the pod's value wins over the service
  account's), the pod gets a projected volume ``kube-api-access-<5 random characters>`` (a
  service account token for 3607 seconds at ``token``, ``ca.crt`` of the ConfigMap
  kube-root-ca.crt, and the pod's namespace at ``namespace``; defaultMode 420) and every
  container and init container that does not already mount something at
  /var/run/secrets/kubernetes.io/serviceaccount mounts it there read-only. A pod that already
  has a ``kube-api-access-`` volume keeps it, and no volume is added when no container needs
  it;
* a pod without imagePullSecrets takes the service account's.

Mirror pods (annotation kubernetes.io/config.mirror) are not changed, and may not name a
service account, reference secrets or project a token.
"""

from __future__ import annotations

import secrets
from typing import Any

from gpufleet.apiserver.admission import AdmissionContext
from gpufleet.apiserver.errors import forbidden
from gpufleet.store import base as store_base

DEFAULT_SERVICE_ACCOUNT = "default"
VOLUME_PREFIX = "kube-api-access-"
MOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
ROOT_CA_CONFIGMAP = "kube-root-ca.crt"
TOKEN_EXPIRATION_SECONDS = 3607
PROJECTED_DEFAULT_MODE = 0o644
MIRROR_POD_ANNOTATION = "kubernetes.io/config.mirror"
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def token_volume(name: str) -> dict[str, Any]:
    """The projected volume Kubernetes gives a pod for its API access."""
    return {
        "name": name,
        "projected": {
            "defaultMode": PROJECTED_DEFAULT_MODE,
            "sources": [
                {"serviceAccountToken": {"expirationSeconds": TOKEN_EXPIRATION_SECONDS, "path": "token"}},
                {"configMap": {"name": ROOT_CA_CONFIGMAP, "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace",
                                            "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
            ],
        },
    }


def should_automount(service_account: dict[str, Any] | None, pod_spec: dict[str, Any]) -> bool:
    if pod_spec.get("automountServiceAccountToken") is not None:
        return bool(pod_spec["automountServiceAccountToken"])
    if service_account is not None and service_account.get("automountServiceAccountToken") is not None:
        return bool(service_account["automountServiceAccountToken"])
    return True


def mount_token(spec: dict[str, Any], new_name: str) -> None:
    """Adds the token volume (named ``new_name`` unless the pod has one) and its mounts."""
    volume_name = ""
    for v in spec.get("volumes") or []:
        if isinstance(v, dict) and str(v.get("name", "")).startswith(VOLUME_PREFIX):
            volume_name = v["name"]
            break
    has_volume = bool(volume_name)
    volume_name = volume_name or new_name
    needs_volume = False
    for key in ("initContainers", "containers"):
        for c in spec.get(key) or []:
            if not isinstance(c, dict):
                continue
            mounts = c.get("volumeMounts") or []
            if any(isinstance(m, dict) and m.get("mountPath") == MOUNT_PATH for m in mounts):
                continue
            c["volumeMounts"] = [*mounts, {"name": volume_name, "readOnly": True, "mountPath": MOUNT_PATH}]
            needs_volume = True
    if needs_volume and not has_volume:
        spec["volumes"] = [*(spec.get("volumes") or []), token_volume(volume_name)]


def _projects_token(spec: dict[str, Any]) -> bool:
    for v in spec.get("volumes") or []:
        for source in ((v.get("projected") or {}).get("sources") or []) if isinstance(v, dict) else []:
            if isinstance(source, dict) and source.get("serviceAccountToken") is not None:
                return True
    return False


class ServiceAccountAdmission:
    name = "ServiceAccount"

    def __init__(self, *, mount_token: bool = True) -> None:
        # kube-apiserver's MountServiceAccountToken: off where no token can be issued.
        self.mount_token = mount_token

    async def admit(self, ctx: AdmissionContext, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        if ctx.operation != "CREATE" or ctx.subresource or ctx.rt.key != "pods":
            return
        spec = obj.setdefault("spec", {})
        meta = obj.get("metadata") or {}
        if MIRROR_POD_ANNOTATION in (meta.get("annotations") or {}):
            self._check_mirror_pod(ctx, obj, spec)
            return
        name = spec.get("serviceAccountName") or spec.get("serviceAccount") or DEFAULT_SERVICE_ACCOUNT
        spec["serviceAccountName"] = spec["serviceAccount"] = name
        try:
            sa: dict[str, Any] | None = await ctx.server.store.get("serviceaccounts", ctx.namespace, name)
        except store_base.NotFound:
            if name != DEFAULT_SERVICE_ACCOUNT:
                raise forbidden(f'pods "{_shown_name(ctx, meta)}" is forbidden: error looking up service account '
                                f'{ctx.namespace}/{name}: serviceaccount "{name}" not found',
                                ctx.rt, _shown_name(ctx, meta)) from None
            sa = None
        if self.mount_token and should_automount(sa, spec):
            mount_token(spec, VOLUME_PREFIX + "".join(secrets.choice(_NAME_ALPHABET) for _ in range(5)))
        pull_secrets = (sa or {}).get("imagePullSecrets") or []
        if not spec.get("imagePullSecrets") and pull_secrets:
            spec["imagePullSecrets"] = [{"name": s.get("name", "")} for s in pull_secrets if isinstance(s, dict)]

    @staticmethod
    def _check_mirror_pod(ctx: AdmissionContext, obj: dict[str, Any], spec: dict[str, Any]) -> None:
        from gpufleet.apiserver.auth.nodeauthz import pod_references

        name = _shown_name(ctx, obj.get("metadata") or {})
        why = ""
        if spec.get("serviceAccountName") or spec.get("serviceAccount"):
            why = "a mirror pod may not reference service accounts"
        elif pod_references(obj)["secrets"]:
            why = "a mirror pod may not reference secrets"
        elif _projects_token(spec):
            why = "a mirror pod may not use ServiceAccountToken volume projections"
        if why:
            raise forbidden(f'pods "{name}" is forbidden: {why}', ctx.rt, name)


def _shown_name(ctx: AdmissionContext, meta: dict[str, Any]) -> str:
    """The name Kubernetes' admission errors show: the generateName prefix for a generated
    name (admission runs before the name is made there), else the name."""
    prefix = meta.get("generateName") or ""
    name = ctx.name or meta.get("name") or ""
    if prefix and name.startswith(prefix[:58]) and len(name) == len(prefix[:58]) + 5:
        return prefix
    return name
