"""ZooKeeper metadata (real server), registration across session expiry, cookies, config, shell."""

from __future__ import annotations

import json
import re
import time
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss, SessionExpiredError

from bkref.impl.bookie.config import BookieConfig, ConfigError
from bkref.impl.bookie.cookie import CookieMismatchError, verify_or_create
from bkref.impl.bookie.registration import Registration
from bkref.impl.cli.shell import main as shell_main
from bkref.impl.core.digest import DigestType
from bkref.impl.core.metadata import LedgerMetadata, LedgerState, Segment
from bkref.impl.core.repair import Reason, Task
from bkref.impl.meta.layout import ledger_path
from bkref.impl.meta.store import MetadataConflictError, ZkMetadataStore, connect
from bkref.impl.meta.underreplication import UnderreplicationManager
from bkref.impl.meta.znodes import ensure_paths
from tests.impl.conftest import MakeCluster

MD = LedgerMetadata(3, 2, 2, (Segment(0, ("a:1", "b:1", "c:1")),), DigestType.CRC32C, "h")


def test_ledger_paths_follow_the_hierarchical_layout() -> None:
    assert ledger_path("/ledgers", 1234567890) == "/ledgers/12/3456/L7890"
    assert ledger_path("/ledgers", 1) == "/ledgers/00/0000/L0001"


@pytest.fixture
def store(zk_connect: str) -> Any:
    zk = connect(zk_connect)
    s = ZkMetadataStore(zk)
    s.ensure_layout()
    yield s
    zk.stop()
    zk.close()


@pytest.mark.zookeeper
def test_every_metadata_update_is_a_versioned_cas(store: ZkMetadataStore) -> None:
    lid, v0 = store.create_ledger(MD)
    assert store.read_ledger(lid) == (MD, v0)
    closed = MD.closed(10, 100)
    v1 = store.write_ledger(lid, closed, v0)
    with pytest.raises(MetadataConflictError) as e:
        store.write_ledger(lid, MD.with_segment(5, ("a:1", "b:1", "d:1")), v0)
    assert e.value.current == closed
    assert e.value.version == v1
    assert store.list_ledgers() == [lid]
    assert closed.state is LedgerState.CLOSED


class _LossyZk:
    """A kazoo double whose first ``set`` lands and then reports a lost connection."""

    def __init__(self, real: KazooClient) -> None:
        self.real = real
        self.lost = False

    def set(self, path: str, data: bytes, version: int) -> Any:
        stat = self.real.set(path, data, version=version)
        if not self.lost:
            self.lost = True
            raise ConnectionLoss("injected after the write landed")
        return stat

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


@pytest.mark.zookeeper
def test_a_cas_whose_reply_was_lost_is_resolved_by_reading_back(store: ZkMetadataStore) -> None:
    lid, v0 = store.create_ledger(MD)
    lossy = ZkMetadataStore(_LossyZk(store.zk), store.root)
    v1 = lossy.cas_ledger(lid, MD.closed(3, 30), v0)
    assert store.read_ledger(lid) == (MD.closed(3, 30), v1)
    # It says when it read the outcome back (the metadata may be another's identical
    # write), and when it did not.
    v2, read_back = ZkMetadataStore(_LossyZk(store.zk), store.root).cas_ledger_resolved(
        lid, MD.closed(4, 40), v1
    )
    assert (v2, read_back) == (v1 + 1, True)
    assert store.cas_ledger_resolved(lid, MD.closed(5, 50), v2) == (v2 + 1, False)


@pytest.mark.zookeeper
def test_registration_is_recreated_after_session_expiry(
    store: ZkMetadataStore, zk_connect: str
) -> None:
    reg = Registration(store, "127.0.0.1:9", "/r1")
    reg.register()
    path = f"{store.root}/available/127.0.0.1:9"
    old_owner = store.zk.exists(path).ephemeralOwner
    # Expire the session as ZooKeeper would: another client closes it by id.
    session_id, password = store.zk.client_id
    other = KazooClient(hosts=zk_connect, client_id=(session_id, password))
    other.start(timeout=15)
    other.stop()
    other.close()
    # The re-registration thread creates the znode, then counts it: under load the test
    # can see the one before the other, so it waits for both.
    deadline = time.monotonic() + 30
    while True:
        try:
            stat = store.zk.exists(path) if store.zk.connected else None
        except (ConnectionLoss, SessionExpiredError):  # connected when asked, lost since
            stat = None  # (a loaded verify run's): ask again, as the deadline allows
        if stat is not None and stat.ephemeralOwner != old_owner and reg.registrations == 2:
            break
        assert time.monotonic() < deadline, (
            f"bookie was not re-registered: znode {stat}, {reg.registrations} registrations"
        )
        time.sleep(0.1)
    assert json.loads(store.zk.get(path)[0])["rack"] == "/r1"


@pytest.mark.zookeeper
def test_ensure_paths_creates_what_is_missing_with_its_ancestors_once(zk_connect: str) -> None:
    zk = connect(zk_connect)
    try:
        zk.ensure_path("/a/b")
        ensure_paths(zk, ["/a/b/c/d", "/a/e"])
        assert sorted(zk.get_children("/a")) == ["b", "e"]
        assert zk.get_children("/a/b/c") == ["d"]
        stat = zk.exists("/a/b/c/d")
        ensure_paths(zk, ["/a/b/c/d", "/a/e"])  # idempotent: nothing created again
        assert zk.exists("/a/b/c/d") == stat
    finally:
        zk.stop()
        zk.close()


@pytest.mark.zookeeper
def test_ensure_paths_survives_another_client_creating_a_path_first(
    zk_connect: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    zk, other = connect(zk_connect), connect(zk_connect)
    try:
        real = zk.transaction

        def racing() -> Any:  # the other client wins the race to /x/y before the multi
            other.ensure_path("/x/y")
            return real()

        monkeypatch.setattr(zk, "transaction", racing)
        ensure_paths(zk, ["/x/y/z"])
        assert zk.get_children("/x/y") == ["z"]
    finally:
        for c in (zk, other):
            c.stop()
            c.close()


@pytest.mark.zookeeper
def test_bookie_ids_name_writable_and_read_only_registrations_alike(
    store: ZkMetadataStore,
) -> None:
    assert store.bookie_ids() == set()
    store.register("127.0.0.1:1", rack="/r1", readonly=False)
    store.register("127.0.0.1:2", rack="/r2", readonly=True)
    # The read-only directory lives under available/: it is no bookie.
    assert store.bookie_ids() == {"127.0.0.1:1", "127.0.0.1:2"}
    assert store.bookie_ids() == {b.bookie_id for b in store.bookies()}
    store.register("127.0.0.1:1", rack="/r1", readonly=True)  # goes read-only: one entry
    assert store.bookie_ids() == {"127.0.0.1:1", "127.0.0.1:2"}
    assert set(store.writable_bookies()) == set()


@pytest.mark.zookeeper
def test_cookies_refuse_swapped_directories(store: ZkMetadataStore, tmp_path: Path) -> None:
    for name in ("j1", "l1", "j2", "l2"):
        (tmp_path / name).mkdir()
    j1, l1, j2, l2 = (str(tmp_path / n) for n in ("j1", "l1", "j2", "l2"))
    verify_or_create(store, "127.0.0.1:1", j1, [l1])
    verify_or_create(store, "127.0.0.1:2", j2, [l2])
    verify_or_create(store, "127.0.0.1:1", j1, [l1])  # a normal restart
    with pytest.raises(CookieMismatchError, match="differs from ZooKeeper's"):
        verify_or_create(store, "127.0.0.1:1", j1, [l2])


def test_config_rejects_unknown_parameters_and_keeps_bookkeeper_defaults(tmp_path: Path) -> None:
    p = tmp_path / "b.toml"
    p.write_text("bookiePort = 4000\njournalMaxGroupWaitMsec = 5\n")
    with pytest.raises(ConfigError, match=r"unknown parameter.*journalMaxGroupWaitMsec"):
        BookieConfig.load(p)
    p.write_text("bookiePort = 4000\n")
    c = BookieConfig.load(p)
    assert (c.minorCompactionThreshold, c.minorCompactionInterval) == (0.2, 3600)
    assert (c.majorCompactionThreshold, c.majorCompactionInterval) == (0.8, 86400)
    assert c.journalSyncData
    assert BookieConfig.from_dict(tomllib.loads(c.to_toml())) == c


@pytest.mark.parametrize(
    ("params", "said"),
    [
        ({"bookiePort": "x"}, "bookiePort must be an integer, got 'x'"),
        ({"bookiePort": 70000}, "bookiePort must be a port from 1 to 65535"),
        ({"zkTimeout": True}, "zkTimeout must be an integer, got True"),
        ({"gcWaitTime": -1}, "gcWaitTime must not be negative"),
        ({"journalMaxGroupWaitMSec": float("nan")}, "journalMaxGroupWaitMSec must be a number"),
        ({"diskUsageThreshold": 1.5}, "diskUsageThreshold must be a fraction from 0 to 1"),
        ({"journalSyncData": 1}, "journalSyncData must be true or false"),
        ({"zkServers": ""}, "zkServers must be a non-empty string"),
        ({"ledgerDirectories": [1]}, "ledgerDirectories must be a list of non-empty strings"),
    ],
)
def test_config_rejects_values_of_the_wrong_type_or_range(
    params: dict[str, object], said: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"b.toml: {said}")):
        BookieConfig.from_dict(params, "b.toml")


def test_an_empty_or_binary_config_file_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "b.toml"
    p.write_text("")
    with pytest.raises(ConfigError, match="no parameters"):
        BookieConfig.load(p)
    p.write_bytes(b"bookiePort = 1\n\xff\n")
    with pytest.raises(ConfigError, match="not UTF-8 text; expected TOML"):
        BookieConfig.load(p)


@pytest.mark.zookeeper
def test_shell_commands_against_a_real_cluster(
    make_cluster: MakeCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = make_cluster(3)
    zk = ["--zk", cluster.zk_hosts, "--json"]
    assert shell_main(["simpletest", *zk, "-n", "20"]) == 0
    ledger = json.loads(capsys.readouterr().out)["ledger"]
    assert shell_main(["listledgers", *zk]) == 0
    assert json.loads(capsys.readouterr().out) == [ledger]
    assert shell_main([*zk, "listledgers"]) == 0  # options before the command work too
    assert json.loads(capsys.readouterr().out) == [ledger]
    assert shell_main(["ledgermetadata", str(ledger), *zk]) == 0
    md = json.loads(capsys.readouterr().out)
    assert md["state"] == "CLOSED"
    assert md["lastEntryId"] == 19
    assert shell_main(["readledger", str(ledger), "--password", "simpletest", *zk]) == 0
    entries = json.loads(capsys.readouterr().out)["entries"]
    assert [e["data"] for e in entries] == [f"simpletest entry {i}" for i in range(20)]
    assert shell_main(["ledgermetadata", "999999", *zk]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_shell_says_clearly_when_zookeeper_is_unreachable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from bkref.impl.cluster.zookeeper import free_port

    zk = f"127.0.0.1:{free_port()}"
    assert shell_main(["listbookies", "--zk", zk, "--zk-timeout", "1"]) == 2
    assert "cannot connect to ZooKeeper" in capsys.readouterr().err


@contextmanager
def _urm(zk_connect: str, root: str) -> Iterator[UnderreplicationManager]:
    """AutoRecovery's ZooKeeper state under ``root``, on a session of its own."""
    zk = KazooClient(hosts=zk_connect)
    zk.start(timeout=30)
    try:
        urm = UnderreplicationManager(zk, root)
        urm.ensure_layout()
        yield urm
    finally:
        zk.stop()
        zk.close()


@pytest.mark.zookeeper
def test_a_lock_this_session_holds_is_taken_again_only_by_its_owner(zk_connect: str) -> None:
    with _urm(zk_connect, "/lock-owner") as urm:
        assert urm.try_lock(3, "worker-1")
        assert urm.try_lock(3, "worker-1")  # its own lock, e.g. a create whose reply was lost
        assert not urm.try_lock(3, "worker-2")  # another worker on the same session
        assert urm.lock_holder(3) == "worker-1"


@pytest.mark.zookeeper
def test_one_pipelined_view_reads_what_the_single_reads_do(zk_connect: str) -> None:
    with _urm(zk_connect, "/view") as urm:
        empty = urm.view([3, 5])
        assert (empty.tasks, empty.locks) == ({3: None, 5: None}, {3: None, 5: None})
        assert (empty.auditor, empty.enabled) == (None, True)
        urm.mark(5, {"a:1": Reason.LOST}, 1)
        assert urm.try_lock(5, "worker-1")
        urm.join_election("node-2")
        urm.join_election("node-1")
        urm.set_enabled(False)
        v = urm.view([3, 5])
        assert v.tasks == {3: None, 5: urm.get(5)}
        assert v.locks == {3: None, 5: "worker-1"}
        assert v.auditor == urm.auditor()
        assert v.auditor is not None
        assert v.auditor.node_id == "node-2"  # the lowest vote
        assert v.enabled is False


@pytest.mark.zookeeper
def test_read_ledgers_reads_each_ledger_as_read_ledger_does(store: ZkMetadataStore) -> None:
    lid, version = store.create_ledger(MD)
    assert store.read_ledgers([lid, lid + 1]) == {lid: store.read_ledger(lid), lid + 1: None}
    assert store.read_ledgers([lid])[lid] == (MD, version)


@pytest.mark.zookeeper
def test_the_audit_always_rewrites_a_task_and_the_check_only_adds_bookies(
    zk_connect: str,
) -> None:
    with _urm(zk_connect, "/mark-rewrite") as urm:

        def task() -> tuple[Task, int]:
            got = urm.get(5)
            assert got is not None
            return got

        urm.mark(5, {"a:1": Reason.LOST}, 1)
        first = task()[1]
        urm.mark(5, {"a:1": Reason.LOST}, 1)  # the audit: a new version all the same
        assert task()[1] == first + 1
        urm.mark(5, {"a:1": Reason.ENTRIES_MISSING}, 1, rewrite=False)  # listed: no write
        assert task()[1] == first + 1
        urm.mark(5, {"b:1": Reason.ENTRIES_MISSING}, 1, rewrite=False)  # a new bookie
        assert task() == (
            Task(5, {"a:1": Reason.LOST, "b:1": Reason.ENTRIES_MISSING}, 1, task()[0].ctime_ms),
            first + 2,
        )


@pytest.mark.zookeeper
def test_release_leaked_frees_this_sessions_locks_and_nothing_while_disconnected(
    zk_connect: str,
) -> None:
    zk = KazooClient(hosts=zk_connect)
    zk.start(timeout=30)
    try:
        urm = UnderreplicationManager(zk, "/release-leaked")
        urm.ensure_layout()
        assert urm.try_lock(7, "worker-1")  # a lock left over from a failed release
        assert urm.release_leaked() == 1
        assert urm.try_lock(7, "worker-1")
    finally:
        zk.stop()
    # A worker's round may run while ZooKeeper is out of reach: no session, nothing of
    # its own to find (it raised TypeError on the missing session id).
    assert zk.client_id is None
    assert urm.release_leaked() == 0
    zk.close()
