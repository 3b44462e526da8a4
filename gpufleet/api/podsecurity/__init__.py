"""The Pod Security Standards as Kubernetes' pod-security-admission checks them.

Pure functions of a pod's metadata and spec, as the JSON dicts the API stores: no I/O, no
server. The admission plugin (apiserver/admission/podsecurity.py) reads the namespace
labels and the configuration and decides what to do with the results.

Levels: ``privileged`` (no checks), ``baseline`` and ``restricted`` (baseline plus the
restricted checks, some of which replace a baseline check with a stricter one). Each check
has versions: a policy version ``v1.N`` runs, for every check, the newest revision of it
whose minimum version is at most 1.N; ``latest`` (and any version newer than the newest
revision known here) runs the newest revision of every check. The table follows
pod-security-admission as of Kubernetes' development branch for v1.37, so ``latest`` means
the 1.37 policy. Reasons and details are Kubernetes' words, and a pod that fails several
checks is described in Kubernetes' order (baseline checks, then restricted ones, each by
check id), e.g. ``host namespaces (hostPID=true), privileged (container "c" must not set
securityContext.privileged=true)``.
"""

from gpufleet.api.podsecurity.checks import CheckFn, CheckResult, Obj, forbidden_detail, forbidden_reason
from gpufleet.api.podsecurity.levels import (
    AUDIT_LABEL,
    AUDIT_VERSION_LABEL,
    AUDIT_VIOLATIONS,
    BASELINE,
    ENFORCE_LABEL,
    ENFORCE_POLICY,
    ENFORCE_VERSION_LABEL,
    EXEMPT,
    LABEL_PREFIX,
    LATEST,
    LEVELS,
    PRIVILEGED,
    RESTRICTED,
    WARN_LABEL,
    WARN_VERSION_LABEL,
    LabelError,
    LevelVersion,
    Policy,
    PolicyValueError,
    Version,
    compare_levels,
    parse_level,
    parse_version,
    policy_to_evaluate,
)
from gpufleet.api.podsecurity.registry import CHECKS, MAX_VERSION, Check, checks_for, evaluate_pod

__all__ = [
    "AUDIT_LABEL",
    "AUDIT_VERSION_LABEL",
    "AUDIT_VIOLATIONS",
    "BASELINE",
    "CHECKS",
    "Check",
    "CheckFn",
    "CheckResult",
    "ENFORCE_LABEL",
    "ENFORCE_POLICY",
    "ENFORCE_VERSION_LABEL",
    "EXEMPT",
    "LABEL_PREFIX",
    "LATEST",
    "LEVELS",
    "LabelError",
    "LevelVersion",
    "MAX_VERSION",
    "Obj",
    "PRIVILEGED",
    "Policy",
    "PolicyValueError",
    "RESTRICTED",
    "Version",
    "WARN_LABEL",
    "WARN_VERSION_LABEL",
    "checks_for",
    "compare_levels",
    "evaluate_pod",
    "forbidden_detail",
    "forbidden_reason",
    "parse_level",
    "parse_version",
    "policy_to_evaluate",
]
