"""Disk corruption of a bookie's files: flipped bytes, a cut journal tail, a wiped disk.

These act on a bookie's directories as a failing disk would, through whatever
filesystem they sit on (lazyfs included, so that its view stays coherent).
Each returns a sentence saying exactly what it did, for the history and the
report. They pick their victims with the ``random.Random`` they are given, so
a run's seed decides them.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path


class NothingToCorruptError(RuntimeError):
    """The bookie has no file of the kind this fault corrupts (yet)."""


def _files(directory: Path, pattern: str) -> list[Path]:
    return sorted(p for p in directory.rglob(pattern) if p.is_file() and p.stat().st_size > 0)


def flip_bytes(ledger_dir: Path, rng: random.Random, count: int = 4) -> str:
    """Flip ``count`` random bytes (xor 0xff) of one entry log, and sync them."""
    logs = _files(ledger_dir, "*.log")
    if not logs:
        raise NothingToCorruptError(f"no entry log under {ledger_dir}")
    path = rng.choice(logs)
    size = path.stat().st_size
    offsets = sorted(rng.randrange(size) for _ in range(count))
    fd = os.open(path, os.O_RDWR)
    try:
        for off in offsets:
            byte = os.pread(fd, 1, off)
            if byte:
                os.pwrite(fd, bytes([byte[0] ^ 0xFF]), off)
        os.fsync(fd)
    finally:
        os.close(fd)
    return f"flipped {count} byte(s) of {path.name} ({size} bytes) at {offsets}"


def truncate_tail(journal_dir: Path, rng: random.Random, max_cut: int = 64 * 1024) -> str:
    """Cut between 1 byte and ``max_cut`` bytes (at most a quarter) off the newest journal."""
    journals = _files(journal_dir, "*.txn")
    if not journals:
        raise NothingToCorruptError(f"no journal file under {journal_dir}")
    path = journals[-1]
    size = path.stat().st_size
    cut = rng.randint(1, max(1, min(max_cut, size // 4)))
    fd = os.open(path, os.O_RDWR)
    try:
        os.ftruncate(fd, size - cut)
        os.fsync(fd)
    finally:
        os.close(fd)
    return f"cut {cut} of {size} bytes off the tail of {path.name}"


def wipe(directories: list[Path]) -> str:
    """Remove everything under ``directories`` (the directories themselves stay)."""
    removed = 0
    for d in directories:
        if not d.exists():
            continue
        for child in d.iterdir():
            removed += 1
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
    return f"wiped {', '.join(str(d) for d in directories)} ({removed} entries removed)"
