"""A container's environment as Kubernetes builds it: envFrom, then env (later names win),
values from the downward API, ConfigMaps and Secrets, and `$(VAR)` expansion.

The lookups of ConfigMaps and Secrets are the only I/O; they go through a callable so the
rules themselves stay testable without an API server.
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from gpufleet.api.quantity import parse_quantity

# (kind, namespace, name) -> the object as a dict, or None when it does not exist.
ObjectGetter = Callable[[str, str, str], Awaitable[dict[str, Any] | None]]

_FIELD_PATH = re.compile(r"^metadata\.(labels|annotations)\['([^']*)'\]$")
_VALID_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")


class EnvError(Exception):
    """The environment cannot be built yet (a missing ConfigMap, a bad reference). The
    container waits with reason CreateContainerConfigError and is retried."""


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: known names are replaced, unknown references are kept
    as written, and `$$` escapes a dollar (so `$$(VAR)` stays literally `$(VAR)`)."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch != "$" or i + 1 >= n:
            out.append(ch)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "$":
            out.append("$")
            i += 2
        elif nxt == "(":
            end = text.find(")", i + 2)
            if end < 0:
                out.append(text[i:])
                break
            name = text[i + 2 : end]
            out.append(env[name] if name in env else text[i : end + 1])
            i = end + 1
        else:
            out.append("$")
            i += 1
    return "".join(out)


def field_ref_value(pod: Mapping[str, Any], path: str) -> str:
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    simple: dict[str, Any] = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName") or spec.get("serviceAccount") or "default",
        "status.hostIP": status.get("hostIP"),
        "status.podIP": status.get("podIP"),
        "status.hostIPs": ",".join(i.get("ip", "") for i in status.get("hostIPs") or []) or status.get("hostIP"),
        "status.podIPs": ",".join(i.get("ip", "") for i in status.get("podIPs") or []) or status.get("podIP"),
    }
    if path in simple:
        return str(simple[path] or "")
    m = _FIELD_PATH.match(path)
    if m:
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    if path in ("metadata.labels", "metadata.annotations"):
        items = meta.get(path.split(".")[1]) or {}
        return "\n".join(f"{k}={go_quote(str(v))}" for k, v in sorted(items.items()))
    raise EnvError(f"unsupported fieldRef fieldPath {path!r}")


_GO_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t",
               "\v": "\\v", "\\": "\\\\", '"': '\\"'}


def go_quote(text: str) -> str:
    """Go's %q of a string (strconv.Quote), which the kubelet writes label and annotation
    values with: printable characters as they are, the rest escaped."""
    out = ['"']
    for ch in text:
        if ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif ch == " " or ch.isprintable():
            out.append(ch)
        elif ord(ch) < 0x80:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) < 0x10000:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    out.append('"')
    return "".join(out)


def resource_field_value(container: Mapping[str, Any], ref: Mapping[str, Any],
                         node_allocatable: Mapping[str, Any]) -> str:
    """limits.cpu / requests.memory ... divided by the divisor and rounded up, as the kubelet
    does; an unset limit reads as the node's allocatable amount."""
    resource = ref.get("resource") or ""
    kind, _, name = resource.partition(".")
    if kind not in ("limits", "requests") or not name:
        raise EnvError(f"unsupported resourceFieldRef resource {resource!r}")
    resources = container.get("resources") or {}
    value = (resources.get(kind) or {}).get(name)
    if value is None and kind == "requests":
        value = (resources.get("limits") or {}).get(name)
    if value is None:
        value = node_allocatable.get(name, 0) if kind == "limits" else 0
    divisor = parse_quantity(ref.get("divisor") or 1)
    if divisor == 0:
        raise EnvError(f"resourceFieldRef {resource}: the divisor must not be zero")
    return str(math.ceil(parse_quantity(value) / divisor))


async def build_env(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    get_object: ObjectGetter,
    *,
    base: Mapping[str, str] | None = None,
    node_allocatable: Mapping[str, Any] | None = None,
) -> dict[str, str]:
    """The environment for one container, in the order Kubernetes resolves it: ``base`` (what
    the agent provides), then envFrom sources, then env entries, each value expanded
    against what came before it."""
    ns = (pod.get("metadata") or {}).get("namespace") or "default"
    env: dict[str, str] = dict(base or {})
    cache: dict[tuple[str, str], dict[str, Any] | None] = {}

    async def fetch(kind: str, name: str) -> dict[str, Any] | None:
        key = (kind, name)
        if key not in cache:
            cache[key] = await get_object(kind, ns, name)
        return cache[key]

    for source in container.get("envFrom") or []:
        prefix = source.get("prefix") or ""
        if source.get("configMapRef"):
            ref = source["configMapRef"]
            obj = await fetch("configmaps", ref.get("name", ""))
            if obj is None:
                if ref.get("optional"):
                    continue
                raise EnvError(f'configmap "{ref.get("name", "")}" not found')
            for key, value in (obj.get("data") or {}).items():
                if _VALID_ENV_NAME.match(prefix + key):
                    env[prefix + key] = str(value)
        elif source.get("secretRef"):
            ref = source["secretRef"]
            obj = await fetch("secrets", ref.get("name", ""))
            if obj is None:
                if ref.get("optional"):
                    continue
                raise EnvError(f'secret "{ref.get("name", "")}" not found')
            for key, value in _secret_values(obj).items():
                if _VALID_ENV_NAME.match(prefix + key):
                    env[prefix + key] = value

    for var in container.get("env") or []:
        name = var.get("name")
        if not name:
            continue
        if "valueFrom" not in var or not var["valueFrom"]:
            env[name] = expand(str(var.get("value") or ""), env)
            continue
        source = var["valueFrom"]
        if source.get("fieldRef"):
            env[name] = field_ref_value(pod, source["fieldRef"].get("fieldPath", ""))
        elif source.get("resourceFieldRef"):
            ref = source["resourceFieldRef"]
            target = container
            if ref.get("containerName"):
                target = next((c for c in _all_containers(pod) if c.get("name") == ref["containerName"]), None)
                if target is None:
                    raise EnvError(f'resourceFieldRef: no container named "{ref["containerName"]}"')
            env[name] = resource_field_value(target, ref, node_allocatable or {})
        elif source.get("configMapKeyRef"):
            ref = source["configMapKeyRef"]
            obj = await fetch("configmaps", ref.get("name", ""))
            data = (obj or {}).get("data") or {}
            if obj is None or ref.get("key") not in data:
                if ref.get("optional"):
                    continue
                if obj is None:
                    raise EnvError(f'configmap "{ref.get("name", "")}" not found')
                raise EnvError(f'couldn\'t find key {ref.get("key")} in ConfigMap {ns}/{ref.get("name")}')
            env[name] = str(data[ref["key"]])
        elif source.get("secretKeyRef"):
            ref = source["secretKeyRef"]
            obj = await fetch("secrets", ref.get("name", ""))
            values = _secret_values(obj) if obj is not None else {}
            if obj is None or ref.get("key") not in values:
                if ref.get("optional"):
                    continue
                if obj is None:
                    raise EnvError(f'secret "{ref.get("name", "")}" not found')
                raise EnvError(f'couldn\'t find key {ref.get("key")} in Secret {ns}/{ref.get("name")}')
            env[name] = values[ref["key"]]
    return env


def _secret_values(secret: Mapping[str, Any]) -> dict[str, str]:
    out = {k: str(v) for k, v in (secret.get("stringData") or {}).items()}
    for key, value in (secret.get("data") or {}).items():
        try:
            out[key] = base64.b64decode(value).decode("utf-8", "replace")
        except (ValueError, TypeError):
            out[key] = str(value)
    return out


def _all_containers(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    spec = pod.get("spec") or {}
    return [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]


def expand_command(container: Mapping[str, Any], env: Mapping[str, str]) -> tuple[list[str], list[str]]:
    return ([expand(str(a), env) for a in container.get("command") or []],
            [expand(str(a), env) for a in container.get("args") or []])
