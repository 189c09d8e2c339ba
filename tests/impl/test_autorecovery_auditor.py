"""The auditor on real ZooKeeper and 5 real bookie processes, each running an
AutoRecovery node: re-election after a SIGKILL, AutoRecovery disabled and enabled
again, and lostBookieRecoveryDelay (deferred, triggered, two bookies lost), set and
read with `bkref shell`.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from bkref.impl.client.client import BookKeeper
from bkref.impl.cluster.local import LocalCluster
from bkref.impl.testing import (
    assert_fully_replicated,
    eventually,
    index_of,
    logged,
    lose_bookie,
    repaired_off,
    shell,
    write_closed_ledgers,
)
from tests.impl.autorecovery_helpers import FAST, PW
from tests.impl.conftest import MakeCluster, ZkView

pytestmark = [pytest.mark.zookeeper, pytest.mark.slow]


def _auditor(cluster: LocalCluster) -> tuple[str, int]:
    out = shell(cluster, "whoisauditor", "--json")
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    return got["auditor"], got["epoch"]


async def test_sigkill_of_the_auditor_elects_another_and_repair_continues(
    make_cluster: MakeCluster,
    zk_view: ZkView,
) -> None:
    cluster = make_cluster(5, autorecovery=True, **FAST)
    store, urm = zk_view(cluster)
    async with BookKeeper(cluster.zk_hosts) as bk:
        assert await eventually(lambda: urm.auditor() is not None, 30)
        auditor, epoch = await asyncio.to_thread(_auditor, cluster)
        ledgers: dict[int, list[bytes]] = {}
        while len(ledgers) < 6:  # ledgers on the auditor's own bookie
            more = await write_closed_ledgers(bk, 1, 50, PW)
            lid = next(iter(more))
            if auditor in store.read_ledger(lid)[0].bookies():
                ledgers.update(more)
        await asyncio.to_thread(cluster.kill_bookie, index_of(cluster, auditor))

        def new_auditor() -> bool:
            a = urm.auditor()
            return a is not None and a.node_id != auditor

        assert await eventually(new_auditor, 60, 0.5)
        successor, new_epoch = await asyncio.to_thread(_auditor, cluster)
        assert successor != auditor
        assert new_epoch > epoch

        assert await eventually(repaired_off(store, urm, auditor, ledgers), 120, 0.5)
        live = {b.bookie_id for b in cluster.bookies if b.bookie_id != auditor}
        await assert_fully_replicated(bk, ledgers, live, PW)


async def test_disabled_autorecovery_repairs_nothing_and_enabling_completes_it(
    make_cluster: MakeCluster,
    zk_view: ZkView,
) -> None:
    cluster = make_cluster(5, autorecovery=True, **FAST)
    store, urm = zk_view(cluster)
    async with BookKeeper(cluster.zk_hosts) as bk:
        ledgers = await write_closed_ledgers(bk, 8, 50, PW)
        out = shell(cluster, "autorecovery", "disable")
        assert out.returncode == 0, out.stderr
        assert "disabled" in out.stdout
        before = {lid: store.read_ledger(lid) for lid in ledgers}
        victim = next(iter(before.values()))[0].segments[0].ensemble[0]
        audited = logged(cluster, "auditor: AutoRecovery is disabled; not publishing")
        await asyncio.to_thread(lose_bookie, cluster, store, victim)
        # The auditor saw the loss and audited, and published nothing (not a fixed
        # sleep: on a loaded machine the audit may come later than any sleep).
        assert await eventually(audited, 60, 0.2)
        await asyncio.sleep(2)  # and the workers had rounds to act on a task, if any
        assert {lid: store.read_ledger(lid) for lid in ledgers} == before
        assert urm.tasks() == []
        out = shell(cluster, "autorecovery", "enable")
        assert out.returncode == 0, out.stderr

        assert await eventually(repaired_off(store, urm, victim, ledgers), 120, 0.5)
        live = {b.bookie_id for b in cluster.bookies if b.bookie_id != victim}
        await assert_fully_replicated(bk, ledgers, live, PW)


async def test_lost_bookie_recovery_delay_defers_the_audit_unless_triggered_or_two_are_lost(
    make_cluster: MakeCluster,
    zk_view: ZkView,
) -> None:
    cluster = make_cluster(5, autorecovery=True, **FAST)
    store, urm = zk_view(cluster)
    ids = [b.bookie_id for b in cluster.bookies]
    async with BookKeeper(cluster.zk_hosts) as bk:
        ledgers = await write_closed_ledgers(bk, 12, 20, PW)
        out = shell(cluster, "lostbookierecoverydelay", "set", "600")
        assert out.returncode == 0, out.stderr
        assert "600 s" in shell(cluster, "lostbookierecoverydelay", "get").stdout
        assert await eventually(lambda: urm.auditor() is not None, 30)
        auditor = urm.auditor()
        assert auditor is not None
        first, second = [b for b in ids if b != auditor.node_id][:2]
        deferred = logged(cluster, f"auditor: bookies lost: ['{first}']")
        await asyncio.to_thread(lose_bookie, cluster, store, first)
        # The auditor saw the loss and deferred its audit (not a fixed sleep: on a
        # loaded machine the auditor may see it later than any sleep).
        assert await eventually(deferred, 60, 0.2)
        await asyncio.sleep(2)  # far short of the 600 s delay
        assert urm.tasks() == []
        # triggeraudit audits now, whatever the delay.
        assert shell(cluster, "triggeraudit").returncode == 0
        # Nothing else can start the repair (the delay is 600 s). Not "every ledger marked
        # at once": workers may complete one before the audit has marked the last.
        on_first = {lid for lid in ledgers if first in store.read_ledger(lid)[0].bookies()}
        assert on_first
        assert await eventually(repaired_off(store, urm, first, on_first), 60, 0.5)
        # Two bookies lost (the first one is still gone): audited at once.
        await asyncio.to_thread(lose_bookie, cluster, store, second)
        on_second = {lid for lid in ledgers if second in store.read_ledger(lid)[0].bookies()}

        assert await eventually(repaired_off(store, urm, second, on_second), 60, 0.5)
        await assert_fully_replicated(bk, ledgers, set(ids) - {first, second}, PW)
