"""The client against a real cluster: real ZooKeeper, real bookie processes, real TCP and
files. Writes and reads back, ensemble changes when a bookie is killed or paused,
fencing and recovery after a writer dies, and `bkref cluster up|status|down`.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import random
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bkref.impl.client.client import BookKeeper
from bkref.impl.client.errors import BKError, FencedError, NoSuchEntryError
from bkref.impl.cluster.process import pid_alive
from bkref.impl.core.frames import Status
from bkref.impl.testing import clients, index_of
from tests.impl.conftest import MakeCluster

pytestmark = pytest.mark.zookeeper

PW = b"integration"


@pytest.mark.slow
async def test_10000_entries_e3_wq2_aq2_on_4_bookies_read_back_close_reopen_lac(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(4)
    async with BookKeeper(cluster.zk_hosts) as bk:
        h = await bk.create_ledger(3, 2, 2, PW)
        payload = [b"entry %d " % i + bytes(random.randbytes(i % 50)) for i in range(10_000)]
        for start in range(0, 10_000, 1000):
            ids = await h.add_many(payload[start : start + 1000])
            assert ids == list(range(start, start + 1000))
        assert h.last_entry == 9_999
        # Bookies know the LAC piggybacked on the adds: it lags by the adds in flight.
        lac = await h.read_lac()
        if len(h.writer.metadata.segments) == 1:
            assert lac == 8_999
        else:  # an add outlived its 5 s timeout (a loaded machine): an ensemble change,
            # and a new segment's start proves the entries before it
            assert 8_999 <= lac < 9_999
        assert await h.read(0, 9_999) == payload
        await h.close()
        r = await bk.open_ledger(h.ledger_id, PW, recovery=False)
        assert r.metadata.is_closed
        assert r.last_entry == 9_999
        assert await r.read_lac() == 9_999
        assert await r.read(0, 9_999) == payload
        r2 = await bk.open_ledger(h.ledger_id, PW)  # recovery open of a closed ledger
        assert r2.last_entry == 9_999


async def test_sigkill_of_a_bookie_during_writes_changes_the_ensemble_and_loses_nothing(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(4)
    async with BookKeeper(cluster.zk_hosts) as bk:
        h = await bk.create_ledger(3, 2, 2, PW)
        victim = h.writer.ensemble[1]
        index = index_of(cluster, victim)
        acked: list[int] = []
        sem = asyncio.Semaphore(32)

        async def one(i: int) -> None:
            async with sem:
                acked.append(await h.add(b"v%d" % i))
                if len(acked) == 500:
                    await asyncio.to_thread(cluster.kill_bookie, index)

        await asyncio.gather(*(one(i) for i in range(3000)))
        assert sorted(acked) == list(range(3000))
        segments = h.writer.metadata.segments
        # At least the victim's replacement (on a loaded machine an add to a live
        # bookie may also outlive its 5 s timeout and change the ensemble again).
        assert len(segments) >= 2
        assert victim in segments[0].ensemble
        assert victim not in segments[-1].ensemble
        await h.close()
        r = await bk.open_ledger(h.ledger_id, PW, recovery=False)
        assert await r.read(0, 2999) == [b"v%d" % i for i in range(3000)]


async def test_sigkill_of_the_writer_then_recovery_keeps_every_acknowledged_entry(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(3)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.impl.writer_proc", cluster.zk_hosts, PW.decode(), "5000"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[2],
    )
    assert proc.stdout is not None
    acked: list[int] = []
    ledger = -1
    try:
        for line in proc.stdout:
            kind, value = line.split()
            if kind == "created":
                ledger = int(value)
            else:
                acked.append(int(value))
            if len(acked) >= 1500:
                break
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    assert ledger >= 0
    assert acked

    async with BookKeeper(cluster.zk_hosts) as bk:
        r = await bk.open_ledger(ledger, PW)  # fences, recovers, closes
        assert r.metadata.is_closed
        assert r.last_entry >= max(acked)
        data = await r.read(0, r.last_entry)
        assert data == [b"entry-%d" % i for i in range(r.last_entry + 1)]


async def test_a_paused_bookie_is_replaced_after_the_add_timeout(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(4)
    async with BookKeeper(cluster.zk_hosts, add_entry_timeout=1.0) as bk:
        h = await bk.create_ledger(3, 3, 3, PW)
        await h.add_many([b"p%d" % i for i in range(10)])
        victim = h.writer.ensemble[1]
        index = index_of(cluster, victim)
        cluster.signal_bookie(index, signal.SIGSTOP)  # alive, connected, silent
        try:
            ids = await asyncio.wait_for(h.add_many([b"p%d" % i for i in range(10, 20)]), 30)
        finally:
            cluster.signal_bookie(index, signal.SIGCONT)
        assert ids == list(range(10, 20))
        assert victim not in h.writer.ensemble
        await h.close()


async def test_closing_the_client_fails_its_adds_in_flight_and_replaces_no_bookie(
    make_cluster: MakeCluster,
) -> None:
    # Adds wait on two paused bookies when the client closes, and its close breaks their
    # connections. Until 2026-12-01 the writer took that for failed bookies, and the
    # replacement it started asked ZooKeeper through the closed client: a task's exception
    # nobody retrieved ("BookKeeper client not started"), and adds left waiting forever.
    cluster = make_cluster(3)
    unretrieved: list[dict[str, object]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, c: unretrieved.append(c))
    bk = await BookKeeper(cluster.zk_hosts).start()
    h = await bk.create_ledger(3, 3, 2, PW)
    await h.add(b"before")
    ensemble = h.writer.ensemble
    paused = [index_of(cluster, b) for b in ensemble[:2]]
    for i in paused:
        cluster.signal_bookie(i, signal.SIGSTOP)
    try:
        adds = [asyncio.ensure_future(h.add(b"in flight %d" % i)) for i in range(20)]
        await asyncio.sleep(0.5)  # sent, one ack each of the two they need
        await bk.close()
        done = await asyncio.wait_for(asyncio.gather(*adds, return_exceptions=True), 30)
    finally:
        for i in paused:
            cluster.signal_bookie(i, signal.SIGCONT)
    assert all(isinstance(d, BKError) for d in done), done
    assert h.writer.ensemble == ensemble  # no bookie replaced
    del adds, done
    gc.collect()  # a task's unretrieved exception is reported as the task is collected
    await asyncio.sleep(0)
    assert unretrieved == []


async def test_an_old_writer_is_fenced_by_a_recovery_open(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(3)
    async with clients(cluster.zk_hosts, 2) as (writer_bk, reader_bk):
        h = await writer_bk.create_ledger(3, 3, 2, PW)
        await h.add_many([b"a", b"b", b"c"])
        r = await reader_bk.open_ledger(h.ledger_id, PW)
        assert r.last_entry == 2
        with pytest.raises(FencedError, match="fenced"):
            await h.add(b"late")
        with pytest.raises(FencedError):
            await h.close()


async def test_a_tailing_reader_takes_the_close_from_its_metadata_watch(
    make_cluster: MakeCluster,
) -> None:
    # BookKeeper's ReadOnlyLedgerHandle listens to its metadata: the close sets its LAC to
    # the last entry. bkref's handle does the same through a ZooKeeper watch.
    cluster = make_cluster(3)
    async with BookKeeper(cluster.zk_hosts) as bk:
        h = await bk.create_ledger(3, 3, 2, PW)
        await h.add_many([b"a", b"b", b"c"])
        r = await bk.open_ledger(h.ledger_id, PW, recovery=False)

        def closed() -> bool:
            return r.metadata.is_closed

        assert not closed()
        assert r.last_entry <= 2  # what the bookies said, lagging the adds in flight
        await h.close()
        for _ in range(600):  # the watch fires on kazoo's thread, then on this loop
            if closed():
                break
            await asyncio.sleep(0.05)
        assert closed()
        assert (r.lac, r.last_entry) == (2, 2)
        assert await r.read(0, 2) == [b"a", b"b", b"c"]


async def test_recovery_replaces_a_dead_bookie_when_write_back_needs_it(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(4)
    async with clients(cluster.zk_hosts, 2) as (writer_bk, reader_bk):
        h = await writer_bk.create_ledger(3, 3, 3, PW)
        await h.add_many([b"w%d" % i for i in range(100)])
        victim = h.writer.ensemble[2]
        await asyncio.to_thread(cluster.kill_bookie, index_of(cluster, victim))
        r = await reader_bk.open_ledger(h.ledger_id, PW)  # Wq = Aq: needs a new bookie
        assert r.last_entry == 99
        assert victim not in r.metadata.last_segment.ensemble
        assert await r.read(0, 99) == [b"w%d" % i for i in range(100)]


@pytest.mark.slow
async def test_a_fenced_ledger_stays_fenced_across_bookie_restarts(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(3, zkTimeout=3000, flushInterval=3_600_000)
    async with clients(cluster.zk_hosts, 2) as (writer_bk, reader_bk):
        h = await writer_bk.create_ledger(3, 3, 2, PW)
        await h.add_many([b"a", b"b"])
        await reader_bk.open_ledger(h.ledger_id, PW)  # fences every bookie
        for b in cluster.bookies:  # the fence is only in the journal: replay restores it
            await asyncio.to_thread(cluster.kill_bookie, b.index)
            await asyncio.to_thread(cluster.start_bookie, b.index)
        with pytest.raises(FencedError):
            await h.add(b"after restart")


async def test_read_tells_an_absent_entry_from_unreachable_replicas(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(3)
    async with BookKeeper(cluster.zk_hosts) as bk:
        h = await bk.create_ledger(3, 2, 2, PW)
        await h.add_many([b"e%d" % i for i in range(10)])
        with pytest.raises(NoSuchEntryError, match="every replica"):
            await h.read_entry(15)  # asked past the end: both replicas say "no such entry"
        ws = h.writer.metadata.quorum.write_set(3)
        for idx in ws:
            bookie = h.writer.ensemble[idx]
            await asyncio.to_thread(cluster.kill_bookie, index_of(cluster, bookie))
        with pytest.raises(BKError) as err:
            await h.read_entry(3)
        assert not isinstance(err.value, NoSuchEntryError)
        assert err.value.status is Status.IO_ERROR


async def test_a_ledger_placed_on_given_bookies_is_there_and_a_bad_placement_is_refused(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(4)
    ids = [b.bookie_id for b in cluster.bookies]
    async with BookKeeper(cluster.zk_hosts) as bk:
        h = await bk.create_ledger(3, 2, 2, PW, bookies=[ids[3], ids[0], ids[2]])
        md, _ = await asyncio.to_thread(bk.meta.read_ledger, h.ledger_id)
        assert md.segments[0].ensemble == (ids[3], ids[0], ids[2])
        await h.add(b"placed")
        with pytest.raises(BKError, match=re.escape("not writable: ['127.0.0.1:1']")):
            await bk.create_ledger(3, 2, 2, PW, bookies=[ids[0], ids[1], "127.0.0.1:1"])
        with pytest.raises(BKError, match="need 3 distinct writable bookies"):
            await bk.create_ledger(3, 2, 2, PW, bookies=[ids[0], ids[0], ids[1]])


def test_cluster_cli_up_status_down(tmp_path: Path) -> None:
    d = tmp_path / "c"
    bkref = [sys.executable, "-m", "bkref.impl.cli.main"]
    up = subprocess.run(
        [*bkref, "cluster", "up", "--bookies", "2", "--dir", str(d)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    try:
        assert up.returncode == 0, up.stderr
        zk = up.stdout.strip()
        st = subprocess.run(
            [*bkref, "cluster", "status", "--dir", str(d), "--json"],
            capture_output=True,
            text=True,
            check=True,
        )
        status = json.loads(st.stdout)
        roles = sorted(p["role"] for p in status["processes"])
        assert roles == ["bookie", "bookie", "zookeeper"]
        assert all(p["alive"] for p in status["processes"])
        ls = subprocess.run(
            [*bkref, "shell", "listbookies", "--zk", zk, "--json"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert len(json.loads(ls.stdout)) == 2
    finally:
        down = subprocess.run(
            [*bkref, "cluster", "down", "--dir", str(d)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert down.returncode == 0, down.stderr
    assert not any(pid_alive(p["pid"]) for p in status["processes"])
