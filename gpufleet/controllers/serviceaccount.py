"""Service accounts of every namespace, and the cluster CA they verify the API server with.

Two of kube-controller-manager's controllers, on one namespace informer:

* ``serviceaccount`` (ServiceAccountsController): every active namespace has a ServiceAccount
  ``default``, made again when deleted.
* ``root-ca-cert-publisher``: every active namespace has a ConfigMap ``kube-root-ca.crt``
  whose ``ca.crt`` is the cluster CA's certificate, with Kubernetes' description annotation;
  an edited one is put back, a deleted one made again. Pods read it through their
  ``kube-api-access-*`` volume to verify the API server. Without a CA (a control plane
  serving plain HTTP) nothing is published.

Namespaces being deleted are left alone (their objects are on their way out).

The decisions are ``decide_service_account`` and ``decide_root_ca`` (the namespace and the
object as cached in; its create or update out), applied with ``actions.apply``.
"""

from __future__ import annotations

import logging
from typing import Any

from gpufleet.api.k8s import ConfigMap, Namespace, ServiceAccount
from gpufleet.client import objects
from gpufleet.client.api import Client
from gpufleet.client.controller import Requeue
from gpufleet.client.errors import AlreadyExists, ApiError, Conflict, NotFound
from gpufleet.client.informer import SharedInformerFactory
from gpufleet.controllers.actions import Actions, Create, Update
from gpufleet.controllers.base import KeyedController

log = logging.getLogger(__name__)

DEFAULT_SERVICE_ACCOUNT = "default"
ROOT_CA_CONFIGMAP = "kube-root-ca.crt"
ROOT_CA_KEY = "ca.crt"
DESCRIPTION_ANNOTATION = "kubernetes.io/description"
DESCRIPTION = ("Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints "
               "such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across "
               "distributions of Kubernetes clusters.")


def _active(ns: Any) -> bool:
    if ns is None or objects.meta(ns, "deletion_timestamp") is not None:
        return False
    phase = ns.status.phase if ns.status is not None else None
    return phase in (None, "Active")


def decide_service_account(namespace: str, current: Any | None) -> Actions:
    """The namespace's ServiceAccount ``default`` created when it has none."""
    if current is not None:
        return Actions(reason="Present")
    body = {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": DEFAULT_SERVICE_ACCOUNT, "namespace": namespace}}
    return Actions(creates=[Create(body, on_exists="ignore")], reason="Create")


def decide_root_ca(namespace: str, root_ca: str | None, current: Any | None) -> Actions:
    """The namespace's ``kube-root-ca.crt`` created, or put back when its data or description
    differ (nothing without a CA)."""
    if not root_ca:
        return Actions(reason="NoCA")
    data = {ROOT_CA_KEY: root_ca}
    if current is None:
        body = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": ROOT_CA_CONFIGMAP, "namespace": namespace,
                             "annotations": {DESCRIPTION_ANNOTATION: DESCRIPTION}},
                "data": data}
        return Actions(creates=[Create(body)], reason="Create")
    annotations = objects.meta(current, "annotations") or {}
    if (current.data or {}) == data and annotations.get(DESCRIPTION_ANNOTATION):
        return Actions(reason="InSync")
    updated = current.to_dict()
    updated["data"] = data
    updated.pop("binaryData", None)
    updated["metadata"]["annotations"] = {**annotations, DESCRIPTION_ANNOTATION: DESCRIPTION}
    return Actions(updates=[Update(updated)], reason="PutBack")


class _NamespaceController(KeyedController):
    """Reconciles one thing per namespace, keyed by the namespace's name."""

    model = Namespace

    def __init__(self, client: Client, informers: SharedInformerFactory, **kwargs: Any) -> None:
        super().__init__(client, informers, **kwargs)
        self.ns_informer = self.informer

    def _watch_owned(self, informer: Any) -> None:
        """Wake the namespace of an object this controller keeps when it changes or goes."""
        def enqueue(obj: Any) -> None:
            self.queue.add(objects.namespace_of(obj))

        informer.add_event_handler(on_update=lambda old, new: enqueue(new), on_delete=enqueue)

    async def sync(self, key: str, ns: Any | None) -> Requeue | None:
        if not _active(ns):
            return None
        try:
            await self.sync_namespace(key)
        except NotFound:
            return None  # the namespace went meanwhile
        except Conflict:
            return Requeue()
        except ApiError as e:
            if _terminating(e):
                return None
            raise
        return None

    async def sync_namespace(self, namespace: str) -> None:
        raise NotImplementedError


def _terminating(e: ApiError) -> bool:
    # The API server refuses creates in a namespace being deleted (NamespaceTerminating).
    return any(c.get("reason") == "NamespaceTerminating" for c in e.causes)


class ServiceAccountsController(_NamespaceController):
    name = "serviceaccount"

    def __init__(self, client: Client, informers: SharedInformerFactory, **kwargs: Any) -> None:
        super().__init__(client, informers, **kwargs)
        self.sa_informer = informers.informer(ServiceAccount, field_selector={"metadata.name": DEFAULT_SERVICE_ACCOUNT})
        self._watch_owned(self.sa_informer)

    async def sync_namespace(self, namespace: str) -> None:
        current = self.sa_informer.get(f"{namespace}/{DEFAULT_SERVICE_ACCOUNT}")
        await self.act(namespace, None, decide_service_account(namespace, current))


class RootCACertPublisher(_NamespaceController):
    name = "root-ca-cert-publisher"

    def __init__(self, client: Client, informers: SharedInformerFactory, *, root_ca: bytes | str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(client, informers, **kwargs)
        self.root_ca = root_ca.decode() if isinstance(root_ca, bytes) else root_ca
        self.cm_informer = informers.informer(ConfigMap, field_selector={"metadata.name": ROOT_CA_CONFIGMAP})
        self._watch_owned(self.cm_informer)

    async def sync_namespace(self, namespace: str) -> None:
        current = self.cm_informer.get(f"{namespace}/{ROOT_CA_CONFIGMAP}")
        actions = decide_root_ca(namespace, self.root_ca, current)
        try:
            await self.act(namespace, None, actions)
        except AlreadyExists:
            # The cache had not shown it yet: decide again on the stored one.
            current = await self.client.get(ConfigMap, ROOT_CA_CONFIGMAP, namespace)
            actions = decide_root_ca(namespace, self.root_ca, current)
            await self.act(namespace, None, actions)
        if actions.updates:
            log.info("root-ca-cert-publisher: %s/%s put back", namespace, ROOT_CA_CONFIGMAP)
