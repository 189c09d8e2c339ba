"""Short real campaigns: the local cluster under process faults, the namespace cluster under
partitions, ZooKeeper faults, session expiry and lazyfs crashes; both checked and valid."""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import asdict
from pathlib import Path

import pytest

from bkref.impl.client.client import BookKeeper
from bkref.impl.cluster.process import pid_alive
from bkref.impl.testing import Clusters
from bkref.linearizability.durability import check_durability
from bkref.linearizability.history import Recorder
from bkref.linearizability.history_files import JsonlWriter, read_jsonl
from bkref.linearizability.ledger_checker import check_ledgers
from bkref.nemesis.backends.local import LocalBackend
from bkref.nemesis.backends.netns import LazyfsNamespaceBackend
from bkref.nemesis.netns import namespaces_supported
from bkref.nemesis.report import render
from bkref.nemesis.report_charts import panels_of, run_figure
from bkref.nemesis.runner import RunSpec, run_once
from bkref.nemesis.workload import Workload, WorkloadSpec

pytestmark = [pytest.mark.zookeeper, pytest.mark.slow]


# One local campaign, traced, for what used to take two (an untraced one with kills and
# pauses, a traced one with kills): the history checks and the trace check of one run.
def test_short_traced_campaign_injects_faults_is_valid_and_explained_by_the_spec(
    tmp_path: Path,
) -> None:
    """Every bookie, writer process, the in-process client and every AutoRecovery log
    their protocol steps, and the run's trace check replays them through the spec."""
    spec = RunSpec(
        seed=3,
        duration=10.0,
        faults=("kill", "pause"),
        bookies=4,
        workload=WorkloadSpec(writers=2, readers=2, in_flight=4, entries_per_ledger=40),
        trace=True,
    )
    traces = tmp_path / "run" / "traces"
    backend = LocalBackend(tmp_path / "cluster", bookies=4, trace_dir=traces)
    messages: list[str] = []
    result = run_once(spec, backend, tmp_path / "run", messages.append)

    assert result.error is None, result.error
    assert result.windows, "seed 3 schedules at least one fault in 10 s"
    assert sum(result.faults.values()) == len(result.windows)
    assert result.ops.get("add:ok", 0) > 0
    assert result.ops.get("recover:ok", 0) >= result.ops.get("create:ok", 0)

    durability = result.checks["durability"]
    assert durability["valid"], durability["anomalies"][:5]
    assert durability["acknowledged"] == result.ops["add:ok"]
    assert durability["final_reads"] >= durability["acknowledged"]
    linearizable = result.checks["linearizable"]
    # Every created ledger is checked. A create whose answer was lost (a timeout under
    # load) may still have made a ledger, which the final phase recovers and the check
    # counts too: at least, not exactly, the created ones.
    assert linearizable["ledgers"] >= result.ops["create:ok"]
    assert linearizable["valid"], linearizable["anomalies"][:5]

    trace = result.checks["trace"]
    assert trace["valid"], trace["anomalies"][:3]
    assert trace["counts"]["violation"] == 0
    # Unknown, never a violation: what the replay cannot decide (a budget share that ran
    # out, an AutoRecovery step decided on a view the spec's worker does not have).
    assert trace["counts"]["explained"] > 0
    assert trace["counts"]["explained"] + trace["counts"]["unknown"] == trace["counts"]["ledgers"]
    assert trace["seconds"] > 0
    assert trace["peak_mib"] > 0
    names = {f.name for f in traces.glob("trace-*.jsonl")}
    assert "trace-client.jsonl" in names
    assert any(n.startswith("trace-writer-") for n in names)
    assert any(n.startswith("trace-autorecovery-") for n in names)
    assert sum(n.startswith("trace-127.0.0.1_") for n in names) == 4  # the bookies
    assert result.valid is True

    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["seed"] == 3
    assert (tmp_path / "run" / "history.jsonl").stat().st_size > 0
    assert "<svg" in (tmp_path / "run" / "timeline.html").read_text()
    assert any(m.startswith("nemesis: ") for m in messages)

    # Teardown stopped every process the campaign started.
    state = json.loads((tmp_path / "cluster" / "cluster.json").read_text())
    pids = [b["pid"] for b in state["bookies"] if b.get("pid")]
    assert not [p for p in pids if pid_alive(p)]


def test_a_traced_run_needs_a_traced_backend(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="trace_dir"):
        run_once(RunSpec(seed=1, trace=True), LocalBackend(tmp_path), tmp_path, lambda _: None)


NETNS, WHY = namespaces_supported()


@pytest.mark.skipif(not NETNS, reason=f"no network namespaces here: {WHY}")
def test_short_namespace_campaign_with_partitions_and_zookeeper_faults_is_valid(
    tmp_path: Path,
) -> None:
    # Seed 86 schedules: a lazyfs crash of a bookie, a paused ZooKeeper server, a
    # bookie's session expiry (cut from every ZooKeeper server) and a majority ring.
    spec = RunSpec(
        seed=86,
        duration=20.0,
        faults=("kill", "pause", "partition", "expire", "lose-unsynced"),
        bookies=4,
        workload=WorkloadSpec(writers=2, readers=1, in_flight=4, entries_per_ledger=40),
        interval=2.0,
    )
    backend = LazyfsNamespaceBackend(tmp_path / "cluster", 4, registry_dir=tmp_path / "registry")
    result = run_once(spec, backend, tmp_path / "run", lambda _: None)

    assert result.error is None, result.error
    assert result.backend == "netns"
    assert {w["kind"] for w in result.windows} == {"lose-unsynced", "pause", "expire", "partition"}
    assert any(str(w["target"]).startswith("zk") for w in result.windows)
    assert sum(result.faults.values()) == len(result.windows)
    assert result.ops.get("add:ok", 0) > 0
    assert result.valid is True, {k: c["anomalies"][:3] for k, c in result.checks.items()}
    assert [s["kind"] for s in result.spans] == [w["kind"] for w in result.windows]
    assert result.throughput
    assert all(len(row) == 4 for row in result.throughput)

    report = render(
        {
            "valid": True,
            "backend": "netns",
            "faults": list(spec.faults),
            "time": 20,
            "runs": [asdict(result)],
        },
        tmp_path,
    )
    # One figure: every panel (throughput, latencies, re-replication, the bookies'
    # /metrics) on one time axis, each with every fault window shaded.
    assert report.count('class="plotly-graph-div"') == 1
    run = asdict(result)
    fig = run_figure(run)
    assert fig is not None
    assert len(fig.layout.shapes) == len(panels_of(run)) * len(result.spans)
    assert '"add p99 (ms)"' in report
    assert result.scraped["scrapes"]["ok"] > 0  # every bookie's /metrics, once a second
    assert '"bookie add p99 (ms)"' in report
    assert not list((tmp_path / "registry").rglob("*.json"))  # torn down
    # The expiry was real: the bookie cut from ZooKeeper lost its session, then registered again.
    expired = next(w["target"] for w in result.windows if w["kind"] == "expire")
    # Its whole log: the run keeps only the last 200 lines, and how much a bookie logs
    # after the expiry (retries while a later partition cuts it off) is timing.
    log = Path(backend.services[str(expired)].log).read_text()
    assert "ZooKeeper session lost" in log
    assert "as writable" in log.split("ZooKeeper session lost")[-1]


def test_auditor_faults_hit_the_elected_auditor_and_another_takes_over(tmp_path: Path) -> None:
    # Windows aimed at "auditor" are resolved through the election when they open;
    # an expiry lasts past the session timeout, so another bookie must have been
    # elected by the time it closes, and the run must still converge and be valid.
    spec = RunSpec(
        seed=12,  # an expiry of the auditor, then two kills
        duration=24.0,
        faults=("kill-auditor", "expire-auditor"),
        bookies=4,
        workload=WorkloadSpec(writers=2, readers=1, in_flight=4, entries_per_ledger=40),
        interval=3.0,
    )
    backend = LocalBackend(tmp_path / "cluster", bookies=4)
    result = run_once(spec, backend, tmp_path / "run", lambda _: None)

    assert result.error is None, result.error
    starts = [e for e in result.events if e["event"] == "start"]
    stops = [e for e in result.events if e["event"] == "stop" and "auditor" in e]
    assert starts, result.windows
    bookies = {f"bookie-{i}" for i in range(4)}
    assert all(e["auditor"] in bookies for e in starts), starts
    expired = [e for e in stops if e["kind"] == "expire-auditor"]
    assert expired, result.events
    assert all(e["elected_meanwhile"] not in (None, e["auditor"]) for e in expired), expired
    assert result.checks["replication"]["valid"], result.checks["replication"]
    # The re-replication progress the report draws: ledgers were marked, then repaired.
    marked = [n for _, n in result.under_replicated]
    assert max(marked) > 0, marked
    assert marked[-1] == 0, marked
    assert result.valid is True, result.checks


def test_kill_writer_kills_a_writer_process_and_its_ledgers_are_recovered(tmp_path: Path) -> None:
    # kill -9 of the process that writes: its adds in flight get unknown outcomes,
    # its ledger stays open until another client recovers it, and nothing it had
    # acknowledged is lost; the workload starts a new writer process each time.
    # Seed 34 kills at 4.3 s and 10.5 s: each killed process has had seconds to start
    # (its log line comes after its imports; a kill 1.1 s in, as seed 2 had, could beat
    # it on a loaded machine) and the next one is running when the second kill comes.
    spec = RunSpec(
        seed=34,
        duration=15.0,
        faults=("kill-writer",),
        bookies=4,
        workload=WorkloadSpec(
            writers=1, process_writers=1, readers=1, in_flight=4, entries_per_ledger=400
        ),
        interval=2.0,
    )
    backend = LocalBackend(tmp_path / "cluster", bookies=4)
    result = run_once(spec, backend, tmp_path / "run", lambda _: None)

    assert result.error is None, result.error
    killed = [e["pid"] for e in result.events if e["kind"] == "kill-writer" and "pid" in e]
    assert len(set(killed)) >= 2, result.events  # a new process after each kill
    # Each writer process logs to the run's writers.log, not to the campaign's terminal.
    started = (tmp_path / "run" / "writers.log").read_text().count(" started, ZooKeeper ")
    assert started >= len(set(killed)), started
    ops = list(read_jsonl(tmp_path / "run" / "history.jsonl"))
    died = [o for o in ops if o.type == "info" and "writer process died" in str(o.value)]
    assert died, "a kill must leave adds in flight with unknown outcomes"
    assert result.checks["durability"]["valid"], result.checks["durability"]["anomalies"][:3]
    assert result.valid is True, result.checks


async def test_final_reads_recover_a_ledger_whose_create_never_returned(
    tmp_path: Path, zk_connect: str
) -> None:
    # A writer process killed during a create leaves a ledger whose id the workload
    # never learned: open for good, so the cluster could never converge, unless the
    # final phase recovers every ledger of the metadata store, not only known ones.
    history = tmp_path / "history.jsonl"
    spec = WorkloadSpec()
    with Clusters(tmp_path, zk_connect) as make_cluster:
        cluster = make_cluster(3)
        async with BookKeeper(cluster.zk_hosts) as bk:
            orphan = await bk.create_ledger(3, 2, 2, spec.password)  # nobody records it
            writer = JsonlWriter(history)
            try:
                workload = Workload(bk, Recorder(writer), spec, random.Random(1))
                await workload.final_reads()
            finally:
                writer.close()
            md, _ = await asyncio.to_thread(bk.meta.read_ledger, orphan.ledger_id)
            assert md.is_closed
            assert md.last_entry == -1
            lid = orphan.ledger_id
    ops = list(read_jsonl(history))
    recovers = [(o.type, o.value) for o in ops if o.f == "recover" and o.ledger == lid]
    assert recovers == [("invoke", None), ("ok", {"last_entry": -1})]
    assert check_ledgers(ops).verdict == "valid"
    assert check_durability(ops)["valid"]
