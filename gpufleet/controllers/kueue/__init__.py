"""Team queues (Kueue's kueue.x-k8s.io/v1beta1): the controller (controller.py), its job
reconciler (jobs.py: decide, then apply), its admission cycle (cycle.py) and the kinds of job
a queue can hold (kinds.py)."""

from gpufleet.controllers.kueue.controller import KueueController
from gpufleet.controllers.kueue.kinds import BATCH_JOB, JOB_UID_LABEL, JobKind, workload_name

__all__ = ["BATCH_JOB", "JOB_UID_LABEL", "JobKind", "KueueController", "workload_name"]
