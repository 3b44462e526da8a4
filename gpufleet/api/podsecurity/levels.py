"""Pod Security levels and versions, and the namespace labels that choose them."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

PRIVILEGED, BASELINE, RESTRICTED = "privileged", "baseline", "restricted"
LEVELS = (PRIVILEGED, BASELINE, RESTRICTED)

LABEL_PREFIX = "pod-security.kubernetes.io/"
ENFORCE_LABEL = LABEL_PREFIX + "enforce"
ENFORCE_VERSION_LABEL = LABEL_PREFIX + "enforce-version"
AUDIT_LABEL = LABEL_PREFIX + "audit"
AUDIT_VERSION_LABEL = LABEL_PREFIX + "audit-version"
WARN_LABEL = LABEL_PREFIX + "warn"
WARN_VERSION_LABEL = LABEL_PREFIX + "warn-version"

# Audit annotation keys (under LABEL_PREFIX), as kube-apiserver records them.
AUDIT_VIOLATIONS = "audit-violations"
ENFORCE_POLICY = "enforce-policy"
EXEMPT = "exempt"

_LEVEL_MESSAGE = "must be one of " + ", ".join(LEVELS)
_VERSION_MESSAGE = 'must be "latest" or "v1.x"'
_VERSION = re.compile(r"^v1\.([0-9]|[1-9][0-9]*)$")


class PolicyValueError(ValueError):
    """A level or version that is not one; the message is Kubernetes' (``must be one of ...``)."""


@dataclass(frozen=True, order=True)
class Version:
    """A policy version: ``v1.<minor>``, or ``latest`` (minor None), newer than any other."""

    minor: int | None = None

    @property
    def latest(self) -> bool:
        return self.minor is None

    def __str__(self) -> str:
        return "latest" if self.minor is None else f"v1.{self.minor}"

    def older(self, other: Version) -> bool:
        if self.minor is None:
            return False
        return other.minor is None or self.minor < other.minor


LATEST = Version()


def parse_level(value: str) -> str:
    if value not in LEVELS:
        raise PolicyValueError(_LEVEL_MESSAGE)
    return value


def parse_version(value: str) -> Version:
    if value == "latest":
        return LATEST
    m = _VERSION.match(value) if isinstance(value, str) else None
    if m is None:
        raise PolicyValueError(_VERSION_MESSAGE)
    return Version(int(m.group(1)))


@dataclass(frozen=True)
class LevelVersion:
    level: str
    version: Version = LATEST

    def __str__(self) -> str:
        return f"{self.level}:{self.version}"

    @classmethod
    def parse(cls, text: str) -> LevelVersion:
        """``baseline`` or ``baseline:v1.30`` (the form this module prints)."""
        level, _, version = text.partition(":")
        return cls(parse_level(level), parse_version(version) if version else LATEST)


@dataclass(frozen=True)
class Policy:
    enforce: LevelVersion = LevelVersion(PRIVILEGED)
    audit: LevelVersion = LevelVersion(PRIVILEGED)
    warn: LevelVersion = LevelVersion(PRIVILEGED)

    def fully_privileged(self) -> bool:
        return PRIVILEGED == self.enforce.level == self.audit.level == self.warn.level

    def equivalent(self, other: Policy) -> bool:
        def same(a: LevelVersion, b: LevelVersion) -> bool:
            return (a.level == PRIVILEGED and b.level == PRIVILEGED) or a == b

        return same(self.enforce, other.enforce) and same(self.audit, other.audit) and same(self.warn, other.warn)


@dataclass(frozen=True)
class LabelError:
    """A namespace label that does not parse: ``metadata.labels[<label>]: Invalid value: ...``."""

    label: str
    value: str
    message: str

    @property
    def field(self) -> str:
        return f"metadata.labels[{self.label}]"

    def __str__(self) -> str:
        return f'{self.field}: Invalid value: "{self.value}": {self.message}'


def compare_levels(a: str, b: str) -> int:
    return LEVELS.index(a) - LEVELS.index(b) if a != b else 0


def policy_to_evaluate(labels: Mapping[str, str] | None, defaults: Policy) -> tuple[Policy, list[LabelError]]:
    """The policy a namespace's labels ask for, over ``defaults``, and the labels that are
    wrong. As Kubernetes: a bad enforce level enforces ``restricted`` (fails closed), bad
    audit and warn levels are ``privileged`` (fail open), a bad version is ``latest``; a warn
    level left unset follows a stricter enforce level (and its version, unless warn-version
    is set)."""
    errors: list[LabelError] = []
    if not labels:
        return defaults, errors
    enforce, audit, warn = defaults.enforce, defaults.audit, defaults.warn

    def level(label: str, on_error: str) -> str | None:
        if label not in labels:
            return None
        try:
            return parse_level(labels[label])
        except PolicyValueError as e:
            errors.append(LabelError(label, labels[label], str(e)))
            return on_error

    def version(label: str) -> Version | None:
        if label not in labels:
            return None
        try:
            return parse_version(labels[label])
        except PolicyValueError as e:
            errors.append(LabelError(label, labels[label], str(e)))
            return LATEST

    enforce_level = level(ENFORCE_LABEL, RESTRICTED)
    has_enforce_level = enforce_level is not None and labels[ENFORCE_LABEL] in LEVELS
    if enforce_level is not None:
        enforce = LevelVersion(enforce_level, enforce.version)
    if (v := version(ENFORCE_VERSION_LABEL)) is not None:
        enforce = LevelVersion(enforce.level, v)
    if (lvl := level(AUDIT_LABEL, PRIVILEGED)) is not None:
        audit = LevelVersion(lvl, audit.version)
    if (v := version(AUDIT_VERSION_LABEL)) is not None:
        audit = LevelVersion(audit.level, v)
    has_warn_level = WARN_LABEL in labels
    if (lvl := level(WARN_LABEL, PRIVILEGED)) is not None:
        warn = LevelVersion(lvl, warn.version)
    has_warn_version = WARN_VERSION_LABEL in labels
    if (v := version(WARN_VERSION_LABEL)) is not None:
        warn = LevelVersion(warn.level, v)
    if not has_warn_level and has_enforce_level and compare_levels(enforce.level, warn.level) > 0:
        warn = LevelVersion(enforce.level, warn.version if has_warn_version else enforce.version)
    return Policy(enforce, audit, warn), errors
