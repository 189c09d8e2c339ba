"""Write sets (round-robin striping) and quorum coverage.

An ensemble of E bookies stores each entry on a write set of Wq consecutive
bookies (mod E) starting at ``entry_id mod E``; an add is confirmed once Aq of
them acknowledge. Recovery's decisions follow from those two numbers:

- an entry that was confirmed is on at least Aq bookies of its write set, so
  it is missing from at most Wq - Aq of them: Wq - Aq + 1 negative answers
  from one write set prove it was never confirmed;
- fencing is complete once no write set can still gather Aq acks from bookies
  that have not been fenced, i.e. Wq - Aq + 1 bookies of every write set have
  answered the fencing request ("ack quorum coverage").
"""

from __future__ import annotations

import functools
from collections.abc import Collection
from dataclasses import dataclass


@functools.cache
def _write_sets(ensemble_size: int, write_quorum: int) -> tuple[tuple[int, ...], ...]:
    """Every write set, by its first ensemble index: an add asks for its own once, and
    for its ack quorum once per ack (a generator per call cost more than the rest)."""
    return tuple(
        tuple((first + i) % ensemble_size for i in range(write_quorum))
        for first in range(ensemble_size)
    )


@functools.cache
def _write_set_members(ensemble_size: int, write_quorum: int) -> tuple[frozenset[int], ...]:
    return tuple(frozenset(ws) for ws in _write_sets(ensemble_size, write_quorum))


@dataclass(frozen=True, slots=True)
class Quorum:
    ensemble_size: int
    write_quorum: int
    ack_quorum: int

    def __post_init__(self) -> None:
        if not self.ensemble_size >= self.write_quorum >= self.ack_quorum >= 1:
            raise ValueError(
                f"need E >= Wq >= Aq >= 1, got E={self.ensemble_size} "
                f"Wq={self.write_quorum} Aq={self.ack_quorum}"
            )

    def write_set(self, entry_id: int) -> tuple[int, ...]:
        """Ensemble indexes that store ``entry_id``."""
        e = self.ensemble_size
        return _write_sets(e, self.write_quorum)[entry_id % e]

    def write_sets(self) -> list[tuple[int, ...]]:
        """Every distinct write set of the ensemble (one per starting index)."""
        return [self.write_set(i) for i in range(self.ensemble_size)]

    @property
    def negatives_needed(self) -> int:
        """Negative answers from one write set that prove an entry was never confirmed."""
        return self.write_quorum - self.ack_quorum + 1

    def is_ack_quorum(self, acked: Collection[int], entry_id: int) -> bool:
        e = self.ensemble_size
        ws = _write_set_members(e, self.write_quorum)[entry_id % e]
        return len(ws.intersection(acked)) >= self.ack_quorum

    def is_covered(self, responded: Collection[int]) -> bool:
        """Ack quorum coverage: every write set has Wq - Aq + 1 of its bookies in ``responded``."""
        got = set(responded)
        return all(len(got.intersection(ws)) >= self.negatives_needed for ws in self.write_sets())

    def is_entry_absent(self, negatives: Collection[int], entry_id: int) -> bool:
        """Enough of the entry's write set said "no such entry" to prove it was never confirmed."""
        return len(set(self.write_set(entry_id)).intersection(negatives)) >= self.negatives_needed
