"""Time as a parameter: the ``Clock`` the shells read, and a manual one tests step.

The core's state machines never read a clock: they take the time with each event
(``now_ms``, or ``tick()``). The shells read it from a :class:`Clock` they are given,
so that a test (or another implementation's harness) can substitute
:class:`ManualClock` and decide when time passes. The system clock the shells use by
default is :class:`bkref.impl.clock.SystemClock`.

Two readings, as the decisions need them:

- ``monotonic_ms``: for intervals and deadlines (a grace period, a delay, a back-off);
  it never goes back, and its origin means nothing.
- ``wall_ms``: milliseconds since the Unix epoch, for stamps other processes compare
  (a task's creation time, a ledger's ``ctime``); it can jump.

No sleep: a shell that waits for a deadline polls the clock (or waits on its events
with a timeout) at a real-time interval of its own, so a manual clock never has to
wake anyone up.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    def monotonic_ms(self) -> int:
        """Milliseconds on a clock that never goes back (origin unspecified)."""
        ...

    def wall_ms(self) -> int:
        """Milliseconds since the Unix epoch."""
        ...


class ManualClock:
    """A clock that moves only when told to: :meth:`step` (both readings move together)
    or :meth:`set_wall` (the wall clock jumps, as an NTP correction does)."""

    def __init__(self, monotonic_ms: int = 0, wall_ms: int = 1_700_000_000_000) -> None:
        if monotonic_ms < 0:
            raise ValueError(f"monotonic_ms must be >= 0, got {monotonic_ms}")
        self._monotonic = monotonic_ms
        self._wall = wall_ms

    def monotonic_ms(self) -> int:
        return self._monotonic

    def wall_ms(self) -> int:
        return self._wall

    def step(self, ms: int) -> int:
        """Let ``ms`` milliseconds pass; returns the new monotonic reading."""
        if ms < 0:
            raise ValueError(f"a monotonic clock cannot go back: step({ms})")
        self._monotonic += ms
        self._wall += ms
        return self._monotonic

    def step_seconds(self, seconds: float) -> int:
        """:meth:`step` by ``seconds`` (rounded to the millisecond)."""
        return self.step(round(seconds * 1000))

    def set_wall(self, wall_ms: int) -> None:
        """Make the wall clock read ``wall_ms`` (forwards or back); monotonic time stays."""
        self._wall = wall_ms

    def __repr__(self) -> str:
        return f"ManualClock(monotonic_ms={self._monotonic}, wall_ms={self._wall})"
