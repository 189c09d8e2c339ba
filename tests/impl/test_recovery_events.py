"""Recovery's state machine fed one event at a time where the order matters: an answer
it did not ask for, and write-back bookies that fail while a replacement is awaited."""

from __future__ import annotations

from typing import Any

from bkref.impl.core.actions import Action, NeedReplacement, SendAdd, SendRead, SendReadLac
from bkref.impl.core.frames import Status
from bkref.impl.core.recovery import RecoveryPhase
from bkref.impl.core.sim import SimCluster
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
    rd.pump()
    run_all(cluster, {"r": rd}, None)
    (done,) = rd.finished
    assert done.ok, done.message
    assert store.metadata.last_entry == 2
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
