"""What the AutoRecovery tests on real processes share: settings, a worker, a lost ledger."""

from __future__ import annotations

import asyncio
from typing import Any

from bkref.impl.autorecovery.worker import ReplicationWorker, WorkerConfig
from bkref.impl.client.client import BookKeeper
from bkref.impl.cluster.local import LocalCluster
from bkref.impl.core.repair import Reason
from bkref.impl.meta.store import ZkMetadataStore
from bkref.impl.meta.underreplication import UnderreplicationManager
from bkref.impl.testing import Ledgers, ledger_on, lose_bookie

PW = b"autorecovery"
# Short ZooKeeper sessions so that a killed bookie's registration lapses in seconds.
FAST = {"zkTimeout": 4000, "rwRereplicateBackoffMs": 500}


def worker(bk: BookKeeper, local: str | None, **config: Any) -> ReplicationWorker:
    """A replication worker on ``bk``'s session, beside bookie ``local`` (None: dedicated)."""
    urm = UnderreplicationManager(bk.meta.zk, bk.root)
    return ReplicationWorker(bk, urm, f"test-worker-{local}", local, WorkerConfig(**config))


async def lost_ledger(
    bk: BookKeeper, cluster: LocalCluster, store: ZkMetadataStore, urm: UnderreplicationManager
) -> tuple[Ledgers, int]:
    """A closed ledger of 50 entries on bookie 0 and not on bookie 3; bookie 0 is then
    lost and the ledger marked under-replicated."""
    ids = [b.bookie_id for b in cluster.bookies]
    urm.ensure_layout()
    ledger = await ledger_on(bk, ids[0], {ids[3]}, 50, PW)
    lid = next(iter(ledger))
    await asyncio.to_thread(lose_bookie, cluster, store, ids[0])
    urm.mark(lid, {ids[0]: Reason.LOST}, 1)
    return ledger, lid
