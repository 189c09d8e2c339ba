"""A real bookie process and its files, with a real ZooKeeper: journal replay after a
SIGKILL, a flipped byte in an entry log, a wiped data directory, the disk usage
thresholds, garbage collection and compaction, and `bookie --dump`.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bkref.impl.client.client import BookKeeper
from bkref.impl.testing import assert_bookie_holds, eventually, index_of
from tests.impl.conftest import MakeCluster

pytestmark = pytest.mark.zookeeper

PW = b"integration"


async def test_sigkill_of_a_bookie_after_acks_then_restart_replays_the_journal(
    make_cluster: MakeCluster,
) -> None:
    # No checkpoint in the test's lifetime: everything is in the journal only.
    cluster = make_cluster(3, flushInterval=3_600_000, zkTimeout=3000)
    async with BookKeeper(cluster.zk_hosts) as bk:
        h = await bk.create_ledger(3, 3, 3, PW)
        payload = [b"durable %d" % i for i in range(1000)]
        await h.add_many(payload)
    victim = cluster.bookies[0]
    cluster.kill_bookie(0)
    cluster.start_bookie(0)
    assert "replayed" in victim.log_path.read_text()
    await assert_bookie_holds(victim.bookie_id, h.ledger_id, payload, PW)


async def test_flipped_byte_in_an_entry_log_is_a_digest_mismatch_and_another_replica_serves(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(2, flushInterval=200)
    async with BookKeeper(cluster.zk_hosts) as bk:
        h = await bk.create_ledger(2, 2, 2, PW)
        await h.add_many([b"payload-%04d" % i for i in range(100)])
        await h.close()
        ledger = h.ledger_id
        md, _ = await asyncio.to_thread(bk.meta.read_ledger, ledger)
    target = 42
    first = md.ensemble_for(target)[target % 2]  # the replica a reader asks first
    index = index_of(cluster, first)
    cluster.stop_bookie(index)  # clean stop: the entry log is flushed
    logs = sorted((Path(cluster.bookies[index].directory) / "ledgers").glob("*.log"))
    needle = b"payload-%04d" % target
    for path in logs:
        raw = bytearray(path.read_bytes())
        at = raw.find(needle)
        if at >= 0:
            raw[at + 3] ^= 0x01
            path.write_bytes(bytes(raw))
            break
    else:
        pytest.fail("entry not found in any entry log")
    cluster.start_bookie(index)

    async with BookKeeper(cluster.zk_hosts) as bk:
        r = await bk.open_ledger(ledger, PW, recovery=False)
        assert await r.read_entry(target) == needle
        assert r.stats.digest_mismatches == [(first, target)]


def test_a_wiped_data_dir_makes_the_bookie_refuse_to_start(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(3)
    b = cluster.bookies[1]
    cluster.stop_bookie(1)
    shutil.rmtree(Path(b.directory) / "ledgers")
    out = subprocess.run(
        [sys.executable, "-m", "bkref.impl.bookie", "--config", str(b.config_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 3
    assert "cookie mismatch" in out.stderr
    assert "wiped or swapped" in out.stderr


async def test_disk_over_threshold_goes_read_only_and_the_client_moves_away(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(4, diskCheckInterval=200)
    async with BookKeeper(cluster.zk_hosts) as bk:
        # Aq = Wq: every add waits for the victim, so its READ_ONLY answer comes while the
        # add is pending and starts the ensemble change. (With Aq < Wq the other acks may
        # confirm every add first, and bkref's writer ignores an error for an entry it has
        # completed, where BookKeeper's changes the ensemble; a difference left open.)
        h = await bk.create_ledger(3, 3, 3, PW)
        await h.add_many([b"before-%d" % i for i in range(50)])
        victim = h.writer.ensemble[0]
        index = index_of(cluster, victim)

        def registered(readonly: bool) -> Callable[[], bool]:
            return lambda: any(
                i.bookie_id == victim and i.readonly == readonly for i in bk.meta.bookies()
            )

        cluster.write_config(index, diskUsageThreshold=0.000001, diskUsageLwmThreshold=0.0000005)
        cluster.signal_bookie(index, signal.SIGHUP)
        deadline = time.monotonic() + 30
        assert await eventually(registered(True), 30, 0.1), "bookie never went read-only"
        await h.add_many([b"after-%d" % i for i in range(50)])
        assert victim not in h.writer.ensemble
        h2 = await bk.create_ledger(3, 3, 2, PW)
        assert victim not in h2.writer.ensemble
        await h.close()
        r = await bk.open_ledger(h.ledger_id, PW, recovery=False)
        assert len(await r.read(0, 99)) == 100
        # Usage back under the low-water mark: writable again.
        cluster.write_config(index, diskUsageThreshold=0.9999, diskUsageLwmThreshold=0.9998)
        cluster.signal_bookie(index, signal.SIGHUP)
        writable = await eventually(registered(False), deadline + 30 - time.monotonic(), 0.1)
        assert writable, "bookie never became writable"


async def test_deleted_ledgers_are_garbage_collected_and_compacted(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(
        3,
        flushInterval=200,
        gcWaitTime=300,
        logSizeLimit=256 * 1024,
        minorCompactionInterval=1,
        majorCompactionInterval=2,
    )
    async with BookKeeper(cluster.zk_hosts) as bk:
        doomed = await bk.create_ledger(3, 3, 3, PW)
        kept = await bk.create_ledger(3, 3, 3, PW)
        for i in range(40):
            await doomed.add_many([b"d" * 4000] * 20)
            await kept.add(b"kept-%d" % i)
        await doomed.close()
        await kept.close()
        await asyncio.sleep(1)
        ledgers = Path(cluster.bookies[0].directory) / "ledgers"
        before = sum(p.stat().st_size for p in ledgers.glob("*.log"))
        await bk.delete_ledger(doomed.ledger_id)

        def reclaimed() -> bool:
            return sum(p.stat().st_size for p in ledgers.glob("*.log")) <= before / 4

        assert await eventually(reclaimed, 30, 0.2), "space was never reclaimed"
        r = await bk.open_ledger(kept.ledger_id, PW, recovery=False)
        assert await r.read(0, 39) == [b"kept-%d" % i for i in range(40)]


async def test_bookie_dump_lists_every_stored_entry_with_equal_digests_across_replicas(
    make_cluster: MakeCluster, tmp_path: Path
) -> None:
    cluster = make_cluster(4)
    async with BookKeeper(cluster.zk_hosts) as bk:
        h = await bk.create_ledger(3, 2, 2, PW)
        await h.add_many([b"d%d" % i for i in range(30)])
        await h.close()
    ledger, ensemble = h.ledger_id, h.metadata.segments[0].ensemble
    out = tmp_path / "entries.jsonl"
    for b in cluster.bookies:
        cluster.stop_bookie(b.index)
        argv = ["--config", str(b.config_path), "--dump", str(out)]
        done = subprocess.run(
            [sys.executable, "-m", "bkref.impl.bookie", *argv],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    holders: dict[int, dict[str, str]] = {}
    for r in rows:
        assert r["ledger"] == ledger
        holders.setdefault(r["entry"], {})[r["bookie"]] = r["digest"]
    assert sorted(holders) == list(range(30))
    for entry, copies in holders.items():
        assert set(copies) == {ensemble[entry % 3], ensemble[(entry + 1) % 3]}
        assert len(set(copies.values())) == 1  # the replicas hold the same bytes
