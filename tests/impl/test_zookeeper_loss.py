"""The client when ZooKeeper goes away: a clear, bounded error, never a hang.

kazoo queues a call made while it reconnects and never times it out, so without
a bound a client call would wait for as long as ZooKeeper stays down.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from kazoo.exceptions import KazooException

from bkref.impl.client.client import BookKeeper
from bkref.impl.client.errors import BKError, ZooKeeperError
from bkref.impl.cluster.zookeeper import ZooKeeperEnsemble
from bkref.impl.testing import eventually

pytestmark = [pytest.mark.zookeeper, pytest.mark.slow]


async def test_metadata_calls_fail_clearly_while_zookeeper_is_down_and_work_again_after(
    tmp_path: Path,
) -> None:
    ensemble = ZooKeeperEnsemble(directory=tmp_path / "zk", size=1)
    ensemble.start()
    try:
        bk = BookKeeper(ensemble.connection_string, session_timeout=4.0, zk_call_timeout=2.0)
        await bk.start()
        try:
            await asyncio.to_thread(bk.meta.ensure_layout)
            assert await bk.list_ledgers() == []
            ensemble.kill(1)
            for call, what in (
                (bk.list_ledgers(), "list ledgers"),
                (bk.open_ledger(7, b"pw"), "read ledger 7's metadata"),
                (bk.create_ledger(3, 2, 2, b"pw"), "list writable bookies"),
            ):
                with pytest.raises(ZooKeeperError) as caught:
                    await asyncio.wait_for(call, 30)  # bounded by zk_call_timeout
                message = str(caught.value)
                assert message.startswith(what), message
                assert ensemble.connection_string in message
                assert "retry once ZooKeeper answers" in message
                # The client's own error; kazoo's (if kazoo raised one) is its cause.
                assert isinstance(caught.value, BKError)
                assert not isinstance(caught.value, KazooException)
                cause = caught.value.__cause__
                assert cause is None or isinstance(cause, KazooException | TimeoutError)
            await asyncio.to_thread(ensemble.start_server, 1)
            # kazoo reconnects on its own, after a back-off; then the same client works.
            assert await eventually(lambda: bk.meta.zk.connected, 60, 0.2)
            assert await bk.list_ledgers() == []
        finally:
            await bk.close()
    finally:
        ensemble.stop()
