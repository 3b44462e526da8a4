"""Admission: what runs between decoding a request and storing its object.

Order, as in kube-apiserver: decode -> defaults -> mutating plugins -> validation ->
validating plugins -> store. Plugins see plain JSON dicts; a plugin rejects by raising an
ApiException (Forbidden for policy such as quota, Invalid for shape).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from gpufleet.api.registry import ResourceType

if TYPE_CHECKING:
    from gpufleet.apiserver.admission.podsecurity import PodSecurityConfig
    from gpufleet.apiserver.server import ApiServer


@dataclass
class UserInfo:
    name: str = "system:anonymous"
    groups: list[str] = field(default_factory=list)
    # Set by the authenticators that know them (service account tokens, impersonation).
    uid: str = ""
    extra: dict[str, list[str]] = field(default_factory=dict)


@dataclass
class AdmissionContext:
    operation: str  # CREATE | UPDATE | DELETE | CONNECT
    rt: ResourceType
    namespace: str
    name: str
    subresource: str
    user: UserInfo
    dry_run: bool
    server: ApiServer
    # What the response tells the client besides the object (``Warning:`` headers).
    warnings: list[str] = field(default_factory=list)


class MutatingPlugin(Protocol):
    name: str

    async def admit(self, ctx: AdmissionContext, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        """Change obj in place (e.g. fill defaults from a LimitRange)."""


class ValidatingPlugin(Protocol):
    name: str

    async def validate(self, ctx: AdmissionContext, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        """Raise an ApiException to reject. Must not change obj."""


def standard_plugins(pod_security: PodSecurityConfig | None = None, *, mount_service_account_token: bool = True,
                     ) -> tuple[list[MutatingPlugin], list[ValidatingPlugin]]:
    """kube-apiserver's default chain for what is served here: LimitRanger, ServiceAccount,
    Priority, DefaultStorageClass, StorageObjectInUseProtection, the queues' suspension of
    queued jobs (Kueue's webhook) and DefaultIngressClass mutate; LimitRanger,
    Priority, PersistentVolumeClaimResize, PodSecurity (``pod_security``: its configuration,
    default enforce baseline outside kube-system), EndpointsAddresses, NetworkPolicyNotEnforced
    (a Warning) and then ResourceQuota (last, so it charges
    exactly what will be stored) validate. ``mount_service_account_token=False`` keeps the
    ServiceAccount plugin from mounting tokens (for a server that issues none)."""
    from gpufleet.apiserver.admission.crdrules import CustomResourceDefinitionRules
    from gpufleet.apiserver.admission.endpoints import EndpointsAddresses
    from gpufleet.apiserver.admission.limitrange import LimitRangerAdmission
    from gpufleet.apiserver.admission.networking import DefaultIngressClass, NetworkPolicyNotEnforced
    from gpufleet.apiserver.admission.podsecurity import PodSecurityAdmission
    from gpufleet.apiserver.admission.priority import PriorityAdmission
    from gpufleet.apiserver.admission.queues import QueuedJobSuspender
    from gpufleet.apiserver.admission.quota import ResourceQuotaAdmission
    from gpufleet.apiserver.admission.serviceaccount import ServiceAccountAdmission
    from gpufleet.apiserver.admission.storage import (
        DefaultStorageClass,
        PersistentVolumeClaimResize,
        StorageObjectInUseProtection,
    )

    limit_ranger, priority = LimitRangerAdmission(), PriorityAdmission()
    service_account = ServiceAccountAdmission(mount_token=mount_service_account_token)
    mutating: list[MutatingPlugin] = [limit_ranger, service_account, priority, DefaultStorageClass(),
                                      StorageObjectInUseProtection(), QueuedJobSuspender(), DefaultIngressClass()]
    validating: list[ValidatingPlugin] = [limit_ranger, priority, PersistentVolumeClaimResize(),
                                          PodSecurityAdmission(pod_security), EndpointsAddresses(),
                                          CustomResourceDefinitionRules(), NetworkPolicyNotEnforced(), ResourceQuotaAdmission()]
    return mutating, validating
