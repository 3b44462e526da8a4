"""The controller manager: one shared informer factory, every controller on one loop."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

from gpufleet.api.storage import DEFAULT_NODE_PATH
from gpufleet.client.api import Client
from gpufleet.client.events import EventRecorder
from gpufleet.client.informer import InformerScope, SharedInformerFactory
from gpufleet.utils.clock import REAL_CLOCK, Clock

log = logging.getLogger(__name__)

# name -> class, imported on use so a manager running a few controllers loads only those.
_CLASSES = {
    "namespace": "gpufleet.controllers.namespace:NamespaceController",
    "serviceaccount": "gpufleet.controllers.serviceaccount:ServiceAccountsController",
    "root-ca-cert-publisher": "gpufleet.controllers.serviceaccount:RootCACertPublisher",
    "replicaset": "gpufleet.controllers.replicaset:ReplicaSetController",
    "deployment": "gpufleet.controllers.deployment:DeploymentController",
    "statefulset": "gpufleet.controllers.statefulset:StatefulSetController",
    "daemonset": "gpufleet.controllers.daemonset:DaemonSetController",
    "job": "gpufleet.controllers.job:JobController",
    "cronjob": "gpufleet.controllers.cronjob:CronJobController",
    "nodelifecycle": "gpufleet.controllers.nodelifecycle:NodeLifecycleController",
    "endpoints": "gpufleet.controllers.endpoints:EndpointsController",
    "endpointslice": "gpufleet.controllers.endpointslice:EndpointSliceController",
    "garbagecollector": "gpufleet.controllers.garbagecollector:GarbageCollector",
    "resourcequota": "gpufleet.controllers.resourcequota:ResourceQuotaController",
    "disruption": "gpufleet.controllers.disruption:DisruptionController",
    "horizontalpodautoscaler": "gpufleet.controllers.hpa:HorizontalPodAutoscalerController",
    "pytorchjob": "gpufleet.controllers.pytorchjob:PyTorchJobController",
    "kueue": "gpufleet.controllers.kueue:KueueController",
    "nodeipam": "gpufleet.controllers.nodeipam:NodeIpamController",
    "persistentvolume": "gpufleet.controllers.persistentvolume:PersistentVolumeController",
    "localpath": "gpufleet.controllers.localpath:LocalPathProvisioner",
    "podgroup": "gpufleet.controllers.podgroup:PodGroupController",
    "volcanojob": "gpufleet.controllers.volcano:VolcanoJobController",
    "volcanoqueue": "gpufleet.controllers.volcano:VolcanoQueueController",
    "raycluster": "gpufleet.controllers.ray:RayClusterController",
    "rayjob": "gpufleet.controllers.ray:RayJobController",
    "rayservice": "gpufleet.controllers.ray:RayServiceController",
}
ALL_CONTROLLERS = tuple(_CLASSES)


def _controller_class(name: str) -> type:
    module, _, attr = _CLASSES[name].partition(":")
    return getattr(importlib.import_module(module), attr)


@dataclass(frozen=True)
class ControllerOptions:
    # A node whose Lease (or Ready heartbeat) has not moved for this long is unreachable.
    # Kubernetes waits 40-50 s; a GPU fleet wants its training gangs restarted sooner.
    node_monitor_grace_period: float = 8.0
    # How long a pod without its own toleration for node.kubernetes.io/unreachable or
    # not-ready stays on such a node (Kubernetes' admission default is 300 s).
    default_eviction_seconds: float = 2.0
    # Back-off before a Job replaces a failed pod: base * 2**(failures-1), capped.
    job_pod_failure_backoff: float = 1.0
    job_pod_failure_backoff_max: float = 60.0
    # A Job's pod events and status updates are synced together this much later (upstream's
    # SyncJobBatchPeriod).
    job_sync_batch_period: float = 1.0
    # How long the informers may take to fill before controllers start anyway.
    sync_timeout: float = 30.0
    workers: int = 2
    # A quota's usage is lowered (objects gone) only after it went this long without an
    # admission charge, so a charged object still on its way to the store is not forgotten.
    quota_charge_grace: float = 5.0
    # How often every quota is recomputed (kinds other than pods are not watched).
    quota_resync_period: float = 30.0
    # How often each HorizontalPodAutoscaler is evaluated (Kubernetes: 15 s), and where the
    # gateway serves the per-pod request metrics (custom.metrics.k8s.io) it may scale on.
    hpa_sync_period: float = 15.0
    hpa_gateway_url: str | None = None
    # Seconds between looks at the gateway's request metrics between syncs: an HPA whose
    # metric goes above its target is evaluated then, not at its next sync (0: off).
    hpa_rate_watch: float = 1.0
    # PyTorchJob: back-off before a gang is recreated (base * 2**restarts, capped), where
    # checkpoints go without the gpufleet.io/checkpoint-dir annotation, and the least time
    # between two automatic elastic resizes of one job.
    pytorchjob_restart_backoff: float = 1.0
    pytorchjob_restart_backoff_max: float = 60.0
    pytorchjob_checkpoint_root: str = "/var/tmp/gpufleet/checkpoints"
    pytorchjob_resize_interval: float = 30.0
    # Team queues: among ClusterQueues of a cohort, lend spare quota to the lowest
    # weighted share first (Kueue's fairSharing.enable; also on when any ClusterQueue
    # declares spec.fairSharing); otherwise by priority and age.
    kueue_fair_sharing: bool = False
    # How long the admission cycle waits after what woke it, so one change's events are
    # decided on in one pass.
    kueue_batch_period: float = 0.1
    # Waiting workloads whose message alone changed, rewritten per pass (see kueue/cycle.py).
    kueue_pending_refreshes: int = 4
    # Node IPAM: the pod network, cut into one subnet of this prefix length per node.
    cluster_cidr: str = "10.244.0.0/16"
    node_cidr_mask_size: int = 24
    # The cluster CA's certificate (PEM), published in every namespace as the ConfigMap
    # kube-root-ca.crt (kube-controller-manager's --root-ca-file); None publishes nothing.
    root_ca: bytes | None = None
    # Where the local-path StorageClass made at start keeps its volumes on each node.
    local_path_node_path: str = DEFAULT_NODE_PATH
    # How often the garbage collector looks for kinds to watch in discovery (CRDs made or deleted).
    gc_resync_period: float = 10.0
    # How many of N pods like a given one the scheduler could place now, and what stops the
    # rest: ``room(pod_body, n, nodes, pods, waiting) -> (count, reason)``
    # (gpufleet.scheduler.placement.room, handed in by the command that wires the control
    # plane). An autoscaled RayCluster creates only the workers that fit; None: it creates
    # every worker its autoscaler asks for.
    worker_room: Callable[..., tuple[int, str | None]] | None = None
    # Which controllers run (names from ALL_CONTROLLERS).
    enabled: tuple[str, ...] = field(default=ALL_CONTROLLERS)


class ControllerManager:
    def __init__(
        self,
        client: Client,
        *,
        clock: Clock = REAL_CLOCK,
        options: ControllerOptions | None = None,
        informers: SharedInformerFactory | None = None,
        **overrides: Any,
    ) -> None:
        """``informers``: a factory of the process that outlives this manager (shared with the
        scheduler, kept across leadership terms); the manager then adds and removes only its
        own handlers. Without it the manager has a factory of its own, stopped with it."""
        opts = options or ControllerOptions()
        if overrides:
            known = {f.name for f in fields(ControllerOptions)}
            unknown = set(overrides) - known
            if unknown:
                raise TypeError(f"unknown controller options: {', '.join(sorted(unknown))}")
            opts = replace(opts, **overrides)
        unknown_names = set(opts.enabled) - set(ALL_CONTROLLERS)
        if unknown_names:
            raise ValueError(f"unknown controllers: {', '.join(sorted(unknown_names))}")
        self.client = client
        self.clock = clock
        self.options = opts
        self._own_informers = informers is None
        self.informers: SharedInformerFactory | InformerScope = (
            SharedInformerFactory(client, strip_managed_fields=True) if informers is None
            else InformerScope(informers))

        def recorder(component: str) -> EventRecorder:
            return EventRecorder(client, component, clock=clock)

        common = {"clock": clock, "workers": opts.workers}
        kwargs: dict[str, dict[str, Any]] = {
            "namespace": {},
            "serviceaccount": common,
            "root-ca-cert-publisher": {**common, "root_ca": opts.root_ca},
            "replicaset": {**common, "recorder": recorder("replicaset-controller")},
            "deployment": {**common, "recorder": recorder("deployment-controller")},
            "statefulset": {**common, "recorder": recorder("statefulset-controller")},
            "daemonset": {**common, "recorder": recorder("daemonset-controller")},
            "job": {
                **common,
                "recorder": recorder("job-controller"),
                "pod_failure_backoff": opts.job_pod_failure_backoff,
                "pod_failure_backoff_max": opts.job_pod_failure_backoff_max,
                "sync_batch_period": opts.job_sync_batch_period,
            },
            "cronjob": {**common, "recorder": recorder("cronjob-controller")},
            "nodelifecycle": {
                **common,
                "recorder": recorder("node-controller"),
                "node_monitor_grace_period": opts.node_monitor_grace_period,
                "default_eviction_seconds": opts.default_eviction_seconds,
            },
            "endpoints": common,
            "endpointslice": common,
            "garbagecollector": {**common, "resync_period": opts.gc_resync_period},
            "resourcequota": {**common, "charge_grace": opts.quota_charge_grace,
                              "resync_period": opts.quota_resync_period},
            "disruption": {**common, "recorder": recorder("controllermanager")},
            "horizontalpodautoscaler": {**common, "recorder": recorder("horizontal-pod-autoscaler"),
                                        "sync_period": opts.hpa_sync_period,
                                        "gateway_url": opts.hpa_gateway_url, "rate_watch": opts.hpa_rate_watch},
            "pytorchjob": {**common, "recorder": recorder("pytorchjob-controller"),
                           "restart_backoff": opts.pytorchjob_restart_backoff,
                           "restart_backoff_max": opts.pytorchjob_restart_backoff_max,
                           "checkpoint_root": opts.pytorchjob_checkpoint_root,
                           "elastic_resize_interval": opts.pytorchjob_resize_interval},
            "podgroup": common,
            "volcanojob": {**common, "recorder": recorder("vc-controller-manager")},
            "volcanoqueue": {**common, "recorder": recorder("vc-scheduler")},
            "raycluster": {**common, "recorder": recorder("raycluster-controller"), "room": opts.worker_room},
            "rayjob": {**common, "recorder": recorder("rayjob-controller")},
            "rayservice": {**common, "recorder": recorder("rayservice-controller")},
            "kueue": {**common, "recorder": recorder("kueue-admission"), "fair_sharing": opts.kueue_fair_sharing,
                      "batch_period": opts.kueue_batch_period,
                      "pending_refreshes": opts.kueue_pending_refreshes},
            "nodeipam": {**common, "recorder": recorder("node-controller"), "cluster_cidr": opts.cluster_cidr,
                         "node_mask": opts.node_cidr_mask_size},
            "persistentvolume": {**common, "recorder": recorder("persistentvolume-controller")},
            "localpath": {**common, "recorder": recorder("gpufleet.io/local-path"),
                          "node_path": opts.local_path_node_path},
        }
        self.controllers: list[Any] = [
            _controller_class(name)(client, self.informers, **kwargs[name])
            for name in ALL_CONTROLLERS
            if name in opts.enabled
        ]

    def controller(self, name: str) -> Any:
        """The running controller called ``name`` (one of ALL_CONTROLLERS)."""
        cls = _controller_class(name)
        for c in self.controllers:
            if isinstance(c, cls):
                return c
        raise KeyError(name)

    async def start(self) -> None:
        await self.informers.start()
        # Acting on half-filled caches would create pods that exist already or delete
        # objects whose owners simply have not been listed yet.
        if not await self.informers.wait_for_sync(self.options.sync_timeout):
            log.warning("controller manager: informers not synced after %ss; starting anyway",
                        self.options.sync_timeout)
        for c in self.controllers:
            await c.start()

    async def stop(self) -> None:
        for c in reversed(self.controllers):
            await c.stop()
        if self._own_informers:
            await self._stop_informers()
        else:
            await self.informers.stop()  # this manager's handlers only

    async def _stop_informers(self) -> None:
        await self.informers.stop()


async def start_controllers(
    client: Client,
    *,
    clock: Clock = REAL_CLOCK,
    options: ControllerOptions | None = None,
    **overrides: Any,
) -> ControllerManager:
    manager = ControllerManager(client, clock=clock, options=options, **overrides)
    await manager.start()
    return manager
