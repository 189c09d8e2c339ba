"""Pure quorum arithmetic shared by many actions of the protocol spec.

Every helper carries PEP 316 contracts (``pre:`` / ``post:`` lines in its
docstring) that ``crosshair check --analysis_kind=PEP316 bkref/spec/quorum.py``
verifies symbolically (``make crosshair``). Bookie sets are bitmasks over
bookie indices; ensemble *positions* are 0..E-1.
"""

from __future__ import annotations


def popcount(mask: int) -> int:
    """Number of bookies in a bitmask.

    pre: mask >= 0
    post: __return__ >= 0
    """
    return bin(mask).count("1")


def write_set_positions(entry: int, ensemble_size: int, write_quorum: int) -> tuple[int, ...]:
    """Ensemble positions that store ``entry``: round-robin striping from entry mod E.

    pre: entry >= 0
    pre: 1 <= write_quorum <= ensemble_size <= 8
    post: len(__return__) == write_quorum
    post: len(set(__return__)) == write_quorum
    post: all(0 <= p < ensemble_size for p in __return__)
    post: __return__[0] == entry % ensemble_size
    """
    return tuple((entry + i) % ensemble_size for i in range(write_quorum))


def quorum_coverage(write_quorum: int, ack_quorum: int) -> int:
    """Responses of a cohort of size Wq needed so that no ack quorum is left out.

    A set covers the cohort when every ack quorum of it intersects the set:
    Wq - Aq + 1 members. One fewer leaves an ack quorum untouched.

    pre: 1 <= ack_quorum <= write_quorum
    post: 1 <= __return__ <= write_quorum
    post: (write_quorum - __return__) < ack_quorum
    post: (write_quorum - (__return__ - 1)) >= ack_quorum
    """
    return write_quorum - ack_quorum + 1


def has_quorum_coverage(count: int, write_quorum: int, ack_quorum: int) -> bool:
    """True when ``count`` members of a write set leave no ack quorum untouched.

    pre: 0 <= count <= write_quorum
    pre: 1 <= ack_quorum <= write_quorum
    post: __return__ == (write_quorum - count < ack_quorum)
    """
    return count >= write_quorum - ack_quorum + 1


def _unfenced(fenced_positions: int, start: int, ensemble_size: int, write_quorum: int) -> int:
    """Unfenced members of the write set starting at ensemble position ``start``."""
    return sum(
        1 for i in range(write_quorum) if not fenced_positions >> ((start + i) % ensemble_size) & 1
    )


def fencing_covers_ensemble(fenced: int, size: int, wq: int, aq: int) -> bool:
    """True when the fenced ensemble positions cover every write set of the ensemble.

    Fencing is complete when no write set still has an ack quorum of unfenced
    bookies: then no add of the old writer can reach Aq acknowledgements.
    ``fenced`` is a mask of ensemble positions, ``size`` is E.

    pre: 1 <= aq <= wq <= size <= 6
    pre: 0 <= fenced < (1 << size)
    post: __return__ == all(_unfenced(fenced, s, size, wq) < aq for s in range(size))
    """
    need = wq - aq + 1
    for start in range(size):
        covered = 0
        for i in range(wq):
            if fenced >> ((start + i) % size) & 1:
                covered += 1
        if covered < need:
            return False
    return True


def recovery_start_entry(max_fenced_lac: int, last_segment_first_entry: int) -> int:
    """First entry a recovery client reads: after the LAC, never before the last segment.

    Entries before the last segment are committed (a segment only ends at the
    writer's LAC), so recovery starts at the later of LAC + 1 and the first
    entry of the last segment. Starting at LAC + 1 alone, with LAC -1 in a
    ledger of several segments, is BOOKKEEPER-2615.

    pre: max_fenced_lac >= -1
    pre: last_segment_first_entry >= 0
    post: __return__ >= max_fenced_lac + 1
    post: __return__ >= last_segment_first_entry
    post: __return__ in (max_fenced_lac + 1, last_segment_first_entry)
    """
    return max(max_fenced_lac + 1, last_segment_first_entry)


def contiguous_confirmed(lac: int, ack_counts: tuple[int, ...], ack_quorum: int) -> int:
    """The LAC after acknowledgements: the end of the contiguous prefix at Aq.

    ``ack_counts[e]`` is how many write-set bookies acknowledged entry e. The
    LAC only moves forward and only over entries that all reached Aq.

    pre: -1 <= lac < len(ack_counts)
    pre: ack_quorum >= 1
    post: __return__ >= lac
    post: all(ack_counts[e] >= ack_quorum for e in range(lac + 1, __return__ + 1))
    post: __return__ + 1 == len(ack_counts) or ack_counts[__return__ + 1] < ack_quorum
    """
    while lac + 1 < len(ack_counts) and ack_counts[lac + 1] >= ack_quorum:
        lac += 1
    return lac
