"""AutoRecovery: re-replication throughput after a bookie is lost, beside raw baselines.

Five bookies, each running AutoRecovery (auditor election and a worker that copies to
its own bookie). Ledgers of 64 KiB entries (E=3, Wq=2, Aq=2) are written and
closed, the bookie holding the most data is SIGKILLed, and the clock runs until no
ledger names it and the task list is empty. Reported apart: the time until the
auditor published the tasks (mostly the ZooKeeper session timeout that makes the
loss visible) and the copy phase from then on, whose bytes/s is the re-replication
throughput. Baselines from the same run: sequential file writes with one fdatasync
at the end (the disk) and 64 KiB requests over raw asyncio loopback (the network
stack as Python sees it).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections import Counter
from pathlib import Path

from bkref.impl.client.client import BookKeeper
from bkref.impl.client.handles import WriteHandle
from bkref.impl.cluster.local import LocalCluster
from bkref.impl.cluster.process import wait_until
from bkref.impl.meta.store import ZkMetadataStore, connect
from bkref.impl.meta.underreplication import UnderreplicationManager
from tests.bench.bench_impl import loopback_throughput

TITLE = "AutoRecovery: re-replication throughput after losing a bookie"

ENTRY = 64 * 1024
MB = 1024 * 1024


def _disk_write_rate(directory: Path, total: int) -> float:
    """Bytes per second of sequential 1 MiB writes plus one fdatasync."""
    path = directory / "disk-baseline"
    block = os.urandom(MB)
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for _ in range(total // MB):
        os.write(fd, block)
    os.fdatasync(fd)
    os.close(fd)
    secs = time.perf_counter() - t0
    path.unlink()
    return total / secs


async def _fill(h: WriteHandle, payload: bytes, n: int, inflight: int = 32) -> None:
    sem = asyncio.Semaphore(inflight)

    async def one() -> None:
        async with sem:
            await h.add(payload)

    await asyncio.gather(*(one() for _ in range(n)))


async def _write(bk: BookKeeper, total: int, per_ledger: int) -> tuple[list[int], float]:
    payload = os.urandom(ENTRY)
    ledgers: list[int] = []
    t0 = time.perf_counter()
    entries = total // ENTRY
    while entries > 0:
        n = min(per_ledger, entries)
        h = await bk.create_ledger(3, 2, 2, b"bench")
        await _fill(h, payload, n)
        await h.close()
        ledgers.append(h.ledger_id)
        entries -= n
    return ledgers, total / (time.perf_counter() - t0)


def run(quick: bool) -> str:
    total = 16 * MB if quick else 1024 * MB
    per_ledger = 64 if quick else 512
    with tempfile.TemporaryDirectory(prefix="bkref-bench-ar-") as d:
        cluster = LocalCluster(
            Path(d) / "cluster",
            {"zkTimeout": 4000, "rwRereplicateBackoffMs": 500},
            autorecovery=True,
        )
        try:
            cluster.up(5)
            zk = connect(cluster.zk_hosts)
            store, urm = ZkMetadataStore(zk), UnderreplicationManager(zk)

            async def write() -> tuple[list[int], float]:
                async with BookKeeper(cluster.zk_hosts) as bk:
                    return await _write(bk, total, per_ledger)

            ledgers, write_rate = asyncio.run(write())
            held: Counter[str] = Counter()
            uses: Counter[str] = Counter()
            for lid in ledgers:
                md, _ = store.read_ledger(lid)
                uses.update(md.bookies())
                q = md.quorum
                for e in range(md.last_entry + 1):
                    for idx in q.write_set(e):
                        held[md.ensemble_for(e)[idx]] += ENTRY
            victim, victim_bytes = held.most_common(1)[0]
            on_victim = uses[victim]
            index = next(b.index for b in cluster.bookies if b.bookie_id == victim)
            t0 = time.perf_counter()
            cluster.kill_bookie(index)
            assert wait_until(lambda: bool(urm.tasks()), 120, 0.1), "no task was published"
            t_marked = time.perf_counter()

            def done() -> bool:
                return not urm.tasks() and all(
                    victim not in store.read_ledger(lid)[0].bookies() for lid in ledgers
                )

            assert wait_until(done, 3600, 0.25), "re-replication did not finish"
            t_done = time.perf_counter()
            zk.stop()
            zk.close()
        finally:
            cluster.down()
        disk = _disk_write_rate(Path(d), min(total, 256 * MB))
    loop = loopback_throughput(200 if quick else 4000, 32, ENTRY)
    copy_s = t_done - t_marked
    rerep = victim_bytes / copy_s
    rows = [
        "| what | value |",
        "|---|---:|",
        f"| ledger data written (64 KiB entries, E=3 Wq=2 Aq=2) | {total / MB:,.0f} MiB |",
        f"| write throughput, 32 adds in flight per ledger | {write_rate / MB:,.1f} MB/s |",
        f"| data on the killed bookie | {victim_bytes / MB:,.0f} MiB in {on_victim} of "
        f"{len(ledgers)} ledgers |",
        f"| SIGKILL -> tasks published (session expiry + audit) | {t_marked - t0:.1f} s |",
        f"| tasks published -> fully re-replicated | {copy_s:.1f} s |",
        f"| **re-replication throughput** | **{rerep / MB:,.1f} MB/s** |",
        f"| baseline: sequential write + fdatasync | {disk / MB:,.0f} MB/s |",
        f"| baseline: asyncio loopback, 64 KiB requests, 32 in flight | {loop / MB:,.0f} MB/s |",
    ]
    return "\n".join(rows) + (
        f"\n\nRe-replication runs at {rerep / disk:.1%} of the raw disk write rate and "
        f"{rerep / loop:.1%} of raw loopback. Each copied entry is read from a surviving "
        "replica, its digest verified, and written with a recovery add that the target "
        "journals and fsyncs before acknowledging, by a worker whose bookie is the target; "
        "only the two bookies outside a ledger's ensemble can take its fragments, and they "
        "share the machine's cores with the other bookies and ZooKeeper.\n"
    )
