"""Drivers that run the writer's and recovery's state machines over the in-memory bookies
of ``bkref.impl.core.sim`` (a fast double; the refinement machine runs the same cores over
real bookies and ZooKeeper)."""

from __future__ import annotations

from hypothesis import strategies as st

from bkref.impl.core.actions import (
    Action,
    AddCompleted,
    CloseCompleted,
    NeedReplacement,
    RecoveryCompleted,
    SendAdd,
    SendRead,
    SendReadLac,
    WriteMetadata,
)
from bkref.impl.core.digest import Digest, DigestType, master_key, password_hash
from bkref.impl.core.metadata import LedgerMetadata, Segment
from bkref.impl.core.recovery import LedgerRecovery
from bkref.impl.core.sim import Delivery, MetaStore, SimBookie, SimCluster, status_of
from bkref.impl.core.writer import LedgerWriter

PW = b"secret"
LEDGER = 7


def setup_cluster(e: int, wq: int, aq: int, n_bookies: int) -> tuple[SimCluster, MetaStore, Digest]:
    bookies = {f"b{i}": SimBookie(f"b{i}") for i in range(n_bookies)}
    meta = LedgerMetadata(
        e,
        wq,
        aq,
        (Segment(0, tuple(f"b{i}" for i in range(e))),),
        DigestType.CRC32C,
        password_hash(PW),
    )
    return SimCluster(bookies, master_key(PW)), MetaStore(meta), Digest(DigestType.CRC32C, PW)


class Driver:
    """Runs one client's state machine against the sim cluster."""

    def __init__(
        self,
        cluster: SimCluster,
        store: MetaStore,
        machine: LedgerWriter | LedgerRecovery,
        name: str,
    ) -> None:
        self.cluster, self.store, self.m, self.name = cluster, store, machine, name
        self.completed: list[AddCompleted] = []
        self.finished: list[RecoveryCompleted | CloseCompleted] = []
        self.events: list[str] = []
        # When set, metadata writes wait here until the test lands them (a slow ZooKeeper).
        self.deferred: list[tuple[Driver, WriteMetadata]] | None = None

    def pump(self) -> None:
        while actions := self.m.take_actions():
            self.cluster.post(self.name, actions, self._other)

    def _other(self, a: Action) -> None:
        if isinstance(a, AddCompleted):
            self.completed.append(a)
            self.events.append(f"complete {a.entry_id}")
        elif isinstance(a, RecoveryCompleted | CloseCompleted):
            self.finished.append(a)
        elif isinstance(a, WriteMetadata):
            if self.deferred is not None:
                self.deferred.append((self, a))
            else:
                self._cas(a)
        elif isinstance(a, NeedReplacement):
            spare = [
                b for b, sb in self.cluster.bookies.items() if sb.alive and b not in a.ensemble
            ]
            if spare:
                self.m.replace(a.failed, spare[0])
            else:
                self.m.no_replacement(a.failed, "no spare bookie")

    def _cas(self, a: WriteMetadata) -> None:
        self.events.append("cas")
        if self.store.cas(a):
            self.m.on_metadata_written(self.store.version)
        else:
            self.m.on_metadata_conflict(self.store.metadata, self.store.version)

    def land(self, a: WriteMetadata) -> None:
        """Perform a deferred metadata write now."""
        self._cas(a)
        self.pump()

    def deliver(self, d: Delivery) -> None:
        resp = self.cluster.deliver(d)
        a = d.action
        st_ = status_of(resp)
        if isinstance(a, SendAdd):
            self.m.on_add_response(a.bookie, a.entry_id, st_)
        elif isinstance(a, SendRead):
            assert isinstance(self.m, LedgerRecovery)
            body = getattr(resp, "body", b"")
            self.m.on_read_response(a.bookie, a.entry_id, st_, body)
        elif isinstance(a, SendReadLac):
            assert isinstance(self.m, LedgerRecovery)
            self.m.on_read_lac_response(a.bookie, st_, getattr(resp, "lac", -1))
        self.pump()


def run_all(
    cluster: SimCluster,
    drivers: dict[str, Driver],
    data: st.DataObject | None,
    limit: int | None = None,
) -> int:
    delivered = 0
    while cluster.inflight and (limit is None or delivered < limit):
        i = 0 if data is None else data.draw(st.integers(0, len(cluster.inflight) - 1))
        d = cluster.inflight.pop(i)
        drivers[d.client].deliver(d)
        delivered += 1
    return delivered


def write_entries(
    cluster: SimCluster, store: MetaStore, digest: Digest, n: int, *, one_at_a_time: bool = False
) -> None:
    """A writer adds entries 0..n-1 to the store's ledger and every add completes; one at
    a time, each entry after the first piggybacks the LAC of the one before."""
    w = LedgerWriter(LEDGER, store.metadata, store.version, digest)
    wd = Driver(cluster, store, w, "w")
    for i in range(n):
        w.add(b"e%d" % i)
        if one_at_a_time:
            wd.pump()
            run_all(cluster, {"w": wd}, None)
    wd.pump()
    run_all(cluster, {"w": wd}, None)
    assert [c.entry_id for c in wd.completed] == list(range(n))


def start_recovery(
    cluster: SimCluster, store: MetaStore, digest: Digest, driver: type[Driver] = Driver
) -> tuple[LedgerRecovery, Driver]:
    """A recovery of the store's ledger, started: its mark's CAS has run, its fencing LAC
    reads are in flight."""
    r = LedgerRecovery(LEDGER, store.metadata, store.version, digest)
    rd = driver(cluster, store, r, "r")
    r.start()
    rd.pump()
    return r, rd
