"""The campaign runner: one run, from a fresh cluster to its checks and results.

One run, in phases (TigerBeetle's VOPR and Jepsen both separate them):

1. setup: a fresh cluster from the backend (:mod:`bkref.nemesis.backends`);
2. safety, 3. heal, 4. final, 5. convergence: the workload under the
   nemesis's faults, then the repairs (:mod:`bkref.nemesis.phases`);
6. check and report: linearizability, durability, replication and cluster
   verdicts (:mod:`bkref.nemesis.checker`), the run's numbers (:mod:`bkref.nemesis.metrics`),
   written with the history and its timeline to the run's directory; then
   teardown, always.

One seed drives the fault schedule, the disk faults' choices and the
workload's choices; a failing run prints "reproduce with --seed N". Timing
still differs between runs (real processes, real disks), so a seed reproduces
the schedule, not the interleaving.

Besides the history's checks, the run checks the cluster itself: a node that
refuses to restart is expected only after a fault that takes it out for good
(a wiped disk: its cookie no longer matches); any other refusal is a finding
(``node-refused-to-start``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bkref.impl import eventloop
from bkref.linearizability.check_cli import write_timeline
from bkref.linearizability.history import JSON, NEMESIS, Op, OpType, Process, Recorder
from bkref.linearizability.history_files import JsonlWriter, read_jsonl
from bkref.nemesis import metrics
from bkref.nemesis.backends.base import Backend
from bkref.nemesis.checker import check_cluster, check_history, check_replication, check_traces
from bkref.nemesis.faults import DEFAULT_KINDS
from bkref.nemesis.nemesis import Log, Nemesis
from bkref.nemesis.phases import Phases, drive, dump_bookies
from bkref.nemesis.workload import WorkloadSpec

Progress = Callable[[dict[str, Any]], None]


def _quiet(_: dict[str, Any]) -> None:
    return None


@dataclass(frozen=True)
class RunSpec:
    seed: int
    duration: float = 60.0
    faults: tuple[str, ...] = DEFAULT_KINDS
    bookies: int = 5
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    plant: tuple[str, ...] = ()  # planted bugs (impl.core.planted), for detection tests
    autorecovery: bool = True  # AutoRecovery in every bookie; replication checked after heal
    converge_timeout: float = 180.0  # seconds the cluster gets to repair after the heal
    interval: float = 4.0  # mean seconds between fault starts
    # Seconds a fault window lasts, drawn uniformly (an expiry lasts at least the session
    # timeout plus 4 s whatever this says). Kills longer than the session timeout are the
    # ones AutoRecovery must repair.
    fault_length: tuple[float, float] = (1.0, 6.0)
    # Record every node's protocol steps (run/traces) and replay them through the spec.
    trace: bool = False
    trace_budget: float = 300.0  # seconds the trace check may take


@dataclass
class RunResult:
    seed: int
    directory: str
    valid: bool | None  # None: the run could not complete
    error: str | None
    checks: dict[str, Any]
    ops: dict[str, int]
    faults: dict[str, int]
    windows: list[dict[str, object]]
    latency_ms: dict[str, dict[str, float]]
    seconds: float
    backend: str = "local"
    plant: list[str] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)  # what each fault did
    throughput: list[list[int]] = field(default_factory=list)  # per second: adds, reads, other
    # Per second (by invocation): p50 and p99 of acknowledged adds' latency, in ms.
    add_latency: list[list[float]] = field(default_factory=list)
    spans: list[dict[str, Any]] = field(default_factory=list)  # faults as the history saw them
    # Per second of the run (safety, final and convergence phases): ledgers marked
    # under-replicated, sampled from ZooKeeper: the re-replication progress.
    under_replicated: list[list[int]] = field(default_factory=list)
    # The bookies' /metrics over the run (bkref.nemesis.scrape.series), and scrape counts.
    scraped: dict[str, Any] = field(default_factory=dict)


class _CountingRecorder(Recorder):
    """A Recorder that reports completions to a progress callback, every 200 ops."""

    def __init__(self, writer: JsonlWriter, progress: Progress) -> None:
        super().__init__(writer)
        self.progress = progress
        self.counts: Counter[str] = Counter()

    def record(self, process: Process, typ: OpType, f: str, ledger: int | None, value: JSON) -> Op:
        op = super().record(process, typ, f, ledger, value)
        if typ != "invoke":
            self.counts["faults" if process == NEMESIS else typ] += 1
            if op.index % 200 == 0 or process == NEMESIS:
                self.progress({"ops": op.index + 1, **self.counts, "seconds": op.time / 1e9})
        return op


def run_once(
    spec: RunSpec,
    backend: Backend,
    directory: Path,
    log: Log,
    progress: Progress = _quiet,
) -> RunResult:
    """One run of the campaign; always tears the cluster down (also on Ctrl-C). The
    backend must have been made with the run's planted bugs (its bookies get them)."""
    if backend.plants != frozenset(spec.plant):
        raise ValueError(
            f"the run plants {sorted(spec.plant)} but the {backend.name} backend's bookies "
            f"get {sorted(backend.plants)}: make the backend with plants=the run's"
        )
    if (backend.trace_dir is not None) != spec.trace:
        raise ValueError(
            "the run records traces only if its backend's bookies do: make the backend "
            "with trace_dir=<run>/traces exactly when the run has trace=True"
        )
    started = time.monotonic()
    directory.mkdir(parents=True, exist_ok=True)
    history = directory / "history.jsonl"
    error: str | None = None
    phases = Phases(Counter(), [], {}, [])
    entries: list[dict[str, Any]] = []
    # The client's warnings (a failed bookie, an ensemble change) belong in the
    # run's log, not on the terminal between the progress lines.
    client_log = logging.FileHandler(directory / "client.log")
    client_log.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.addHandler(client_log)
    root.setLevel(logging.INFO)
    rng = random.Random(spec.seed)
    nemesis = Nemesis(backend, random.Random(rng.getrandbits(64)))
    try:
        log(
            f"setup: {spec.bookies} bookies and ZooKeeper ({backend.name} backend) under "
            f"{directory}" + (f"; planted bug(s): {', '.join(spec.plant)}" if spec.plant else "")
        )
        backend.setup()
        with JsonlWriter(history) as writer:
            recorder = _CountingRecorder(writer, progress)
            phases = backend.run_client(
                lambda: eventloop.run(drive(spec, backend, recorder, log, nemesis, rng, directory))
            )
        if phases.after:
            log("replication audit: stopping the bookies and dumping what each stores")
            entries = dump_bookies(backend, directory / "dumps" / "entries.jsonl", log)
    except Exception as e:  # the run could not complete: exit code 2, not a verdict
        error = f"{type(e).__name__}: {e}"
        log(f"run failed: {error}")
    finally:
        with contextlib.suppress(Exception):
            (directory / "logs").mkdir(exist_ok=True)
            for node, text in backend.logs().items():
                (directory / "logs" / f"{node}.log").write_text(text)
        try:
            backend.teardown()
        finally:
            nemesis.executor.shutdown(wait=False)
            root.removeHandler(client_log)
            client_log.close()

    ops = list(read_jsonl(history)) if history.exists() else []
    checks: dict[str, Any] = {}
    valid: bool | None = None
    if error is None:
        checks = {**check_history(ops), "cluster": check_cluster(nemesis.events)}
        if phases.after:
            checks["replication"] = check_replication(phases.after, entries, directory)
        if backend.trace_dir is not None:
            log(f"trace check: replaying {backend.trace_dir} through the spec")
            try:
                checks["trace"] = check_traces(backend.trace_dir, spec.trace_budget)
            except (RuntimeError, OSError, ValueError) as e:
                error = f"trace check: {e}"
        valid = None if error else all(c["valid"] for c in checks.values())
        write_timeline(history, directory / "timeline.html")
    result = RunResult(
        seed=spec.seed,
        directory=str(directory),
        valid=valid,
        error=error,
        checks=checks,
        ops=dict(Counter(f"{o.f}:{o.type}" for o in ops if not o.is_nemesis)),
        faults=dict(phases.counts),
        windows=[w.to_json() for w in phases.windows],
        latency_ms=metrics.latencies(ops),
        seconds=round(time.monotonic() - started, 1),
        backend=backend.name,
        plant=list(spec.plant),
        events=nemesis.events,
        throughput=metrics.throughput(ops),
        add_latency=metrics.add_latency(ops),
        spans=metrics.spans(ops),
        under_replicated=phases.under_replicated,
        scraped=phases.scraped,
    )
    (directory / "results.json").write_text(json.dumps(asdict(result), indent=2) + "\n")
    return result
