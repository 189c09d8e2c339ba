"""Checkpoints of a long breadth-first search, to go on after it stopped (TLC's -recover).

With fingerprints (``check(..., fingerprints=True)``) what a search needs to go on from
the end of a BFS level is small, and mostly on disk already: the fingerprint of every
state seen and the index of its parent (both only grow: each level appends its own),
the file of the next layer's states, and a few counters. A :class:`Checkpoint` keeps
them in one directory. Each level's end appends and syncs the data first, then replaces
``meta.json`` by an atomic rename, so a search killed at any moment leaves its last
complete level to go on from; data written past it is cut off when it goes on.

A fingerprint is Python's hash of a state's marshal bytes (``visited.fingerprint``):
another process computes the same one only under the same hash secret and the same
marshal format. So a checkpointed search needs a fixed ``PYTHONHASHSEED``, recorded and
required again to go on, and the same interpreter and spec source (``build.source_hash``)
and config.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from array import array
from pathlib import Path
from typing import Any

from bkref.spec.build import source_hash
from bkref.spec.config import Config

FORMAT = 1
META = "meta.json"


class CheckpointError(ValueError):
    """A checkpoint cannot be written or gone on from here: the message says why and what to do."""


def hash_seed() -> str:
    """The fixed PYTHONHASHSEED this process runs under, or CheckpointError."""
    seed = os.environ.get("PYTHONHASHSEED", "")
    if not seed.isdigit():
        raise CheckpointError(
            "a checkpointed search needs a fixed PYTHONHASHSEED (fingerprints are Python's "
            "hash, which differs between processes otherwise): run it as "
            "`PYTHONHASHSEED=1 bkref spec check ...`, and go on under the same seed"
        )
    return seed


def config_key(cfg: Config) -> str:
    """The config's every field, as text that does not depend on the hash seed."""

    def plain(v: object) -> object:
        if isinstance(v, frozenset | set):
            return sorted(map(str, v))
        return str(v)

    return json.dumps(dataclasses.asdict(cfg), sort_keys=True, default=plain)


@dataclasses.dataclass
class Saved:
    """The search at the end of a level: what ``_bfs`` goes on from."""

    depth: int  # levels completed after Init's
    explored: int
    levels: list[int]  # new states per level, Init's first
    seconds: float  # search time so far, over every run
    fps: array[int]  # fingerprint by state index
    parent: array[int]  # parent index by state index (-1: Init)
    layer: Path  # the states of the level to expand next, marshalled
    complete: bool  # the search had nothing left to expand

    def __str__(self) -> str:
        return (
            f"the checkpoint in {self.layer.parent}: level {self.depth} done, "
            f"{len(self.fps):,} distinct, {self.explored:,} explored, {self.seconds:,.1f} s"
        )


class Checkpoint:
    """One search's checkpoint directory (see the module docstring)."""

    def __init__(self, directory: Path, cfg: Config, *, symmetry: bool) -> None:
        self.dir = directory
        self.seed = hash_seed()
        self.identity = {
            "format": FORMAT,
            "config": config_key(cfg),
            "symmetry": symmetry,
            "spec": source_hash(),
            "python": f"{sys.implementation.cache_tag} {sys.version.split()[0]}",
            "hash_seed": self.seed,
        }
        self._saved_count = 0  # fingerprints and parents already in their files

    def layer_path(self, depth: int) -> Path:
        """Where the states of level ``depth`` go while it is built."""
        self.dir.mkdir(parents=True, exist_ok=True)
        return self.dir / f"layer-{depth}.bin"

    def load(self) -> Saved | None:
        """The saved search, None if the directory holds none; CheckpointError if it holds
        one of another search (config, spec, interpreter or hash seed)."""
        meta_path = self.dir / META
        if not meta_path.is_file():
            return None
        try:
            meta: dict[str, Any] = json.loads(meta_path.read_text())
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{meta_path}: unreadable ({e}); remove the directory") from e
        for key, want in self.identity.items():
            if meta.get(key) != want:
                raise CheckpointError(
                    f"{self.dir} holds a search with another {key} ({str(meta.get(key))[:80]}, "
                    f"here {str(want)[:80]}): go on with the same one, or use a new directory"
                )
        count = int(meta["distinct"])
        fps, parent = array("q"), array("i")
        for arr, name in ((fps, "fps.bin"), (parent, "parent.bin")):
            path = self.dir / name
            try:
                with path.open("r+b") as f:
                    arr.fromfile(f, count)
                    f.truncate(count * arr.itemsize)  # what a killed run wrote past the level
            except (OSError, EOFError) as e:
                raise CheckpointError(f"{path}: {count:,} entries expected ({e})") from e
        self._saved_count = count
        return Saved(
            depth=int(meta["depth"]),
            explored=int(meta["explored"]),
            levels=[int(n) for n in meta["levels"]],
            seconds=float(meta["seconds"]),
            fps=fps,
            parent=parent,
            layer=self._layer(str(meta["layer"])),
            complete=bool(meta["complete"]),
        )

    def _layer(self, name: str) -> Path:
        path = self.dir / name
        if not path.is_file():
            raise CheckpointError(f"{path}: the layer the checkpoint names is gone")
        return path

    def save(
        self,
        *,
        depth: int,
        explored: int,
        levels: list[int],
        seconds: float,
        fps: array[int],
        parent: array[int],
        layer: Path,
        complete: bool,
    ) -> None:
        """Record the end of a level: its data synced first, ``meta.json`` last."""
        count = len(fps)
        for arr, name in ((fps, "fps.bin"), (parent, "parent.bin")):
            with (self.dir / name).open("ab") as f:
                f.truncate(self._saved_count * arr.itemsize)
                arr[self._saved_count : count].tofile(f)
                f.flush()
                os.fsync(f.fileno())
        meta = self.identity | {
            "depth": depth,
            "distinct": count,
            "explored": explored,
            "levels": levels,
            "seconds": round(seconds, 3),
            "layer": layer.name,
            "complete": complete,
        }
        tmp = self.dir / (META + ".tmp")
        with tmp.open("w") as f:
            f.write(json.dumps(meta, indent=1) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.dir / META)
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self._saved_count = count
        for old in self.dir.glob("layer-*.bin"):
            if old != layer:
                old.unlink(missing_ok=True)
