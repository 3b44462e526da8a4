"""The ``default/kubernetes`` Service and its Endpoints: where programs in pods find the API.

As kube-apiserver's bootstrap controller with the lease endpoint reconciler: every API
server keeps the Service (ClusterIP 10.96.0.1, port ``https`` 443 to the servers' port,
labels component=apiserver and provider=kubernetes) as it should be, and renews a Lease of its
own in kube-system (``gpufleet-apiserver-<address>-<port>``, which names its address and
port) every ``interval`` seconds. The Endpoints list the address of every server whose Lease
is still live (renewed within ``lease_duration``), grouped by port, so a server that died
drops out within that time and one that stops cleanly drops out at once. The node agents set
KUBERNETES_SERVICE_HOST/PORT from them.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from gpufleet.apiserver.admission import UserInfo
from gpufleet.apiserver.errors import ApiException
from gpufleet.utils.clock import REAL_CLOCK, Clock, parse_rfc3339, rfc3339
from gpufleet.utils.tasks import cancel_and_wait

if TYPE_CHECKING:
    from gpufleet.apiserver.server import ApiServer

log = logging.getLogger("gpufleet.apiserver")

NAMESPACE = "default"
NAME = "kubernetes"
SERVICE_IP = "10.96.0.1"
SERVICE_PORT = 443
PORT_NAME = "https"
LEASE_NAMESPACE = "kube-system"
LEASE_PREFIX = "gpufleet-apiserver-"
LEASE_LABEL = "gpufleet.io/apiserver-endpoint"
ADDRESS_ANNOTATION = "gpufleet.io/apiserver-address"
PORT_ANNOTATION = "gpufleet.io/apiserver-port"
SERVICE_LABELS = {"component": "apiserver", "provider": "kubernetes"}
ENDPOINTS_LABELS = {"endpointslice.kubernetes.io/skip-mirror": "true"}
_SYSTEM = UserInfo("system:apiserver", ["system:masters"])


def lease_name(address: str, port: int) -> str:
    return LEASE_PREFIX + re.sub(r"[^a-z0-9]+", "-", f"{address}-{port}".lower()).strip("-")


def service_body(port: int, cluster_ip: str | None = SERVICE_IP) -> dict[str, Any]:
    spec: dict[str, Any] = {"type": "ClusterIP", "sessionAffinity": "None",
                            "ports": [{"name": PORT_NAME, "port": SERVICE_PORT, "protocol": "TCP", "targetPort": port}]}
    if cluster_ip:
        spec["clusterIP"] = cluster_ip
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": dict(SERVICE_LABELS)}, "spec": spec}


def live_endpoints(leases: Iterable[dict[str, Any]], now: float) -> list[dict[str, Any]]:
    """The Endpoints subsets of the servers whose Lease is live at ``now`` (pure)."""
    by_port: dict[int, set[str]] = {}
    for lease in leases:
        meta = lease.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        spec = lease.get("spec") or {}
        renewed, duration = spec.get("renewTime"), spec.get("leaseDurationSeconds")
        if meta.get("deletionTimestamp") or not renewed or not isinstance(duration, int):
            continue
        if parse_rfc3339(renewed) + duration < now:
            continue
        address, port = annotations.get(ADDRESS_ANNOTATION), annotations.get(PORT_ANNOTATION, "")
        if not address or not port.isdigit():
            continue
        by_port.setdefault(int(port), set()).add(address)
    return [{"addresses": [{"ip": ip} for ip in sorted(ips, key=_ip_order)],
             "ports": [{"name": PORT_NAME, "port": port, "protocol": "TCP"}]}
            for port, ips in sorted(by_port.items())]


def _ip_order(ip: str) -> tuple[int, int]:
    parsed = ipaddress.ip_address(ip)
    return parsed.version, int(parsed)


class KubernetesService:
    def __init__(self, api: ApiServer, address: str, port: int, *, clock: Clock = REAL_CLOCK,
                 interval: float = 10.0, lease_duration: int = 15) -> None:
        ipaddress.ip_address(address)  # an Endpoints address is an IP
        self.api = api
        self.address = address
        self.port = port
        self.clock = clock
        self.interval = interval
        self.lease_duration = lease_duration
        self.lease = lease_name(address, port)
        self._task: asyncio.Task | None = None

    def _rt(self, key: str) -> Any:
        rt = self.api.registry.by_key(key)
        assert rt is not None
        return rt

    async def start(self) -> None:
        await self.reconcile()
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        # Leaving cleanly: out of the Endpoints at once, not after the lease runs out.
        with contextlib.suppress(ApiException):
            await self.api.delete_object(self._rt("leases.coordination.k8s.io"), LEASE_NAMESPACE, self.lease,
                                         user=_SYSTEM)
        with contextlib.suppress(ApiException):
            await self._endpoints()

    async def _loop(self) -> None:
        while True:
            await self.clock.sleep(self.interval)
            try:
                await self.reconcile()
            except Exception:  # one failed round must not end the loop
                log.exception("could not reconcile the %s/%s service", NAMESPACE, NAME)

    async def reconcile(self) -> None:
        await self._service()
        await self._renew()
        await self._endpoints()

    async def _service(self) -> None:
        rt = self._rt("services")
        try:
            current = await self.api.get_object(rt, NAMESPACE, NAME)
        except ApiException as e:
            if e.code != 404:
                raise
            taken = any((s.get("spec") or {}).get("clusterIP") == SERVICE_IP
                        for s in (await self.api.store.list("services", None)).items)
            try:
                await self.api.create_object(rt, NAMESPACE, service_body(self.port, None if taken else SERVICE_IP),
                                             user=_SYSTEM)
            except ApiException as e:
                if e.code != 409:
                    raise
            return
        # As kube-apiserver: the ports and type are put back; the rest is left as it is.
        want = service_body(self.port)["spec"]
        spec = current.get("spec") or {}
        ports = [{k: p.get(k) for k in ("name", "port", "protocol", "targetPort")} for p in spec.get("ports") or []]
        if spec.get("type") == want["type"] and ports == want["ports"]:
            return
        updated = {**current, "spec": {**spec, "type": want["type"], "ports": want["ports"]}}
        try:
            await self.api.update_object(rt, NAMESPACE, NAME, updated, user=_SYSTEM)
        except ApiException as e:
            if e.code != 409:
                raise

    async def _renew(self) -> None:
        rt = self._rt("leases.coordination.k8s.io")
        now = rfc3339(self.clock.now(), micro=True)
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.lease, "namespace": LEASE_NAMESPACE, "labels": {LEASE_LABEL: "true"},
                             "annotations": {ADDRESS_ANNOTATION: self.address, PORT_ANNOTATION: str(self.port)}},
                "spec": {"holderIdentity": f"{self.address}:{self.port}", "leaseDurationSeconds": self.lease_duration,
                         "renewTime": now}}
        try:
            current = await self.api.get_object(rt, LEASE_NAMESPACE, self.lease)
        except ApiException as e:
            if e.code != 404:
                raise
            body["spec"]["acquireTime"] = now
            try:
                await self.api.create_object(rt, LEASE_NAMESPACE, body, user=_SYSTEM)
            except ApiException as err:
                if err.code != 409:
                    raise
            return
        body["metadata"]["resourceVersion"] = current["metadata"].get("resourceVersion")
        body["spec"]["acquireTime"] = (current.get("spec") or {}).get("acquireTime") or now
        try:
            await self.api.update_object(rt, LEASE_NAMESPACE, self.lease, body, user=_SYSTEM)
        except ApiException as e:
            if e.code != 409:
                raise

    async def _endpoints(self) -> None:
        rt = self._rt("endpoints")
        now = self.clock.now()
        leases = [lease for lease in (await self.api.store.list("leases.coordination.k8s.io", LEASE_NAMESPACE)).items
                  if ((lease.get("metadata") or {}).get("labels") or {}).get(LEASE_LABEL)]
        subsets = live_endpoints(leases, now)
        live = {a["ip"] + ":" + str(s["ports"][0]["port"]) for s in subsets for a in s["addresses"]}
        for lease in leases:
            # A server gone for good leaves its Lease behind: whoever sees it expired removes it.
            holder = (lease.get("spec") or {}).get("holderIdentity")
            name = (lease.get("metadata") or {}).get("name", "")
            if holder not in live and name != self.lease:
                with contextlib.suppress(ApiException):
                    await self.api.delete_object(self._rt("leases.coordination.k8s.io"), LEASE_NAMESPACE, name,
                                                 {"preconditions": {"uid": lease["metadata"].get("uid")}},
                                                 user=_SYSTEM)
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "Endpoints",
                                "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": dict(ENDPOINTS_LABELS)}}
        if subsets:
            body["subsets"] = subsets
        try:
            current = await self.api.get_object(rt, NAMESPACE, NAME)
        except ApiException as e:
            if e.code != 404:
                raise
            try:
                await self.api.create_object(rt, NAMESPACE, body, user=_SYSTEM)
            except ApiException as err:
                if err.code != 409:
                    raise
            return
        if (current.get("subsets") or []) == subsets and \
                ((current.get("metadata") or {}).get("labels") or {}) == ENDPOINTS_LABELS:
            return
        body["metadata"]["resourceVersion"] = current["metadata"].get("resourceVersion")
        try:
            await self.api.update_object(rt, NAMESPACE, NAME, body, user=_SYSTEM)
        except ApiException as e:
            if e.code != 409:
                raise


def advertise_address(host: str) -> str:
    """The address other machines reach a server listening on ``host`` by: the host itself
    when it is an IP, else (a wildcard) the first non-loopback IPv4 address of this machine,
    as kube-apiserver picks its --advertise-address; loopback when there is none."""
    import socket

    import psutil

    if host not in ("0.0.0.0", "::", ""):
        try:
            return str(ipaddress.ip_address(host))
        except ValueError:
            try:
                return socket.gethostbyname(host)
            except OSError:
                return "127.0.0.1"
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not ipaddress.ip_address(a.address).is_loopback:
                return a.address
    return "127.0.0.1"
