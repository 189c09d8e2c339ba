"""Traces of real runs (bookie processes, clients, a session ZooKeeper), recorded once
per module and read by the trace checker's tests."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from bkref.impl.client.client import BookKeeper
from bkref.impl.client.errors import BKError, FencedError
from bkref.impl.cluster.local import LocalCluster
from bkref.impl.cluster.pytest_plugin import fresh_chroot
from bkref.impl.cluster.zookeeper import ZooKeeperEnsemble
from bkref.impl.testing import Clusters, eventually, repaired_off, zookeeper_view
from bkref.impl.trace import Tracer


@dataclass(frozen=True)
class Recorded:
    traces: Path  # the run's trace directory
    recovered: int  # written one add at a time, recovered by two racing clients, closed
    planted: int  # recovered by a client with recovery-reads-without-fence
    fenced: int  # recovered, then its writer's next add is refused (fenced)
    restarted: int  # a bookie of its ensemble killed and restarted between adds


async def _record(cluster: LocalCluster, traces: Path) -> Recorded:
    zk, ids = cluster.zk_hosts, [b.bookie_id for b in cluster.bookies]
    with (
        Tracer(traces, "writer") as tw,
        Tracer(traces, "recoverer") as tr,
        Tracer(traces, "racer") as tr2,
        Tracer(traces, "planted") as tp,
    ):
        async with (
            BookKeeper(zk, tracer=tw) as w,
            BookKeeper(zk, tracer=tr) as r,
            BookKeeper(zk, tracer=tr2) as r2,
            BookKeeper(zk, tracer=tp, plants=frozenset({"recovery-reads-without-fence"})) as bad,
        ):
            recovered = await _race(w, r, r2, ids, traces)
            g = await w.create_ledger(3, 2, 2, b"pw", bookies=ids[:3])
            await g.add_many([b"f%d" % i for i in range(5)])
            await bad.open_ledger(g.ledger_id, b"pw")
            f = await w.create_ledger(3, 2, 2, b"pw", bookies=ids[:3])
            for i in range(3):
                await f.add(b"g%d" % i)
            await r.open_ledger(f.ledger_id, b"pw")
            try:
                await f.add(b"late")
            except FencedError:
                pass
            else:
                raise AssertionError("a fenced ledger took the old writer's add")
            k = await w.create_ledger(3, 2, 2, b"pw", bookies=ids[:3])
            for i in range(6):
                await k.add(b"k%d" % i)
            cluster.kill_bookie(0)  # a crash: it comes back with what its journal kept
            cluster.start_bookie(0)
            for i in range(6):
                await k.add(b"l%d" % i)
            await k.close()
    return Recorded(traces, recovered, g.ledger_id, f.ledger_id, k.ledger_id)


async def _race(w: BookKeeper, r: BookKeeper, r2: BookKeeper, ids: list[str], traces: Path) -> int:
    """A ledger written one add at a time, recovered by two clients at once, then closed
    by its writer. Recorded again until the race is close enough that one recovery's
    close CAS loses to the other's (the close on a stale version the tests need)."""
    for _ in range(10):
        h = await w.create_ledger(3, 2, 2, b"pw", bookies=ids[:3])
        for i in range(10):  # one at a time: each add piggybacks the previous one's LAC
            await h.add(b"e%d" % i)
        await asyncio.gather(r.open_ledger(h.ledger_id, b"pw"), r2.open_ledger(h.ledger_id, b"pw"))
        try:
            await h.close()  # the recoveries closed it at its LAC: the writer's close agrees
        except BKError as e:
            raise AssertionError(f"the writer could not close at its own LAC: {e}") from e
        if any(
            x.get("outcome") == "lost" and x.get("ledger") == h.ledger_id
            for f in ("recoverer", "racer")
            for x in map(json.loads, (traces / f"trace-{f}.jsonl").read_text().splitlines())
        ):
            return h.ledger_id
    raise AssertionError("in 10 tries, no recovery's close lost the race")


@pytest.fixture(scope="module")
def recorded(zookeeper: ZooKeeperEnsemble, tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    base = tmp_path_factory.mktemp("recorded")
    traces = base / "traces"
    with Clusters(base, fresh_chroot(zookeeper, "bkref-trace")) as make:
        cluster = make(4, trace_dir=traces)
        return asyncio.run(_record(cluster, traces))


@dataclass(frozen=True)
class Repaired:
    traces: Path
    closed: int  # closed on bookies 0-2; bookie 0 killed; AutoRecovery copied its fragment
    open: int  # left open on bookies 0-2; a worker had it recovered, then repaired it
    lost: str  # bookie 0, restarted after the repairs


async def _record_repairs(cluster: LocalCluster, traces: Path) -> Repaired:
    ids = [b.bookie_id for b in cluster.bookies]
    with Tracer(traces, "writer") as tw:
        async with BookKeeper(cluster.zk_hosts, tracer=tw) as w:
            c = await w.create_ledger(3, 2, 2, b"pw", bookies=ids[:3])
            await c.add_many([b"c%d" % i for i in range(12)])
            await c.close()
            o = await w.create_ledger(3, 2, 2, b"pw", bookies=ids[:3])
            await o.add_many([b"o%d" % i for i in range(7)])
            cluster.kill_bookie(0)
            with zookeeper_view(cluster.zk_hosts) as (store, urm):
                done = repaired_off(store, urm, ids[0], [c.ledger_id, o.ledger_id])
                assert await eventually(done, 120.0, 0.5), "AutoRecovery did not repair"
            cluster.start_bookie(0)  # it comes back with both ledgers' old replicas
    return Repaired(traces, c.ledger_id, o.ledger_id, ids[0])


def _repairs(zookeeper: ZooKeeperEnsemble, base: Path) -> Repaired:
    traces = base / "traces"
    with Clusters(base, fresh_chroot(zookeeper, "bkref-trace")) as make:
        cluster = make(
            5,
            trace_dir=traces,
            autorecovery=True,
            openLedgerRereplicationGracePeriod=1000,
            zkTimeout=4000,
            rwRereplicateBackoffMs=500,
        )
        return asyncio.run(_record_repairs(cluster, traces))


@pytest.fixture(scope="module")
def repaired(zookeeper: ZooKeeperEnsemble, tmp_path_factory: pytest.TempPathFactory) -> Repaired:
    """A closed and an open ledger repaired by AutoRecovery after their bookie's crash."""
    return _repairs(zookeeper, tmp_path_factory.mktemp("repaired"))
