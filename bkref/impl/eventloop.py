"""The event loop a bkref process runs: asyncio's own, or uvloop's.

Every process of bkref (bookie, AutoRecovery node, shell, a campaign's writer) is one
single-threaded event loop, and at 32 adds in flight the loops' own work (selecting,
scheduling callbacks, transport writes) is a share of the CPU an add costs. uvloop
(libuv under the same asyncio API) does that work in C. Which loop runs is chosen by
``BKREF_LOOP`` in the environment, so that one setting reaches every process a cluster
or a campaign starts (they inherit it):

- ``asyncio`` (the default): the standard library's loop;
- ``uvloop``: uvloop's; an error naming the package if it is not installed.

BENCHMARKS.md ("Bookies and client") measures adds with each, in one run.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
LOOPS = ("asyncio", "uvloop")
ENV = "BKREF_LOOP"


class EventLoopError(RuntimeError):
    pass


def chosen() -> str:
    """The loop ``BKREF_LOOP`` names (``asyncio`` when unset)."""
    name = os.environ.get(ENV, "").strip().lower() or "asyncio"
    if name not in LOOPS:
        raise EventLoopError(
            f"{ENV}={os.environ[ENV]!r} names no event loop: use one of {', '.join(LOOPS)}"
        )
    return name


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on the chosen loop."""
    if chosen() == "uvloop":
        try:
            import uvloop
        except ImportError as e:
            main.close()
            raise EventLoopError(
                f"{ENV}=uvloop, but uvloop is not installed: pip install uvloop, or unset {ENV}"
            ) from e
        return uvloop.run(main)
    return asyncio.run(main)
