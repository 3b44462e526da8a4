"""Container-level rules of ``pkg/apis/core/validation``: ports, probes, handlers, env, mounts, volumes."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from gpufleet.api import k8s
from gpufleet.api.validation.core import (
    Errs,
    _enum,
    _int_or_string,
    _names,
    _nonneg,
    validate_resource_requirements,
)
from gpufleet.api.validation.errors import (
    Unquoted,
    duplicate,
    forbidden,
    invalid,
    not_found,
    not_supported,
    required,
)
from gpufleet.api.validation.names import (
    _HTTP_HEADER_NAME_RE,
    HTTP_HEADER_NAME_FMT,
    is_dns1123_label,
    is_env_var_name,
    is_valid_port_name,
    is_valid_port_num,
    regex_error,
)

PORT_PROTOCOLS = ["SCTP", "TCP", "UDP"]
RESTART_POLICIES = ["Always", "Never", "OnFailure"]
DNS_POLICIES = ["ClusterFirstWithHostNet", "ClusterFirst", "Default", "None"]
PULL_POLICIES = ["Always", "IfNotPresent", "Never"]
TERMINATION_MESSAGE_POLICIES = ["File", "FallbackToLogsOnError"]
TAINT_EFFECTS = ["NoSchedule", "PreferNoSchedule", "NoExecute"]
TOLERATION_OPERATORS = ["Equal", "Exists"]
PREEMPTION_POLICIES = ["PreemptLowerPriority", "Never"]
HTTP_SCHEMES = ["HTTP", "HTTPS"]
UNSATISFIABLE_CONSTRAINT_ACTIONS = ["DoNotSchedule", "ScheduleAnyway"]
HOST_PATH_TYPES = ["", "BlockDevice", "CharDevice", "Directory", "DirectoryOrCreate", "File", "FileOrCreate", "Socket"]
_VOLUME_SOURCES = [f for f in k8s.Volume.model_fields if f != "name"]


def _alias(model: type[BaseModel], attr: str) -> str:
    return model.model_fields[attr].alias or attr


def _validate_port_num_or_name(port: Any, path: str, errs: Errs) -> None:
    port = _int_or_string(port, path, errs)
    if port is None:
        errs.append(required(path))
    elif isinstance(port, int):
        errs.extend(invalid(path, port, msg) for msg in is_valid_port_num(port))
    else:
        errs.extend(invalid(path, port, msg) for msg in is_valid_port_name(port))


def _validate_handler(handler: Any, path: str, errs: Errs, grace_period: int | None) -> None:
    kinds = [
        ("exec", "exec"),
        ("http_get", "httpGet"),
        ("tcp_socket", "tcpSocket"),
        ("grpc", "grpc"),
        ("sleep", "sleep"),
    ]
    count = 0
    for attr, alias in kinds:
        action = getattr(handler, attr, None)
        if action is None:
            continue
        p = f"{path}.{alias}"
        if count:
            errs.append(forbidden(p, "may not specify more than 1 handler type"))
            continue
        count += 1
        if attr == "exec" and not action.command:
            errs.append(required(f"{p}.command"))
        elif attr == "http_get":
            if action.path == "":
                errs.append(required(f"{p}.path"))
            _validate_port_num_or_name(action.port, f"{p}.port", errs)
            if action.scheme is not None and action.scheme not in HTTP_SCHEMES:
                errs.append(not_supported(f"{p}.scheme", action.scheme, HTTP_SCHEMES))
            for header in action.http_headers or []:
                if not _HTTP_HEADER_NAME_RE.fullmatch(header.name):
                    errs.append(
                        invalid(
                            f"{p}.httpHeaders",
                            header.name,
                            regex_error(
                                "a valid HTTP header must consist of alphanumeric characters or '-'",
                                HTTP_HEADER_NAME_FMT,
                                "X-Header-Name",
                            ),
                        )
                    )
        elif attr == "tcp_socket":
            _validate_port_num_or_name(action.port, f"{p}.port", errs)
        elif attr == "grpc":
            _validate_port_num_or_name(action.port, f"{p}.port", errs)
        elif attr == "sleep" and grace_period is not None and not 0 < action.seconds <= grace_period:
            errs.append(
                invalid(
                    p,
                    action.seconds,
                    f"must be greater than 0 and less than terminationGracePeriodSeconds ({grace_period})",
                )
            )
    if count == 0:
        errs.append(required(path, "must specify a handler type"))


def _validate_probe(
    probe: k8s.Probe | None, path: str, errs: Errs, *, kind: str, grace_period: int | None
) -> None:
    if probe is None:
        return
    _validate_handler(probe, path, errs, None)
    for attr, alias in (
        ("initial_delay_seconds", "initialDelaySeconds"),
        ("timeout_seconds", "timeoutSeconds"),
        ("period_seconds", "periodSeconds"),
        ("success_threshold", "successThreshold"),
        ("failure_threshold", "failureThreshold"),
    ):
        _nonneg(getattr(probe, attr), f"{path}.{alias}", errs)
    tgps = probe.termination_grace_period_seconds
    if kind == "readiness" and tgps is not None:
        errs.append(
            invalid(f"{path}.terminationGracePeriodSeconds", tgps, "must not be set for readinessProbes")
        )
    elif tgps is not None and tgps <= 0:
        errs.append(invalid(f"{path}.terminationGracePeriodSeconds", tgps, "must be greater than 0"))
    if kind in ("liveness", "startup") and probe.success_threshold not in (None, 1):
        errs.append(invalid(f"{path}.successThreshold", probe.success_threshold, "must be 1"))


def _validate_env(env: list[k8s.EnvVar] | None, path: str, errs: Errs) -> None:
    for i, var in enumerate(env or []):
        p = f"{path}[{i}]"
        if not var.name:
            errs.append(required(f"{p}.name"))
        else:
            _names(var.name, f"{p}.name", is_env_var_name, errs)
        source = var.value_from
        if source is None:
            continue
        sources = [
            s
            for s in (
                source.field_ref,
                source.resource_field_ref,
                source.config_map_key_ref,
                source.secret_key_ref,
                source.file_key_ref,
            )
            if s is not None
        ]
        vp = f"{p}.valueFrom"
        if not sources:
            errs.append(
                invalid(
                    vp,
                    "",
                    "must specify one of: `fieldRef`, `resourceFieldRef`, `configMapKeyRef` or `secretKeyRef`",
                )
            )
        elif var.value:
            errs.append(invalid(vp, "", "may not be specified when `value` is not empty"))
        elif len(sources) > 1:
            errs.append(invalid(vp, "", "may not have more than one field specified at a time"))


def _validate_local_descending_path(target: str, path: str, errs: Errs) -> None:
    if target.startswith("/"):
        errs.append(invalid(path, target, "must be a relative path"))
    if ".." in target.replace("\\", "/").split("/"):
        errs.append(invalid(path, target, "must not contain '..'"))


def _validate_volume_mounts(
    mounts: list[k8s.VolumeMount] | None, volumes: set[str], path: str, errs: Errs
) -> None:
    seen: set[str] = set()
    for i, mount in enumerate(mounts or []):
        p = f"{path}[{i}]"
        if not mount.name:
            errs.append(required(f"{p}.name"))
        if mount.name not in volumes:
            errs.append(not_found(f"{p}.name", mount.name))
        if not mount.mount_path:
            errs.append(required(f"{p}.mountPath"))
        elif mount.mount_path in seen:
            errs.append(invalid(f"{p}.mountPath", mount.mount_path, "must be unique"))
        seen.add(mount.mount_path)
        if mount.sub_path:
            _validate_local_descending_path(mount.sub_path, f"{p}.subPath", errs)


def _validate_container_ports(ports: list[k8s.ContainerPort] | None, path: str, errs: Errs) -> None:
    names: set[str] = set()
    seen: set[tuple[int, str]] = set()
    for i, port in enumerate(ports or []):
        p = f"{path}[{i}]"
        if port.name:
            msgs = is_valid_port_name(port.name)
            errs.extend(invalid(f"{p}.name", port.name, msg) for msg in msgs)
            if not msgs:
                if port.name in names:
                    errs.append(duplicate(f"{p}.name", port.name))
                names.add(port.name)
        if port.container_port == 0:
            errs.append(required(f"{p}.containerPort"))
        else:
            errs.extend(
                invalid(f"{p}.containerPort", port.container_port, m)
                for m in is_valid_port_num(port.container_port)
            )
        if port.host_port:
            errs.extend(
                invalid(f"{p}.hostPort", port.host_port, m) for m in is_valid_port_num(port.host_port)
            )
        _enum(port.protocol, f"{p}.protocol", PORT_PROTOCOLS, errs)
        # Deliberate difference: Kubernetes only warns about a repeated containerPort/protocol
        # in one container; here it is an error, since the second entry can never be served.
        key = (port.container_port, port.protocol or "TCP")
        if key in seen:
            errs.append(duplicate(p, Unquoted(f"{key[0]}/{key[1]}")))
        seen.add(key)


def _validate_host_port_conflicts(
    containers: list[k8s.Container], path: str, errs: Errs, *, first_index: int = 0
) -> None:
    seen: set[str] = set()
    for ci, c in enumerate(containers, start=first_index):
        for pi, port in enumerate(c.ports or []):
            if not port.host_port:
                continue
            key = f"{port.protocol or 'TCP'}/{port.host_ip or ''}/{port.host_port}"
            if key in seen:
                errs.append(duplicate(f"{path}[{ci}].ports[{pi}].hostPort", key))
            seen.add(key)


def _validate_container(c: k8s.Container, path: str, volumes: set[str], errs: Errs) -> None:
    if not c.name:
        errs.append(required(f"{path}.name"))
    else:
        _names(c.name, f"{path}.name", is_dns1123_label, errs)
    if not c.image:
        errs.append(required(f"{path}.image"))
    _enum(
        c.termination_message_policy, f"{path}.terminationMessagePolicy", TERMINATION_MESSAGE_POLICIES, errs
    )
    _enum(c.image_pull_policy, f"{path}.imagePullPolicy", PULL_POLICIES, errs)
    _validate_container_ports(c.ports, f"{path}.ports", errs)
    _validate_env(c.env, f"{path}.env", errs)
    _validate_volume_mounts(c.volume_mounts, volumes, f"{path}.volumeMounts", errs)
    validate_resource_requirements(c.resources, f"{path}.resources", errs)


def _validate_probes_and_lifecycle(c: k8s.Container, path: str, grace: int | None, errs: Errs) -> None:
    if c.lifecycle is not None:
        for attr, alias in (("post_start", "postStart"), ("pre_stop", "preStop")):
            handler = getattr(c.lifecycle, attr)
            if handler is not None:
                _validate_handler(handler, f"{path}.lifecycle.{alias}", errs, grace)
    _validate_probe(c.liveness_probe, f"{path}.livenessProbe", errs, kind="liveness", grace_period=grace)
    _validate_probe(c.readiness_probe, f"{path}.readinessProbe", errs, kind="readiness", grace_period=grace)
    _validate_probe(c.startup_probe, f"{path}.startupProbe", errs, kind="startup", grace_period=grace)


def _no_backsteps(target: str, path: str, errs: Errs) -> None:
    if ".." in target.replace("\\", "/").split("/"):
        errs.append(invalid(path, target, "must not contain '..'"))


def _validate_host_path(source: k8s.HostPathVolumeSource, path: str, errs: Errs) -> None:
    if not source.path:
        errs.append(required(f"{path}.path"))
        return
    _no_backsteps(source.path, f"{path}.path", errs)
    if source.type is not None and source.type not in HOST_PATH_TYPES:
        errs.append(not_supported(f"{path}.type", source.type, HOST_PATH_TYPES))


def _validate_volumes(volumes: list[k8s.Volume] | None, path: str, errs: Errs) -> set[str]:
    names: set[str] = set()
    for i, vol in enumerate(volumes or []):
        p = f"{path}[{i}]"
        set_sources = [attr for attr in _VOLUME_SOURCES if getattr(vol, attr) is not None]
        if not set_sources:
            errs.append(required(p, "must specify a volume type"))
        for attr in set_sources[1:]:
            errs.append(
                forbidden(f"{p}.{_alias(k8s.Volume, attr)}", "may not specify more than 1 volume type")
            )
        if vol.persistent_volume_claim is not None and not vol.persistent_volume_claim.claim_name:
            errs.append(required(f"{p}.persistentVolumeClaim.claimName"))
        if vol.host_path is not None:
            _validate_host_path(vol.host_path, f"{p}.hostPath", errs)
        if not vol.name:
            errs.append(required(f"{p}.name"))
        else:
            _names(vol.name, f"{p}.name", is_dns1123_label, errs)
        if vol.name in names:
            errs.append(duplicate(f"{p}.name", vol.name))
        names.add(vol.name)
    return names
