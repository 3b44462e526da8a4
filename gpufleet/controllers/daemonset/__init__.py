"""DaemonSet: one pod on every node that should run it, as Kubernetes runs daemons.

- A node should run the daemon when the template's nodeSelector and required node affinity
  match it and its NoSchedule and NoExecute taints are tolerated, counting the tolerations
  every daemon pod gets (not-ready and unreachable NoExecute; disk-, memory- and
  pid-pressure and unschedulable NoSchedule; network-unavailable with hostNetwork). A node
  whose only untolerated taints are NoSchedule keeps a daemon already there.
- Each pod is made from the template with its required node affinity replaced by
  ``metadata.name In [<node>]`` (as Kubernetes 1.12+ does) and placed by the scheduler; it
  is labelled ``controller-revision-hash`` with the template's hash.
- Nodes joining, leaving, relabelled or (un)tainted bring every DaemonSet back: new nodes
  get a pod, nodes that no longer match lose it, failed pods are replaced (with a back-off
  per node), extra pods on a node are deleted.
- ``updateStrategy``: RollingUpdate with maxUnavailable (nodes without an available pod at a
  time) or maxSurge (the new pod starts beside the old, which goes once the new one is
  available); OnDelete replaces pods only when they are deleted.
- ControllerRevisions (``controllers/history.py``) for `kubectl rollout history/undo`;
  status (desired/current/ready/updated/available/misscheduled/unavailable, observed
  generation) as `kubectl get ds` and `kubectl rollout status` read it.

Not done: the deprecated ``pod-template-generation`` label and template generation annotation.
"""

from __future__ import annotations

from gpufleet.controllers.daemonset.controller import DaemonSetController
from gpufleet.controllers.daemonset.decide import Observed, decide

__all__ = ["DaemonSetController", "Observed", "decide"]
