"""What a plugin answers with (Code, Status) and the scratch space of one scheduling
cycle (CycleState); pure, shared by the framework and every plugin."""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from typing import Any

MAX_NODE_SCORE = 100
MIN_NODE_SCORE = 0

# CycleState key under which a Reserve plugin leaves the GPU indices it chose.
GPU_INDICES_KEY = "gpufleet.io/gpu-indices"


class Code(enum.IntEnum):
    # SUCCESS is 0 so the hot path can test ``if status.code:``.
    SUCCESS = 0
    ERROR = 1
    UNSCHEDULABLE = 2
    UNSCHEDULABLE_AND_UNRESOLVABLE = 3
    WAIT = 4
    SKIP = 5


class Status:
    __slots__ = ("code", "reasons", "plugin", "_detail", "timeout", "error")

    def __init__(
        self,
        code: Code = Code.SUCCESS,
        reasons: Iterable[str] = (),
        plugin: str = "",
        *,
        detail: str | Callable[[], str] = "",
        timeout: float | None = None,
        error: BaseException | None = None,
    ) -> None:
        self.code = code
        self.reasons = list(reasons)
        self.plugin = plugin
        # What is particular to this node, for the per-node breakdown. A callable is
        # rendered only when read: most rejections of a successful cycle are never shown.
        self._detail = detail
        # Seconds a WAIT from Permit may last.
        self.timeout = timeout
        # The exception behind an ERROR (the scheduler decides on it whether to retry).
        self.error = error

    @classmethod
    def unschedulable(cls, *reasons: str, detail: str | Callable[[], str] = "", plugin: str = "") -> Status:
        return cls(Code.UNSCHEDULABLE, reasons, plugin, detail=detail)

    @classmethod
    def unresolvable(cls, *reasons: str, detail: str | Callable[[], str] = "", plugin: str = "") -> Status:
        return cls(Code.UNSCHEDULABLE_AND_UNRESOLVABLE, reasons, plugin, detail=detail)

    @property
    def detail(self) -> str:
        if callable(self._detail):
            self._detail = self._detail()
        return self._detail

    @classmethod
    def from_error(cls, error: BaseException, plugin: str = "") -> Status:
        return cls(Code.ERROR, [str(error) or type(error).__name__], plugin, error=error)

    @classmethod
    def wait(cls, timeout: float, plugin: str = "") -> Status:
        return cls(Code.WAIT, (), plugin, timeout=timeout)

    @property
    def is_success(self) -> bool:
        return self.code is Code.SUCCESS

    @property
    def is_skip(self) -> bool:
        return self.code is Code.SKIP

    @property
    def is_rejected(self) -> bool:
        return self.code in (Code.UNSCHEDULABLE, Code.UNSCHEDULABLE_AND_UNRESOLVABLE)

    @property
    def message(self) -> str:
        return ", ".join(self.reasons)

    def describe(self) -> str:
        """The per-node text: the detail when the plugin gave one, else the reasons."""
        return self.detail or self.message

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Status):
            return NotImplemented
        return (self.code, self.reasons, self.plugin, self.detail) == (
            other.code,
            other.reasons,
            other.plugin,
            other.detail,
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        parts = [self.code.name]
        if self.plugin:
            parts.append(f"plugin={self.plugin!r}")
        if self.reasons:
            parts.append(f"reasons={self.reasons!r}")
        if self.detail:
            parts.append(f"detail={self.detail!r}")
        return f"Status({', '.join(parts)})"


OK = Status()
SKIP = Status(Code.SKIP)


class CycleState:
    """Scratch space of one scheduling cycle, shared by the plugins of that cycle (and by the
    binding steps of the same pod). Keys are plugin-chosen strings."""

    __slots__ = ("_data", "skip_filter", "skip_score")

    def __init__(self) -> None:
        self._data: dict[str, Any] = {}
        # Plugins whose PreFilter/PreScore said SKIP: nothing to check for this pod.
        self.skip_filter: set[str] = set()
        self.skip_score: set[str] = set()

    def read(self, key: str, default: Any = None) -> Any:
        return self._data.get(key, default)

    def write(self, key: str, value: Any) -> None:
        self._data[key] = value

    def delete(self, key: str) -> None:
        self._data.pop(key, None)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def clone(self) -> CycleState:
        other = CycleState()
        other._data = dict(self._data)
        other.skip_filter = set(self.skip_filter)
        other.skip_score = set(self.skip_score)
        return other


# -- extension points -------------------------------------------------------------------
