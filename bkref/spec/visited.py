"""What the model checker's breadth-first search stores: the visited set and the layers.

The checker (``bkref.spec.checker``) keeps each distinct state it has seen, so that it expands
it once, and the states of the BFS layer it expands and of the next one. By default it
keeps whole states. With fingerprints (``check(..., fingerprints=True)``), as TLC does,
the visited set holds a 64-bit :func:`fingerprint` per state and a layer is a temporary
file of marshalled states: a fraction of the memory, at the risk that two states share a
fingerprint (:func:`collision_probability`).
"""

from __future__ import annotations

import marshal
import os
import tempfile
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, cast

from bkref.spec.protocol import State


def fingerprint(s: State) -> int:
    """A state's 64-bit fingerprint: Python's SipHash of its marshal encoding.

    Not ``hash(s)``: CPython hashes the int -1 as -2, so two states that differ
    only in a -1 where the other has -2 (a LAC, ``Recovery.last``) would always
    collide. Marshal version 2 writes no back-references, so equal states
    encode to equal bytes however their tuples are shared. Forked workers
    inherit the hash secret, so they agree with the checker.
    """
    return hash(_marshal(s))


def _marshal(s: State) -> bytes:
    return marshal.dumps(tuple(s), 2)


def collision_probability(n: int) -> float:
    """The chance that two of ``n`` distinct states share a 64-bit fingerprint, if
    fingerprints were uniform and independent (TLC's optimistic estimate): n^2 / 2^65."""
    return min(1.0, n * (n - 1) / 2 / 2.0**64)


class Visited:
    """The states seen so far: whole states (index by state) or their fingerprints.

    ``encode`` gives what the set holds for a state (its key) and, with
    fingerprints, the marshal bytes the key was hashed from, which a layer on
    disk stores as they are (a state is marshalled once); ``known`` looks a key
    up (an index, any non-negative number for a fingerprint, None if new);
    ``add`` records a new key under the next index and says whether it was new.
    """

    def __init__(self, fingerprints: bool) -> None:
        self.fingerprints = fingerprints
        self.index: dict[State, int] = {}
        self.seen: set[int] = set()
        self.fps = array("q")  # fingerprint by state index (fingerprint mode)
        self.count = 0

    def encode(self, s: State) -> tuple[State | int, bytes | None]:
        if not self.fingerprints:
            return s, None
        blob = _marshal(s)
        return hash(blob), blob  # fingerprint(s)

    def known(self, key: State | int) -> int | None:
        if self.fingerprints:
            return 0 if key in self.seen else None
        return self.index.get(cast(State, key))

    def restore(self, fps: array[int]) -> None:
        """Take a checkpoint's fingerprints, by state index, as if each had been added."""
        assert self.fingerprints, "a checkpoint holds fingerprints"
        self.fps, self.seen, self.count = fps, set(fps), len(fps)

    def add(self, key: State | int) -> int:
        """The key's index: a new one (== the count before) if it was not seen."""
        n = self.count
        if self.fingerprints:
            k = cast(int, key)
            if k in self.seen:
                return 0  # not n: the caller tests for n
            self.seen.add(k)
            self.fps.append(k)
        else:
            j = self.index.setdefault(cast(State, key), n)  # one hash of the state, not two
            if j != n:
                return j
        self.count = n + 1
        return n


class Layer:
    """The states of one BFS layer, in index order: in a list, or (with fingerprints)
    in a temporary file, marshalled one after another, so that a wide layer costs disk
    and not memory (TLC keeps its queue on disk too)."""

    def __init__(self, on_disk: bool, path: Path | None = None) -> None:
        self.states: list[State] = []
        self.file: BinaryIO | None = None
        self.path = path
        if path is not None:  # a checkpoint's (bkref.spec.checkpoint): it outlives the run
            self.file = path.open("w+b")
        elif on_disk:
            self.file = tempfile.TemporaryFile()  # noqa: SIM115
        self.count = 0

    @classmethod
    def from_file(cls, path: Path, count: int) -> Layer:
        """The layer of ``count`` states a checkpoint saved in ``path``."""
        layer = cls(on_disk=False)
        layer.file, layer.path = path.open("rb"), path
        layer.count = count
        return layer

    def sync(self) -> None:
        """Make the states appended so far durable (before a checkpoint names the file)."""
        if self.file is not None:
            self.file.flush()
            os.fsync(self.file.fileno())

    def append(self, s: State | None, blob: bytes | None) -> None:
        """Add a state: in memory the state, on disk its marshal bytes."""
        self.count += 1
        if self.file is None:
            assert s is not None, "a layer in memory holds states"
            self.states.append(s)
        else:
            assert blob is not None, "a layer on disk holds marshal bytes"
            self.file.write(blob)

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[State]:
        if self.file is None:
            yield from self.states
            return
        f, new = self.file, tuple.__new__
        f.flush()
        f.seek(0)
        for _ in range(self.count):
            yield new(State, marshal.load(f))  # noqa: S302 - our own file

    def close(self) -> None:
        self.states = []
        if self.file is not None:
            self.file.close()
