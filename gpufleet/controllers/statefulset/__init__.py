"""StatefulSet: pods with a stable identity and storage of their own, as Kubernetes runs them.

- Pods are named ``<set>-<ordinal>`` for the ordinals ``[start, start+replicas)``
  (``spec.ordinals.start``, 0 by default), labelled ``statefulset.kubernetes.io/pod-name``,
  ``apps.kubernetes.io/pod-index`` and ``controller-revision-hash`` (the revision's name), with
  ``hostname`` the pod's name and ``subdomain`` the set's ``serviceName``.
- Each ``volumeClaimTemplates`` entry gives every replica a claim ``<template>-<set>-<ordinal>``
  (the template's labels plus the selector's), created before the pod and mounted in place of
  a volume of the template's name; the PV controller and the local-path provisioner bind it.
  A recreated pod finds its claim again. ``persistentVolumeClaimRetentionPolicy``: Retain
  (the default) leaves claims without owners; ``whenDeleted: Delete`` makes the set their
  owner and ``whenScaled: Delete`` makes a pod scaled away the owner of its claims, so the
  garbage collector deletes them then.
- ``podManagementPolicy``: OrderedReady creates ordinals in order, each once the one before
  is Running and Ready, and scales down from the highest, never while another pod is
  unhealthy; Parallel creates and deletes all at once.
- ``updateStrategy``: RollingUpdate replaces pods from the highest ordinal down to
  ``partition``, one at a time, each after the one before is Ready again; OnDelete replaces
  none (a pod deleted by hand comes back at the update revision).
- ControllerRevisions hold every template (``controllers/history.py``), so `kubectl rollout
  history` and `undo` work; status carries replicas, readyReplicas, currentReplicas,
  updatedReplicas, availableReplicas (minReadySeconds), currentRevision, updateRevision,
  observedGeneration and collisionCount, which is what `kubectl rollout status` reads.

Not done: ``rollingUpdate.maxUnavailable`` above 1 (a beta feature upstream), and updating the
identity or storage of a pod that lost them in place.
"""

from __future__ import annotations

from gpufleet.controllers.statefulset.controller import StatefulSetController
from gpufleet.controllers.statefulset.decide import Observed, decide, decide_revisions

__all__ = ["Observed", "StatefulSetController", "decide", "decide_revisions"]
