"""Audit logging as kube-apiserver's: an ``audit.k8s.io/v1`` Policy says, per request, at which
level (None, Metadata, Request, RequestResponse) it is recorded, and each recorded stage of it
(RequestReceived, ResponseStarted for streams, ResponseComplete) is an ``audit.k8s.io/v1``
Event, one JSON object per line, in the file given by ``--audit-log-path``.

The first rule of the policy that matches decides; a request no rule matches is not logged.
Metadata holds who, what, when, from where and the answer's status, never a body, so a
Secret's data is in the log only at Request or RequestResponse level.

Lines are written by a thread of their own, in batches, from a bounded buffer: a request never
waits on the disk. When the buffer is full (the disk stalled) the event is dropped and counted in
``apiserver_audit_error_total{plugin="log"}``, as kube-apiserver's batching backend does.
"""

from __future__ import annotations

import collections
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpufleet.apiserver.auth.rbac import Attributes

log = logging.getLogger("gpufleet.apiserver.audit")

LEVELS = ("None", "Metadata", "Request", "RequestResponse")
STAGES = ("RequestReceived", "ResponseStarted", "ResponseComplete", "Panic")
_API_VERSIONS = ("audit.k8s.io/v1",)


class PolicyError(ValueError):
    """A policy file that cannot be used; the message names the field."""


@dataclass(frozen=True)
class GroupResources:
    group: str = ""
    resources: tuple[str, ...] = ()
    resource_names: tuple[str, ...] = ()


@dataclass(frozen=True)
class PolicyRule:
    level: str
    users: tuple[str, ...] = ()
    user_groups: tuple[str, ...] = ()
    verbs: tuple[str, ...] = ()
    resources: tuple[GroupResources, ...] = ()
    namespaces: tuple[str, ...] = ()
    non_resource_urls: tuple[str, ...] = ()
    omit_stages: tuple[str, ...] = ()
    omit_managed_fields: bool | None = None


@dataclass(frozen=True)
class Decision:
    """What the policy says of one request."""

    level: str = "None"
    omit_stages: frozenset[str] = frozenset()
    omit_managed_fields: bool = False

    @property
    def logged(self) -> bool:
        return self.level != "None"

    def at_least(self, level: str) -> bool:
        return LEVELS.index(self.level) >= LEVELS.index(level)


@dataclass(frozen=True)
class Policy:
    rules: tuple[PolicyRule, ...] = ()
    omit_stages: tuple[str, ...] = ()
    omit_managed_fields: bool = False

    def decide(self, user_name: str | None, groups: list[str], attrs: Attributes) -> Decision:
        """The first matching rule's level and the stages to leave out (the policy's and the
        rule's); None when no rule matches."""
        for rule in self.rules:
            if rule_matches(rule, user_name, groups, attrs):
                omit = rule.omit_managed_fields if rule.omit_managed_fields is not None else self.omit_managed_fields
                return Decision(rule.level, frozenset(self.omit_stages) | frozenset(rule.omit_stages), omit)
        return Decision()


def _path_matches(path: str, spec: str) -> bool:
    return spec == "*" or spec == path or (spec.endswith("*") and path.startswith(spec.rstrip("*")))


def _resource_matches(rule: PolicyRule, attrs: Attributes) -> bool:
    if not attrs.is_resource:
        return False
    if rule.namespaces and attrs.namespace not in rule.namespaces:  # "" names the cluster-scoped ones
        return False
    if not rule.resources:
        return True
    combined = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
    for gr in rule.resources:
        if gr.group != attrs.group:
            continue
        if not gr.resources:
            return True
        if gr.resource_names and attrs.name not in gr.resource_names:
            continue
        for res in gr.resources:
            if res in ("*", combined):
                return True
            if attrs.subresource and res.startswith("*/") and res[2:] == attrs.subresource:
                return True
            if res.endswith("/*") and res[:-2] == attrs.resource:
                return True
    return False


def rule_matches(rule: PolicyRule, user_name: str | None, groups: list[str], attrs: Attributes) -> bool:
    """Kubernetes' policy rule matching (k8s.io/apiserver/pkg/audit/policy/checker.go)."""
    if rule.users and (user_name is None or user_name not in rule.users):
        return False
    if rule.user_groups and not any(g in rule.user_groups for g in groups):
        return False
    if rule.verbs and attrs.verb not in rule.verbs:
        return False
    if rule.namespaces or rule.resources:
        return _resource_matches(rule, attrs)
    if rule.non_resource_urls:
        return not attrs.is_resource and any(_path_matches(attrs.path, u) for u in rule.non_resource_urls)
    return True


# ---------------------------------------------------------------------------- the policy file


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PolicyError(f"{where}: Invalid value: must be a list of strings")
    return tuple(value)


def _stages(value: Any, where: str) -> tuple[str, ...]:
    stages = _strings(value, where)
    for i, s in enumerate(stages):
        if s not in STAGES:
            raise PolicyError(f'{where}[{i}]: Unsupported value: "{s}": supported values: '
                              + ", ".join(f'"{x}"' for x in STAGES))
    return stages


def parse_policy(doc: Any) -> Policy:
    if not isinstance(doc, dict):
        raise PolicyError("the policy must be a YAML or JSON object (kind: Policy, apiVersion: audit.k8s.io/v1)")
    if doc.get("kind") != "Policy":
        raise PolicyError(f'kind: Invalid value: "{doc.get("kind")}": must be "Policy"')
    if doc.get("apiVersion") not in _API_VERSIONS:
        raise PolicyError(f'apiVersion: Unsupported value: "{doc.get("apiVersion")}": supported values: '
                          + ", ".join(f'"{v}"' for v in _API_VERSIONS))
    raw_rules = doc.get("rules")
    if not isinstance(raw_rules, list) or not raw_rules:
        raise PolicyError("rules: Required value: a policy needs at least one rule (e.g. - level: Metadata)")
    rules = []
    for i, r in enumerate(raw_rules):
        where = f"rules[{i}]"
        if not isinstance(r, dict):
            raise PolicyError(f"{where}: Invalid value: must be an object with a level")
        level = r.get("level")
        if level not in LEVELS:
            raise PolicyError(f'{where}.level: Unsupported value: "{level}": supported values: '
                              + ", ".join(f'"{x}"' for x in LEVELS))
        resources = []
        for j, gr in enumerate(r.get("resources") or []):
            w = f"{where}.resources[{j}]"
            if not isinstance(gr, dict):
                raise PolicyError(f"{w}: Invalid value: must be an object with group, resources, resourceNames")
            group = gr.get("group", "")
            if not isinstance(group, str):
                raise PolicyError(f"{w}.group: Invalid value: must be a string")
            names = _strings(gr.get("resourceNames"), f"{w}.resourceNames")
            res = _strings(gr.get("resources"), f"{w}.resources")
            for k, name in enumerate(res):
                if name.count("/") > 1 or name == "*/*":
                    raise PolicyError(f'{w}.resources[{k}]: Invalid value: "{name}": give a resource, '
                                      'resource/subresource, */subresource, resource/* or *')
            resources.append(GroupResources(group, res, names))
        urls = _strings(r.get("nonResourceURLs"), f"{where}.nonResourceURLs")
        if urls and (resources or r.get("namespaces")):
            raise PolicyError(f"{where}.nonResourceURLs: Invalid value: rules cannot apply to both regular "
                              "resources and non-resource URLs")
        for k, u in enumerate(urls):
            if not u.startswith("/") and u != "*":
                raise PolicyError(f'{where}.nonResourceURLs[{k}]: Invalid value: "{u}": must start with "/"')
        omit_mf = r.get("omitManagedFields")
        if omit_mf is not None and not isinstance(omit_mf, bool):
            raise PolicyError(f"{where}.omitManagedFields: Invalid value: must be true or false")
        rules.append(PolicyRule(
            level=level, users=_strings(r.get("users"), f"{where}.users"),
            user_groups=_strings(r.get("userGroups"), f"{where}.userGroups"),
            verbs=_strings(r.get("verbs"), f"{where}.verbs"), resources=tuple(resources),
            namespaces=_strings(r.get("namespaces"), f"{where}.namespaces"), non_resource_urls=urls,
            omit_stages=_stages(r.get("omitStages"), f"{where}.omitStages"), omit_managed_fields=omit_mf))
    omit_mf = doc.get("omitManagedFields", False)
    if not isinstance(omit_mf, bool):
        raise PolicyError("omitManagedFields: Invalid value: must be true or false")
    return Policy(tuple(rules), _stages(doc.get("omitStages"), "omitStages"), omit_mf)


def load_policy(path: Path) -> Policy:
    try:
        text = path.read_text()
    except OSError as e:
        raise PolicyError(f"cannot read {path}: {e.strerror}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise PolicyError(f"{path} is not YAML: {e}") from None
    try:
        return parse_policy(doc)
    except PolicyError as e:
        raise PolicyError(f"{path}: {e}") from None


# ---------------------------------------------------------------------------- the log file


@dataclass
class LogOptions:
    """kube-apiserver's --audit-log-maxsize (MiB before the file is rotated, 0: never),
    --audit-log-maxbackup (rotated files kept, 0: all) and --audit-log-maxage (days a rotated
    file is kept, 0: no limit)."""

    max_size_mb: int = 0
    max_backups: int = 0
    max_age_days: int = 0


class AuditLog:
    """Appends lines to ``path`` (``-``: standard output) from a thread of its own. The request
    side only appends to a buffer; the thread takes what gathered, at most every
    ``LINGER`` seconds, and writes it in one go."""

    QUEUE_SIZE = 10000
    LINGER = 0.01

    def __init__(self, path: str, options: LogOptions | None = None, on_drop: Any = None) -> None:
        self.path = path
        self.options = options or LogOptions()
        self.on_drop = on_drop
        self._pending: collections.deque[bytes] = collections.deque()
        self._wake = threading.Event()
        self._closing = False
        self._fd: int | None = None
        self._size = 0
        self._open()
        self._thread = threading.Thread(target=self._run, name="audit-log", daemon=True)
        self._thread.start()

    def _open(self) -> None:
        if self.path == "-":
            self._fd = sys.stdout.fileno()
            return
        p = Path(self.path)
        p.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.fchmod(self._fd, 0o600)  # also a file an earlier run or a loose umask left readable
        self._size = os.fstat(self._fd).st_size

    def write(self, line: bytes) -> bool:
        """Queue one line (without its newline); False when it had to be dropped."""
        if len(self._pending) >= self.QUEUE_SIZE or self._closing:
            if self.on_drop is not None:
                self.on_drop()
            return False
        self._pending.append(line)
        if not self._wake.is_set():
            self._wake.set()
        return True

    def _run(self) -> None:
        while True:
            self._wake.wait()
            if not self._closing:
                time.sleep(self.LINGER)  # let a batch gather: one wake-up and one write for many lines
            self._wake.clear()
            batch = []
            while self._pending:
                batch.append(self._pending.popleft())
            if batch:
                self._write(batch)
            if self._closing and not self._pending:
                return

    def _write(self, lines: list[bytes]) -> None:
        limit = self.options.max_size_mb * 1024 * 1024 if self.path != "-" else 0
        try:
            chunk: list[bytes] = []
            size = 0
            for line in lines:
                data = line + b"\n"
                if limit and self._size + size and self._size + size + len(data) > limit:
                    self._flush(chunk)
                    chunk, size = [], 0
                    self._rotate()
                chunk.append(data)
                size += len(data)
            self._flush(chunk)
        except OSError as e:
            log.error("audit log %s: %s", self.path, e)
            if self.on_drop is not None:
                for _ in lines:
                    self.on_drop()

    def _flush(self, chunk: list[bytes]) -> None:
        data = b"".join(chunk)
        assert self._fd is not None
        while data:
            n = os.write(self._fd, data)
            self._size += n
            data = data[n:]

    def _rotate(self) -> None:
        """As kube-apiserver's (lumberjack): ``audit.log`` becomes
        ``audit-2006-01-02T15-04-05.000.log`` and a new ``audit.log`` is started."""
        assert self._fd is not None
        os.close(self._fd)
        p = Path(self.path)
        now = time.time()
        stamp = time.strftime("%Y-%m-%dT%H-%M-%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}"
        target, n = p.with_name(f"{p.stem}-{stamp}{p.suffix}"), 0
        while target.exists():  # two rotations within a millisecond
            n += 1
            target = p.with_name(f"{p.stem}-{stamp}-{n}{p.suffix}")
        os.replace(p, target)
        self._open()
        backups = sorted(p.parent.glob(f"{p.stem}-*{p.suffix}"), key=lambda b: b.stat().st_mtime, reverse=True)
        for i, b in enumerate(backups):
            too_many = self.options.max_backups and i >= self.options.max_backups
            too_old = self.options.max_age_days and now - b.stat().st_mtime > self.options.max_age_days * 86400
            if too_many or too_old:
                b.unlink(missing_ok=True)

    def close(self) -> None:
        if not self._thread.is_alive():
            return
        self._closing = True
        self._wake.set()
        self._thread.join(timeout=10)
        if self._fd is not None and self.path != "-":
            os.close(self._fd)
            self._fd = None


@dataclass
class Auditor:
    policy: Policy
    log: AuditLog
    extra: dict[str, Any] = field(default_factory=dict)

    def close(self) -> None:
        self.log.close()
