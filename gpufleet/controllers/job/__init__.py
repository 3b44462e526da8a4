"""Job: run pods until ``completions`` of them succeed, or give up.

What it does, as Kubernetes' job controller (1.31) does:
- keeps up to ``parallelism`` pods running (never more than the completions still needed),
  created from the template in slow-start batches with expectations, like ReplicaSets;
- ``completionMode: Indexed`` gives every pod an index: the annotation and label
  ``batch.kubernetes.io/job-completion-index``, the environment variable
  ``JOB_COMPLETION_INDEX`` (a literal value: each pod has its own, so no downward API is
  needed from the node agent), hostname ``<job>-<index>`` and name ``<job>-<index>-<5 chars>``;
  ``status.completedIndexes`` lists the indexes done;
- counts each finished pod exactly once with the ``batch.kubernetes.io/job-tracking``
  finalizer: a pod is created holding it; once it finished (or is being deleted) its uid is
  first written to ``status.uncountedTerminatedPods``, then the finalizer is removed, then the
  uid moves into ``succeeded``/``failed``. A pod can therefore neither vanish uncounted nor be
  counted twice, whatever crashes in between;
- fails the Job (conditions FailureTarget, then Failed) with reason BackoffLimitExceeded when
  more pods failed than ``backoffLimit`` (for restartPolicy OnFailure, container restarts
  count too), or DeadlineExceeded after ``activeDeadlineSeconds``; active pods are deleted;
- completes it (SuccessCriteriaMet, then Complete, with completionTime) when enough pods
  succeeded; a Job without completions completes when one pod succeeded and none is running;
- ``suspend`` deletes the active pods (condition Suspended); resuming restarts startTime;
- waits ``pod_failure_backoff * 2**(n-1)`` (capped) before replacing the n-th consecutive
  failure (Kubernetes: 10 s doubling to 6 min; ours is shorter and configurable);
- syncs a Job at once when its spec changes (a new generation: created, unsuspended,
  resized), and ``sync_batch_period`` (1 s, upstream's SyncJobBatchPeriod) after a pod event
  or a status-only update, so that a burst of them (a gang's pods finishing) is one sync and
  one status write;
- ``ttlSecondsAfterFinished`` deletes the finished Job (foreground, so its pods go first).
- ``podFailurePolicy`` (``api/podfailurepolicy.py``): a Failed pod matching a FailJob rule
  fails the Job (reason PodFailurePolicy), one matching an Ignore rule is replaced without
  counting against ``backoffLimit`` or the back-off (``onPodConditions: [{type:
  DisruptionTarget}]`` covers a pod the node agent stopped on a failed GPU), Count and no
  match count as usual. Without a policy a disrupted pod counts, as in Kubernetes.

The selector: the API server gives every Job without ``manualSelector`` the selector
``batch.kubernetes.io/controller-uid=<uid>`` and puts that label, ``job-name`` and their
``batch.kubernetes.io/`` forms on its pod template, as Kubernetes does (``api/batch.py``);
the controller selects pods by ``spec.selector``. A Job stored before that was done has no
selector (both fields are immutable): for it the controller uses the generated selector and
puts the labels on the pods it creates.

Not done: FailIndex rules (they count, as backoffLimitPerIndex is not done), successPolicy, backoffLimitPerIndex/maxFailedIndexes,
podReplacementPolicy (pods are replaced once they are terminating or failed), managedBy.

The decisions are plain functions in ``decide`` (with the table of condition transitions,
``TRANSITIONS``) over ``model``; ``controller`` wires and applies them.
"""

from gpufleet.controllers.job.controller import JobController
from gpufleet.controllers.job.decide import (
    TRANSITIONS,
    Backoff,
    Observed,
    Settings,
    Sync,
    begin,
    decide_expire,
    decide_finish,
    decide_pods,
    decide_tracking,
    state,
)
from gpufleet.controllers.job.model import (
    COMPLETION_INDEX,
    CONTROLLER_UID_LABEL,
    JOB_NAME_LABEL,
    TRACKING_FINALIZER,
    format_indexes,
    is_finished,
    job_selector,
    parse_indexes,
)

__all__ = [
    "COMPLETION_INDEX",
    "CONTROLLER_UID_LABEL",
    "JOB_NAME_LABEL",
    "TRACKING_FINALIZER",
    "TRANSITIONS",
    "Backoff",
    "JobController",
    "Observed",
    "Settings",
    "Sync",
    "begin",
    "decide_expire",
    "decide_finish",
    "decide_pods",
    "decide_tracking",
    "format_indexes",
    "is_finished",
    "job_selector",
    "parse_indexes",
    "state",
]
