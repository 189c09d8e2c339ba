"""Protocol traces (bkref.impl.trace): one JSON line per step, numbered per node, whole
lines only, safe across threads, and what a SIGKILL leaves."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from kazoo.exceptions import ConnectionLoss

from bkref.impl.client.client import BookKeeper
from bkref.impl.client.errors import CreateOutcomeUnknownError, ZooKeeperError
from bkref.impl.core.metadata import LedgerMetadata
from bkref.impl.testing import eventually, repaired_off
from bkref.impl.trace import REGISTERED, Tracer, new_node_tracer, trace_path
from bkref.spec.protocol import ACTIONS
from tests.impl.autorecovery_helpers import FAST, PW
from tests.impl.conftest import MakeCluster, ZkView


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_each_step_is_a_line_with_node_seq_action_and_arguments(tmp_path: Path) -> None:
    with Tracer(tmp_path, "127.0.0.1:3181") as t:
        t.step("bookie_handles_add", ledger=3, entry=0, status="OK")
        t.step("bookie_handles_add", ledger=3, entry=1, status="FENCED")
    path = trace_path(tmp_path, "127.0.0.1:3181")
    assert path.name == "trace-127.0.0.1_3181.jsonl"
    lines = _lines(path)
    assert [(x["seq"], x["action"], x["entry"], x["status"]) for x in lines] == [
        (0, "bookie_handles_add", 0, "OK"),
        (1, "bookie_handles_add", 1, "FENCED"),
    ]
    assert {x["node"] for x in lines} == {"127.0.0.1:3181"}
    t0, t1 = lines[0]["t"], lines[1]["t"]
    assert isinstance(t0, int)
    assert isinstance(t1, int)
    assert t0 <= t1


def test_a_restarted_node_continues_its_numbering_and_drops_a_cut_last_line(
    tmp_path: Path,
) -> None:
    with Tracer(tmp_path, "b") as t:
        assert not t.restarted
        t.step("bookie_handles_add", entry=0)
    path = trace_path(tmp_path, "b")
    with path.open("a") as f:
        f.write('{"node":"b","seq":1,"act')  # the crash cut this line short
    with Tracer(tmp_path, "b") as t:
        assert t.restarted
        t.step("bookie_restarts")
    assert [(x["seq"], x["action"]) for x in _lines(path)] == [
        (0, "bookie_handles_add"),
        (1, "bookie_restarts"),
    ]


def test_each_start_of_a_new_node_process_gets_a_file_of_its_own(tmp_path: Path) -> None:
    """Two starts in one process (so with one pid, as two starts of a container's
    bookie): each a node of its own, numbered from 0, the first free start count taken."""
    with new_node_tracer(tmp_path, "autorecovery-127.0.0.1:3181") as first:
        first.step("node_wins_auditor_election")
    (tmp_path / "trace-autorecovery-127.0.0.1_3181-2.jsonl").touch()  # an unrelated file
    with new_node_tracer(tmp_path, "autorecovery-127.0.0.1:3181") as second:
        second.step("node_wins_auditor_election")
    with new_node_tracer(tmp_path, "autorecovery-127.0.0.1:3181") as third:
        pass
    assert [first.node, second.node, third.node] == [
        "autorecovery-127.0.0.1:3181-0",
        "autorecovery-127.0.0.1:3181-1",
        "autorecovery-127.0.0.1:3181-3",
    ]
    assert not any(t.restarted for t in (first, second, third))
    for t in (first, second):
        assert [(x["node"], x["seq"]) for x in _lines(t.path)] == [(t.node, 0)]
    with pytest.raises(FileExistsError):
        Tracer(tmp_path, first.node, new=True)


def test_steps_from_many_threads_get_distinct_consecutive_numbers(tmp_path: Path) -> None:
    with Tracer(tmp_path, "client") as t:

        def work(n: int) -> None:
            for i in range(200):
                t.step("writer_sends_add", thread=n, i=i)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    lines = _lines(trace_path(tmp_path, "client"))
    assert [x["seq"] for x in lines] == list(range(1600))
    for n in range(8):  # each thread's own steps stay in its order
        assert [x["i"] for x in lines if x["thread"] == n] == list(range(200))


def test_a_node_killed_with_sigkill_leaves_every_step_it_logged(tmp_path: Path) -> None:
    code = (
        "import sys, pathlib\n"
        "from bkref.impl.trace import Tracer\n"
        "t = Tracer(pathlib.Path(sys.argv[1]), 'w')\n"
        "for i in range(500):\n"
        "    t.step('writer_sends_add', entry=i)\n"
        "print('logged', flush=True)\n"
        "sys.stdin.read()\n"  # wait to be killed, without closing the tracer
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == "logged\n"
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    proc.stdout.close()
    assert proc.stdin is not None
    proc.stdin.close()
    assert [x["entry"] for x in _lines(trace_path(tmp_path, "w"))] == list(range(500))


# ------------------------------------------------------------- bookies on a real cluster


@pytest.mark.zookeeper
async def test_bookies_log_adds_and_fencing_reads_under_the_spec_names(
    make_cluster: MakeCluster, tmp_path: Path
) -> None:
    traces = tmp_path / "traces"
    cluster = make_cluster(3, trace_dir=traces)
    ids = [b.bookie_id for b in cluster.bookies]
    async with BookKeeper(cluster.zk_hosts) as bk:
        h = await bk.create_ledger(3, 2, 2, b"pw", bookies=ids)
        await h.add_many([b"e%d" % i for i in range(10)])
        h2 = await bk.open_ledger(h.ledger_id, b"pw")  # with recovery: fences, reads, closes
        assert h2.last_entry == 9
    lines = {b: _lines(trace_path(traces, b)) for b in ids}
    every = [x for steps in lines.values() for x in steps]
    assert {x["action"] for x in every} <= {a.__name__ for a in ACTIONS} | {REGISTERED}
    for b, steps in lines.items():
        assert [x["seq"] for x in steps] == list(range(len(steps)))
        assert {x["node"] for x in steps} == {b}
        adds = [x for x in steps if x["action"] == "bookie_handles_add" and not x["recovery"]]
        # Round-robin striping, E = 3, Wq = 2: bookie i holds the entries whose write set
        # (e mod 3, e + 1 mod 3) names it; each add answered OK, with its request id.
        mine = [e for e in range(10) if ids.index(b) in (e % 3, (e + 1) % 3)]
        assert sorted(int(str(x["entry"])) for x in adds) == mine
        assert all(x["status"] == "OK" and x["ledger"] == h.ledger_id for x in adds)
        assert all(isinstance(x["rid"], int) and ":" in str(x["peer"]) for x in adds)
        fences = [x for x in steps if x["action"] == "bookie_handles_fencing_lac_read"]
        assert len(fences) == 1  # recovery fences every bookie of the last ensemble once
        assert fences[0]["lac"] in range(-1, 10)
        # Every fencing read comes after the adds this bookie took.
        assert steps.index(fences[0]) > max(steps.index(x) for x in adds)
    reads = [x for x in every if x["action"] == "bookie_handles_recovery_read"]
    assert reads, "the recovery read entries with a fence"
    assert {x["entry"] for x in reads if x["found"]} <= set(range(10))


@pytest.mark.zookeeper
def test_a_restarted_bookie_logs_bookie_restarts(make_cluster: MakeCluster, tmp_path: Path) -> None:
    """The restart after its replay, and a registration in ZooKeeper at each start."""
    traces = tmp_path / "traces"
    cluster = make_cluster(1, trace_dir=traces)
    cluster.kill_bookie(0)
    cluster.start_bookie(0)
    steps = _lines(trace_path(traces, cluster.bookies[0].bookie_id))
    assert [x["action"] for x in steps] == [REGISTERED, "bookie_restarts", REGISTERED]
    assert {x["bookie"] for x in steps} == {cluster.bookies[0].bookie_id}


# ------------------------------------------------------------- AutoRecovery on a real cluster


@pytest.mark.zookeeper
@pytest.mark.slow
async def test_autorecovery_logs_its_audit_and_repair_under_the_spec_names(
    make_cluster: MakeCluster, zk_view: ZkView, tmp_path: Path
) -> None:
    """A bookie killed under a closed ledger: the auditor's mark, the worker's lock, copy
    (its adds linked to the target's answers by request id), metadata write, check and
    versioned delete are each one line named as the spec's action."""
    traces = tmp_path / "traces"
    cluster = make_cluster(5, autorecovery=True, trace_dir=traces, **FAST)
    store, urm = zk_view(cluster)
    ids = [b.bookie_id for b in cluster.bookies]
    async with BookKeeper(cluster.zk_hosts) as bk:
        h = await bk.create_ledger(3, 2, 2, PW, bookies=ids[:3])
        await h.add_many([b"e%d" % i for i in range(12)])
        await h.close()
        await asyncio.to_thread(cluster.kill_bookie, 0)
        assert await eventually(repaired_off(store, urm, ids[0], [h.ledger_id]), 120.0, 0.5)
    ar = [
        x
        for f in sorted(traces.glob("trace-autorecovery-*.jsonl"))
        for x in _lines(f)
        if x.get("ledger") in (None, h.ledger_id)
    ]
    names = {a.__name__ for a in ACTIONS}
    assert {x["action"] for x in ar} <= names | {"connected"}
    wins = [x for x in ar if x["action"] == "node_wins_auditor_election"]
    assert wins
    assert all(x["node"].startswith(f"autorecovery-{x['auditor']}-") for x in wins)
    marks = [x for x in ar if x["action"] == "auditor_marks_ledgers_of_lost_bookies"]
    assert marks
    assert all(x["replicas"] == {ids[0]: "LOST"} for x in marks)
    copies = [x for x in ar if x["action"] == "worker_copies_fragment"]
    assert copies
    assert all(x["lost"] == ids[0] for x in copies)
    done = [x for x in copies if x["outcome"] == "copied"]
    # Each fragment of bookie 0 (E = 3, Wq = 2: entries e with 0 in {e mod 3, e+1 mod 3})
    # copied once, in full, to a bookie outside the ensemble.
    assert sorted(e for x in done for e in x["entries"]) == [
        e for e in range(12) if 0 in (e % 3, (e + 1) % 3)
    ]
    assert all(x["bookie"] in ids[3:] for x in done)
    for x in done:
        assert sorted(s["entry"] for s in x["sends"]) == sorted(x["entries"])
        worker_node = next(y["node"] for y in ar if y is x)
        peer = {
            c["bookie"]: c["local"]
            for c in _lines(trace_path(traces, worker_node))
            if c["action"] == "connected"
        }[x["bookie"]]
        handled = {
            (y["rid"], y["entry"])
            for y in _lines(trace_path(traces, x["bookie"]))
            if y["action"] == "bookie_handles_add" and y["peer"] == peer and y["recovery"]
        }
        assert {(s["rid"], s["entry"]) for s in x["sends"]} <= handled
    cas = [x for x in ar if x["action"] == "worker_updates_segment_ensemble"]
    assert [x["outcome"] for x in cas].count("written") == len(done)
    assert any(x["action"] == "worker_verifies_ledger_replicated" for x in ar)
    deletes = [x for x in ar if x["action"] == "worker_deletes_task"]
    assert deletes
    assert deletes[-1]["deleted"] is True
    # Each worker's steps of the ledger begin with the lock and end with a delete or a release.
    for node in {x["node"] for x in ar if str(x["action"]).startswith("worker_")}:
        mine = [x["action"] for x in ar if x["node"] == node and x["action"].startswith("worker_")]
        assert mine[0] == "worker_acquires_ledger_lock"
        assert mine[-1] in ("worker_deletes_task", "worker_releases_lock")


@pytest.mark.zookeeper
@pytest.mark.parametrize("landed", [True, False])
async def test_a_create_whose_answer_was_lost_is_traced_with_its_ledger_and_outcome_unknown(
    make_cluster: MakeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, landed: bool
) -> None:
    # ZooKeeper lost the connection on the metadata write of a new ledger, after it landed
    # or before: the client cannot tell which. It raises with the ledger's id, and its
    # trace names that ledger with its outcome unknown, so the trace check replays the
    # creation as a step that may have happened (a campaign's run of seed 101 on netns had
    # a ledger created so, which a recovery closed later: "a client that left no trace").
    traces = tmp_path / "traces"
    cluster = make_cluster(3)
    ids = [b.bookie_id for b in cluster.bookies]
    tracer = Tracer(traces, "client")
    async with BookKeeper(cluster.zk_hosts, tracer=tracer) as bk:
        store = bk.meta
        create_at = store.create_ledger_at

        def lost(lid: int, md: LedgerMetadata) -> bool:
            if landed:
                create_at(lid, md)
            raise ConnectionLoss()

        monkeypatch.setattr(store, "create_ledger_at", lost)
        with pytest.raises(CreateOutcomeUnknownError, match="may or may not have happened") as e:
            await bk.create_ledger(3, 2, 2, b"pw", bookies=ids)
        lid = e.value.ledger_id
        assert isinstance(e.value.__cause__, ZooKeeperError)
        monkeypatch.undo()
        exists = lid in await bk.list_ledgers()
        assert exists is landed
        if landed:  # an orphan, open and empty, until a recovery closes it
            h = await bk.open_ledger(lid, b"pw")
            assert h.last_entry == -1
        created = await bk.create_ledger(3, 2, 2, b"pw", bookies=ids)
        assert created.ledger_id != lid
    tracer.close()
    creates = [
        x for x in _lines(trace_path(traces, "client")) if x["action"] == "writer_creates_ledger"
    ]
    assert [(x["ledger"], x.get("outcome")) for x in creates] == [
        (lid, "unknown"),
        (created.ledger_id, None),
    ]
    assert creates[0]["ensemble"] == ids
    assert (creates[0]["write_quorum"], creates[0]["ack_quorum"], creates[0]["version"]) == (
        2,
        2,
        0,
    )
