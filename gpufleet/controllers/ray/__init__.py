"""KubeRay's operator for RayCluster and RayJob (ray.io/v1), on gpufleet's scheduler.

RayCluster, as KubeRay does it:
- a head pod (``<cluster>-head-<suffix>``) and worker pods (``<cluster>-<group>-worker-
  <suffix>``) from the templates, labelled ``ray.io/cluster``, ``ray.io/node-type``
  (head/worker), ``ray.io/group``, ``ray.io/identifier``, ``ray.io/is-ray-node``; the
  first container runs ``ulimit -n 65536; ray start ... --block`` under ``/bin/bash -c``
  (or ``ray start`` then the template's own command), with the flags from
  ``rayStartParams`` and, where they do not say, from the container's resources:
  ``--num-cpus`` (CPU limit, rounded up), ``--num-gpus`` (the ``nvidia.com/gpu`` limit,
  so the GPUs need not be repeated in rayStartParams) and ``--memory``;
- the head Service ``<cluster>-head-svc`` (ports gcs-server 6379, dashboard 8265, client
  10001), status (state, ready/available/desired/min/max workers, desired CPU, memory and
  GPUs, endpoints, head pod and service IPs, conditions HeadPodReady and
  RayClusterProvisioned) with KubeRay's field names;
- ``replicas`` clamped to ``minReplicas..maxReplicas``; ``scaleStrategy.workersToDelete``
  deleted and the list cleared; ``suspend`` on the cluster or a group.

Where gpufleet differs, and why:
- Addresses. There is no cluster DNS: the workers read the head's address and GCS port
  from the ConfigMap ``<cluster>-head``, written once the head has an address (the node
  agent holds the workers back until then), as env FQ_RAY_IP / RAY_IP.
- Ports. Ray nodes of several clusters may share one server's network (the process
  runtime): the head's ports are the ones its agent handed out (GPUFLEET_PORT_<NAME>, the
  pod's ``gpufleet.io/host-ports``), and the dashboard agent's and metrics ports are left
  to the system. ``status.endpoints`` gives the ports as reachable.
- Gang. A PodGroup ``<cluster>`` (head plus every group's minReplicas) makes the minimum
  placed whole or not at all; an Event Unschedulable (and ``status.reason``) carries the
  scheduler's reason while Ray pods wait unplaced.

Autoscaling (``enableInTreeAutoscaling``): the head gets Ray's own autoscaler as a sidecar
(``ray kuberay-autoscaler``, v2 unless ``autoscalerOptions.version`` says v1) with a
ServiceAccount, Role and RoleBinding named after the cluster; it scales the groups through
``replicas`` and ``workersToDelete``. The controller creates only the workers the
scheduler's filters can place now (``gpufleet.scheduler.placement``, handed in as the
manager's ``worker_room``) and reports the rest (condition
ReplicaFailure, reason Unschedulable), so none waits as a Pending pod.

RayJob: see ``job``. RayService: see ``service`` (the decision) and ``servicecontroller``.
"""

from gpufleet.controllers.ray.cluster import ClusterObserved, decide_cluster
from gpufleet.controllers.ray.controller import RayClusterController, RayJobController
from gpufleet.controllers.ray.job import JobObserved, decide_job
from gpufleet.controllers.ray.pods import ray_start_command, resource_params, start_params
from gpufleet.controllers.ray.service import ServiceObserved, decide_service
from gpufleet.controllers.ray.servicecontroller import RayServiceController

__all__ = [
    "ClusterObserved",
    "JobObserved",
    "RayClusterController",
    "RayJobController",
    "RayServiceController",
    "ServiceObserved",
    "decide_cluster",
    "decide_job",
    "decide_service",
    "ray_start_command",
    "resource_params",
    "start_params",
]
