"""batch/v1 rules defined once: the labels and selector Kubernetes' API server gives a Job,
and the names and annotations a CronJob's Jobs carry.

A Job created without ``manualSelector: true`` gets, in kube-apiserver's Job strategy
(PrepareForCreate's generateSelector), the selector
``batch.kubernetes.io/controller-uid=<uid>`` and on its pod template the labels
``batch.kubernetes.io/controller-uid``, ``batch.kubernetes.io/job-name`` and their legacy
forms ``controller-uid`` and ``job-name`` (Kubernetes 1.27+ writes both). Labels the user
already set are kept; validation then says when they do not fit.
"""

from __future__ import annotations

from typing import Any

CONTROLLER_UID_LABEL = "batch.kubernetes.io/controller-uid"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
LEGACY_CONTROLLER_UID_LABEL = "controller-uid"
LEGACY_JOB_NAME_LABEL = "job-name"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"

# A CronJob's Job: when it was due (RFC 3339), and `kubectl create job --from=cronjob/x`'s mark.
CRONJOB_SCHEDULED_TIMESTAMP = "batch.kubernetes.io/cronjob-scheduled-timestamp"
CRONJOB_INSTANTIATE = "cronjob.kubernetes.io/instantiate"
# Kubernetes keeps CronJob names short enough for `<name>-<minutes since epoch>` Job names
# (DNS-1035 label, 63) and their pods' generated names.
CRONJOB_NAME_MAX = 52


def manual_selector(job: dict[str, Any]) -> bool:
    return bool((job.get("spec") or {}).get("manualSelector"))


def generate_job_selector(job: dict[str, Any]) -> None:
    """Kubernetes' generateSelector on a Job about to be created (``metadata.uid`` and
    ``metadata.name`` set): the template's labels and the selector, unless manualSelector.
    Does nothing to a body whose shape is wrong: decoding reports that."""
    if manual_selector(job):
        return
    meta, spec = job.get("metadata"), job.get("spec")
    if not isinstance(meta, dict) or not isinstance(spec, dict) or not isinstance(spec.get("template"), dict):
        return
    template = spec["template"]
    tmeta = template.setdefault("metadata", {})
    if not isinstance(tmeta, dict):
        return
    labels = tmeta.get("labels")
    if labels is None:
        labels = tmeta["labels"] = {}
    if not isinstance(labels, dict):
        return
    name, uid = str(meta.get("name") or ""), str(meta.get("uid") or "")
    for key in (LEGACY_JOB_NAME_LABEL, JOB_NAME_LABEL):
        labels.setdefault(key, name)
    for key in (LEGACY_CONTROLLER_UID_LABEL, CONTROLLER_UID_LABEL):
        labels.setdefault(key, uid)
    selector = spec.get("selector")
    if selector is None:
        selector = spec["selector"] = {}
    if not isinstance(selector, dict):
        return
    match = selector.get("matchLabels")
    if match is None:
        match = selector["matchLabels"] = {}
    if isinstance(match, dict):
        match.setdefault(CONTROLLER_UID_LABEL, uid)
