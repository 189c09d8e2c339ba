"""The ZooKeeper launcher against Debian's real server: sessions, ephemerals, elections."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from bkref.impl.cluster.process import pid_alive, wait_until
from bkref.impl.cluster.zookeeper import ZooKeeperEnsemble, ZooKeeperError, server_mode

pytestmark = pytest.mark.zookeeper

# A separate process holds the session, so that SIGSTOP silences its heartbeats
# and the *server* expires the session, as it would for a hung bookie.
HOLDER = textwrap.dedent(
    """
    import sys, time
    from kazoo.client import KazooClient
    zk = KazooClient(hosts=sys.argv[1], timeout=1.0)
    zk.add_listener(lambda state: print("state", state, flush=True))
    zk.start(timeout=15)
    zk.create(sys.argv[2], b"holder", ephemeral=True, makepath=True)
    print("created", flush=True)
    while True:
        time.sleep(0.1)
    """
)


def _client(hosts: str) -> KazooClient:
    zk = KazooClient(hosts=hosts, timeout=5.0)
    zk.start(timeout=15)
    return zk


def test_standalone_server_serves_on_loopback(zookeeper: ZooKeeperEnsemble) -> None:
    [server] = zookeeper.servers.values()
    assert server.host == "127.0.0.1"
    assert server_mode(server) == "standalone"
    assert zookeeper.connection_string == f"127.0.0.1:{server.client_port}"


def test_ephemeral_znode_disappears_when_its_session_expires(zk_connect: str) -> None:
    path = "/available/bookie-1"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, zk_connect, path],
        stdout=subprocess.PIPE,
        text=True,
    )
    observer = _client(zk_connect)
    try:
        assert holder.stdout is not None
        lines: list[str] = []
        while "created" not in lines:
            line = holder.stdout.readline()
            assert line, f"holder exited before creating its znode: {lines}"
            lines.append(line.strip())
        assert observer.exists(path) is not None

        os.kill(holder.pid, signal.SIGSTOP)  # no more heartbeats from the holder
        stopped = time.monotonic()
        assert wait_until(lambda: observer.exists(path) is None, timeout=15.0), (
            "the server kept the ephemeral znode of a silent session"
        )
        # The session timeout is 1 s; the server must not drop it much earlier.
        assert time.monotonic() - stopped > 0.5

        os.kill(holder.pid, signal.SIGCONT)
        # The holder learns that its session is gone: kazoo reports LOST.
        deadline = time.monotonic() + 15.0
        while "state LOST" not in lines and time.monotonic() < deadline:
            line = holder.stdout.readline()
            if not line:
                break
            lines.append(line.strip())
        assert "state LOST" in lines, lines
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
        observer.stop()
        observer.close()


def test_ensemble_elects_a_new_leader_and_clients_continue(
    zookeeper_ensemble: ZooKeeperEnsemble,
) -> None:
    ensemble = zookeeper_ensemble
    modes = sorted(ensemble.mode(sid) or "down" for sid in ensemble.servers)
    assert modes == ["follower", "follower", "leader"]
    old_leader = ensemble.leader()
    assert old_leader is not None

    zk = _client(ensemble.connection_string)
    try:
        zk.create("/ledgers/L0001", b"v0", makepath=True)
        ensemble.kill(old_leader)
        assert wait_until(lambda: (ensemble.leader() or old_leader) != old_leader, timeout=30.0), (
            "no new leader among the two survivors"
        )
        new_leader = ensemble.leader()
        assert new_leader is not None
        assert new_leader != old_leader

        # The same client keeps working: its session moves to a live server.
        zk.retry(zk.set, "/ledgers/L0001", b"v1")
        data, stat = zk.retry(zk.get, "/ledgers/L0001")
        assert (data, stat.version) == (b"v1", 1)

        # The killed server rejoins as a follower.
        ensemble.start_server(old_leader)
        assert wait_until(lambda: ensemble.mode(old_leader) == "follower", timeout=30.0)
    finally:
        zk.stop()
        zk.close()


def test_stop_by_pid_and_reload_from_state_file(tmp_path: Path) -> None:
    ensemble = ZooKeeperEnsemble(directory=tmp_path / "zk", size=1)
    ensemble.start()
    try:
        # Another process (the CLI) finds the server through zookeeper.json.
        loaded = ZooKeeperEnsemble.load(tmp_path / "zk")
        assert loaded.connection_string == ensemble.connection_string
        [server] = loaded.servers.values()
        assert server.pid is not None
        assert server.pid == ensemble.servers[1].pid
        loaded.stop()
        assert server_mode(ensemble.servers[1]) is None
        assert ZooKeeperEnsemble.load(tmp_path / "zk").servers[1].pid is None
    finally:
        ensemble.stop()


def test_missing_zookeeper_jar_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BKREF_ZOOKEEPER_CLASSPATH", str(tmp_path / "nothing.jar"))
    ensemble = ZooKeeperEnsemble(directory=tmp_path / "zk")
    with pytest.raises(ZooKeeperError, match="make setup"):
        ensemble.start()
    ensemble.stop()


# An owner that starts a server dying with it, prints its PID, then waits to be killed.
OWNER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from bkref.impl.cluster.zookeeper import ZooKeeperEnsemble
    ensemble = ZooKeeperEnsemble(directory=Path(sys.argv[1]), size=1, die_with_owner=True)
    ensemble.start()
    print(ensemble.servers[1].pid, ensemble.connection_string, flush=True)
    while True:
        time.sleep(0.1)
    """
)


def test_a_server_that_dies_with_its_owner_leaves_no_orphan(tmp_path: Path) -> None:
    # SIGKILL gives the owner no chance to call stop(): the parent-death signal must.
    pid = 0
    with subprocess.Popen(
        [sys.executable, "-c", OWNER, str(tmp_path / "zk")], stdout=subprocess.PIPE, text=True
    ) as owner:
        try:
            assert owner.stdout is not None
            pid_text, hosts = owner.stdout.readline().split()
            pid = int(pid_text)
            assert "java" in Path(f"/proc/{pid}/cmdline").read_text()  # the server's PID
            zk = _client(hosts)  # and it serves
            zk.stop()
            zk.close()
            owner.kill()
            owner.wait(timeout=30)
            assert wait_until(lambda: not pid_alive(pid), timeout=30.0), f"{pid} outlived it"
        finally:
            owner.kill()
            if pid and pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
