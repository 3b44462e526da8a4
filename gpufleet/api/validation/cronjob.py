"""batch/v1 CronJob, as kube-apiserver validates it (validateCronJobSpec)."""

from __future__ import annotations

from gpufleet.api import cronschedule, k8s
from gpufleet.api.batch import CRONJOB_NAME_MAX
from gpufleet.api.validation.core import Errs, _nonneg, validate_object_meta
from gpufleet.api.validation.errors import invalid, not_supported, required
from gpufleet.api.validation.workloads import validate_job_spec

CONCURRENCY_POLICIES = ["Allow", "Forbid", "Replace"]


def _validate_cron_job(cj: k8s.CronJob, errs: Errs) -> None:
    validate_object_meta(cj.metadata, errs)
    name = cj.metadata.name if cj.metadata is not None else None
    if name and len(name) > CRONJOB_NAME_MAX:
        # The controller names each Job `<name>-<minutes since epoch>` (11 more characters).
        errs.append(invalid("metadata.name", name, f"must be no more than {CRONJOB_NAME_MAX} characters"))
    _validate_spec(cj.spec, None, errs)


def _validate_spec(spec: k8s.CronJobSpec, old: k8s.CronJobSpec | None, errs: Errs) -> None:
    schedule = spec.schedule
    if not schedule:
        errs.append(required("spec.schedule", "a cron schedule such as \"*/5 * * * *\" or \"@hourly\""))
    else:
        allow_tz = old is not None and "TZ" in old.schedule
        try:
            cronschedule.parse(schedule, None)
        except cronschedule.ScheduleError as e:
            if "time zone" not in str(e):
                errs.append(invalid("spec.schedule", schedule, str(e)))
        if allow_tz and "TZ" in schedule and spec.time_zone is not None:
            errs.append(invalid("spec.schedule", schedule, "cannot use both timeZone field and TZ or CRON_TZ in "
                                                           "schedule"))
        elif not allow_tz and "TZ" in schedule:
            errs.append(invalid("spec.schedule", schedule, "cannot use TZ or CRON_TZ in schedule, use timeZone "
                                                           "field instead"))
    if spec.starting_deadline_seconds is not None:
        _nonneg(spec.starting_deadline_seconds, "spec.startingDeadlineSeconds", errs)
    if spec.time_zone is not None and (old is None or old.time_zone != spec.time_zone):
        problem = cronschedule.time_zone_error(spec.time_zone)
        if problem is not None:
            errs.append(invalid("spec.timeZone", spec.time_zone, problem))
    policy = spec.concurrency_policy
    if not policy:
        errs.append(required("spec.concurrencyPolicy"))
    elif policy not in CONCURRENCY_POLICIES:
        errs.append(not_supported("spec.concurrencyPolicy", policy, CONCURRENCY_POLICIES))
    _validate_job_template(spec.job_template, errs)
    _nonneg(spec.successful_jobs_history_limit, "spec.successfulJobsHistoryLimit", errs)
    _nonneg(spec.failed_jobs_history_limit, "spec.failedJobsHistoryLimit", errs)


def _validate_job_template(template: k8s.JobTemplateSpec, errs: Errs) -> None:
    path = "spec.jobTemplate.spec"
    spec = template.spec
    if spec is None:
        errs.append(required(f"{path}.template"))
        return
    validate_job_spec(spec, path, errs)
    # Each Job gets its selector from its own uid.
    if spec.selector is not None:
        errs.append(invalid(f"{path}.selector", spec.selector.to_dict(), "`selector` will be auto-generated"))
    if spec.manual_selector:
        errs.append(not_supported(f"{path}.manualSelector", spec.manual_selector, ["nil", "false"]))
