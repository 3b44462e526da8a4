"""The kubelet's container restart back-off, and Go's way of printing a duration (the
CrashLoopBackOff message users grep for reads "back-off 20s", "back-off 2m40s")."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RestartBackoff:
    """Per container: the first restart is immediate, then each one waits the current delay,
    which doubles up to ``cap``. A container that ran for ``reset_after`` seconds before it
    exited starts over from no delay."""

    initial: float = 10.0
    cap: float = 300.0
    reset_after: float = 600.0
    current: float = 0.0

    def next_delay(self, ran_for: float) -> float:
        """The wait before restarting a container that just exited after ``ran_for`` seconds,
        moving the back-off on by one step."""
        delay, self.current = next_backoff(self.current, ran_for, self.initial, self.cap, self.reset_after)
        return delay


def next_backoff(current: float, ran_for: float, initial: float, cap: float,
                 reset_after: float) -> tuple[float, float]:
    """RestartBackoff.next_delay without the state: (the wait now, where the back-off stands
    after it)."""
    if ran_for >= reset_after:
        current = 0.0
    return current, initial if current == 0 else min(current * 2, cap)


def go_duration(seconds: float) -> str:
    """time.Duration.String(): 500ms, 10s, 1m20s, 5m0s, 1h0m0s."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        ms = seconds * 1000
        return f"{ms:g}ms" if ms >= 1 else f"{seconds * 1e6:g}µs"
    total = round(seconds, 9)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    sec_text = f"{secs:.9f}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{int(hours)}h{int(minutes)}m{sec_text}"
    if minutes:
        return f"{int(minutes)}m{sec_text}"
    return sec_text
