"""The one client every component uses to reach the API server (see ARCHITECTURE.md).

Import what you need from here; the submodules are: transport (HTTP or in-process),
api (the typed Client), informer (list+watch caches), workqueue and controller (reconcile
loops), events (Event recording), kubeconfig and errors.
"""

from gpufleet.client.api import Client, ObjectList, WatchEvent, retry_on_conflict
from gpufleet.client.controller import Controller, PermanentError, Requeue, TemporaryError
from gpufleet.client.errors import (
    AlreadyExists,
    ApiError,
    BadRequest,
    ClientError,
    Conflict,
    Expired,
    Forbidden,
    Gone,
    Invalid,
    NotFound,
    ServerError,
    TooManyRequests,
    TransportError,
    Unauthorized,
)
from gpufleet.client.events import EventRecorder
from gpufleet.client.informer import Indexer, Informer, SharedInformerFactory
from gpufleet.client.kubeconfig import load_kubeconfig, transport_from_kubeconfig, write_kubeconfig
from gpufleet.client.transport import HttpTransport, LocalTransport, Transport
from gpufleet.client.workqueue import ShutDown, WorkQueue

__all__ = [
    "AlreadyExists",
    "ApiError",
    "BadRequest",
    "Client",
    "ClientError",
    "Conflict",
    "Controller",
    "EventRecorder",
    "Expired",
    "Forbidden",
    "Gone",
    "HttpTransport",
    "Indexer",
    "Informer",
    "Invalid",
    "LocalTransport",
    "NotFound",
    "ObjectList",
    "PermanentError",
    "Requeue",
    "ServerError",
    "SharedInformerFactory",
    "ShutDown",
    "TemporaryError",
    "TooManyRequests",
    "Transport",
    "TransportError",
    "Unauthorized",
    "WatchEvent",
    "WorkQueue",
    "load_kubeconfig",
    "retry_on_conflict",
    "transport_from_kubeconfig",
    "write_kubeconfig",
]
