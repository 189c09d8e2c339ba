"""Two recoveries of one ledger racing to close it, over the in-memory bookies.

The refinement machine runs the same race on real bookies and ZooKeeper (config
``a-recoveries``); these tests pin the outcome the spec's ``recovery_client_closes_ledger``
states, after BookKeeper's ``ReadOnlyLedgerHandle.closeRecovered``: the close that loses
the CAS writes nothing and reports the stored close, whatever it recovered itself.

At the end, single recoveries that test_writer_recovery.py has no room for.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from bkref.impl.core.actions import (
    ReadCompleted,
    ReadLacCompleted,
    RecoveryCompleted,
    SendAdd,
    SendRead,
    SendReadLac,
    WriteMetadata,
)
from bkref.impl.core.frames import Status
from bkref.impl.core.metadata import LedgerMetadata, LedgerState, Segment
from bkref.impl.core.reads import EntryReader, LacReader
from bkref.impl.core.recovery import LedgerRecovery, RecoveryPhase
from bkref.impl.core.sim import Delivery, MetaStore, SimCluster, status_of
from bkref.impl.core.writer import LedgerWriter
from tests.impl.client_sim import LEDGER, Driver, run_all, setup_cluster, write_entries


def _deliver(
    cluster: SimCluster,
    drivers: dict[str, Driver],
    client: str,
    kind: type | tuple[type, ...],
    bookies: set[str],
) -> None:
    """Deliver ``client``'s requests of ``kind`` to ``bookies``, in the order sent."""
    for d in [d for d in cluster.inflight if d.client == client]:
        if isinstance(d.action, kind) and d.action.bookie in bookies:
            cluster.inflight.remove(d)
            drivers[client].deliver(d)


@pytest.mark.parametrize("first", ["reads-e0", "misses-e0"])
def test_the_recovery_that_loses_the_close_reports_the_stored_close(first: str) -> None:
    cluster, store, digest = setup_cluster(3, 3, 2, 4)
    w = LedgerWriter(LEDGER, store.metadata, store.version, digest)
    wd = Driver(cluster, store, w, "w")
    w.add(b"e0")
    wd.pump()
    # e0 reaches b0 only: below the ack quorum, so either close is correct.
    _deliver(cluster, {"w": wd}, "w", SendAdd, {"b0"})
    cluster.inflight.clear()
    assert not wd.completed

    drivers: dict[str, Driver] = {}
    for name in ("misses-e0", "reads-e0"):
        r = LedgerRecovery(LEDGER, store.metadata, store.version, digest)
        drivers[name] = Driver(cluster, store, r, name)
        r.start()
        drivers[name].pump()  # the first marks IN_RECOVERY, the second finds it so
        drivers[name].deferred = []  # hold each close until the test lands it
        _deliver(cluster, drivers, name, SendReadLac, {"b0", "b1", "b2"})
    assert store.metadata.state is LedgerState.IN_RECOVERY
    # One recovery hears the two bookies without e0 (absent: Wq - Aq + 1 negatives), the
    # other finds e0 on b0 and writes it back to the whole write set.
    _deliver(cluster, drivers, "misses-e0", SendRead, {"b1", "b2"})
    _deliver(cluster, drivers, "reads-e0", SendRead, {"b0"})
    _deliver(cluster, drivers, "reads-e0", SendAdd, {"b0", "b1", "b2"})
    _deliver(cluster, drivers, "reads-e0", SendRead, {"b0", "b1", "b2"})  # e1: absent
    closes = {}
    for name, d in drivers.items():
        assert d.deferred is not None
        ((_d, closes[name]),) = d.deferred
        d.deferred = None
    assert closes["misses-e0"].metadata.last_entry == -1
    assert closes["reads-e0"].metadata.last_entry == 0

    second = "misses-e0" if first == "reads-e0" else "reads-e0"
    drivers[first].land(closes[first])
    version = store.version
    drivers[second].land(closes[second])

    stored = closes[first].metadata.last_entry
    assert store.metadata.is_closed
    assert store.metadata.last_entry == stored
    assert store.version == version  # the loser wrote nothing
    for d in drivers.values():
        (done,) = d.finished
        assert isinstance(done, RecoveryCompleted)
        assert done.ok, done.message
        assert done.last_entry == stored


def test_a_recovery_that_gets_only_errors_fails_and_the_next_one_recovers() -> None:
    # bkref's recovery, like BookKeeper's LedgerRecoveryOp, does not retry a request that
    # failed: it gives up, and the ledger stays IN_RECOVERY for the next open to recover
    # (the spec's recovery_client_gives_up, D18).
    cluster, store, digest = setup_cluster(3, 3, 2, 4)
    w = LedgerWriter(LEDGER, store.metadata, store.version, digest)
    wd = Driver(cluster, store, w, "w")
    w.add(b"e0")
    wd.pump()
    _deliver(cluster, {"w": wd}, "w", SendAdd, {"b0", "b1", "b2"})
    assert [c.entry_id for c in wd.completed] == [0]

    first = LedgerRecovery(LEDGER, store.metadata, store.version, digest)
    fd = Driver(cluster, store, first, "first")
    first.start()
    fd.pump()
    for b in ("b0", "b1", "b2"):
        cluster.bookies[b].alive = False  # every fencing read fails
    _deliver(cluster, {"first": fd}, "first", SendReadLac, {"b0", "b1", "b2"})
    (failed,) = fd.finished
    assert isinstance(failed, RecoveryCompleted)
    assert not failed.ok
    assert "could not fence" in failed.message
    assert store.metadata.state is LedgerState.IN_RECOVERY

    for b in ("b0", "b1", "b2"):
        cluster.bookies[b].alive = True
    second = LedgerRecovery(LEDGER, store.metadata, store.version, digest)
    drivers = {"second": Driver(cluster, store, second, "second")}
    second.start()
    drivers["second"].pump()
    while any(d.client == "second" for d in cluster.inflight):
        _deliver(cluster, drivers, "second", (SendReadLac, SendRead, SendAdd), {"b0", "b1", "b2"})
    (done,) = drivers["second"].finished
    assert isinstance(done, RecoveryCompleted)
    assert done.ok, done.message
    assert store.metadata.is_closed
    assert store.metadata.last_entry == 0


def _read_lac(cluster: SimCluster, md: LedgerMetadata) -> int:
    """A tailing reader's LAC read (bkref's ``LacReader``, no fence) answered by every bookie."""
    reader = LacReader(LEDGER, md)
    reader.start()
    for a in reader.take_actions():
        assert isinstance(a, SendReadLac)
        resp = cluster.deliver(Delivery("reader", a))
        reader.on_read_lac_response(a.bookie, status_of(resp), getattr(resp, "lac", -1))
    (done,) = reader.take_actions()
    assert isinstance(done, ReadLacCompleted)
    assert done.ok
    return done.lac


@pytest.mark.parametrize("plants", [frozenset(), frozenset({"recovery-piggybacks-its-own-lac"})])
def test_a_tailing_reader_returns_no_entry_the_close_excludes(plants: frozenset[str]) -> None:
    # docs/findings/two-recoveries.md on bkref's cores: E=Wq=Aq=2, two adds in flight reach
    # b0 only; one recovery finds e0 there and writes it back (both bookies ack it, its own
    # LAC becomes 0), the other hears "no such entry" from b1 and closes the ledger at -1;
    # the first then writes e1 back. BookKeeper signs that write-back with the recovery's
    # own LAC (0), so b0 tells a tailing reader that e0 is confirmed in a ledger that ends
    # before it. bkref signs it with LC (-1): the reader never gets past -1.
    cluster, store, digest = setup_cluster(2, 2, 2, 2)
    opened = store.metadata  # the reader opened the ledger while it was OPEN
    w = LedgerWriter(LEDGER, store.metadata, store.version, digest)
    wd = Driver(cluster, store, w, "w")
    w.add(b"e0")
    w.add(b"e1")
    wd.pump()
    _deliver(cluster, {"w": wd}, "w", SendAdd, {"b0"})
    cluster.inflight.clear()  # the adds to b1 never arrive
    assert not wd.completed

    drivers: dict[str, Driver] = {}
    for name in ("reads-e0", "misses-e0"):
        r = LedgerRecovery(LEDGER, store.metadata, store.version, digest, plants=plants)
        drivers[name] = Driver(cluster, store, r, name)
        r.start()
        drivers[name].pump()
        _deliver(cluster, drivers, name, SendReadLac, {"b0", "b1"})
    _deliver(cluster, drivers, "reads-e0", SendRead, {"b0"})  # e0 found, written back
    _deliver(cluster, drivers, "misses-e0", SendRead, {"b1"})  # absent: one negative covers
    assert store.metadata.is_closed
    assert store.metadata.last_entry == -1
    _deliver(cluster, drivers, "reads-e0", SendAdd, {"b0", "b1"})  # e0 at Aq: its LAC is 0
    _deliver(cluster, drivers, "reads-e0", SendRead, {"b0"})  # e1 found, written back
    _deliver(cluster, drivers, "reads-e0", SendAdd, {"b0"})

    lac = _read_lac(cluster, opened)
    assert store.metadata.is_closed
    assert store.metadata.last_entry == -1
    if not plants:
        assert lac == -1  # nothing to read: the close and the bookies agree
        return
    # BookKeeper's recovery (the plant): b0's LAC is 0, and a reader that polls it while
    # its handle has not applied the close reads e0, which the closed ledger excludes.
    assert lac == 0
    reader = EntryReader(LEDGER, opened, 0, digest)
    reader.start()
    pending = reader.take_actions()
    while pending:
        a = pending.pop(0)
        if isinstance(a, SendRead):
            resp = cluster.deliver(Delivery("reader", a))
            reader.on_read_response(a.bookie, status_of(resp), getattr(resp, "body", b""))
            pending += reader.take_actions()
    assert isinstance(reader.result, ReadCompleted)
    assert reader.result.data == b"e0"


# ---------------------------------------------------------------- single recoveries


def test_recovery_of_an_empty_ledger_closes_it_at_minus_one_with_length_zero() -> None:
    """Nothing was written: entry 0 is proved absent, and the close says the ledger has no
    entry and no byte. ``reading`` shows the entry read: -1 before reading, -2 at the end."""
    cluster, store, digest = setup_cluster(3, 2, 2, 3)
    r = LedgerRecovery(LEDGER, store.metadata, store.version, digest)
    rd = Driver(cluster, store, r, "r")
    r.start()
    assert (r.phase, r.reading) == (RecoveryPhase.MARKING, -1)
    rd.pump()  # the IN_RECOVERY mark lands; the fencing LAC reads go out
    assert (r.phase, r.reading) == (RecoveryPhase.FENCING, -1)
    seen: set[int] = set()
    while cluster.inflight:
        rd.deliver(cluster.inflight.pop(0))
        if r.phase is RecoveryPhase.READING:
            seen.add(r.reading)
    assert seen == {0}
    assert r.reading == -2
    (done,) = rd.finished
    assert done == RecoveryCompleted(True, -1, 0, "")
    md = store.metadata
    assert (md.state, md.last_entry, md.length) == (LedgerState.CLOSED, -1, 0)


@pytest.mark.parametrize(
    "status",
    [
        s
        for s in Status
        if s not in (Status.OK, Status.NO_SUCH_LEDGER, Status.NO_SUCH_ENTRY, Status.UNAUTHORIZED)
    ],
    ids=lambda s: s.name,
)
def test_a_fencing_lac_read_that_errors_counts_as_a_bookie_that_did_not_answer(
    status: Status,
) -> None:
    """Any error but UNAUTHORIZED (a wrong password, which fails the recovery at once) is
    the bookie not answering: recovery goes on once the others cover every write set."""
    cluster, store, digest = setup_cluster(3, 2, 2, 3)
    w = LedgerWriter(LEDGER, store.metadata, store.version, digest)
    wd = Driver(cluster, store, w, "w")
    w.add(b"e0")
    wd.pump()
    run_all(cluster, {"w": wd}, None)
    assert [c.entry_id for c in wd.completed] == [0]
    r = LedgerRecovery(LEDGER, store.metadata, store.version, digest)
    rd = Driver(cluster, store, r, "r")
    r.start()
    rd.pump()
    (b0,) = [
        d for d in cluster.inflight if isinstance(d.action, SendReadLac) and d.action.bookie == "b0"
    ]
    cluster.inflight.remove(b0)
    r.on_read_lac_response("b0", status, -1)
    rd.pump()
    assert r.phase is RecoveryPhase.FENCING  # b0 failed; b1 and b2 have not answered yet
    run_all(cluster, {"r": rd}, None)  # b1 and b2 cover every write set (one of each)
    (done,) = rd.finished
    assert done.ok, done.message
    assert (store.metadata.last_entry, store.metadata.length) == (0, 2)


def test_a_recovery_close_retried_on_a_worker_swap_keeps_its_own_replacement() -> None:
    """As test_writer_recovery's c-merge test, and recovery also replaced a failed
    write-back bookie of the segment it read: the retried close keeps the worker's swap
    of the earlier segment and recovery's replacement in the segment it wrote back to."""
    cluster, one, digest = setup_cluster(2, 2, 2, 5)
    two = (Segment(0, ("b0", "b1")), Segment(1, ("b0", "b2")))
    store = MetaStore(replace(one.metadata, segments=two), 1)
    write_entries(cluster, store, digest, 2)
    cluster.bookies["b1"].alive = cluster.bookies["b2"].alive = False
    r = LedgerRecovery(LEDGER, store.metadata, store.version, digest)
    rd = Driver(cluster, store, r, "r")
    rd.deferred = []
    r.start()
    rd.pump()
    ((_d, mark),) = rd.deferred
    rd.deferred.clear()
    rd.land(mark)
    # Entry 1 is found on b0 and written back; b2's write-back fails and b3 replaces it
    # from entry 1 (held until the close).
    run_all(cluster, {"r": rd}, None)
    ((_d, close),) = rd.deferred
    assert close.metadata.segments[1] == Segment(1, ("b0", "b3"))
    # A replication worker's CAS lands first: b4 replaces the lost b1 in segment 0.
    swapped = replace(store.metadata, segments=(Segment(0, ("b0", "b4")), two[1]))
    assert swapped.state is LedgerState.IN_RECOVERY
    assert store.cas(WriteMetadata(swapped, store.version, "worker swap"))
    rd.deferred = None
    rd.land(close)
    (done,) = rd.finished
    assert done.ok, done.message
    md = store.metadata
    assert (md.state, md.last_entry) == (LedgerState.CLOSED, 1)
    assert md.segments == (Segment(0, ("b0", "b4")), Segment(1, ("b0", "b3")))
    assert all((LEDGER, 1) in cluster.bookies[b].entries for b in ("b0", "b3"))
