"""CronJob (batch/v1): make a Job from ``spec.jobTemplate`` at each time of ``spec.schedule``.

The rules are in ``decide`` (pure: the CronJob, its Jobs and the time in, a plan out); the
schedule is read by ``gpufleet.api.cronschedule``; ``controller`` wires and applies. Time
comes from the injected Clock, so the schedule logic runs in virtual time in tests.
"""

from gpufleet.controllers.cronjob.controller import CronJobController
from gpufleet.controllers.cronjob.decide import (
    Observed,
    Plan,
    after_create,
    decide,
    job_from_template,
    job_name,
    most_recent_schedule_time,
)

__all__ = [
    "CronJobController",
    "Observed",
    "Plan",
    "after_create",
    "decide",
    "job_from_template",
    "job_name",
    "most_recent_schedule_time",
]
