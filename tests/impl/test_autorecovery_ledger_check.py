"""The ledger check finds bad replicas that no bookie loss shows, on real ZooKeeper
and 5 real bookie processes each running an AutoRecovery node: the auditor's
periodic check and `bkref shell checkledgers`, against a replica whose digest fails
and one whose bookie can no longer read it; each bad replica then moves to a new
bookie, where every copy verifies.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from bkref.impl.bookie.config import BookieConfig
from bkref.impl.client.client import BookKeeper
from bkref.impl.core.frames import Status
from bkref.impl.storage.bookie_storage import BookieStorage
from bkref.impl.storage.entrylog import log_path
from bkref.impl.testing import (
    assert_fully_replicated,
    corrupt_replica,
    eventually,
    index_of,
    read_request,
    replica_moved,
    replicas,
    shell,
    write_closed_ledgers,
)
from tests.impl.autorecovery_helpers import FAST, PW
from tests.impl.conftest import MakeCluster, ZkView

pytestmark = [pytest.mark.zookeeper, pytest.mark.slow]


async def test_periodic_ledger_check_finds_a_corrupt_replica_and_it_moves_to_a_new_bookie(
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
    async with BookKeeper(cluster.zk_hosts) as bk:
        ledgers = await write_closed_ledgers(bk, 2, 30, PW)
        lid = next(iter(ledgers))
        md, bookie = await corrupt_replica(bk, lid, 7, PW)
        assert bookie not in await replicas(bk, lid, md, 7, PW)

        moved = replica_moved(bk, store, urm, lid=lid, bookie=bookie, entry=7, password=PW)
        assert await eventually(moved, 60, 0.5)
        await assert_fully_replicated(bk, ledgers, {b.bookie_id for b in cluster.bookies}, PW)


async def test_checkledgers_finds_a_gap_in_the_middle_only_when_it_reads_every_entry(
    make_cluster: MakeCluster,
    zk_view: ZkView,
) -> None:
    # No periodic check runs (its interval is a week); the shell's check is the only one.
    cluster = make_cluster(5, autorecovery=True, **FAST)
    store, urm = zk_view(cluster)
    async with BookKeeper(cluster.zk_hosts) as bk:
        ledgers = await write_closed_ledgers(bk, 1, 30, PW)
        lid = next(iter(ledgers))
        _, bookie = await corrupt_replica(bk, lid, 13, PW)

        # First and last entries only: the corrupt copy of entry 13 is not read.
        sampled = shell(cluster, "checkledgers", "--percentage", "0", "--json")
        assert sampled.returncode == 0, sampled.stderr
        assert json.loads(sampled.stdout) == {"marked": 0}
        assert not urm.tasks()

        full = shell(cluster, "checkledgers", "--json")
        assert full.returncode == 0, full.stderr
        assert json.loads(full.stdout) == {"marked": 1}

        moved = replica_moved(bk, store, urm, lid=lid, bookie=bookie, entry=13, password=PW)
        assert await eventually(moved, 60, 0.5)


async def test_checkledgers_marks_an_entry_its_bookie_can_no_longer_read_and_it_moves(
    make_cluster: MakeCluster,
    zk_view: ZkView,
) -> None:
    # A record whose length a disk fault flipped: the bookie indexes the entry but its
    # read fails (IO_ERROR), which the full check must count as a missing replica.
    cluster = make_cluster(5, autorecovery=True, **FAST)
    store, urm = zk_view(cluster)
    async with BookKeeper(cluster.zk_hosts) as bk:
        lid = next(iter(await write_closed_ledgers(bk, 1, 30, PW)))
    md = store.read_ledger(lid)[0]
    bookie = md.ensemble_for(13)[md.quorum.write_set(13)[0]]
    index = index_of(cluster, bookie)
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

    async with BookKeeper(cluster.zk_hosts) as bk:
        resp = await bk.request(bookie, read_request(lid, 13))
        assert resp.status is Status.IO_ERROR
        full = await asyncio.to_thread(shell, cluster, "checkledgers", "--json")
        assert full.returncode == 0, full.stderr
        assert json.loads(full.stdout) == {"marked": 1}

        moved = replica_moved(bk, store, urm, lid=lid, bookie=bookie, entry=13, password=PW)
        assert await eventually(moved, 60, 0.5)
