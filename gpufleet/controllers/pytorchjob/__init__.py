"""PyTorchJob: a gang of pods (one Master, N Workers) that trains together, restarts together
from its last checkpoint, and resizes between elasticPolicy.minReplicas and maxReplicas.

What it does, as Kubeflow's training operator does:
- pods ``<job>-master-0`` and ``<job>-worker-<i>`` from the replica templates, labelled
  ``training.kubeflow.org/job-name``, ``replica-type`` (master/worker), ``replica-index``,
  ``operator-name`` (and ``job-role: master`` on the master); a headless Service ``<job>``
  selecting them; conditions Created, Running, Restarting, Succeeded, Failed, Suspended with
  upstream's reasons (PyTorchJobCreated, ...); ``replicaStatuses`` per type with a selector,
  which the scale subresource reads;
- the environment Kubeflow gives (into the container named ``pytorch``, else the first):
  MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, PET_NNODES, PET_NODE_RANK,
  PET_NPROC_PER_NODE, PET_MASTER_ADDR, PET_MASTER_PORT, PYTHONUNBUFFERED; in elastic mode
  instead of WORLD_SIZE/RANK: PET_NNODES (below), PET_RDZV_BACKEND, PET_RDZV_ENDPOINT,
  PET_RDZV_ID, PET_RDZV_CONF, PET_MAX_RESTARTS, PET_STANDALONE; plus
  GPUFLEET_CHECKPOINT_DIR (below). A variable the template sets itself is left alone;
- a PodGroup (scheduling.x-k8s.io/v1alpha1) named after the job, owned by it, with minMember
  the pods of the gang (runPolicy.schedulingPolicy.minAvailable when given; minReplicas plus
  the Master when Workers are resized in place, below); every pod carries
  ``scheduling.x-k8s.io/pod-group``;
- while the scheduler holds the gang back (a PodGroup is placed whole or not at all), an
  Event GangPending on the job carries the scheduler's reason (e.g. "pod group default/b:
  2 of 6 members fit, needs minMember 6; ..."), once per distinct reason; GangScheduled
  follows once every member is placed. The conditions stay Kubeflow's;
- ``runPolicy.suspend`` deletes the pods (condition Suspended); resuming creates them again;
  a job whose ``runPolicy.managedBy`` names another controller (MultiKueue) is left alone;
  ``activeDeadlineSeconds`` fails the job (DeadlineExceeded); ``cleanPodPolicy`` and
  ``ttlSecondsAfterFinished`` apply once it finished.

Where gpufleet differs, and why:
- Addresses. There is no cluster DNS, so MASTER_ADDR (and the rendezvous host) is an
  address, not the master's Service name. The leader (master-0, or worker-0 without a
  master) reads its own ``status.podIP``; the others read key ``MASTER_ADDR`` of the
  ConfigMap ``<job>-rendezvous``, which the controller writes once the leader has an
  address (its node's, when the node's pods share the host's network as with the process
  runtime; its own pod IP otherwise); until then the node agent holds those containers back
  (CreateContainerConfigError, retried). When pods share the host's network and every node
  has the same address (one server, or a test fleet on loopback), it is that address, known
  before scheduling.
- Port. Jobs whose pods share one server's network must not collide, so each gang attempt
  gets its own port (20000-39999, from the job's uid and the attempt) as the containerPort of
  the leader's ``pytorchjob-port``, pinned as the node port by the leader's annotation
  ``gpufleet.io/rendezvous-port`` (not a hostPort, which Pod Security's baseline refuses);
  the agent then refuses to start a second pod holding it. ``elasticPolicy.rdzvPort`` fixes
  it instead.
- Restarts. Member pods run with restartPolicy Never and the controller restarts the whole
  gang: when a member fails (replica restartPolicy OnFailure/Always; ExitCode only for exit
  codes above 127, i.e. signals; Never fails the job) or is lost (deleted, or evicted with its
  node), every member is deleted (members on nodes that are not Ready with
  gracePeriodSeconds=0), condition Restarting says which pod, node and exit code, and once
  the old pods are gone a new gang is created after a back-off. Each restart counts against
  ``runPolicy.backoffLimit`` (unlimited when unset, as upstream); the count is kept in the
  job's annotation ``gpufleet.io/gang-restarts``; ``gpufleet.io/gang-attempt`` numbers the
  gangs (restarts and resizes) and every pod carries the attempt it belongs to.
- Resizing. An elastic job's Workers (edit, scale subresource, automatic resize) are added
  and removed under the running torchrun group, as upstream: torchrun sees members join or
  leave, restarts its processes and re-forms the group, and the script resumes from its
  checkpoint; a lost Worker other than worker-0 (the rendezvous host) is only replaced.
  Elastic pods get TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: with the rendezvous store shared
  as the workers' store (torch's default), nodes joining a later round wait forever for the
  bootstrap address that the rank-0 agent only publishes in its first round.
  With the annotation ``gpufleet.io/elastic-resize: restart``, and for every job without an
  elasticPolicy, a change of the Workers restarts the whole gang at the new size from its
  checkpoint instead, not counted as a failure (condition Restarting, reason
  PyTorchJobResizing; pods carry ``gpufleet.io/gang-size``); torchrun is then told the exact
  size (PET_NNODES "n:n").
- Hardware. A member Failed with DisruptionTarget for its hardware (``api.gpu.
  pod_failed_by_hardware``: the node agent's GPUUnhealthy, a node's NoExecute taint, its node
  gone) is not the job's failure: backoffLimit, restartPolicy and the back-off do not apply,
  ``gpufleet.io/hardware-restarts`` counts the moves, and condition Restarting (reason
  GPUUnhealthy, or the pod's disruption reason) names the pod, GPU and XID. A fixed gang
  restarts from its checkpoint as a new attempt; an elastic job resized in place with
  elasticPolicy.maxRestarts >= 1 replaces only that member (not its rendezvous host), and
  the others re-form the group through torchrun's rendezvous (docs/gpu-work-moves.md).
- Checkpoints. GPUFLEET_CHECKPOINT_DIR is the same for every member and every attempt:
  the job's annotation ``gpufleet.io/checkpoint-dir`` when set, else
  ``<checkpoint_root>/<namespace>/<job>-<uid[:8]>``. Across servers it must be on a shared
  filesystem (an NFS export mounted at the same path on every server).
- Automatic resize (elastic jobs with maxReplicas > minReplicas, unless the job's annotation
  ``gpufleet.io/elastic-autoscale`` is ``"false"``, and not for jobs in a Kueue queue, whose
  size the queue admitted): one more Worker when a schedulable, Ready
  node has the GPUs a Worker asks for free and no pod of equal or higher priority is waiting
  to be scheduled; one Worker fewer (never below minReplicas) when pods of higher priority
  wait and do not fit anywhere. At most one step per ``elastic_resize_interval``; each step
  is an Event (ElasticGrow/ElasticShrink) and the annotation ``gpufleet.io/elastic-reason``.

Success: the Master succeeded; without a Master, worker-0 succeeded.

The package: ``model`` (names, labels, the facts read from a job and its pods), ``pods``
(the pods and objects around them, as wire dicts), ``decide`` (a sync as a pure decision,
with the table of phase transitions), ``controller`` (events, snapshot, apply).
"""

from gpufleet.api.podresources import pod_gpu_request
from gpufleet.controllers.pytorchjob.controller import PyTorchJobController
from gpufleet.controllers.pytorchjob.decide import TRANSITIONS, Memory, Observed, Settings, decide, phase
from gpufleet.controllers.pytorchjob.model import (
    ATTEMPT_ANNOTATION,
    AUTOSCALE_ANNOTATION,
    CHECKPOINT_ANNOTATION,
    CHECKPOINT_ENV,
    ELASTIC_REASON_ANNOTATION,
    GANG_PENDING,
    GANG_SCHEDULED,
    GANG_SIZE_ANNOTATION,
    HARDWARE_RESTARTS_ANNOTATION,
    RESIZE_ANNOTATION,
    RESTARTS_ANNOTATION,
    gang_wait_reason,
)

__all__ = [
    "ATTEMPT_ANNOTATION",
    "AUTOSCALE_ANNOTATION",
    "CHECKPOINT_ANNOTATION",
    "CHECKPOINT_ENV",
    "ELASTIC_REASON_ANNOTATION",
    "GANG_PENDING",
    "GANG_SCHEDULED",
    "GANG_SIZE_ANNOTATION",
    "HARDWARE_RESTARTS_ANNOTATION",
    "RESIZE_ANNOTATION",
    "RESTARTS_ANNOTATION",
    "TRANSITIONS",
    "Memory",
    "Observed",
    "PyTorchJobController",
    "Settings",
    "decide",
    "gang_wait_reason",
    "phase",
    "pod_gpu_request",
]
