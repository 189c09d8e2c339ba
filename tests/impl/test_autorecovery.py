"""Issue 5's "Done when": AutoRecovery on real ZooKeeper and 5 real bookie processes, each
running an AutoRecovery node (auditor election and a replication worker).

Replication is verified by reading every entry from each bookie directly (digest
checked), not only by the metadata.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss

from impl.autorecovery.auditor import Auditor, AuditorConfig
from impl.autorecovery.worker import ReplicationWorker, WorkerConfig
from impl.bookie.config import BookieConfig
from impl.client.client import BookKeeper, FencedError
from impl.client.connection import BookieUnavailableError
from impl.cluster.local import LocalCluster
from impl.cluster.process import wait_until
from impl.core.digest import Digest, DigestMismatchError, master_key
from impl.core.frames import AddRequest, ReadRequest, ReadResponse, Status
from impl.core.metadata import LedgerMetadata
from impl.core.repair import Reason, Task
from impl.meta.store import ZkMetadataStore, connect
from impl.meta.underreplication import UnderreplicationManager
from impl.storage.bookie_storage import BookieStorage
from impl.storage.entrylog import log_path
from tests.impl.conftest import MakeCluster

pytestmark = [pytest.mark.zookeeper, pytest.mark.slow]

PW = b"autorecovery"
# Short ZooKeeper sessions so that a killed bookie's registration lapses in seconds.
FAST = {"zkTimeout": 4000, "rwRereplicateBackoffMs": 500}


ZkView = Callable[[LocalCluster], tuple[ZkMetadataStore, UnderreplicationManager]]


@pytest.fixture
def zk_view() -> Iterator[ZkView]:
    """``zk_view(cluster)``: the test's own ZooKeeper view of the cluster (metadata and
    AutoRecovery state), closed after the test."""
    clients: list[KazooClient] = []

    def view(cluster: LocalCluster) -> tuple[ZkMetadataStore, UnderreplicationManager]:
        zk = connect(cluster.zk_hosts)
        clients.append(zk)
        return ZkMetadataStore(zk), UnderreplicationManager(zk)

    yield view
    for zk in clients:
        zk.stop()
        zk.close()


def _off(
    store: ZkMetadataStore, urm: UnderreplicationManager, bookie: str, ledgers: Iterable[int]
) -> Callable[[], bool]:
    """Repair is done: no task left and no ledger of ``ledgers`` names ``bookie``."""
    ids = list(ledgers)

    def done() -> bool:
        return not urm.tasks() and all(
            bookie not in store.read_ledger(lid)[0].bookies() for lid in ids
        )

    return done


async def _write_closed_ledgers(
    bk: BookKeeper, count: int, entries: int, size: int = 100
) -> dict[int, list[bytes]]:
    out: dict[int, list[bytes]] = {}
    for n in range(count):
        h = await bk.create_ledger(3, 2, 2, PW)
        data = [b"%d:%d:" % (n, i) + b"x" * size for i in range(entries)]
        await h.add_many(data)
        await h.close()
        out[h.ledger_id] = data
    return out


async def _replicas(bk: BookKeeper, lid: int, md: LedgerMetadata, entry: int) -> list[str]:
    """The bookies of ``entry``'s write set that hold a copy whose digest verifies."""
    digest = Digest(md.digest_type, PW)
    ensemble = md.ensemble_for(entry)
    holders = []
    for idx in md.quorum.write_set(entry):
        b = ensemble[idx]
        try:
            resp = await bk.request(b, lambda rid: ReadRequest(rid, lid, entry))
        except BookieUnavailableError:
            continue
        if isinstance(resp, ReadResponse) and resp.status is Status.OK:
            try:
                digest.verify(resp.body, lid, entry)
            except DigestMismatchError:
                continue
            holders.append(b)
    return holders


async def _assert_fully_replicated(
    bk: BookKeeper, ledgers: dict[int, list[bytes]], live: set[str]
) -> None:
    for lid, data in ledgers.items():
        md, _ = await asyncio.to_thread(bk.meta.read_ledger, lid)
        assert md.is_closed
        assert md.last_entry == len(data) - 1
        assert md.bookies() <= live, f"ledger {lid} still names {md.bookies() - live}"
        for seg in md.segments:  # one bookie never holds two replicas of a segment
            assert len(set(seg.ensemble)) == len(seg.ensemble), (lid, seg)
        for e in range(len(data)):
            holders = await _replicas(bk, lid, md, e)
            assert len(set(holders)) == md.write_quorum, (lid, e, holders)
        r = await bk.open_ledger(lid, PW, recovery=False)
        assert await r.read(0, len(data) - 1) == data


def _names(md: LedgerMetadata) -> set[str]:
    return md.bookies()


def test_sigkill_of_a_bookie_re_replicates_every_entry_to_wq_live_bookies(
    make_cluster: MakeCluster,
    zk_view: ZkView,
) -> None:
    cluster = make_cluster(5, autorecovery=True, **FAST)
    store, urm = zk_view(cluster)

    async def go() -> None:
        async with BookKeeper(cluster.zk_hosts) as bk:
            ledgers = await _write_closed_ledgers(bk, 20, 100)
            uses: Counter[str] = Counter()
            for lid in ledgers:
                md, _ = await asyncio.to_thread(bk.meta.read_ledger, lid)
                uses.update(md.bookies())
            victim, held = uses.most_common(1)[0]
            index = next(b.index for b in cluster.bookies if b.bookie_id == victim)
            started = time.monotonic()
            await asyncio.to_thread(cluster.kill_bookie, index)

            repaired = _off(store, urm, victim, ledgers)
            assert await asyncio.to_thread(wait_until, repaired, 120.0, 0.5)
            took = time.monotonic() - started
            print(f"re-replicated {held} ledgers of {victim} in {took:.1f} s after SIGKILL")
            live = {b.bookie_id for b in cluster.bookies if b.bookie_id != victim}
            await _assert_fully_replicated(bk, ledgers, live)

            # The victim comes back with its old copies, which no segment names any more:
            # REDUNDANT in the status view, then dropped by its GC after the wait. The
            # wait is the window in which the test must see them REDUNDANT (a status
            # command per poll, a subprocess): generous, or a loaded machine misses it.
            cluster.write_config(index, gcWaitTime=1000, gcOverreplicatedLedgerWaitTime=15000)
            await asyncio.to_thread(cluster.start_bookie, index)
            mine = [lid for lid in ledgers if await _holds_any(bk, victim, lid, 100)]
            assert len(mine) == held

            def health() -> dict[int, str]:
                out = _shell(cluster, "status", "--json", "--per-ledger")
                assert out.returncode == 0, out.stderr
                return {row["ledger"]: row["health"] for row in json.loads(out.stdout)}

            def flagged() -> bool:
                return set(mine) <= {k for k, v in health().items() if v == "REDUNDANT"}

            assert await asyncio.to_thread(wait_until, flagged, 30, 0.5)

            async def dropped() -> bool:
                return not any([await _holds_any(bk, victim, lid, 100) for lid in mine])

            deadline = time.monotonic() + 60
            while not await dropped():
                assert time.monotonic() < deadline, "the GC kept the over-replicated ledgers"
                await asyncio.sleep(0.5)
            assert set(health().values()) == {"HEALTHY"}
            await _assert_fully_replicated(bk, ledgers, live)

    asyncio.run(go())


def test_idle_open_ledger_is_fenced_after_the_grace_period_and_an_active_writer_is_not(
    make_cluster: MakeCluster,
    zk_view: ZkView,
) -> None:
    cluster = make_cluster(5, autorecovery=True, openLedgerRereplicationGracePeriod=3000, **FAST)
    store, urm = zk_view(cluster)

    async def go() -> None:
        async with BookKeeper(cluster.zk_hosts) as bk:
            idle = await bk.create_ledger(3, 2, 2, PW)
            await idle.add_many([b"idle-%d" % i for i in range(50)])
            victim = idle.writer.ensemble[0]
            active = None
            for _ in range(20):  # an active ledger on the same victim
                h = await bk.create_ledger(3, 2, 2, PW)
                if victim in h.writer.ensemble:
                    active = h
                    break
                await h.close()
            assert active is not None
            await active.add_many([b"active-%d" % i for i in range(50)])
            index = next(b.index for b in cluster.bookies if b.bookie_id == victim)
            await asyncio.to_thread(cluster.kill_bookie, index)

            # The active writer keeps adding: its own ensemble change replaces the victim.
            written = 50
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                await active.add(b"active-%d" % written)
                written += 1
                await asyncio.sleep(0.05)
            assert victim not in active.writer.ensemble

            def idle_closed() -> bool:
                md = store.read_ledger(idle.ledger_id)[0]
                return md.is_closed and victim not in md.bookies()

            assert await asyncio.to_thread(wait_until, idle_closed, 60.0, 0.5)
            with pytest.raises(FencedError):
                await idle.add(b"after the fence")
            # The active writer was never fenced: it still adds and closes normally.
            await active.add(b"active-%d" % written)
            await active.close()
            md = store.read_ledger(active.ledger_id)[0]
            assert md.last_entry == written
            assert await asyncio.to_thread(wait_until, lambda: not urm.tasks(), 60.0, 0.5)
            live = {b.bookie_id for b in cluster.bookies if b.bookie_id != victim}
            await _assert_fully_replicated(
                bk,
                {
                    idle.ledger_id: [b"idle-%d" % i for i in range(50)],
                    active.ledger_id: [b"active-%d" % i for i in range(written + 1)],
                },
                live,
            )

    asyncio.run(go())


def _shell(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "impl.cli.main", "shell", *args, "--zk", cluster.zk_hosts],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _logged(cluster: LocalCluster, text: str) -> Callable[[], bool]:
    """A condition: some bookie logs ``text`` more often than when this was called."""

    def count() -> int:
        return sum(b.log_path.read_text().count(text) for b in cluster.bookies)

    before = count()
    return lambda: count() > before


def _auditor(cluster: LocalCluster) -> tuple[str, int]:
    out = _shell(cluster, "whoisauditor", "--json")
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    return got["auditor"], got["epoch"]


def test_sigkill_of_the_auditor_elects_another_and_repair_continues(
    make_cluster: MakeCluster,
    zk_view: ZkView,
) -> None:
    cluster = make_cluster(5, autorecovery=True, **FAST)
    store, urm = zk_view(cluster)

    async def go() -> None:
        async with BookKeeper(cluster.zk_hosts) as bk:
            assert await asyncio.to_thread(wait_until, lambda: urm.auditor() is not None, 30)
            auditor, epoch = await asyncio.to_thread(_auditor, cluster)
            ledgers: dict[int, list[bytes]] = {}
            while len(ledgers) < 6:  # ledgers on the auditor's own bookie
                more = await _write_closed_ledgers(bk, 1, 50)
                lid = next(iter(more))
                if auditor in store.read_ledger(lid)[0].bookies():
                    ledgers.update(more)
            index = next(b.index for b in cluster.bookies if b.bookie_id == auditor)
            await asyncio.to_thread(cluster.kill_bookie, index)

            def new_auditor() -> bool:
                a = urm.auditor()
                return a is not None and a.node_id != auditor

            assert await asyncio.to_thread(wait_until, new_auditor, 60, 0.5)
            successor, new_epoch = await asyncio.to_thread(_auditor, cluster)
            assert successor != auditor
            assert new_epoch > epoch

            repaired = _off(store, urm, auditor, ledgers)
            assert await asyncio.to_thread(wait_until, repaired, 120, 0.5)
            live = {b.bookie_id for b in cluster.bookies if b.bookie_id != auditor}
            await _assert_fully_replicated(bk, ledgers, live)

    asyncio.run(go())


def test_disabled_autorecovery_repairs_nothing_and_enabling_completes_it(
    make_cluster: MakeCluster,
    zk_view: ZkView,
) -> None:
    cluster = make_cluster(5, autorecovery=True, **FAST)
    store, urm = zk_view(cluster)

    async def go() -> None:
        async with BookKeeper(cluster.zk_hosts) as bk:
            ledgers = await _write_closed_ledgers(bk, 8, 50)
            out = _shell(cluster, "autorecovery", "disable")
            assert out.returncode == 0, out.stderr
            assert "disabled" in out.stdout
            before = {lid: store.read_ledger(lid) for lid in ledgers}
            victim = next(iter(before.values()))[0].segments[0].ensemble[0]
            index = next(b.index for b in cluster.bookies if b.bookie_id == victim)
            audited = _logged(cluster, "auditor: AutoRecovery is disabled; not publishing")
            await asyncio.to_thread(cluster.kill_bookie, index)
            gone = lambda: victim not in {b.bookie_id for b in store.bookies()}  # noqa: E731
            assert await asyncio.to_thread(wait_until, gone, 30, 0.2)
            # The auditor saw the loss and audited, and published nothing (not a fixed
            # sleep: on a loaded machine the audit may come later than any sleep).
            assert await asyncio.to_thread(wait_until, audited, 60, 0.2)
            await asyncio.sleep(2)  # and the workers had rounds to act on a task, if any
            assert {lid: store.read_ledger(lid) for lid in ledgers} == before
            assert urm.tasks() == []
            out = _shell(cluster, "autorecovery", "enable")
            assert out.returncode == 0, out.stderr

            repaired = _off(store, urm, victim, ledgers)
            assert await asyncio.to_thread(wait_until, repaired, 120, 0.5)
            live = {b.bookie_id for b in cluster.bookies if b.bookie_id != victim}
            await _assert_fully_replicated(bk, ledgers, live)

    asyncio.run(go())


async def _ledger_on(
    bk: BookKeeper, store: ZkMetadataStore, must: str, avoid: set[str], entries: int
) -> dict[int, list[bytes]]:
    """A closed ledger whose ensemble holds ``must`` and none of ``avoid``."""
    for _ in range(50):
        more = await _write_closed_ledgers(bk, 1, entries)
        lid = next(iter(more))
        ens = set(store.read_ledger(lid)[0].bookies())
        if must in ens and not ens & avoid:
            return more
        await bk.delete_ledger(lid)
    raise AssertionError(f"no ensemble with {must} and without {avoid} in 50 tries")


async def _lost_ledger(
    bk: BookKeeper, cluster: LocalCluster, store: ZkMetadataStore, urm: UnderreplicationManager
) -> tuple[dict[int, list[bytes]], int]:
    """A closed ledger of 50 entries on bookie 0 and not on bookie 3; bookie 0 is then
    lost and the ledger marked under-replicated."""
    ids = [b.bookie_id for b in cluster.bookies]
    urm.ensure_layout()
    ledger = await _ledger_on(bk, store, ids[0], {ids[3]}, 50)
    lid = next(iter(ledger))
    await asyncio.to_thread(_lose, cluster, store, ids[0])
    urm.mark(lid, {ids[0]: Reason.LOST}, 1)
    return ledger, lid


async def _holds_any(bk: BookKeeper, bookie: str, lid: int, entries: int) -> bool:
    for e in range(entries):
        resp = await bk.request(bookie, functools.partial(_read, lid, e))
        if resp.status is Status.OK:
            return True
    return False


def _read(lid: int, entry: int, rid: int) -> ReadRequest:
    return ReadRequest(rid, lid, entry)


def _lose(cluster: LocalCluster, store: ZkMetadataStore, bookie: str) -> None:
    cluster.kill_bookie(next(b.index for b in cluster.bookies if b.bookie_id == bookie))
    gone = lambda: bookie not in {b.bookie_id for b in store.bookies()}  # noqa: E731
    assert wait_until(gone, 30, 0.2)


def _worker(bk: BookKeeper, local: str | None, **config: Any) -> ReplicationWorker:
    urm = UnderreplicationManager(bk.meta.zk, bk.root)
    return ReplicationWorker(bk, urm, f"test-worker-{local}", local, WorkerConfig(**config))


class _Racing(UnderreplicationManager):
    """Takes a ledger's lock only when every racer has come to take it."""

    def __init__(self, zk: KazooClient, root: str, barrier: threading.Barrier) -> None:
        super().__init__(zk, root)
        self.barrier = barrier

    def try_lock(self, ledger_id: int, owner: str) -> bool:
        self.barrier.wait()
        return super().try_lock(ledger_id, owner)


def test_two_workers_race_for_one_ledger_one_holds_the_lock_and_copies_once(
    make_cluster: MakeCluster,
    zk_view: ZkView,
) -> None:
    cluster = make_cluster(5, **FAST)
    store, urm = zk_view(cluster)
    ids = [b.bookie_id for b in cluster.bookies]

    async def go() -> None:
        async with (
            BookKeeper(cluster.zk_hosts) as bk,
            BookKeeper(cluster.zk_hosts) as bk1,
            BookKeeper(cluster.zk_hosts) as bk2,
        ):
            urm.ensure_layout()
            ledger = await _ledger_on(bk, store, ids[0], {ids[3], ids[4]}, 300)
            lid = next(iter(ledger))
            await asyncio.to_thread(_lose, cluster, store, ids[0])
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
            assert not await _holds_any(bk, loser, lid, 300)  # no second copy
            assert urm.tasks() == []
            live = set(ids[1:])
            await _assert_fully_replicated(bk, ledger, live)

    asyncio.run(go())


def test_repair_slots_bound_concurrent_copies_per_bookie(
    make_cluster: MakeCluster, zk_view: ZkView
) -> None:
    cluster = make_cluster(5, **FAST)
    store, urm = zk_view(cluster)
    ids = [b.bookie_id for b in cluster.bookies]

    async def go() -> None:
        async with BookKeeper(cluster.zk_hosts) as bk, BookKeeper(cluster.zk_hosts) as bk1:
            ledger, lid = await _lost_ledger(bk, cluster, store, urm)
            before = store.read_ledger(lid)
            held = urm.slot(ids[3], "another repair", 1)
            assert held.acquire(blocking=False)
            worker = _worker(bk1, ids[3], slots_per_bookie=1)
            await worker.run_once()
            # The destination's only slot is taken: the worker copied nothing and waits.
            assert store.read_ledger(lid) == before
            assert not await _holds_any(bk, ids[3], lid, 50)
            assert [t.ledger_id for t, _ in urm.tasks()] == [lid]
            assert worker.stats.failures == 0
            held.release()
            await worker.run_once()
            assert worker.stats.repaired == 1
            assert ids[3] in store.read_ledger(lid)[0].bookies()
            await _assert_fully_replicated(bk, ledger, set(ids[1:]))

    asyncio.run(go())


def test_the_most_at_risk_ledger_is_repaired_first(
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

    async def go() -> None:
        async with BookKeeper(cluster.zk_hosts) as bk:
            urm.ensure_layout()
            # Older but safer: Wq = 3 keeps 2 live replicas of every entry.
            safer = await bk.create_ledger(3, 3, 2, PW)
            await safer.add_many([b"s%d" % i for i in range(30)])
            await safer.close()
            victim = safer.metadata.segments[0].ensemble[0]
            riskier = None
            for _ in range(50):  # Wq = 2: some entries keep 1 live replica
                h = await bk.create_ledger(3, 2, 2, PW)
                await h.add_many([b"r%d" % i for i in range(30)])
                await h.close()
                if victim in h.metadata.bookies():
                    riskier = h
                    break
            assert riskier is not None
            await asyncio.to_thread(_lose, cluster, store, victim)
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
            await _assert_fully_replicated(
                bk,
                {
                    safer.ledger_id: [b"s%d" % i for i in range(30)],
                    riskier.ledger_id: [b"r%d" % i for i in range(30)],
                },
                live,
            )

    asyncio.run(go())


def test_manual_recovery_to_a_target_bookie_reports_per_ledger(
    make_cluster: MakeCluster, zk_view: ZkView
) -> None:
    cluster = make_cluster(5, **FAST)
    store, _ = zk_view(cluster)
    ids = [b.bookie_id for b in cluster.bookies]
    lost, target = ids[0], ids[4]

    async def go() -> None:
        async with BookKeeper(cluster.zk_hosts) as bk:
            ledgers: dict[int, list[bytes]] = {}
            for _ in range(3):
                ledgers.update(await _ledger_on(bk, store, lost, {target}, 40))
            # An open ledger whose writer went idle: recovery fences and closes it first.
            while True:
                h = await bk.create_ledger(3, 2, 2, PW)
                if lost in h.writer.ensemble and target not in h.writer.ensemble:
                    break
                await h.close()
                await bk.delete_ledger(h.ledger_id)
            await h.add_many([b"open-%d" % i for i in range(40)])
            ledgers[h.ledger_id] = [b"open-%d" % i for i in range(40)]
            await asyncio.to_thread(_lose, cluster, store, lost)
            out = await asyncio.to_thread(_shell, cluster, "recover", lost, "--target", target)
            assert out.returncode == 0, out.stdout + out.stderr
            for lid in ledgers:
                assert f"ledger {lid}: done" in out.stdout
                bookies = store.read_ledger(lid)[0].bookies()
                assert lost not in bookies
                # The open ledger's recovery may replace the lost bookie itself, while it
                # writes back the last entries (the client's choice, as in BookKeeper).
                assert target in bookies or lid == h.ledger_id
            assert f"{len(ledgers)} of {len(ledgers)} ledgers re-replicated" in out.stdout
            await _assert_fully_replicated(bk, ledgers, set(ids[1:]))
            with pytest.raises(FencedError):
                await h.add(b"after recovery")

    asyncio.run(go())


def test_decommission_moves_every_replica_off_a_live_bookie(
    make_cluster: MakeCluster, zk_view: ZkView
) -> None:
    cluster = make_cluster(5, autorecovery=True, **FAST)
    store, urm = zk_view(cluster)
    ids = [b.bookie_id for b in cluster.bookies]

    async def go() -> None:
        async with BookKeeper(cluster.zk_hosts) as bk:
            ledgers = await _write_closed_ledgers(bk, 8, 40)
            leaving = Counter(
                b for lid in ledgers for b in store.read_ledger(lid)[0].bookies()
            ).most_common(1)[0][0]
            assert store.read_cookie(leaving) is not None
            out = await asyncio.to_thread(
                _shell, cluster, "decommission", leaving, "--timeout", "120"
            )
            assert out.returncode == 0, out.stdout + out.stderr
            assert "decommissioned" in out.stdout
            assert store.read_cookie(leaving) is None
            assert urm.decommissioning() == set()
            await _assert_fully_replicated(bk, ledgers, set(ids) - {leaving})

    asyncio.run(go())


def test_periodic_ledger_check_finds_a_corrupt_replica_and_it_moves_to_a_new_bookie(
    make_cluster: MakeCluster,
    zk_view: ZkView,
) -> None:
    cluster = make_cluster(
        5,
        autorecovery=True,
        auditorPeriodicCheckInterval=2,
        auditorLedgerVerificationPercentage=100,
        **FAST,
    )
    store, urm = zk_view(cluster)

    async def go() -> None:
        async with BookKeeper(cluster.zk_hosts) as bk:
            ledgers = await _write_closed_ledgers(bk, 2, 30)
            lid = next(iter(ledgers))
            md = store.read_ledger(lid)[0]
            bookie = md.ensemble_for(7)[md.quorum.write_set(7)[0]]
            # Overwrite entry 7 on one live replica with a body whose digest fails, as a
            # flipped bit on disk would leave it (the bookie does not check digests).
            good = await bk.request(bookie, functools.partial(_read, lid, 7))
            assert isinstance(good, ReadResponse)
            bad_body = good.body[:-1] + bytes([good.body[-1] ^ 0xFF])
            resp = await bk.request(
                bookie,
                lambda rid: AddRequest(rid, lid, 7, master_key(PW), bad_body, recovery=True),
            )
            assert resp.status is Status.OK
            assert bookie not in await _replicas(bk, lid, md, 7)

            assert await asyncio.to_thread(
                wait_until,
                lambda: _moved(cluster.zk_hosts, store, urm=urm, lid=lid, bookie=bookie, entry=7),
                60,
                0.5,
            )
            await _assert_fully_replicated(bk, ledgers, {b.bookie_id for b in cluster.bookies})

    asyncio.run(go())


def bk_sync_replicas(zk_hosts: str, lid: int, md: LedgerMetadata, entry: int) -> list[str]:
    async def go() -> list[str]:
        async with BookKeeper(zk_hosts) as bk:
            return await _replicas(bk, lid, md, entry)

    return asyncio.run(go())


def _moved(
    zk_hosts: str,
    store: ZkMetadataStore,
    *,
    urm: UnderreplicationManager,
    lid: int,
    bookie: str,
    entry: int,
) -> bool:
    """The replica of ``entry`` on ``bookie`` moved to a new bookie (as BookKeeper's
    worker moves a replica that misses entries), every replica verifies, no task left."""
    md = store.read_ledger(lid)[0]
    if urm.tasks() or bookie in md.ensemble_for(entry):
        return False
    return len(bk_sync_replicas(zk_hosts, lid, md, entry)) == md.write_quorum


def test_a_dedicated_autorecovery_process_repairs_a_cluster_without_autorecovery(
    make_cluster: MakeCluster, zk_view: ZkView, tmp_path: Path
) -> None:
    cluster = make_cluster(5, **FAST)
    store, urm = zk_view(cluster)
    config = tmp_path / "autorecovery.toml"
    config.write_text(
        f'zkServers = "{cluster.zk_hosts}"\nzkTimeout = 4000\nrwRereplicateBackoffMs = 500\n'
    )
    argv = ["autorecovery", "--config", str(config), "--dedicated"]
    with (tmp_path / "autorecovery.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "impl.cli.main", *argv],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )

    async def go() -> None:
        async with BookKeeper(cluster.zk_hosts) as bk:
            ledgers = await _write_closed_ledgers(bk, 6, 40)
            victim = store.read_ledger(next(iter(ledgers)))[0].segments[0].ensemble[0]
            await asyncio.to_thread(_lose, cluster, store, victim)

            repaired = _off(store, urm, victim, ledgers)
            assert await asyncio.to_thread(wait_until, repaired, 60, 0.5), (
                tmp_path / "autorecovery.log"
            ).read_text()[-3000:]
            live = {b.bookie_id for b in cluster.bookies if b.bookie_id != victim}
            await _assert_fully_replicated(bk, ledgers, live)

    try:
        asyncio.run(go())
        assert proc.poll() is None  # still running: it serves until stopped
    finally:
        proc.terminate()
        assert proc.wait(30) == 0  # SIGTERM stops it cleanly


def test_lost_bookie_recovery_delay_defers_the_audit_unless_triggered_or_two_are_lost(
    make_cluster: MakeCluster,
    zk_view: ZkView,
) -> None:
    cluster = make_cluster(5, autorecovery=True, **FAST)
    store, urm = zk_view(cluster)
    ids = [b.bookie_id for b in cluster.bookies]

    async def go() -> None:
        async with BookKeeper(cluster.zk_hosts) as bk:
            ledgers = await _write_closed_ledgers(bk, 12, 20)
            out = _shell(cluster, "lostbookierecoverydelay", "set", "600")
            assert out.returncode == 0, out.stderr
            assert "600 s" in _shell(cluster, "lostbookierecoverydelay", "get").stdout
            assert await asyncio.to_thread(wait_until, lambda: urm.auditor() is not None, 30)
            auditor = urm.auditor()
            assert auditor is not None
            first, second = [b for b in ids if b != auditor.node_id][:2]
            deferred = _logged(cluster, f"auditor: bookies lost: ['{first}']")
            await asyncio.to_thread(_lose, cluster, store, first)
            # The auditor saw the loss and deferred its audit (not a fixed sleep: on a
            # loaded machine the auditor may see it later than any sleep).
            assert await asyncio.to_thread(wait_until, deferred, 60, 0.2)
            await asyncio.sleep(2)  # far short of the 600 s delay
            assert urm.tasks() == []
            # triggeraudit audits now, whatever the delay.
            assert _shell(cluster, "triggeraudit").returncode == 0
            # Nothing else can start the repair (the delay is 600 s). Not "every ledger marked
            # at once": workers may complete one before the audit has marked the last.
            on_first = {lid for lid in ledgers if first in store.read_ledger(lid)[0].bookies()}
            assert on_first
            repaired_first = _off(store, urm, first, on_first)
            assert await asyncio.to_thread(wait_until, repaired_first, 60, 0.5)
            # Two bookies lost (the first one is still gone): audited at once.
            await asyncio.to_thread(_lose, cluster, store, second)
            on_second = {lid for lid in ledgers if second in store.read_ledger(lid)[0].bookies()}

            repaired = _off(store, urm, second, on_second)
            assert await asyncio.to_thread(wait_until, repaired, 60, 0.5)
            await _assert_fully_replicated(bk, ledgers, set(ids) - {first, second})

    asyncio.run(go())


def test_two_lost_replicas_of_one_segment_move_to_two_different_bookies(
    make_cluster: MakeCluster, zk_view: ZkView
) -> None:
    cluster = make_cluster(5, **FAST)
    store, urm = zk_view(cluster)

    async def go() -> None:
        async with BookKeeper(cluster.zk_hosts) as bk:
            urm.ensure_layout()
            h = await bk.create_ledger(3, 3, 2, PW)
            data = [b"t%d" % i for i in range(40)]
            await h.add_many(data)
            await h.close()
            a, b, c = h.metadata.segments[0].ensemble
            for lost in (a, b):
                await asyncio.to_thread(_lose, cluster, store, lost)
            urm.mark(h.ledger_id, {a: Reason.LOST, b: Reason.LOST}, 1)
            worker = _worker(bk, None)  # dedicated: placement picks both targets
            await worker.run_once()
            assert worker.stats.repaired == 1
            ensemble = store.read_ledger(h.ledger_id)[0].segments[0].ensemble
            assert len(set(ensemble)) == 3
            assert c in ensemble
            assert not {a, b} & set(ensemble)
            live = {x.bookie_id for x in cluster.bookies} - {a, b}
            await _assert_fully_replicated(bk, {h.ledger_id: data}, live)

    asyncio.run(go())


def test_checkledgers_finds_a_gap_in_the_middle_only_when_it_reads_every_entry(
    make_cluster: MakeCluster,
    zk_view: ZkView,
) -> None:
    # No periodic check runs (its interval is a week); the shell's check is the only one.
    cluster = make_cluster(5, autorecovery=True, **FAST)
    store, urm = zk_view(cluster)

    async def go() -> None:
        async with BookKeeper(cluster.zk_hosts) as bk:
            ledgers = await _write_closed_ledgers(bk, 1, 30)
            lid = next(iter(ledgers))
            md = store.read_ledger(lid)[0]
            bookie = md.ensemble_for(13)[md.quorum.write_set(13)[0]]
            good = await bk.request(bookie, functools.partial(_read, lid, 13))
            assert isinstance(good, ReadResponse)
            bad_body = good.body[:-1] + bytes([good.body[-1] ^ 0xFF])
            resp = await bk.request(
                bookie,
                lambda rid: AddRequest(rid, lid, 13, master_key(PW), bad_body, recovery=True),
            )
            assert resp.status is Status.OK

            # First and last entries only: the corrupt copy of entry 13 is not read.
            sampled = _shell(cluster, "checkledgers", "--percentage", "0", "--json")
            assert sampled.returncode == 0, sampled.stderr
            assert json.loads(sampled.stdout) == {"marked": 0}
            assert not urm.tasks()

            full = _shell(cluster, "checkledgers", "--json")
            assert full.returncode == 0, full.stderr
            assert json.loads(full.stdout) == {"marked": 1}

            assert await asyncio.to_thread(
                wait_until,
                lambda: _moved(cluster.zk_hosts, store, urm=urm, lid=lid, bookie=bookie, entry=13),
                60,
                0.5,
            )

    asyncio.run(go())


def test_checkledgers_marks_an_entry_its_bookie_can_no_longer_read_and_it_moves(
    make_cluster: MakeCluster,
    zk_view: ZkView,
) -> None:
    # A record whose length a disk fault flipped: the bookie indexes the entry but its
    # read fails (IO_ERROR), which the full check must count as a missing replica.
    cluster = make_cluster(5, autorecovery=True, **FAST)
    store, urm = zk_view(cluster)

    async def write() -> int:
        async with BookKeeper(cluster.zk_hosts) as bk:
            return next(iter(await _write_closed_ledgers(bk, 1, 30)))

    lid = asyncio.run(write())
    md = store.read_ledger(lid)[0]
    bookie = md.ensemble_for(13)[md.quorum.write_set(13)[0]]
    index = next(b.index for b in cluster.bookies if b.bookie_id == bookie)
    # AutoRecovery off while the bookie is down for the disk edit: else the auditor may
    # mark it lost and a worker move its replicas before the check runs (under load).
    urm.set_enabled(False)
    cluster.stop_bookie(index)
    cfg = BookieConfig.load(cluster.bookies[index].config_path)
    ledgers = Path(cfg.ledgerDirectories[0])
    storage = BookieStorage(Path(cfg.journalDirectory), ledgers, cfg.storage())
    storage.checkpoint()
    log_id, offset = storage.index.ledgers[lid].entries[13]
    storage.close()
    with log_path(ledgers, log_id).open("r+b") as f:
        f.seek(offset)
        f.write((0x7FFFFFF0).to_bytes(4, "big"))
    cluster.start_bookie(index)
    urm.set_enabled(True)

    async def read_13() -> Status:
        async with BookKeeper(cluster.zk_hosts) as bk:
            resp = await bk.request(bookie, functools.partial(_read, lid, 13))
            return resp.status

    assert asyncio.run(read_13()) is Status.IO_ERROR
    full = _shell(cluster, "checkledgers", "--json")
    assert full.returncode == 0, full.stderr
    assert json.loads(full.stdout) == {"marked": 1}

    assert wait_until(
        lambda: _moved(cluster.zk_hosts, store, urm=urm, lid=lid, bookie=bookie, entry=13), 60, 0.5
    )


class _UnlockFailsOnce(UnderreplicationManager):
    """ZooKeeper out of reach at the moment a worker releases its lock (as in a
    partition that starts just then): the unlock raises, the lock stays."""

    failed = False

    def unlock(self, ledger_id: int) -> None:
        if not self.failed:
            self.failed = True
            raise ConnectionLoss("the partition started as the worker unlocked")
        super().unlock(ledger_id)


def test_a_lock_left_by_a_failed_unlock_never_keeps_the_ledger_from_repair(
    make_cluster: MakeCluster,
    zk_view: ZkView,
) -> None:
    # Found by the 30-minute campaign: a worker's unlock failed as a partition began,
    # its session survived, and the ledger, marked again later, stayed locked (and
    # unrepaired) until that bookie was stopped.
    cluster = make_cluster(5, **FAST)
    store, urm = zk_view(cluster)
    ids = [b.bookie_id for b in cluster.bookies]

    async def go() -> None:
        async with (
            BookKeeper(cluster.zk_hosts) as bk,
            BookKeeper(cluster.zk_hosts) as bk1,
            BookKeeper(cluster.zk_hosts) as bk2,
        ):
            ledger, lid = await _lost_ledger(bk, cluster, store, urm)
            flaky = _UnlockFailsOnce(bk1.meta.zk, bk1.root)
            w1 = ReplicationWorker(bk1, flaky, "worker-1", ids[3], WorkerConfig())
            w2 = _worker(bk2, ids[4])
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
            await _assert_fully_replicated(bk, ledger, set(ids[1:]))

    asyncio.run(go())


def test_repair_slots_left_by_failed_releases_are_reaped_by_their_session(
    make_cluster: MakeCluster,
    zk_view: ZkView,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Leases a session holds though no repair uses them (their release failed while
    # ZooKeeper was out of reach) fill the bookie's slots: every other worker defers.
    cluster = make_cluster(5, **FAST)
    store, urm = zk_view(cluster)
    ids = [b.bookie_id for b in cluster.bookies]

    async def go() -> None:
        async with (
            BookKeeper(cluster.zk_hosts) as bk,
            BookKeeper(cluster.zk_hosts) as bk1,
            BookKeeper(cluster.zk_hosts) as bk2,
        ):
            _, lid = await _lost_ledger(bk, cluster, store, urm)
            # The leaking worker's own bookie is in the ensemble: it cannot take the copy.
            member = sorted(store.read_ledger(lid)[0].bookies() - {ids[0]})[0]
            leaker = _worker(bk1, member, slots_per_bookie=2)
            for _ in range(2):  # both slots of the destination, held and forgotten
                assert leaker.urm.slot(ids[3], "leaked", 2).acquire(blocking=False)
            blocked = _worker(bk2, ids[3], slots_per_bookie=2)
            caplog.set_level(logging.INFO, "impl.autorecovery.worker")
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

    asyncio.run(go())
