"""BKREF_LOOP: which event loop bkref's processes run (bkref/impl/eventloop.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bkref.impl import eventloop
from bkref.impl.client.client import BookKeeper
from tests.impl.conftest import MakeCluster


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_the_default_loop_is_asyncio_s(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(eventloop.ENV, raising=False)
    assert eventloop.run(_loop_module()).startswith("asyncio")


def test_bkref_loop_uvloop_runs_on_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(eventloop.ENV, "uvloop")
    assert eventloop.run(_loop_module()).startswith("uvloop")


def test_a_loop_that_does_not_exist_is_named_in_the_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(eventloop.ENV, "tokio")
    coro = _loop_module()
    with pytest.raises(eventloop.EventLoopError, match="'tokio' names no event loop"):
        eventloop.run(coro)
    coro.close()


@pytest.mark.zookeeper
async def test_bookies_on_uvloop_take_adds_and_serve_reads(
    make_cluster: MakeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The bookie processes inherit BKREF_LOOP: uvloop's extension is what they load.
    monkeypatch.setenv(eventloop.ENV, "uvloop")
    cluster = make_cluster(3)
    for b in cluster.bookies:
        assert b.pid is not None
        assert "uvloop/loop.cpython" in Path(f"/proc/{b.pid}/maps").read_text()
    async with BookKeeper(cluster.zk_hosts) as bk:
        h = await bk.create_ledger(3, 3, 2, b"pw")
        entries = [b"e%d" % i for i in range(200)]
        for e in entries:
            await h.add(e)
        await h.close()
        r = await bk.open_ledger(h.ledger_id, b"pw", recovery=False)
        assert await r.read(0, 199) == entries
