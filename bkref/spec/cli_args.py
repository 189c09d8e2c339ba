"""argparse ``type=`` checks for the numbers a command takes.

A number out of range is a usage error: argparse prints the usage and
``argument --budget: expected a number > 0, got '-5'`` and exits 2, before
the command reads a file or starts a process.

Two identical copies: ``bkref/spec/cli_args.py`` (for spec, linearizability and
spark_checks, which may import spec) and ``bkref/impl/cli/args.py`` (for impl and
nemesis). No one package may be imported by all five without breaking the
dependency direction (spec imports nothing of bkref; impl imports neither spec
nor linearizability). tests/unit/test_bad_input.py keeps the copies equal.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def int_range(low: int, high: int | None = None) -> Callable[[str], int]:
    """An integer ``low <= n`` (and ``n <= high`` if given)."""
    wanted = f"an integer >= {low}" if high is None else f"an integer from {low} to {high}"

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}") from None
        if n < low or (high is not None and n > high):
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}")
        return n

    parse.__name__ = f"int_range({low}, {high})"
    return parse


def _finite(text: str, wanted: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}") from None
    if not math.isfinite(x):
        raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}")
    return x


def positive_float(text: str) -> float:
    """A finite number > 0 (seconds, for instance)."""
    x = _finite(text, "a number > 0")
    if x <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return x


def non_negative_float(text: str) -> float:
    """A finite number >= 0."""
    x = _finite(text, "a number >= 0")
    if x < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return x


positive_int = int_range(1)
non_negative_int = int_range(0)
