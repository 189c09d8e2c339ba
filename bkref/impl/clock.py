"""The system clock the shells read by default (the core's :class:`bkref.impl.core.clock.Clock`).

Tests and harnesses pass :class:`bkref.impl.core.clock.ManualClock` instead, re-exported
here so that a shell's callers find both in one place.
"""

from __future__ import annotations

import time

from bkref.impl.core.clock import Clock, ManualClock

__all__ = ["SYSTEM_CLOCK", "Clock", "ManualClock", "SystemClock"]


class SystemClock:
    """``time.monotonic_ns`` and ``time.time_ns``, in milliseconds."""

    def monotonic_ms(self) -> int:
        return time.monotonic_ns() // 1_000_000

    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def __repr__(self) -> str:
        return "SystemClock()"


SYSTEM_CLOCK: Clock = SystemClock()
