"""AutoRecovery repairs a cluster: real ZooKeeper and 5 real bookie processes, each
running an AutoRecovery node (auditor election and a replication worker), or a
dedicated AutoRecovery process; and the operator's `recover` and `decommission`.

Replication is verified by reading every entry from each bookie directly (digest
checked), not only by the metadata.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from bkref.impl.client.client import BookKeeper
from bkref.impl.client.errors import FencedError
from bkref.impl.testing import (
    assert_fully_replicated,
    eventually,
    holds_any,
    index_of,
    ledger_on,
    lose_bookie,
    repaired_off,
    shell,
    write_closed_ledgers,
)
from tests.impl.autorecovery_helpers import FAST, PW
from tests.impl.conftest import MakeCluster, ZkView

pytestmark = [pytest.mark.zookeeper, pytest.mark.slow]


async def test_sigkill_of_a_bookie_re_replicates_every_entry_to_wq_live_bookies(
    make_cluster: MakeCluster,
    zk_view: ZkView,
) -> None:
    cluster = make_cluster(5, autorecovery=True, **FAST)
    store, urm = zk_view(cluster)
    async with BookKeeper(cluster.zk_hosts) as bk:
        ledgers = await write_closed_ledgers(bk, 20, 100, PW)
        uses: Counter[str] = Counter()
        for lid in ledgers:
            md, _ = await asyncio.to_thread(bk.meta.read_ledger, lid)
            uses.update(md.bookies())
        victim, held = uses.most_common(1)[0]
        index = index_of(cluster, victim)
        started = time.monotonic()
        await asyncio.to_thread(cluster.kill_bookie, index)

        assert await eventually(repaired_off(store, urm, victim, ledgers), 120.0, 0.5)
        took = time.monotonic() - started
        print(f"re-replicated {held} ledgers of {victim} in {took:.1f} s after SIGKILL")
        live = {b.bookie_id for b in cluster.bookies if b.bookie_id != victim}
        await assert_fully_replicated(bk, ledgers, live, PW)

        # The victim comes back with its old copies, which no segment names any more:
        # REDUNDANT in the status view, then dropped by its GC after the wait. The
        # wait is the window in which the test must see them REDUNDANT (a status
        # command per poll, a subprocess): generous, or a loaded machine misses it.
        cluster.write_config(index, gcWaitTime=1000, gcOverreplicatedLedgerWaitTime=15000)
        await asyncio.to_thread(cluster.start_bookie, index)
        mine = [lid for lid in ledgers if await holds_any(bk, victim, lid, 100)]
        assert len(mine) == held

        def health() -> dict[int, str]:
            out = shell(cluster, "status", "--json", "--per-ledger")
            assert out.returncode == 0, out.stderr
            return {row["ledger"]: row["health"] for row in json.loads(out.stdout)}

        def flagged() -> bool:
            return set(mine) <= {k for k, v in health().items() if v == "REDUNDANT"}

        assert await eventually(flagged, 30, 0.5)

        async def dropped() -> bool:
            return not any([await holds_any(bk, victim, lid, 100) for lid in mine])

        assert await eventually(dropped, 60, 0.5), "the GC kept the over-replicated ledgers"
        assert set(health().values()) == {"HEALTHY"}
        await assert_fully_replicated(bk, ledgers, live, PW)


async def test_idle_open_ledger_is_fenced_after_the_grace_period_and_an_active_writer_is_not(
    make_cluster: MakeCluster,
    zk_view: ZkView,
) -> None:
    cluster = make_cluster(5, autorecovery=True, openLedgerRereplicationGracePeriod=3000, **FAST)
    store, urm = zk_view(cluster)
    async with BookKeeper(cluster.zk_hosts) as bk:
        idle = await bk.create_ledger(3, 2, 2, PW)
        await idle.add_many([b"idle-%d" % i for i in range(50)])
        victim = idle.writer.ensemble[0]
        others = [b.bookie_id for b in cluster.bookies if b.bookie_id != victim]
        # an active ledger on the same victim
        active = await bk.create_ledger(3, 2, 2, PW, bookies=[victim, *others[:2]])
        await active.add_many([b"active-%d" % i for i in range(50)])
        await asyncio.to_thread(cluster.kill_bookie, index_of(cluster, victim))

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

        assert await eventually(idle_closed, 60.0, 0.5)
        with pytest.raises(FencedError):
            await idle.add(b"after the fence")
        # The active writer was never fenced: it still adds and closes normally.
        await active.add(b"active-%d" % written)
        await active.close()
        md = store.read_ledger(active.ledger_id)[0]
        assert md.last_entry == written
        assert await eventually(lambda: not urm.tasks(), 60.0, 0.5)
        live = {b.bookie_id for b in cluster.bookies if b.bookie_id != victim}
        await assert_fully_replicated(
            bk,
            {
                idle.ledger_id: [b"idle-%d" % i for i in range(50)],
                active.ledger_id: [b"active-%d" % i for i in range(written + 1)],
            },
            live,
            PW,
        )


async def test_a_dedicated_autorecovery_process_repairs_a_cluster_without_autorecovery(
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
            [sys.executable, "-m", "bkref.impl.cli.main", *argv],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    try:
        async with BookKeeper(cluster.zk_hosts) as bk:
            ledgers = await write_closed_ledgers(bk, 6, 40, PW)
            victim = store.read_ledger(next(iter(ledgers)))[0].segments[0].ensemble[0]
            await asyncio.to_thread(lose_bookie, cluster, store, victim)

            repaired = repaired_off(store, urm, victim, ledgers)
            assert await eventually(repaired, 60, 0.5), (tmp_path / "autorecovery.log").read_text()[
                -3000:
            ]
            live = {b.bookie_id for b in cluster.bookies if b.bookie_id != victim}
            await assert_fully_replicated(bk, ledgers, live, PW)
        assert proc.poll() is None  # still running: it serves until stopped
    finally:
        proc.terminate()
        assert proc.wait(30) == 0  # SIGTERM stops it cleanly


async def test_manual_recovery_to_a_target_bookie_reports_per_ledger(
    make_cluster: MakeCluster, zk_view: ZkView
) -> None:
    cluster = make_cluster(5, **FAST)
    store, _ = zk_view(cluster)
    ids = [b.bookie_id for b in cluster.bookies]
    lost, target = ids[0], ids[4]
    async with BookKeeper(cluster.zk_hosts) as bk:
        ledgers: dict[int, list[bytes]] = {}
        for _ in range(3):
            ledgers.update(await ledger_on(bk, lost, {target}, 40, PW))
        # An open ledger whose writer went idle: recovery fences and closes it first.
        h = await bk.create_ledger(3, 2, 2, PW, bookies=[lost, ids[1], ids[2]])
        await h.add_many([b"open-%d" % i for i in range(40)])
        ledgers[h.ledger_id] = [b"open-%d" % i for i in range(40)]
        await asyncio.to_thread(lose_bookie, cluster, store, lost)
        out = await asyncio.to_thread(shell, cluster, "recover", lost, "--target", target)
        assert out.returncode == 0, out.stdout + out.stderr
        for lid in ledgers:
            assert f"ledger {lid}: done" in out.stdout
            bookies = store.read_ledger(lid)[0].bookies()
            assert lost not in bookies
            # The open ledger's recovery may replace the lost bookie itself, while it
            # writes back the last entries (the client's choice, as in BookKeeper).
            assert target in bookies or lid == h.ledger_id
        assert f"{len(ledgers)} of {len(ledgers)} ledgers re-replicated" in out.stdout
        await assert_fully_replicated(bk, ledgers, set(ids[1:]), PW)
        with pytest.raises(FencedError):
            await h.add(b"after recovery")


async def test_decommission_moves_every_replica_off_a_live_bookie(
    make_cluster: MakeCluster, zk_view: ZkView
) -> None:
    cluster = make_cluster(5, autorecovery=True, **FAST)
    store, urm = zk_view(cluster)
    ids = [b.bookie_id for b in cluster.bookies]
    async with BookKeeper(cluster.zk_hosts) as bk:
        ledgers = await write_closed_ledgers(bk, 8, 40, PW)
        leaving = Counter(
            b for lid in ledgers for b in store.read_ledger(lid)[0].bookies()
        ).most_common(1)[0][0]
        assert store.read_cookie(leaving) is not None
        out = await asyncio.to_thread(shell, cluster, "decommission", leaving, "--timeout", "120")
        assert out.returncode == 0, out.stdout + out.stderr
        assert "decommissioned" in out.stdout
        assert store.read_cookie(leaving) is None
        assert urm.decommissioning() == set()
        await assert_fully_replicated(bk, ledgers, set(ids) - {leaving}, PW)
