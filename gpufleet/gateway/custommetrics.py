"""custom.metrics.k8s.io/v1beta2 as the gateway serves it: per-pod ``requests_per_second`` and
``concurrency`` of the pods behind the Services it routes, as MetricValueLists."""

from __future__ import annotations

from aiohttp import web

from gpufleet.gateway.routes import CUSTOM_METRICS_PREFIX, _status
from gpufleet.gateway.stats import METRIC_NAMES, milli_quantity
from gpufleet.utils.clock import rfc3339


class CustomMetrics:
    """The Gateway's custom.metrics.k8s.io answers (from its routes and request statistics)."""

    # -- custom.metrics.k8s.io -------------------------------------------------------------

    def _custom_metrics(self, request: web.Request) -> web.Response:
        rest = request.path[len(CUSTOM_METRICS_PREFIX):].strip("/")
        if not rest:
            return web.json_response({
                "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "custom.metrics.k8s.io/v1beta2",
                "resources": [{"name": f"pods/{m}", "singularName": "", "namespaced": True, "kind": "MetricValueList",
                               "verbs": ["get"]} for m in METRIC_NAMES],
            })
        parts = rest.split("/")
        # namespaces/{ns}/pods/{name|*}/{metric}
        if len(parts) != 5 or parts[0] != "namespaces" or parts[2] != "pods":
            return _status(404, "NotFound", "the server could not find the requested resource")
        ns, pod_name, metric = parts[1], parts[3], parts[4]
        if metric not in METRIC_NAMES:
            return _status(404, "NotFound", f'the gateway has no metric "{metric}"; '
                           f"it serves {', '.join(METRIC_NAMES)}")
        if request.query.get("labelSelector"):
            # The gateway knows pods by their endpoints, not their labels.
            return _status(400, "BadRequest", "labelSelector is not supported here: ask for pods/* "
                           "or pods/{name} and filter by name")
        live: set[str] = set()
        for key, route in self.routes.items():
            if key.partition("/")[0] == ns:
                # Endpoints written by hand (default/kubernetes) name no pod: no pod metrics.
                live.update(e.pod for eps in route.ports.values() for e in eps if "/" in e.pod)
        now = rfc3339(self.clock.now())
        items = []
        for pod in sorted(live):
            name = pod.partition("/")[2]
            if pod_name != "*" and name != pod_name:
                continue
            value = self.stats.pod_metric(pod, metric)
            items.append({
                "describedObject": {"kind": "Pod", "namespace": ns, "name": name, "apiVersion": "v1"},
                "metric": {"name": metric},
                "timestamp": now,
                "windowSeconds": int(self.stats.window),
                "value": milli_quantity(value or 0.0),
            })
        return web.json_response({"kind": "MetricValueList", "apiVersion": "custom.metrics.k8s.io/v1beta2",
                                  "metadata": {}, "items": items})
