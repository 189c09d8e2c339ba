"""Recovery's state machine fed one event at a time where the order matters: an answer
it did not ask for, and write-back bookies that fail while a replacement is awaited."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from bkref.impl.core.actions import (
    Action,
    NeedReplacement,
    RecoveryCompleted,
    SendAdd,
    SendRead,
    SendReadLac,
    WriteMetadata,
)
from bkref.impl.core.frames import Status
from bkref.impl.core.metadata import LedgerState
from bkref.impl.core.recovery import LedgerRecovery, RecoveryPhase
from bkref.impl.core.sim import MetaStore, SimCluster
from tests.impl.client_sim import (
    LEDGER,
    Driver,
    run_all,
    setup_cluster,
    start_recovery,
    write_entries,
)


class HoldingDriver(Driver):
    """A driver whose replacement requests wait for the test to answer them."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.needs: list[NeedReplacement] = []

    def _other(self, a: Action) -> None:
        if isinstance(a, NeedReplacement):
            self.needs.append(a)
        else:
            super()._other(a)


def _deliver(cluster: SimCluster, drv: Driver, which: type, bookie: str | None = None) -> None:
    """Deliver every request in flight of type ``which`` (to ``bookie`` if given)."""
    while True:
        match = [
            d
            for d in cluster.inflight
            if isinstance(d.action, which) and bookie in (None, d.action.bookie)
        ]
        if not match:
            return
        cluster.inflight.remove(match[0])
        drv.deliver(match[0])


def _closes_at(cluster: SimCluster, rd: Driver, store: MetaStore, last: int) -> None:
    """Run the recovery's actions to the end: it closes the ledger at ``last``."""
    rd.pump()
    run_all(cluster, {"r": rd}, None)
    (done,) = rd.finished
    assert done.ok, done.message
    assert store.metadata.last_entry == last


def test_a_read_answer_for_an_entry_recovery_is_not_reading_changes_nothing() -> None:
    # A late answer of an earlier attempt (a recovery restarted on new metadata) may name
    # any entry: only the one being read counts.
    cluster, store, digest = setup_cluster(3, 3, 2, 3)
    write_entries(cluster, store, digest, 3)
    r, rd = start_recovery(cluster, store, digest)
    _deliver(cluster, rd, SendReadLac)
    assert r.phase is RecoveryPhase.READING
    reading, last = r.reading, r.last_entry
    later = cluster.bookies["b0"].entries[(LEDGER, reading + 1)]
    r.on_read_response("b0", reading + 1, Status.OK, later)
    assert r.take_actions() == []
    assert (r.phase, r.reading, r.last_entry) == (RecoveryPhase.READING, reading, last)


def test_a_write_back_bookie_without_a_spare_does_not_stop_the_next_ones_replacement() -> None:
    """E = Wq = 3, Aq = 2. Entry 2's write-backs to b1 and then b0 fail; b1 gets no
    replacement (say its rack has no spare), b0 gets b3: with b2 that is Aq, and the
    recovery closes. Dropping b0 from the queue with b1 would fail it."""
    cluster, store, digest = setup_cluster(3, 3, 2, 4)
    write_entries(cluster, store, digest, 3, one_at_a_time=True)  # entry 2 piggybacks LAC 1
    r, rd = start_recovery(cluster, store, digest, HoldingDriver)
    assert isinstance(rd, HoldingDriver)
    _deliver(cluster, rd, SendReadLac)
    _deliver(cluster, rd, SendRead)  # LC = 1, entry 2 found, entry 3 absent
    assert r.phase is RecoveryPhase.CLOSING
    _deliver(cluster, rd, SendAdd, "b2")
    cluster.bookies["b0"].alive = cluster.bookies["b1"].alive = False
    _deliver(cluster, rd, SendAdd, "b1")
    _deliver(cluster, rd, SendAdd, "b0")
    assert rd.needs == [NeedReplacement("b1", ("b0", "b1", "b2"))]  # b0 waits its turn
    r.no_replacement("b1", "no spare in its rack")
    rd.pump()
    assert rd.needs[1:] == [NeedReplacement("b0", ("b0", "b1", "b2"))]
    r.replace("b0", "b3")
    _closes_at(cluster, rd, store, 2)
    assert (LEDGER, 2) in cluster.bookies["b3"].entries


def test_a_corrupt_copy_read_by_recovery_counts_as_an_error_and_another_copy_serves() -> None:
    cluster, store, digest = setup_cluster(3, 3, 2, 3)
    write_entries(cluster, store, digest, 3)
    r, rd = start_recovery(cluster, store, digest)
    _deliver(cluster, rd, SendReadLac)
    reading = r.reading
    good = cluster.bookies["b1"].entries[(LEDGER, reading)]
    bad = bytearray(good)
    bad[-1] ^= 0xFF
    r.on_read_response("b0", reading, Status.OK, bytes(bad))  # a digest mismatch: no raise
    assert (r.phase, r.reading) == (RecoveryPhase.READING, reading)
    r.on_read_response("b1", reading, Status.OK, good)
    assert r.reading == reading + 1  # found on b1: on to the next entry


def test_a_write_back_that_can_no_longer_reach_ack_quorum_fails_the_recovery() -> None:
    # E = Wq = Aq = 3 on three bookies: b0 dead, no spare to replace it, so entry 2's
    # write-back can never be acknowledged by three: the recovery says so and stops.
    cluster, store, digest = setup_cluster(3, 3, 3, 3)
    write_entries(cluster, store, digest, 3, one_at_a_time=True)  # entry 2 piggybacks LAC 1
    cluster.bookies["b0"].alive = False
    _, rd = start_recovery(cluster, store, digest)
    run_all(cluster, {"r": rd}, None)
    (done,) = rd.finished
    assert not done.ok
    assert "write-back of entry 2 cannot reach ack quorum" in done.message


@pytest.mark.parametrize(
    ("negative", "errors"), [((), ("b0", "b1", "b2")), (("b0",), ("b1", "b2"))]
)
def test_an_entry_whose_write_set_errors_or_lacks_it_short_of_proof_fails_the_recovery(
    negative: tuple[str, ...], errors: tuple[str, ...]
) -> None:
    # E = Wq = 3, Aq = 2: two "no such entry" answers prove the entry was never confirmed
    # (Wq - Aq + 1). One, or none, with every other bookie failing proves nothing, and
    # the whole write set has answered: recovery cannot decide the entry and stops,
    # rather than wait for answers that will not come or close before it.
    cluster, store, digest = setup_cluster(3, 3, 2, 3)
    write_entries(cluster, store, digest, 3)
    r, rd = start_recovery(cluster, store, digest)
    _deliver(cluster, rd, SendReadLac)
    reading = r.reading
    for b in negative:
        r.on_read_response(b, reading, Status.NO_SUCH_ENTRY, b"")
    for b in errors:
        r.on_read_response(b, reading, Status.IO_ERROR, b"")
    (done,) = r.take_actions()
    assert isinstance(done, RecoveryCompleted)
    assert not done.ok
    assert f"entry {reading}: {len(negative)} bookies lack it" in done.message
    assert r.phase is RecoveryPhase.FAILED


def test_a_recovery_whose_mark_meets_another_recoverys_mark_goes_on_to_fence() -> None:
    # Two recoveries race to mark the ledger IN_RECOVERY: the loser's CAS fails on the
    # winner's mark, and it recovers on that metadata (fences and reads) instead of
    # failing; BookKeeper's mark re-reads the metadata and finds nothing left to change.
    cluster, store, digest = setup_cluster(3, 3, 2, 3)
    write_entries(cluster, store, digest, 2)
    r = LedgerRecovery(LEDGER, store.metadata, store.version, digest)
    r.start()
    (mark,) = r.take_actions()
    assert isinstance(mark, WriteMetadata)
    other = replace(store.metadata, state=LedgerState.IN_RECOVERY)
    assert store.cas(WriteMetadata(other, store.version, "the other recovery's mark"))
    assert not store.cas(mark)
    r.on_metadata_conflict(store.metadata, store.version)
    sent = r.take_actions()
    assert r.phase is RecoveryPhase.FENCING
    assert {(a.bookie, a.fence) for a in sent if isinstance(a, SendReadLac)} == {
        ("b0", True),
        ("b1", True),
        ("b2", True),
    }
    assert r.version == store.version


def test_a_write_back_bookie_with_no_spare_while_the_rest_reach_ack_quorum_closes() -> None:
    # E = Wq = 3, Aq = 2 on three bookies: b1 dead, no spare. Entry 2's write-backs reach
    # b0 and b2 (Aq) before recovery hears there is no replacement for b1: with nothing
    # left in flight, that answer is what closes the ledger.
    cluster, store, digest = setup_cluster(3, 3, 2, 3)
    write_entries(cluster, store, digest, 3, one_at_a_time=True)  # entry 2 piggybacks LAC 1
    cluster.bookies["b1"].alive = False
    r, rd = start_recovery(cluster, store, digest, HoldingDriver)
    assert isinstance(rd, HoldingDriver)
    run_all(cluster, {"r": rd}, None)
    assert rd.needs == [NeedReplacement("b1", ("b0", "b1", "b2"))]
    assert r.writeback_acks() == {2: frozenset({0, 2})}
    assert rd.finished == []
    assert not cluster.inflight
    r.no_replacement("b1", "no spare bookie")
    _closes_at(cluster, rd, store, 2)
