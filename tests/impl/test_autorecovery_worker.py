"""Replication workers driven one round at a time on real ZooKeeper and 5 real bookie
processes: ledger locks, repair slots, most-at-risk-first order, target placement,
and what ZooKeeper failures during a release leave behind.

Replication is verified by reading every entry from each bookie directly (digest
checked), not only by the metadata.
"""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss

from bkref.impl.autorecovery.auditor import Auditor, AuditorConfig
from bkref.impl.autorecovery.worker import ReplicationWorker, WorkerConfig
from bkref.impl.client.client import BookKeeper
from bkref.impl.core.repair import Reason, Task
from bkref.impl.meta.underreplication import UnderreplicationManager
from bkref.impl.testing import assert_fully_replicated, clients, holds_any, ledger_on, lose_bookie
from tests.impl.autorecovery_helpers import FAST, PW, lost_ledger, worker
from tests.impl.conftest import MakeCluster, ZkView

pytestmark = [pytest.mark.zookeeper, pytest.mark.slow]


class _Racing(UnderreplicationManager):
    """Takes a ledger's lock only when every racer has come to take it."""

    def __init__(self, zk: KazooClient, root: str, barrier: threading.Barrier) -> None:
        super().__init__(zk, root)
        self.barrier = barrier

    def try_lock(self, ledger_id: int, owner: str) -> bool:
        self.barrier.wait()
        return super().try_lock(ledger_id, owner)


async def test_two_workers_race_for_one_ledger_one_holds_the_lock_and_copies_once(
    make_cluster: MakeCluster,
    zk_view: ZkView,
) -> None:
    cluster = make_cluster(5, **FAST)
    store, urm = zk_view(cluster)
    ids = [b.bookie_id for b in cluster.bookies]
    async with clients(cluster.zk_hosts, 3) as (bk, bk1, bk2):
        urm.ensure_layout()
        ledger = await ledger_on(bk, ids[0], {ids[3], ids[4]}, 300, PW)
        lid = next(iter(ledger))
        await asyncio.to_thread(lose_bookie, cluster, store, ids[0])
        urm.mark(lid, {ids[0]: Reason.LOST}, 1)
        # Both try the lock once both have listed the task: the race happens on any
        # machine, not only when neither worker is done before the other starts.
        both = threading.Barrier(2, timeout=60)
        w1, w2 = (
            ReplicationWorker(b, _Racing(b.meta.zk, b.root, both), f"w-{n}", n, WorkerConfig())
            for b, n in ((bk1, ids[3]), (bk2, ids[4]))
        )
        await asyncio.gather(w1.run_once(), w2.run_once())
        assert w1.stats.repaired + w2.stats.repaired == 1
        assert w1.stats.lock_busy + w2.stats.lock_busy == 1  # the race did happen
        winner, loser = (ids[3], ids[4]) if w1.stats.repaired else (ids[4], ids[3])
        md = store.read_ledger(lid)[0]
        assert winner in md.bookies()
        assert ids[0] not in md.bookies()
        assert not await holds_any(bk, loser, lid, 300)  # no second copy
        assert urm.tasks() == []
        live = set(ids[1:])
        await assert_fully_replicated(bk, ledger, live, PW)


async def test_repair_slots_bound_concurrent_copies_per_bookie(
    make_cluster: MakeCluster, zk_view: ZkView
) -> None:
    cluster = make_cluster(5, **FAST)
    store, urm = zk_view(cluster)
    ids = [b.bookie_id for b in cluster.bookies]
    async with clients(cluster.zk_hosts, 2) as (bk, bk1):
        ledger, lid = await lost_ledger(bk, cluster, store, urm)
        before = store.read_ledger(lid)
        held = urm.slot(ids[3], "another repair", 1)
        assert held.acquire(blocking=False)
        w = worker(bk1, ids[3], slots_per_bookie=1)
        await w.run_once()
        # The destination's only slot is taken: the worker copied nothing and waits.
        assert store.read_ledger(lid) == before
        assert not await holds_any(bk, ids[3], lid, 50)
        assert [t.ledger_id for t, _ in urm.tasks()] == [lid]
        assert w.stats.failures == 0
        held.release()
        await w.run_once()
        assert w.stats.repaired == 1
        assert ids[3] in store.read_ledger(lid)[0].bookies()
        await assert_fully_replicated(bk, ledger, set(ids[1:]), PW)


async def test_the_most_at_risk_ledger_is_repaired_first(
    make_cluster: MakeCluster, zk_view: ZkView
) -> None:
    cluster = make_cluster(5, **FAST)
    store, urm = zk_view(cluster)
    ids = [b.bookie_id for b in cluster.bookies]

    class Recording(ReplicationWorker):
        order: list[int]

        async def repair(self, task: Task, version: int) -> bool | None:
            self.order.append(task.ledger_id)
            return await super().repair(task, version)

    async with BookKeeper(cluster.zk_hosts) as bk:
        urm.ensure_layout()
        # Older but safer: Wq = 3 keeps 2 live replicas of every entry.
        safer = await bk.create_ledger(3, 3, 2, PW)
        await safer.add_many([b"s%d" % i for i in range(30)])
        await safer.close()
        victim = safer.metadata.segments[0].ensemble[0]
        others = [b for b in ids if b != victim]
        # Wq = 2 on the same victim: some entries keep 1 live replica
        riskier = await bk.create_ledger(3, 2, 2, PW, bookies=[victim, *others[:2]])
        await riskier.add_many([b"r%d" % i for i in range(30)])
        await riskier.close()
        await asyncio.to_thread(lose_bookie, cluster, store, victim)
        urm2 = UnderreplicationManager(bk.meta.zk, bk.root)
        auditor = Auditor(bk, urm2, "t", AuditorConfig())
        assert await auditor.audit() == 2
        prio = {t.ledger_id: t.priority for t, _ in urm.tasks()}
        assert prio == {safer.ledger_id: 2, riskier.ledger_id: 1}
        w = Recording(bk, urm2, "rec", None, WorkerConfig())
        w.order = []
        await w.run_once()
        assert w.order == [riskier.ledger_id, safer.ledger_id]
        assert w.stats.repaired == 2
        live = {b for b in ids if b != victim}
        await assert_fully_replicated(
            bk,
            {
                safer.ledger_id: [b"s%d" % i for i in range(30)],
                riskier.ledger_id: [b"r%d" % i for i in range(30)],
            },
            live,
            PW,
        )


async def test_two_lost_replicas_of_one_segment_move_to_two_different_bookies(
    make_cluster: MakeCluster, zk_view: ZkView
) -> None:
    cluster = make_cluster(5, **FAST)
    store, urm = zk_view(cluster)
    async with BookKeeper(cluster.zk_hosts) as bk:
        urm.ensure_layout()
        h = await bk.create_ledger(3, 3, 2, PW)
        data = [b"t%d" % i for i in range(40)]
        await h.add_many(data)
        await h.close()
        a, b, c = h.metadata.segments[0].ensemble
        for lost in (a, b):
            await asyncio.to_thread(lose_bookie, cluster, store, lost)
        urm.mark(h.ledger_id, {a: Reason.LOST, b: Reason.LOST}, 1)
        w = worker(bk, None)  # dedicated: placement picks both targets
        await w.run_once()
        assert w.stats.repaired == 1
        ensemble = store.read_ledger(h.ledger_id)[0].segments[0].ensemble
        assert len(set(ensemble)) == 3
        assert c in ensemble
        assert not {a, b} & set(ensemble)
        live = {x.bookie_id for x in cluster.bookies} - {a, b}
        await assert_fully_replicated(bk, {h.ledger_id: data}, live, PW)


class _UnlockFailsOnce(UnderreplicationManager):
    """ZooKeeper out of reach at the moment a worker releases its lock (as in a
    partition that starts just then): the unlock raises, the lock stays."""

    failed = False

    def unlock(self, ledger_id: int) -> None:
        if not self.failed:
            self.failed = True
            raise ConnectionLoss("the partition started as the worker unlocked")
        super().unlock(ledger_id)


async def test_a_lock_left_by_a_failed_unlock_never_keeps_the_ledger_from_repair(
    make_cluster: MakeCluster,
    zk_view: ZkView,
) -> None:
    # Found by the 30-minute campaign: a worker's unlock failed as a partition began,
    # its session survived, and the ledger, marked again later, stayed locked (and
    # unrepaired) until that bookie was stopped.
    cluster = make_cluster(5, **FAST)
    store, urm = zk_view(cluster)
    ids = [b.bookie_id for b in cluster.bookies]
    async with clients(cluster.zk_hosts, 3) as (bk, bk1, bk2):
        ledger, lid = await lost_ledger(bk, cluster, store, urm)
        flaky = _UnlockFailsOnce(bk1.meta.zk, bk1.root)
        w1 = ReplicationWorker(bk1, flaky, "worker-1", ids[3], WorkerConfig())
        w2 = worker(bk2, ids[4])
        await w1.run_once()
        assert w1.stats.repaired == 1
        assert urm.lock_holder(lid) == "worker-1"  # left behind

        # The same session re-takes a lock it holds: a lost create reply or a failed
        # unlock never locks the ledger against its own worker.
        assert flaky.try_lock(lid, "worker-1")
        assert not w2.urm.try_lock(lid, "worker-2")  # another session still cannot

        urm.mark(lid, {ids[0]: Reason.LOST}, 1)  # marked again later
        await w2.run_once()
        assert w2.stats.lock_busy == 1
        await w1.run_once()  # releases the lock it left, then repairs
        assert urm.tasks() == []
        assert urm.lock_holder(lid) is None
        await assert_fully_replicated(bk, ledger, set(ids[1:]), PW)


async def test_repair_slots_left_by_failed_releases_are_reaped_by_their_session(
    make_cluster: MakeCluster,
    zk_view: ZkView,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Leases a session holds though no repair uses them (their release failed while
    # ZooKeeper was out of reach) fill the bookie's slots: every other worker defers.
    cluster = make_cluster(5, **FAST)
    store, urm = zk_view(cluster)
    ids = [b.bookie_id for b in cluster.bookies]
    async with clients(cluster.zk_hosts, 3) as (bk, bk1, bk2):
        _, lid = await lost_ledger(bk, cluster, store, urm)
        # The leaking worker's own bookie is in the ensemble: it cannot take the copy.
        member = sorted(store.read_ledger(lid)[0].bookies() - {ids[0]})[0]
        leaker = worker(bk1, member, slots_per_bookie=2)
        for _ in range(2):  # both slots of the destination, held and forgotten
            assert leaker.urm.slot(ids[3], "leaked", 2).acquire(blocking=False)
        blocked = worker(bk2, ids[3], slots_per_bookie=2)
        caplog.set_level(logging.INFO, "bkref.impl.autorecovery.worker")
        await blocked.run_once()
        assert blocked.stats.repaired == 0
        assert [t.ledger_id for t, _ in urm.tasks()] == [lid]
        # Why the ledger waits is in the log, once.
        assert caplog.text.count(f"ledger {lid} deferred: no free repair slot on") == 1
        await leaker.run_once()  # its round starts by reaping its own leftovers
        assert leaker.stats.repaired == 0
        assert leaker.urm.slot(ids[3], "probe", 2).lease_holders() == []
        await blocked.run_once()
        assert blocked.stats.repaired == 1
        assert ids[3] in store.read_ledger(lid)[0].bookies()
