"""Planted bugs: test-only switches that make the implementation wrong on purpose.

A fault campaign is only worth its verdict if it can fail. Each switch here
re-creates a known way to break BookKeeper's guarantees, so that a test can
show the campaign's checks catch it (and the same seed without the switch is
valid). They are arguments, never ambient state: every constructor that hosts
one takes ``plants: frozenset[str]`` (empty by default: nothing is planted),
and every process entry point that builds such objects takes ``--plant NAME``
on its command line (``bkref bookie``, ``bkref autorecovery``, ``bkref shell``,
the campaign's writer process ``bkref.nemesis.writer_proc``). An unknown name is an
error (a typo must not silently test the correct code).

- ``ack-before-fsync``: the journal acknowledges an add once it is written,
  before any fsync, and syncs only when it rolls to a new file. Killed with
  its unsynced writes lost (lazyfs), a bookie forgets entries it acknowledged.
- ``recovery-reads-without-fence``: recovery's reads (the LAC reads that
  start it and the entry reads that follow) do not carry the fence flag, so
  a writer that is still alive keeps adding entries past the point where
  recovery closes the ledger. BookKeeper #2614 dropped the flag from the entry
  reads only; this switch drops it from both, so that the campaign's writers,
  which race recoveries on one segment, can show its effect.

- ``repair-without-copy``: a replication worker records the new replica in the
  ledger's metadata without copying the fragment to it, so the metadata names a
  bookie that lacks the entries (the order the replicator exists to keep: copy
  first, then CAS). The campaign's replication audit of the bookies' dumps finds it.

- ``repair-open-segment-without-fence``: a replication worker does not wait for
  the open-ledger grace period and does not fence: it copies the open last segment
  up to the LAC its live replicas report and records the new replica while the
  writer may still be adding to the old ensemble (what BookKeeper's grace period
  and fencing prevent). Entries acknowledged after the copy are missing from the
  new replica; with Wq = Aq one negative read from it lets a recovery close the
  ledger before them.

- ``bookie-forgets-lac-on-replay``: a restarted bookie rebuilds its entries and
  fences from the journal but not the LAC its entries piggybacked, so it reports
  an older LAC than it had. No acknowledged entry is lost and no hand-written
  invariant breaks (a lower LAC only makes readers and recoveries start earlier),
  and the history checkers accept a LAC that goes back (BookKeeper's
  readLastAddConfirmed may), so no campaign check can see it: the refinement
  machine does (``bkref refine --config b --plant bookie-forgets-lac-on-replay``),
  because the bookie's state is no longer the spec's.

- ``acks-from-replaced-bookie-count``: when an ensemble change's CAS lands, the
  writer releases the completions it held before it unsets the replaced bookie's
  acks (apache/bookkeeper#4651, as LedgerHandle orders it today). An entry that
  the replaced bookie acknowledged is confirmed on a bookie the new metadata no
  longer names and is never re-sent to its replacement: it has fewer than Aq
  copies where the metadata says. A campaign would need that exact race and then
  the loss of the last copy; the refinement machine sees the early LAC at once
  (``bkref refine --config m-4651 --plant acks-from-replaced-bookie-count``).
  The spec's mutant of the same name re-creates it.

- ``ensemble-change-undoes-swap``: the writer's ensemble change, retried after a
  version conflict with a replication worker's swap of an earlier segment, writes
  its own view of the earlier segments at the new version (BOOKKEEPER-667, before
  ensembles were merged from the store): the lost bookie is back in the segment the
  worker repaired. Nothing is lost at once (the next audit marks the ledger again),
  so no campaign check sees it; the refinement machine does, at the CAS
  (``bkref refine --config m-merge-writer --plant ensemble-change-undoes-swap``). The
  spec's mutant of the same name re-creates it.

- ``recovery-piggybacks-its-own-lac``: a recovery's write-back carries the
  recovery's own LAC, which grows as its earlier write-backs reach ack quorum, as
  BookKeeper's recovery adds do (``PendingAddOp.initiate`` signs with the handle's
  ``lastAddConfirmed``). With two recoveries racing, a bookie's LAC passes the last
  entry the other recovery closes the ledger at, and a tailing reader returns an
  entry the closed ledger does not contain (docs/findings/two-recoveries.md). The
  refinement machine sees the LAC the write-back carries at once
  (``bkref refine --config a-readers --plant recovery-piggybacks-its-own-lac``); the spec's
  mutant of the same name re-creates it with a reader.

Only tests and campaigns (``bkref campaign --plant NAME``) switch them on; a
campaign passes its ``--plant`` list to every bookie and writer process it
starts, on each backend, and to the clients in its own process.
"""

from __future__ import annotations

from collections.abc import Iterable

PLANTS = (
    "ack-before-fsync",
    "recovery-reads-without-fence",
    "repair-without-copy",
    "repair-open-segment-without-fence",
    "bookie-forgets-lac-on-replay",
    "acks-from-replaced-bookie-count",
    "ensemble-change-undoes-swap",
    "recovery-piggybacks-its-own-lac",
)
# Planted bugs that no campaign check can see (``make planted`` skips them): one loses no
# acknowledged entry and breaks no hand-written invariant; one leaves an entry short of
# copies only after a race that a campaign's timing almost never lines up, and loses it
# only if the last copy goes too; one undoes a repair that the next audit redoes; one
# needs two recoveries of one ledger racing over pipelined adds, which a campaign's
# timing almost never lines up, and a reader in between. The refinement machine, which
# compares the implementation's whole state with the spec's step by step, catches all four.
REFINEMENT_ONLY = (
    "bookie-forgets-lac-on-replay",
    "acks-from-replaced-bookie-count",
    "ensemble-change-undoes-swap",
    "recovery-piggybacks-its-own-lac",
)
# The planted bugs whose effect a campaign's checks must catch (``make planted``).
CAMPAIGN_PLANTS = tuple(p for p in PLANTS if p not in REFINEMENT_ONLY)


class UnknownPlantError(ValueError):
    """A name that is not one of the planted bugs."""


def validate(names: Iterable[str], *, source: str = "") -> frozenset[str]:
    """The plant names, checked: a typo must not silently test the correct code."""
    plants = frozenset(names)
    unknown = sorted(plants - set(PLANTS))
    if unknown:
        raise UnknownPlantError(
            f"{source}unknown planted bug(s) {unknown}; known: {', '.join(PLANTS)}"
        )
    return plants


def active(name: str, plants: frozenset[str]) -> bool:
    """True if the planted bug ``name`` is among ``plants`` (both checked)."""
    if name not in PLANTS:
        raise UnknownPlantError(f"no planted bug {name!r}; known: {', '.join(PLANTS)}")
    return name in validate(plants)
