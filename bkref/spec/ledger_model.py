"""The sequential ledger model: what a client may observe of one ledger (level 1).

Scope. One ledger seen as an atomic object, as a linearizability checker needs
it: every operation takes effect at one instant between its invocation and its
completion, and this module says which sequences of such instants are legal.
It says nothing about bookies, quorums or messages (the protocol state machine
does); it is the contract the whole protocol must present to its clients.

State (all of it visible to clients through some operation):

- ``created``: the ledger exists. A history without the ledger's ``create``
  starts with the ledger created and empty.
- ``entries``: the data of the entries added so far, entry id = position. The
  single writer assigns entry ids in order and an add takes effect only as the
  next entry id, so the added entries are always a prefix 0..n-1: an entry
  becomes visible only after every smaller one.
- ``closed``: closed by the writer or by a recovery client; the last entry is
  then ``len(entries) - 1`` for ever.

Operations (``LedgerOp``; ``known`` is false when the outcome is unknown):

- ``create``: legal once; every other operation needs the ledger created.
- ``add(entry e, data d)``: legal iff the ledger is open and ``e`` is the next
  entry id; appends ``d``. Once closed (by close, or by recovery, which fences
  first), no add takes effect: an add acknowledged after that is
  ack-after-fence or a lost write.
- ``read(e)``: found with data ``d`` iff ``e`` is added with data ``d``; not
  found iff ``e`` is not added yet. Reads are linearizable: a read of an entry
  whose add was acknowledged before the read began must find it (a BookKeeper
  reader asks the bookies, not only its own view of the LAC), and a found
  entry is never lost later (it counts as confirmed: no dirty reads).
- ``read_lac -> v``: legal iff ``-1 <= v <= n - 1`` where it takes effect,
  open or closed; it changes nothing. The LAC is a lower bound, not a
  linearizable register. In BookKeeper it is a hint: the writer piggybacks its
  LAC on the entries it sends, each bookie remembers the highest one it was
  given, and readLastAddConfirmed returns the highest a quorum-covering set of
  bookies reports. Two readers that reach different bookies may thus be told
  different values, a later reader less than an earlier one, and BookKeeper
  documents that on a closed ledger readLastAddConfirmed may differ from the
  last entry, since it asks the bookies' hint and not the metadata. What it
  does promise is that every entry up to the returned LAC was confirmed and is
  never lost: the LAC never exceeds the entries that exist, so a LAC above the
  last entry of a close stays a violation (a confirmed entry was truncated).
- ``close`` / ``recover`` (open with recovery) ``-> L``: ``L == n - 1``; the
  ledger is closed at ``L``. On a closed ledger they return the same ``L``
  again, so two closes never disagree.

Not modelled here: how long an add takes to be acknowledged, ensembles and
quorums, and an add that failed as fenced (the checker treats it as
indeterminate, since recovery may have found it on one bookie and kept it).
"""

from __future__ import annotations

from typing import Final, NamedTuple

NO_ENTRY: Final = -1
OPERATIONS: Final = frozenset({"create", "add", "read", "read_lac", "close", "recover"})


class LedgerState(NamedTuple):
    created: bool
    entries: tuple[str, ...]  # data of entries 0..n-1: the added prefix
    closed: bool  # the last entry is then len(entries) - 1, fixed


class LedgerOp(NamedTuple):
    """One operation as the model sees it; ``known`` false: outcome unknown."""

    f: str
    entry: int = NO_ENTRY  # add, read
    data: str | None = None  # add: the data written; read: the data found
    found: bool | None = None  # read
    result: int | None = None  # read_lac: the LAC; close/recover: the last entry
    known: bool = True


def initial_state(created: bool = True) -> LedgerState:
    """A new ledger: empty and open; ``created`` false if the history creates it."""
    return LedgerState(created, (), False)


def step(state: LedgerState, op: LedgerOp) -> frozenset[LedgerState] | None:
    """The states after ``op`` takes effect in ``state``, or None if it cannot."""
    if op.f == "create":
        return None if state.created else frozenset({state._replace(created=True)})
    if not state.created:
        return None
    n = len(state.entries)
    if op.f == "add":
        if state.closed or op.entry != n:
            return None
        return frozenset({state._replace(entries=(*state.entries, op.data or ""))})
    if op.f == "read":
        if not op.known:
            return frozenset({state})
        if op.found:
            ok = 0 <= op.entry < n and state.entries[op.entry] == op.data
        else:
            ok = op.entry >= n
        return frozenset({state}) if ok else None
    if op.f == "read_lac":
        if not op.known:
            return frozenset({state})
        ok = op.result is not None and NO_ENTRY <= op.result <= n - 1
        return frozenset({state}) if ok else None
    if op.f in ("close", "recover"):
        if op.known and op.result != n - 1:
            return None
        return frozenset({state._replace(closed=True)})
    return None
