"""Each GPU's health state on the agent: fenced or not, why, its recent failures and history.

A pure state machine, no I/O: ``observe`` takes what the device plugin reported this poll
(signals per GPU, the operator's cordon set) and returns what changed; ``validated`` takes a
validation result. The agent (gpuhealthloop.py) acts on the changes: stops pods, writes the
node, records Events, runs validations.

States of a GPU:

- healthy: handed out.
- fenced: a signal the policy drains for (or an operator's cordon) took it out; it returns
  once the drain-level signals are gone and a validation passes.
- held: fenced, and it failed ``failure_limit`` times within ``failure_window`` seconds (fences
  and failed validations both count): it stays out until an operator uncordons it.
"""

from __future__ import annotations

import json
from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufleet.api.gpuhealth import (
    DRAIN_NODE,
    WARN,
    XID,
    Policy,
    Signal,
    action_for,
    drains,
)
from gpufleet.utils.clock import rfc3339

HEALTHY_STATE = "Healthy"
FENCED_STATE = "Fenced"
HELD_STATE = "Held"
CORDONED_STATE = "Cordoned"
OPERATOR_CORDON = "OperatorCordon"
REPEATED_FAILURES = "RepeatedFailures"


@dataclass(frozen=True)
class Change:
    """``kind``: fence (stop its pod when ``evict``), warn, held, returned, validation-failed."""
    kind: str
    index: int
    message: str
    signal: Signal | None = None
    evict: bool = False


@dataclass
class GPUHealthState:
    index: int
    uuid: str = ""
    fenced: bool = False
    held: bool = False
    cordoned: bool = False
    # Why it is out: the signal, and its words.
    signal: Signal | None = None
    reason: str = ""
    message: str = ""
    since: float = 0.0
    failures: list[float] = field(default_factory=list)
    next_validation: float = 0.0
    validating: bool = False
    # What the last poll reported, to count and tell each new signal once.
    current: frozenset[Signal] = frozenset()
    xid_counts: Counter[int] = field(default_factory=Counter)
    last_xid: int = 0
    values: dict[str, int] = field(default_factory=dict)
    history: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=10))
    # False after restore(): the first poll only learns what the device reports, so a signal
    # that fenced the GPU before the agent restarted is not counted as a new failure.
    primed: bool = True

    @property
    def state(self) -> str:
        if self.held:
            return HELD_STATE
        if self.fenced:
            return FENCED_STATE if self.signal is not None else CORDONED_STATE
        if self.cordoned:
            return CORDONED_STATE
        return HEALTHY_STATE

    @property
    def out(self) -> bool:
        return self.fenced or self.held or self.cordoned


class HealthTracker:
    def __init__(self, policy: Policy, *, failure_limit: int = 3, failure_window: float = 3600.0,
                 validation_backoff: float = 60.0) -> None:
        self.policy = policy
        self.failure_limit = failure_limit
        self.failure_window = failure_window
        self.validation_backoff = validation_backoff
        self.gpus: dict[int, GPUHealthState] = {}
        # Indices seen in the cordon annotation at the last poll: one that leaves it was
        # uncordoned by an operator.
        self._cordon_seen: set[int] = set()

    def state(self, index: int, uuid: str = "") -> GPUHealthState:
        st = self.gpus.get(index)
        if st is None:
            st = self.gpus[index] = GPUHealthState(index, uuid)
        if uuid:
            st.uuid = uuid
        return st

    def fenced(self) -> set[int]:
        return {i for i, s in self.gpus.items() if s.out}

    def held(self) -> set[int]:
        return {i for i, s in self.gpus.items() if s.held}

    def _note(self, st: GPUHealthState, now: float, event: str, message: str) -> None:
        st.history.append({"time": rfc3339(now), "event": event, "message": message})

    def _failure(self, st: GPUHealthState, now: float) -> bool:
        """Count a failure; True when it makes the GPU held."""
        st.failures = [t for t in st.failures if now - t < self.failure_window] + [now]
        if len(st.failures) >= self.failure_limit and not st.held:
            st.held = True
            return True
        return False

    def _who(self, st: GPUHealthState) -> str:
        return f"GPU {st.index}" + (f" ({st.uuid})" if st.uuid else "")

    def observe(self, signals: Mapping[int, Sequence[Signal]], uuids: Mapping[int, str],
                cordon: Iterable[int] | None, now: float) -> list[Change]:
        """``cordon``: the indices in the Node's cordon annotation; None when the Node is not
        known (the cordons stay as they were)."""
        out: list[Change] = []
        cordon = set(self._cordon_seen) if cordon is None else set(cordon)
        drain_node: Signal | None = None
        drain_node_index = -1
        for index in sorted(set(uuids) | set(signals)):
            st = self.state(index, uuids.get(index, ""))
            sigs = frozenset(signals.get(index, ()))
            new = sigs - st.current if st.primed else frozenset()
            st.current, st.primed = sigs, True
            for s in new:
                if s.kind == XID:
                    st.xid_counts[s.value] += 1
                    st.last_xid = s.value
            for s in sigs:
                if s.kind != XID:
                    st.values[s.kind] = s.value
            for kind in list(st.values):
                if not any(s.kind == kind for s in sigs):
                    st.values[kind] = 0
            draining = sorted((s for s in sigs if drains(action_for(s, self.policy))),
                              key=lambda s: (s.kind != XID, s.kind, s.value))
            for s in sorted(new, key=lambda s: (s.kind, s.value)):
                if action_for(s, self.policy) == WARN:
                    msg = f"{self._who(st)}: {s.describe()}"
                    self._note(st, now, "Warning", s.describe())
                    out.append(Change("warn", index, msg, s))
            fresh = [s for s in draining if s in new]
            if draining and (not st.fenced or st.signal is None or fresh):
                s = (fresh or draining)[0]
                if action_for(s, self.policy) == DRAIN_NODE and drain_node is None:
                    drain_node, drain_node_index = s, index
                out += self._fence(st, s, now)
            # Cordons.
            if index in cordon and not st.cordoned:
                st.cordoned = True
                if not st.held:
                    self._note(st, now, "Cordoned", "cordoned by an operator")
                    if not st.fenced:
                        st.fenced, st.signal, st.since = True, None, now
                        st.reason, st.message = OPERATOR_CORDON, f"{self._who(st)} cordoned by an operator"
                        out.append(Change("fence", index, st.message, None, evict=False))
            elif index not in cordon and index in self._cordon_seen:
                st.cordoned = False
                was_held = st.held
                st.held = False
                st.failures = []
                self._note(st, now, "Uncordoned", "uncordoned by an operator")
                if st.fenced and st.signal is None:
                    out += self._return(st, now, "uncordoned by an operator")
                elif was_held:
                    st.next_validation = now
            elif index not in cordon and st.cordoned and index not in self._cordon_seen:
                # Set here (held) but never seen in the annotation yet: still being written.
                pass
        if drain_node is not None:
            for index, st in sorted(self.gpus.items()):
                if index != drain_node_index and not st.fenced:
                    out += self._fence(st, drain_node, now, f"node drained for GPU {drain_node_index}: ")
        self._cordon_seen = cordon & set(self.gpus)
        return out

    def _fence(self, st: GPUHealthState, s: Signal, now: float, prefix: str = "") -> list[Change]:
        out: list[Change] = []
        st.fenced, st.signal, st.since = True, s, now
        st.reason = s.reason()
        st.message = f"{prefix}{self._who(st)}: {s.describe()} at {rfc3339(now)}"
        st.next_validation = now
        self._note(st, now, "Unhealthy", f"{prefix}{s.describe()}")
        out.append(Change("fence", st.index, st.message, s, evict=True))
        if self._failure(st, now):
            out.append(self._held(st, now))
        return out

    def _held(self, st: GPUHealthState, now: float) -> Change:
        st.cordoned = True
        msg = (f"{self._who(st)} failed {len(st.failures)} times within {self.failure_window:.0f}s: kept out until "
               f"an operator runs `gpufleet uncordon --gpu NODE:{st.index}`")
        self._note(st, now, "Held", msg)
        return Change("held", st.index, msg, st.signal)

    def _return(self, st: GPUHealthState, now: float, why: str) -> list[Change]:
        st.fenced = st.held = st.validating = False
        st.signal = None
        st.reason = st.message = ""
        self._note(st, now, "Healthy", why)
        return [Change("returned", st.index, f"{self._who(st)} is back in service: {why}")]

    def due_for_validation(self, now: float) -> list[int]:
        """Fenced GPUs whose drain-level signals are gone and that may be validated now."""
        out = []
        for index, st in sorted(self.gpus.items()):
            if not st.fenced or st.held or st.cordoned or st.validating or st.signal is None:
                continue
            if any(drains(action_for(s, self.policy)) for s in st.current):
                continue
            if now >= st.next_validation:
                out.append(index)
        return out

    def validated(self, index: int, ok: bool, detail: str, now: float) -> list[Change]:
        st = self.state(index)
        st.validating = False
        if not st.fenced or st.held or st.cordoned:
            return []
        if any(drains(action_for(s, self.policy)) for s in st.current):
            # It failed again while the check ran: the fence stands, the check is moot.
            return []
        if ok:
            return self._return(st, now, f"validation passed{': ' + detail if detail else ''}")
        st.next_validation = now + self.validation_backoff
        msg = f"{self._who(st)}: validation failed: {detail}"
        self._note(st, now, "ValidationFailed", detail)
        out = [Change("validation-failed", index, msg, st.signal)]
        if self._failure(st, now):
            out.append(self._held(st, now))
        return out

    # -- what is published -------------------------------------------------------------------

    def restore(self, record: Mapping[str, Any], uuids: Mapping[int, str]) -> list[int]:
        """Take up the fences an earlier run of the agent published (its gpufleet.io/gpu-health
        annotation): a GPU fenced then stays fenced until a validation passes, even when the
        event that fenced it (an XID) is long gone. Only for GPUs with the same UUID; returns
        the indices restored."""
        out = []
        for key, entry in record.items():
            if not key.isdigit() or not isinstance(entry, Mapping):
                continue
            index = int(key)
            if index not in uuids or entry.get("uuid") != uuids[index]:
                continue
            st = self.state(index, uuids[index])
            for h in entry.get("history") or []:
                if isinstance(h, Mapping):
                    st.history.append(dict(h))
            for code, n in (entry.get("xids") or {}).items():
                if str(code).isdigit() and isinstance(n, int):
                    st.xid_counts[int(code)] = n
            sig = entry.get("signal")
            state = entry.get("state")
            if state in (FENCED_STATE, HELD_STATE) and isinstance(sig, Mapping) and isinstance(sig.get("kind"), str):
                value = sig.get("value")
                st.fenced, st.primed = True, False
                if state == HELD_STATE:
                    # Its index is in the cordon annotation, which only an operator clears.
                    st.held = st.cordoned = True
                st.signal = Signal(sig["kind"], value if isinstance(value, int) else 0, str(sig.get("detail") or ""))
                st.reason = str(entry.get("reason") or st.signal.reason())
                st.message = str(entry.get("message") or "")
                out.append(index)
        return out

    def annotation(self) -> str:
        doc = {}
        for index, st in sorted(self.gpus.items()):
            entry: dict[str, Any] = {"state": st.state}
            if st.uuid:
                entry["uuid"] = st.uuid
            if st.reason:
                entry["reason"] = st.reason
            if st.fenced and st.signal is not None:
                entry["signal"] = {"kind": st.signal.kind, "value": st.signal.value,
                                   **({"detail": st.signal.detail} if st.signal.detail else {})}
            if st.message:
                entry["message"] = st.message
            if st.xid_counts:
                entry["xids"] = {str(k): v for k, v in sorted(st.xid_counts.items())}
            if st.history:
                entry["history"] = list(st.history)
            doc[str(index)] = entry
        return json.dumps(doc, separators=(",", ":"))

    def condition(self) -> tuple[str, str, str]:
        """(status, reason, message) of the node's GPUHealthy condition."""
        out = [st for _, st in sorted(self.gpus.items()) if st.out]
        if not out:
            return "True", "AllGPUsHealthy", "every GPU is healthy"
        first = out[0]
        reason = REPEATED_FAILURES if first.held else (first.reason or OPERATOR_CORDON)
        return "False", reason, "; ".join(st.message or f"GPU {st.index} {st.state.lower()}" for st in out)
