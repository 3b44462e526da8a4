"""Deployment: roll a pod template out through ReplicaSets, as Kubernetes does.

- Each template gets a ReplicaSet ``<deployment>-<pod-template-hash>``; the hash is
  ``compute_hash`` (FNV-1a of the template's canonical JSON and the collision count, spelled
  with Kubernetes' SafeEncodeString alphabet), so it is stable across restarts. The label
  ``pod-template-hash`` is added to the ReplicaSet's selector, labels and template. The
  ReplicaSet of the current template is found by comparing templates without that label, not
  by the hash, so a hash that changes (a new field defaulted after an upgrade) never starts
  a rollout by itself; a name taken by a different template bumps ``status.collisionCount``.
- RollingUpdate follows maxSurge (percentages round up) and maxUnavailable (round down; both
  zero means one unavailable): scale the new set up within the surge, scale old sets down
  only as far as availability allows, unhealthy old pods first. Recreate scales every old
  set to zero, waits for their pods to be gone, then scales the new one up.
- A Deployment resized during a rollout is spread over its active sets in proportion to their
  size (the ``deployment.kubernetes.io/desired-replicas`` and ``max-replicas`` annotations).
- Revisions: ``deployment.kubernetes.io/revision`` on every set and on the Deployment, and
  ``revision-history`` when an old template comes back (``kubectl rollout undo`` works: it
  copies an old set's template into the Deployment). Old sets scaled to zero beyond
  ``revisionHistoryLimit`` are deleted, oldest revision first.
- ``paused`` only scales; ``progressDeadlineSeconds`` turns Progressing False with reason
  ProgressDeadlineExceeded when no progress was seen for that long; Available reflects
  minimum availability; status is computed by ``deployment_status`` and carries exactly what
  ``kubectl rollout status`` checks (observedGeneration, updatedReplicas, replicas,
  availableReplicas, the Progressing reason).

The decisions are plain functions in ``decide`` (over ``model``); ``controller`` wires and
applies them.

Not done: the deprecated ``spec.rollbackTo`` (extensions/v1beta1) and terminatingReplicas.
"""

from __future__ import annotations

from gpufleet.controllers.deployment.controller import DeploymentController
from gpufleet.controllers.deployment.decide import (
    Observed,
    decide,
    decide_collision,
    decide_create_failed,
    decide_new_replica_set,
    decide_selecting_all,
    strategy,
)
from gpufleet.controllers.deployment.model import (
    DESIRED_REPLICAS,
    MAX_REPLICAS,
    POD_TEMPLATE_HASH,
    REVISION,
    REVISION_HISTORY,
    compute_hash,
    deployment_status,
    equal_ignore_hash,
    max_surge,
    max_unavailable,
    resolve_fenceposts,
    scaled_value,
)

__all__ = [
    "DESIRED_REPLICAS",
    "MAX_REPLICAS",
    "POD_TEMPLATE_HASH",
    "REVISION",
    "REVISION_HISTORY",
    "DeploymentController",
    "Observed",
    "compute_hash",
    "decide",
    "decide_collision",
    "decide_create_failed",
    "decide_new_replica_set",
    "decide_selecting_all",
    "deployment_status",
    "equal_ignore_hash",
    "max_surge",
    "max_unavailable",
    "resolve_fenceposts",
    "scaled_value",
    "strategy",
]
