"""A CronJob's schedule, read as Kubernetes reads it (robfig/cron's ParseStandard), and the
times it names.

``parse(schedule, time_zone)`` accepts what kube-apiserver accepts: five fields (minute, hour,
day of month, month, day of week; numbers, ``*``, ``?``, ranges ``a-b``, steps ``/n``, lists
``a,b``, month and weekday names), or a descriptor (``@yearly``/``@annually``, ``@monthly``,
``@weekly``, ``@daily``/``@midnight``, ``@hourly``, ``@every <duration>``), optionally after
``TZ=<zone>``/``CRON_TZ=<zone>``. A refusal is a ``ScheduleError`` whose message is robfig's.
The times themselves come from croniter (DST-aware, in the schedule's zone through zoneinfo);
``@every`` is a constant delay, as in robfig.

``time_zone_error`` says what is wrong with a ``spec.timeZone``, as kube-apiserver says it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter


class ScheduleError(ValueError):
    pass


_DESCRIPTORS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTHS = {m: i + 1 for i, m in enumerate(
    ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"))}
_DAYS = {d: i for i, d in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}
# (name, minimum, maximum, names) of the five fields, in order.
_FIELDS = (
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day of month", 1, 31, {}),
    ("month", 1, 12, _MONTHS),
    ("day of week", 0, 6, _DAYS),
)


@dataclass(frozen=True)
class Schedule:
    """A parsed schedule: ``next(t)`` is the first time it names strictly after ``t``
    (seconds since the epoch)."""

    expression: str  # five fields, or "" for @every
    zone: tzinfo
    every: float = 0.0

    def next(self, t: float) -> float:
        if self.every:
            return math.floor(t) + self.every
        start = datetime.fromtimestamp(math.floor(t), tz=self.zone)
        return float(croniter(self.expression, start).get_next(float))


def load_zone(name: str) -> tzinfo:
    """An IANA zone (``""`` and ``UTC`` are UTC); ScheduleError when there is none by that name."""
    if name in ("", "UTC"):
        return UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ScheduleError(f"unknown time zone {name}") from None


def parse(schedule: str, time_zone: str | None = None) -> Schedule:
    """The schedule of a CronJob (``time_zone``: its spec.timeZone; None: UTC)."""
    spec = schedule.strip()
    if not spec:
        raise ScheduleError("empty spec string")
    zone_name = time_zone or ""
    if spec.startswith(("TZ=", "CRON_TZ=")):
        head, _, spec = spec.partition(" ")
        zone_name = head.split("=", 1)[1]
        spec = spec.strip()
    zone = load_zone(zone_name)
    if spec.startswith("@"):
        if spec.startswith("@every "):
            seconds = go_duration(spec[len("@every "):].strip())
            if not math.isfinite(seconds) or seconds > _MAX_DURATION:
                raise ScheduleError(f"failed to parse duration {spec[len('@every '):].strip()}: time: invalid "
                                    "duration")
            return Schedule("", zone, every=max(round(seconds), 1))
        expression = _DESCRIPTORS.get(spec)
        if expression is None:
            raise ScheduleError(f"unrecognized descriptor: {spec}")
        return Schedule(expression, zone)
    fields = spec.split()
    if len(fields) != 5:
        raise ScheduleError(f"expected exactly 5 fields, found {len(fields)}: [{' '.join(fields)}]")
    for text, (_, lo, hi, names) in zip(fields, _FIELDS, strict=True):
        _check_field(text, lo, hi, names)
    # croniter reads "?" as "*" and names in any case, as robfig does.
    return Schedule(" ".join(fields), zone)


def _check_field(text: str, lo: int, hi: int, names: dict[str, int]) -> None:
    for part in text.split(","):
        _check_range(part, lo, hi, names)


def _check_range(expr: str, lo: int, hi: int, names: dict[str, int]) -> None:
    range_and_step = expr.split("/")
    if len(range_and_step) > 2:
        raise ScheduleError(f"too many slashes: {expr}")
    low_and_high = range_and_step[0].split("-")
    if len(low_and_high) > 2:
        raise ScheduleError(f"too many hyphens: {expr}")
    if low_and_high[0] in ("*", "?"):
        start, end = lo, hi
    else:
        start = _int_or_name(low_and_high[0], names, expr)
        end = _int_or_name(low_and_high[1], names, expr) if len(low_and_high) == 2 else start
    if len(range_and_step) == 2:
        step = _int(range_and_step[1], expr)
        if step <= 0:
            raise ScheduleError(f"step of range should be a positive number: {expr}")
        if len(low_and_high) == 1 and low_and_high[0] not in ("*", "?"):
            end = hi  # "n/step" is "n-max/step"
    if start < lo:
        raise ScheduleError(f"beginning of range ({start}) below minimum ({lo}): {expr}")
    if end > hi:
        raise ScheduleError(f"end of range ({end}) above maximum ({hi}): {expr}")
    if start > end:
        raise ScheduleError(f"beginning of range ({start}) beyond end of range ({end}): {expr}")


def _int_or_name(text: str, names: dict[str, int], expr: str) -> int:
    if text.lower() in names:
        return names[text.lower()]
    return _int(text, expr)


def _int(text: str, expr: str) -> int:
    if not re.fullmatch(r"[+-]?\d+", text):
        raise ScheduleError(f'failed to parse int from {text}: strconv.Atoi: parsing "{text}": invalid syntax')
    value = int(text)
    if value < 0:
        raise ScheduleError(f"negative number ({value}) not allowed: {expr}")
    return value


# Go's time.Duration holds about 292 years.
_MAX_DURATION = 9_223_372_036.0
_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_GO_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def go_duration(text: str) -> float:
    """Seconds in a Go duration ("90s", "1h30m", "1.5h")."""
    rest, total = text, 0.0
    if not rest:
        raise ScheduleError(f'failed to parse duration {text}: time: invalid duration ""')
    while rest:
        m = _GO_PART.match(rest)
        if m is None:
            raise ScheduleError(f'failed to parse duration {text}: time: invalid duration "{text}"')
        total += float(m.group(1)) * _GO_UNITS[m.group(2)]
        rest = rest[m.end():]
    return total


_ZONE_PART = re.compile(r"[A-Za-z.\-_0-9+]{1,14}")


def time_zone_error(time_zone: str) -> str | None:
    """What kube-apiserver says of a spec.timeZone it refuses (None: the zone is fine)."""
    if time_zone == "":
        return "timeZone must be nil or non-empty string"
    for part in time_zone.split("/"):
        if part in (".", "..") or part.startswith("-") or not _ZONE_PART.fullmatch(part):
            return f"unknown time zone {time_zone}"
    if time_zone.lower() == "local":
        return "timeZone must be an explicit time zone as defined in https://www.iana.org/time-zones"
    try:
        load_zone(time_zone)
    except ScheduleError as e:
        return str(e)
    return None


def rfc3339_in(t: float, zone: tzinfo) -> str:
    """``t`` as Go's time.RFC3339 in ``zone``: "Z" in UTC, else the zone's offset."""
    dt = datetime.fromtimestamp(math.floor(t), tz=zone)
    if dt.utcoffset() == UTC.utcoffset(None):
        return dt.strftime("%Y-%m-%dT%H:%M:%SZ")
    return dt.isoformat()
