"""The namespace backend against the real kernel, ZooKeeper and bookies.

One cluster (3 ZooKeeper servers, 3 bookies on lazyfs, the client) serves
the whole lifecycle: a ledger written from the client's namespace, a bookie
cut off by a real partition, a ZooKeeper server killed and restarted, a bookie
crashed with its unsynced writes lost, a wiped bookie refused by its cookie;
then teardown leaves no process, mount or namespace, and ``cleanup`` removes
what a runner that died without teardown left.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from pathlib import Path

import pytest

from bkref.impl.client.client import BookKeeper
from bkref.impl.cluster.process import pid_alive
from bkref.nemesis.backends.base import NodeRefusedError
from bkref.nemesis.backends.netns import LazyfsNamespaceBackend, cleanup
from bkref.nemesis.netns import list_namespaces, namespaces_supported
from bkref.nemesis.partition import isolate

SUPPORTED, WHY = namespaces_supported()
pytestmark = [
    pytest.mark.zookeeper,
    pytest.mark.skipif(
        not SUPPORTED or not os.path.exists("/dev/fuse"), reason=f"needs namespaces, FUSE: {WHY}"
    ),
]


def _orphan(directory: Path) -> None:
    """Make every registry and state file under ``directory`` look written by a dead runner."""
    for path in directory.rglob("*.json"):
        recorded = json.loads(path.read_text())
        if "owner" in recorded:
            recorded["owner"] = {"pid": 2**22 + 1, "start": 0}  # above pid_max: never runs
            path.write_text(json.dumps(recorded))


def _write_and_read(backend: LazyfsNamespaceBackend, entries: int) -> list[bytes]:
    async def go() -> list[bytes]:
        bk = BookKeeper(backend.zk_connect, seed=1)
        await bk.start()
        try:
            h = await bk.create_ledger(3, 2, 2, b"pw")
            for i in range(entries):
                await h.add_async(f"e{i}".encode())
            await h.close()
            r = await bk.open_ledger(h.ledger_id, b"pw", recovery=False)
            return [await r.read_entry(i) for i in range(entries)]
        finally:
            await bk.close()

    return backend.run_client(lambda: asyncio.run(go()))


# Seconds a connection attempt may take. A partition drops packets, so an attempt it
# cuts waits the whole time: short where it must fail, generous where it must succeed.
CUT, THROUGH = 2.0, 30.0


def _reachable(backend: LazyfsNamespaceBackend, bookie: str, timeout: float = THROUGH) -> bool:
    """Can the client open a TCP connection to the bookie's 127.0.0.1:<port>?"""

    async def go() -> bool:
        try:
            _, w = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", backend.ports[bookie]), timeout
            )
        except (OSError, TimeoutError):
            return False
        w.close()
        return True

    return backend.run_client(lambda: asyncio.run(go()))


def test_lifecycle_faults_and_clean_teardown(tmp_path: Path) -> None:
    backend = LazyfsNamespaceBackend(tmp_path / "c", 3, registry_dir=tmp_path / "reg" / "netns")
    namespaces = {n.netns for n in backend.net.nodes.values()} | {backend.net.bridge_ns}
    try:
        backend.setup()
        assert namespaces <= list_namespaces()
        assert backend.zk_connect.count(":2181") == 3
        assert _write_and_read(backend, 20) == [f"e{i}".encode() for i in range(20)]

        backend.partition(isolate(backend.network, "bookie-1"))
        assert not _reachable(backend, "bookie-1", CUT)
        assert _reachable(backend, "bookie-0")
        backend.heal()
        assert _reachable(backend, "bookie-1")

        backend.kill("zk2")
        backend.start("zk2")
        backend.pause("bookie-2")
        backend.resume("bookie-2")

        backend.lose_unsynced("bookie-0")
        backend.start("bookie-0")
        assert _write_and_read(backend, 5) == [f"e{i}".encode() for i in range(5)]

        backend.corrupt("bookie-2", "wipe", random.Random(1))
        with pytest.raises(NodeRefusedError, match="refused to start"):
            backend.start("bookie-2")
        with pytest.raises(NodeRefusedError, match="stays down"):
            backend.start("bookie-2")
        pids = [s.pid for s in backend.services.values() if s.pid]
        assert backend.ensemble is not None
        pids += [s.pid for s in backend.ensemble.servers.values() if s.pid]
        mounts = [m.mountpoint for m in backend.mounts.values()]
    finally:
        backend.teardown()
    assert not namespaces & list_namespaces()
    assert not [p for p in pids if pid_alive(p)]
    assert not [m for m in mounts if os.path.ismount(m)]
    assert not list((tmp_path / "reg").rglob("*.json"))


def test_cleanup_removes_what_a_dead_runner_left(tmp_path: Path) -> None:
    backend = LazyfsNamespaceBackend(tmp_path / "c", 3, registry_dir=tmp_path / "reg" / "netns")
    try:
        backend.setup()
    except BaseException:
        backend.teardown()
        raise
    pids = [s.pid for s in backend.services.values() if s.pid]
    mounts = [m.mountpoint for m in backend.mounts.values()]
    namespaces = {n.netns for n in backend.net.nodes.values()} | {backend.net.bridge_ns}
    assert backend._admin is not None  # the runner "dies": only its ZooKeeper client goes
    backend._admin.stop()
    backend._admin.close()

    assert cleanup(tmp_path / "reg" / "netns") == []  # its runner (this test) is alive
    _orphan(tmp_path)  # now the runner "died"
    removed = cleanup(tmp_path / "reg" / "netns")
    # The processes were stopped by PID, as from another process; reap our handles.
    assert backend.ensemble is not None
    children = [*backend._children.values(), *backend.ensemble._children.values()]
    children += [m.process for m in backend.mounts.values() if m.process is not None]
    for child in children:
        child.wait(timeout=10)
    assert any(r.startswith("namespace ") for r in removed)
    assert not namespaces & list_namespaces()
    assert not [p for p in pids if pid_alive(p)]
    assert not [m for m in mounts if os.path.ismount(m)]
    assert not list((tmp_path / "reg").rglob("*.json"))
