"""GPU health: the signals a node agent reads from its GPUs, the policy that says what each one
means (ignore, warn, drain the GPU, drain the node), and the names every component shares for
what follows (the node condition, taint and annotations). Pure functions; docs/gpu-health.md
is the user's page.

The default XID actions follow NVIDIA's XID catalog (docs.nvidia.com/deploy/xid-errors): codes
whose resolution is RESTART_APP (the application's fault) are ignored, as the Kubernetes NVIDIA
device plugin does; codes whose resolution is RESET_GPU or RESTART_BM drain the GPU; codes
that report a corrected or contained problem worth watching warn. A code the table does not
know warns: an unknown number is not evidence enough to stop somebody's job.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpufleet.api.gpu import GPU_UNHEALTHY_REASON

# -- names --------------------------------------------------------------------------------------

GPU_HEALTHY_CONDITION = "GPUHealthy"
GPU_UNHEALTHY_TAINT = "gpufleet.io/gpu-unhealthy"
# Per-GPU state and bounded history, written by the agent (JSON, by index).
GPU_HEALTH_ANNOTATION = "gpufleet.io/gpu-health"
# GPU indices an operator took out of service ("0,3"); the agent adds a GPU it holds out after
# repeated failures, and `gpufleet uncordon --gpu` removes it again.
GPU_CORDON_ANNOTATION = "gpufleet.io/gpu-cordon"
HISTORY_LIMIT = 10

# Actions, mildest first.
IGNORE = "ignore"
WARN = "warn"
DRAIN_GPU = "drain-gpu"
DRAIN_NODE = "drain-node"
ACTIONS = (IGNORE, WARN, DRAIN_GPU, DRAIN_NODE)
_RANK = {a: n for n, a in enumerate(ACTIONS)}

# Signal kinds.
XID = "xid"
ECC_VOLATILE = "ecc-volatile-uncorrected"
ECC_AGGREGATE = "ecc-aggregate-uncorrected"
REMAPPED_ROWS_FAILED = "remapped-rows-failed"
REMAPPED_ROWS_PENDING = "remapped-rows-pending"
RETIRED_PAGES_PENDING = "retired-pages-pending"
NVLINK_ERRORS = "nvlink-errors"
THROTTLE = "throttle"
GPU_LOST = "gpu-lost"
DECLARED_UNHEALTHY = "declared-unhealthy"
SIGNAL_KINDS = (XID, ECC_VOLATILE, ECC_AGGREGATE, REMAPPED_ROWS_FAILED, REMAPPED_ROWS_PENDING,
                RETIRED_PAGES_PENDING, NVLINK_ERRORS, THROTTLE, GPU_LOST, DECLARED_UNHEALTHY)

# XID -> action, with the catalog's meaning.
DEFAULT_XID_ACTIONS: dict[int, str] = {
    13: IGNORE,     # graphics engine exception: an application fault
    31: IGNORE,     # GPU memory page fault: an illegal address in the application
    43: IGNORE,     # GPU stopped processing: the application's channel was reset
    45: IGNORE,     # preemptive cleanup, after an earlier error or a killed process
    68: IGNORE,     # NVDEC/video exception in user code
    109: IGNORE,    # context switch timeout caused by the application
    8: WARN,        # GPU stopped processing (restart the application)
    92: WARN,       # high single-bit ECC error rate: corrected, but the memory is degrading
    48: DRAIN_GPU,  # double-bit ECC error
    61: DRAIN_GPU,  # internal micro-controller breakpoint/warning
    62: DRAIN_GPU,  # internal micro-controller halt
    63: DRAIN_GPU,  # row remapping event / page retirement recorded: reset to apply
    64: DRAIN_GPU,  # row remapping failure
    74: DRAIN_GPU,  # NVLink error
    79: DRAIN_GPU,  # GPU has fallen off the bus
    94: DRAIN_GPU,  # contained ECC error: the memory is failing
    95: DRAIN_GPU,  # uncontained ECC error
    119: DRAIN_GPU,  # GSP RPC timeout
    120: DRAIN_GPU,  # GSP error
    140: DRAIN_GPU,  # unrecovered ECC error
    154: DRAIN_GPU,  # the driver asks for a GPU reset (or more) to recover
}


@dataclass(frozen=True)
class Signal:
    """One thing wrong (or worth saying) about a GPU. ``value``: the XID, the error count, the
    throttle reason bits; ``detail``: words for people ("thermal", the NVML error)."""

    kind: str
    value: int = 0
    detail: str = ""

    def describe(self) -> str:
        if self.kind == XID:
            return f"XID {self.value}"
        if self.kind == ECC_VOLATILE:
            return f"{self.value} uncorrected ECC error(s) since the driver loaded"
        if self.kind == ECC_AGGREGATE:
            return f"{self.value} uncorrected ECC error(s) in the GPU's lifetime"
        if self.kind == REMAPPED_ROWS_FAILED:
            return "row remapping failed"
        if self.kind == REMAPPED_ROWS_PENDING:
            return "remapped rows pending a GPU reset"
        if self.kind == RETIRED_PAGES_PENDING:
            return "retired pages pending a GPU reset"
        if self.kind == NVLINK_ERRORS:
            return f"{self.value} NVLink error(s)"
        if self.kind == THROTTLE:
            return f"clocks throttled ({self.detail or 'thermal'})"
        if self.kind == GPU_LOST:
            return f"GPU lost{': ' + self.detail if self.detail else ''}"
        if self.kind == DECLARED_UNHEALTHY:
            return f"declared unhealthy{': ' + self.detail if self.detail else ''}"
        return f"{self.kind} {self.value}"

    def reason(self) -> str:
        """The signal as a condition reason (CamelCase, no spaces)."""
        return {XID: f"XID{self.value}", ECC_VOLATILE: "ECCUncorrectable", ECC_AGGREGATE: "ECCUncorrectable",
                REMAPPED_ROWS_FAILED: "RowRemapFailure", REMAPPED_ROWS_PENDING: "RowRemapPending",
                RETIRED_PAGES_PENDING: "PageRetirementPending", NVLINK_ERRORS: "NVLinkErrors",
                THROTTLE: "ThermalThrottle", GPU_LOST: "GPULost",
                DECLARED_UNHEALTHY: "DeclaredUnhealthy"}.get(self.kind, GPU_UNHEALTHY_REASON)


@dataclass(frozen=True)
class Policy:
    """What each signal means. ``xid`` overrides DEFAULT_XID_ACTIONS; ``kinds`` the action of a
    non-XID signal kind; NVLink errors drain the GPU from ``nvlink_threshold`` on and warn below."""

    xid: Mapping[int, str] = field(default_factory=dict)
    kinds: Mapping[str, str] = field(default_factory=dict)
    unknown_xid: str = WARN
    nvlink_threshold: int = 100


DEFAULT_KIND_ACTIONS: dict[str, str] = {
    ECC_VOLATILE: DRAIN_GPU,
    ECC_AGGREGATE: WARN,
    REMAPPED_ROWS_FAILED: DRAIN_GPU,
    REMAPPED_ROWS_PENDING: WARN,
    RETIRED_PAGES_PENDING: WARN,
    THROTTLE: WARN,
    GPU_LOST: DRAIN_GPU,
    DECLARED_UNHEALTHY: DRAIN_GPU,
}

DEFAULT_POLICY = Policy()


def action_for(signal: Signal, policy: Policy = DEFAULT_POLICY) -> str:
    """The policy table: what ``signal`` asks for."""
    if signal.kind == XID:
        return policy.xid.get(signal.value) or DEFAULT_XID_ACTIONS.get(signal.value) or policy.unknown_xid
    if signal.kind in policy.kinds:
        return policy.kinds[signal.kind]
    if signal.kind == NVLINK_ERRORS:
        if signal.value <= 0:
            return IGNORE
        return DRAIN_GPU if signal.value >= policy.nvlink_threshold else WARN
    if signal.kind in (ECC_VOLATILE, ECC_AGGREGATE) and signal.value <= 0:
        return IGNORE
    return DEFAULT_KIND_ACTIONS.get(signal.kind, WARN)


def worst(signals: Iterable[Signal], policy: Policy = DEFAULT_POLICY) -> tuple[str, Signal | None]:
    """The strongest action among ``signals`` and the signal asking for it."""
    best: tuple[str, Signal | None] = (IGNORE, None)
    for s in signals:
        a = action_for(s, policy)
        if _RANK[a] > _RANK[best[0]]:
            best = (a, s)
    return best


def throttle_signal(reasons: Iterable[str]) -> Signal | None:
    """The throttle signal for these reasons ("hw-thermal", ...); None for none."""
    words = sorted({str(r) for r in reasons if r})
    return Signal(THROTTLE, len(words), ",".join(words)) if words else None


def drains(action: str) -> bool:
    return action in (DRAIN_GPU, DRAIN_NODE)


def parse_policy(text: str | None) -> Policy:
    """``--gpu-health-policy``: comma-separated ``xid:79=drain-node``, ``xid:13=warn``,
    ``<kind>=<action>`` (``throttle=ignore``), ``xid:unknown=ignore``, ``nvlink-threshold=50``.
    Raises ValueError naming the entry and what is allowed."""
    policy = DEFAULT_POLICY
    xids: dict[int, str] = {}
    kinds: dict[str, str] = {}
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        key, eq, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not eq:
            raise ValueError(f"gpu health policy entry {part!r} is not key=value")
        if key == "nvlink-threshold":
            if not value.isdigit() or int(value) <= 0:
                raise ValueError(f"gpu health policy entry {part!r}: nvlink-threshold must be a positive integer")
            policy = replace(policy, nvlink_threshold=int(value))
            continue
        if value not in ACTIONS:
            raise ValueError(f"gpu health policy entry {part!r}: the action must be one of {', '.join(ACTIONS)}")
        if key == "xid:unknown":
            policy = replace(policy, unknown_xid=value)
        elif key.startswith("xid:"):
            code = key[4:]
            if not code.isdigit():
                raise ValueError(f"gpu health policy entry {part!r}: an XID must be a number (xid:79=drain-gpu)")
            xids[int(code)] = value
        elif key in SIGNAL_KINDS and key != XID:
            kinds[key] = value
        else:
            raise ValueError(f"gpu health policy entry {part!r}: the key must be xid:<number>, xid:unknown, "
                             f"nvlink-threshold or one of {', '.join(k for k in SIGNAL_KINDS if k != XID)}")
    return replace(policy, xid=xids, kinds=kinds)


# -- the node's record ------------------------------------------------------------------------


def parse_cordon(text: str | None) -> set[int]:
    out: set[int] = set()
    for part in (text or "").split(","):
        part = part.strip()
        if part.isdigit():
            out.add(int(part))
    return out


def format_cordon(indices: Iterable[int]) -> str:
    return ",".join(str(i) for i in sorted(set(indices)))


def parse_health_annotation(text: str | None) -> dict[str, Any]:
    """The ``gpufleet.io/gpu-health`` annotation by index (as a string); {} when unreadable."""
    try:
        raw = json.loads(text or "{}")
    except ValueError:
        return {}
    return raw if isinstance(raw, dict) else {}


def with_unhealthy_taint(taints: Sequence[Mapping[str, Any]], present: bool) -> list[dict[str, Any]]:
    """The node's taints with ``gpufleet.io/gpu-unhealthy:NoSchedule`` added or removed."""
    rest = [dict(t) for t in taints if t.get("key") != GPU_UNHEALTHY_TAINT]
    if present:
        rest.append({"key": GPU_UNHEALTHY_TAINT, "effect": "NoSchedule"})
    return rest


def disruption_condition(message: str, now_rfc3339: str) -> dict[str, Any]:
    """The pod condition saying the pod was stopped because its GPU failed (Kubernetes'
    DisruptionTarget, reason GPUUnhealthy)."""
    return {"type": "DisruptionTarget", "status": "True", "reason": GPU_UNHEALTHY_REASON,
            "message": message, "lastProbeTime": None, "lastTransitionTime": now_rfc3339}
