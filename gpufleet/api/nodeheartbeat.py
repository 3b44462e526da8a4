"""Which Node updates are heartbeats.

A node agent (the kubelet, ``gpufleet agent``) rewrites its Node's status every status
period, and most of those writes only move the conditions' ``lastHeartbeatTime``: nothing a
scheduler, a workload controller or a queue decides from. Node lifecycle is the one reader of
heartbeats (it watches the node's Lease, and the Ready condition's status). Controllers whose
Node update handler only reacts to what a node *is* can skip these updates with
:func:`heartbeat_only`.
"""

from __future__ import annotations

from typing import Any

# Fields every write moves, whatever it changes.
_BOOKKEEPING = frozenset({"resource_version", "managed_fields", "generation"})


def _same_except(a: Any, b: Any, skip: frozenset[str]) -> bool:
    if a is None or b is None:
        return a is b
    if type(a) is not type(b):
        return False
    return all(getattr(a, name) == getattr(b, name) for name in type(a).model_fields if name not in skip)


def _same_conditions(old: Any, new: Any) -> bool:
    if len(old or ()) != len(new or ()):
        return False
    skip = frozenset({"last_heartbeat_time"})
    return all(_same_except(a, b, skip) for a, b in zip(old or (), new or (), strict=True))


def heartbeat_only(old: Any, new: Any) -> bool:
    """Whether the Node update ``old`` -> ``new`` (typed models) changed nothing but heartbeat
    times: the conditions' ``lastHeartbeatTime`` (and the resourceVersion and managedFields
    every write moves). A changed condition status, reason, message or transition time, any
    other status field, the spec, labels, annotations or taints all count as a change."""
    if old is None or new is None or old.spec != new.spec:
        return False
    if not _same_except(old.metadata, new.metadata, _BOOKKEEPING):
        return False
    os_, ns_ = old.status, new.status
    if os_ is None or ns_ is None:
        return os_ is ns_
    return _same_except(os_, ns_, frozenset({"conditions"})) and _same_conditions(os_.conditions, ns_.conditions)
