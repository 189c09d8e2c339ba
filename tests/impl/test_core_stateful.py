"""The writer and a recovery client under random delivery, loss, bookie crashes and timeouts.

Bookies keep what they journaled across crashes (adds are acknowledged only once
journaled), so a crash is "unreachable for a while". Invariants, named as the
protocol's TLA+ specs name them:

- NoOutOfOrderEntries: completions are 0, 1, 2, ... in order.
- AllAckedEntriesAreReadable: every acknowledged entry is on Aq bookies of its
  write set in the metadata ZooKeeper holds (while no recovery is rewriting).
- NoDivergenceBetweenClientAndMetaData: once recovery closed the ledger, every
  entry the writer had acknowledged is at or below the closed last entry.
"""

from __future__ import annotations

from hypothesis import note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from bkref.impl.core.actions import RecoveryCompleted, WriteMetadata
from bkref.impl.core.frames import Status
from bkref.impl.core.metadata import LedgerState
from bkref.impl.core.recovery import LedgerRecovery, RecoveryPhase
from bkref.impl.core.writer import LedgerWriter, WriterState
from tests.impl.client_sim import LEDGER, Driver, setup_cluster


class CoreMachine(RuleBasedStateMachine):
    quorum = (3, 3, 2)

    def __init__(self) -> None:
        super().__init__()
        self.cluster, self.store, self.digest = setup_cluster(*self.quorum, 5)
        self.writer = LedgerWriter(
            LEDGER, self.store.metadata, self.store.version, self.digest, add_timeout_ticks=3
        )
        self.wd = Driver(self.cluster, self.store, self.writer, "w")
        self.drivers = {"w": self.wd}
        self.meta_queue: list[tuple[Driver, WriteMetadata]] = []
        self.wd.deferred = self.meta_queue
        self.recovery: LedgerRecovery | None = None
        self.rd: Driver | None = None
        self.rival: Driver | None = None  # a second recovery client racing the first

    @precondition(lambda self: self.writer.state is WriterState.OPEN and self.writer.pending < 8)
    @rule()
    def add(self) -> None:
        e = self.writer.add(b"e%d" % self.writer.next_entry)
        note(f"add {e}")
        self.wd.pump()

    @precondition(lambda self: self.cluster.inflight)
    @rule(data=st.data())
    def deliver(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(0, len(self.cluster.inflight) - 1))
        d = self.cluster.inflight.pop(i)
        self.drivers[d.client].deliver(d)

    @precondition(lambda self: self.meta_queue)
    @rule(data=st.data())
    def zookeeper_applies_a_metadata_write(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(0, len(self.meta_queue) - 1))
        driver, write = self.meta_queue.pop(i)
        note(f"CAS lands: {write.reason}")
        driver.land(write)

    @precondition(lambda self: self.cluster.inflight)
    @rule(data=st.data())
    def lose_connection(self, data: st.DataObject) -> None:
        """A request's connection breaks: the sender sees an error, the bookie nothing."""
        i = data.draw(st.integers(0, len(self.cluster.inflight) - 1))
        d = self.cluster.inflight.pop(i)
        note(f"lost {d.action}")
        bookie = self.cluster.bookies[d.action.bookie]
        alive, bookie.alive = bookie.alive, False
        self.drivers[d.client].deliver(d)
        bookie.alive = alive

    @precondition(lambda self: sum(not b.alive for b in self.cluster.bookies.values()) < 1)
    @rule(name=st.sampled_from(["b0", "b1", "b2", "b3", "b4"]))
    def crash_bookie(self, name: str) -> None:
        note(f"crash {name}")
        self.cluster.bookies[name].alive = False

    @rule(name=st.sampled_from(["b0", "b1", "b2", "b3", "b4"]))
    def restart_bookie(self, name: str) -> None:
        self.cluster.bookies[name].alive = True

    @rule()
    def tick(self) -> None:
        self.writer.tick()
        self.wd.pump()

    @precondition(lambda self: self.recovery is None)
    @rule()
    def start_recovery(self) -> None:
        note("recovery starts")
        self.recovery = LedgerRecovery(LEDGER, self.store.metadata, self.store.version, self.digest)
        self.rd = Driver(self.cluster, self.store, self.recovery, "r")
        self.rd.deferred = self.meta_queue
        self.drivers["r"] = self.rd
        self.recovery.start()
        self.rd.pump()

    @precondition(lambda self: self.writer.state is WriterState.OPEN and self.writer.pending == 0)
    @rule()
    def writer_closes(self) -> None:
        note("writer closes")
        self.writer.close()
        self.wd.pump()

    @precondition(lambda self: self.recovery is not None and self.rival is None)
    @rule()
    def rival_recovery_starts(self) -> None:
        note("a second recovery client starts")
        rival = LedgerRecovery(LEDGER, self.store.metadata, self.store.version, self.digest)
        self.rival = Driver(self.cluster, self.store, rival, "r2")
        self.rival.deferred = self.meta_queue
        self.drivers["r2"] = self.rival
        rival.start()
        self.rival.pump()

    @invariant()
    def writer_close_matches_metadata(self) -> None:
        for c in self.wd.finished:
            if c.ok:
                assert self.store.metadata.state is LedgerState.CLOSED
                assert self.store.metadata.last_entry == c.last_entry

    @invariant()
    def recoveries_agree(self) -> None:
        ends = [
            f.last_entry for d in (self.rd, self.rival) if d is not None for f in d.finished if f.ok
        ]
        assert len(set(ends)) <= 1, ends
        if ends:
            assert ends[0] == self.store.metadata.last_entry

    @invariant()
    def NoOutOfOrderEntries(self) -> None:
        ok = [c.entry_id for c in self.wd.completed if c.status is Status.OK]
        assert ok == list(range(len(ok)))

    @invariant()
    def AllAckedEntriesAreReadable(self) -> None:
        if self.recovery is not None and self.recovery.phase is not RecoveryPhase.DONE:
            return
        md = self.store.metadata
        for c in self.wd.completed:
            if c.status is not Status.OK:
                continue
            ens = md.ensemble_for(c.entry_id)
            held = [
                i
                for i in md.quorum.write_set(c.entry_id)
                if (LEDGER, c.entry_id) in self.cluster.bookies[ens[i]].entries
            ]
            assert len(held) >= md.ack_quorum, (c.entry_id, md)

    @invariant()
    def NoDivergenceBetweenClientAndMetaData(self) -> None:
        md = self.store.metadata
        if md.state is LedgerState.CLOSED:
            acked = [c.entry_id for c in self.wd.completed if c.status is Status.OK]
            assert all(e <= md.last_entry for e in acked), (acked, md.last_entry)

    def _quiesce(self) -> None:
        for _ in range(100_000):
            if self.meta_queue:
                driver, write = self.meta_queue.pop(0)
                driver.land(write)
            elif self.cluster.inflight:
                d = self.cluster.inflight.pop(0)
                self.drivers[d.client].deliver(d)
            else:
                return

    def teardown(self) -> None:
        # Liveness: heal everything, deliver all; an started recovery must finish and close.
        for b in self.cluster.bookies.values():
            b.alive = True
        self._quiesce()
        if self.rd is not None:
            (done,) = self.rd.finished
            assert isinstance(done, RecoveryCompleted)
            if not done.ok:
                # Recovery may give up while bookies are down; healed, a retry must close.
                note(f"first recovery failed: {done.message}")
                self.recovery = None
                self.start_recovery()
                self._quiesce()
                assert self.rd is not None
                (done,) = self.rd.finished
                assert isinstance(done, RecoveryCompleted)
                assert done.ok, done.message
            assert self.store.metadata.state is LedgerState.CLOSED
            self.NoDivergenceBetweenClientAndMetaData()
            self.AllAckedEntriesAreReadable()


class CoreMachineWqEqualsAq(CoreMachine):
    quorum = (3, 3, 3)


class CoreMachineStriped(CoreMachine):
    quorum = (4, 2, 2)


_SETTINGS = settings(max_examples=100, stateful_step_count=60, deadline=None)
CoreMachine.TestCase.settings = _SETTINGS
CoreMachineWqEqualsAq.TestCase.settings = _SETTINGS
CoreMachineStriped.TestCase.settings = _SETTINGS
TestCore = CoreMachine.TestCase
TestCoreWqEqualsAq = CoreMachineWqEqualsAq.TestCase
TestCoreStriped = CoreMachineStriped.TestCase
