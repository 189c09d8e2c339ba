"""``--plant NAME``: the planted bugs a process switches on (bkref/impl/core/planted.py).

Every process entry point that can host a planted bug takes it the same way:
repeatable, one name each time, an unknown name a usage error (exit 2) that
lists the known ones. Only tests and campaigns pass it.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable

from bkref.impl.core.planted import PLANTS, validate


def add_plant_argument(p: argparse.ArgumentParser, where: str) -> None:
    """Add ``--plant NAME`` to ``p``; ``where`` says which part of this process it changes."""
    p.add_argument(
        "--plant",
        action="append",
        default=[],
        choices=PLANTS,
        metavar="NAME",
        help=(
            f"test-only: switch on a planted bug (bkref/impl/core/planted.py) in {where}, so "
            "that a test or campaign can show its checks catch it; repeatable; "
            f"one of {', '.join(PLANTS)}"
        ),
    )


def plants_of(args: argparse.Namespace) -> frozenset[str]:
    """The ``--plant`` names given, as the ``plants`` argument constructors take."""
    return validate(args.plant)


def plant_argv(plants: Iterable[str]) -> list[str]:
    """``--plant NAME`` for each name, sorted: the arguments that pass ``plants`` on to a
    process this one starts."""
    return [arg for name in sorted(validate(plants)) for arg in ("--plant", name)]
