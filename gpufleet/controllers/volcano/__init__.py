"""Volcano: the batch Job (batch.volcano.sh/v1alpha1) with its tasks, lifecycle policies and
plugins, and the Queues (scheduling.volcano.sh/v1beta1) that admit its PodGroups.

What it does, as Volcano's job controller and scheduler do (docs/volcano.md):
- pods ``<job>-<task>-<index>`` from the task templates, labelled ``volcano.sh/job-name``,
  ``volcano.sh/job-namespace``, ``volcano.sh/queue-name``, ``volcano.sh/task-spec``,
  ``volcano.sh/task-index`` and annotated ``scheduling.k8s.io/group-name`` (their PodGroup),
  ``volcano.sh/job-version`` and ``volcano.sh/job-retry-count``;
- a PodGroup ``<job>-<uid>`` with minMember the job's minAvailable, minTaskMember, the queue
  and minResources (the requests of minAvailable pods); the scheduler's gang cycle places
  its members all together (at least minMember) or none (``api.volcano.gang_view``);
- pods are made only once the PodGroup's Queue admitted it (Inqueue: ``queues.py``), so a
  Queue's capability bounds what its jobs hold;
- the phases of ``status.state`` (Pending, Running, Restarting, Completing, Completed,
  Aborting, Aborted, Terminating, Terminated, Failed), the counts, taskStatusCount,
  version and retryCount; lifecycle policies (task's first, then the job's) answer
  PodFailed, PodEvicted, TaskCompleted and ``*`` (or an exitCode) with RestartJob (up to
  maxRetry, then Failed), AbortJob, CompleteJob, TerminateJob, RestartTask, RestartPod;
- plugins: env (VC_TASK_INDEX, VK_TASK_INDEX), svc (headless Service ``<job>``, ConfigMap
  ``<job>-svc`` with ``<task>.host``/``<task>.num`` mounted at /etc/volcano,
  VC_<TASK>_HOSTS/_NUM, hostname and subdomain; host names resolve through hostAliases where
  every pod shares one address, as there is no cluster DNS), ssh (Secret ``<job>-ssh`` with a
  key pair, mounted at /root/.ssh), pytorch (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK).
"""

from gpufleet.controllers.volcano.controller import VolcanoJobController
from gpufleet.controllers.volcano.decide import TRANSITIONS, Memory, Observed, decide
from gpufleet.controllers.volcano.queues import VolcanoQueueController
from gpufleet.controllers.volcano.queues import decide as decide_queues

__all__ = ["TRANSITIONS", "Memory", "Observed", "VolcanoJobController", "VolcanoQueueController", "decide",
           "decide_queues"]
