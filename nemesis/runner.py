"""The campaign runner: cluster up, workload under faults, heal, final reads, checks, report.

One run, in phases (TigerBeetle's VOPR and Jepsen both separate them):

1. setup: a fresh cluster from the backend;
2. safety: the workload runs while the nemesis walks its fault schedule;
3. heal: every fault is reverted (the schedule closes all windows) and the
   writers finish their ledgers (close, or crash and get recovered);
4. final: every ledger is recovered and read back in full;
5. check and report: linearizability and durability verdicts, written with
   the history to the run's directory; then teardown, always.

One seed drives the fault schedule and the workload's choices; a failing run
prints "reproduce with --seed N". Timing still differs between runs (real
processes, real disks), so a seed reproduces the schedule, not the interleaving.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from impl.client.client import BookKeeper
from linearizability import check_cli
from linearizability.history import NEMESIS, JsonlWriter, Op, Recorder, pair, read_jsonl
from nemesis.checker import check_durability, check_linearizable
from nemesis.db import ClusterBackend
from nemesis.generator import FaultWindow, ScheduleSpec, schedule
from nemesis.workload import Workload, WorkloadSpec

Log = Callable[[str], None]


@dataclass(frozen=True)
class RunSpec:
    seed: int
    duration: float = 60.0
    faults: tuple[str, ...] = ("kill", "pause")
    bookies: int = 5
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)


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


def _apply(backend: ClusterBackend, window: FaultWindow, event: str) -> None:
    start = event == "start"
    if window.kind == "kill":
        (backend.kill if start else backend.start)(window.target)
    elif window.kind == "pause":
        (backend.pause if start else backend.resume)(window.target)
    else:
        raise ValueError(f"unknown fault kind {window.kind!r}")


async def _nemesis(
    backend: ClusterBackend,
    windows: list[FaultWindow],
    recorder: Recorder,
    log: Log,
    counts: Counter[str],
) -> None:
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    events = sorted(
        [(w.start, 1, "start", w) for w in windows] + [(w.stop, 0, "stop", w) for w in windows],
        key=lambda e: (e[0], e[1]),
    )
    for at, _, event, w in events:
        await asyncio.sleep(max(0.0, t0 + at - loop.time()))
        recorder.record(NEMESIS, "info", w.kind, None, {"target": w.target, "event": event})
        log(f"nemesis: {w.kind} {event} {w.target}")
        await asyncio.to_thread(_apply, backend, w, event)
        if event == "start":
            counts[w.kind] += 1


def _latencies(ops: list[Op]) -> dict[str, dict[str, float]]:
    by_f: dict[str, list[float]] = {}
    for o in pair(ops):
        if o.complete is not None and o.status == "ok":
            by_f.setdefault(o.f, []).append((o.complete.time - o.invoke.time) / 1e6)
    out: dict[str, dict[str, float]] = {}
    for f, xs in sorted(by_f.items()):
        xs.sort()
        out[f] = {
            "count": len(xs),
            "p50": round(xs[len(xs) // 2], 2),
            "p99": round(xs[min(len(xs) - 1, int(len(xs) * 0.99))], 2),
            "max": round(xs[-1], 2),
        }
    return out


async def _drive(
    spec: RunSpec, backend: ClusterBackend, recorder: Recorder, log: Log
) -> tuple[Counter[str], list[FaultWindow]]:
    rng = random.Random(spec.seed)
    windows = schedule(
        ScheduleSpec(duration=spec.duration, kinds=spec.faults, targets=tuple(backend.bookies)),
        rng.getrandbits(64),
    )
    counts: Counter[str] = Counter()
    bk = BookKeeper(backend.zk_connect, seed=rng.getrandbits(64))
    await bk.start()
    try:
        workload = Workload(bk, recorder, spec.workload, random.Random(rng.getrandbits(64)))
        stop = asyncio.Event()
        log(f"safety phase: {spec.duration:.0f} s, {len(windows)} fault windows")
        work = asyncio.create_task(workload.run(stop))
        await _nemesis(backend, windows, recorder, log, counts)
        remaining = spec.duration - max((w.stop for w in windows), default=0.0)
        await asyncio.sleep(max(0.0, remaining))
        recorder.record(NEMESIS, "info", "heal", None, {"event": "start"})
        await asyncio.to_thread(backend.heal)
        log("heal phase: faults reverted; writers finish their ledgers")
        stop.set()
        await work
        log(f"final phase: recovering and reading back {len(workload.ledgers)} ledgers")
        await workload.final_reads()
    finally:
        await bk.close()
    return counts, windows


def run_once(spec: RunSpec, backend: ClusterBackend, directory: Path, log: Log) -> RunResult:
    """One run of the campaign; always tears the cluster down."""
    started = time.monotonic()
    directory.mkdir(parents=True, exist_ok=True)
    history = directory / "history.jsonl"
    error: str | None = None
    counts: Counter[str] = Counter()
    windows: list[FaultWindow] = []
    # The client's warnings (a failed bookie, an ensemble change) belong in the
    # run's log, not on the terminal between the progress lines.
    client_log = logging.FileHandler(directory / "client.log")
    client_log.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.addHandler(client_log)
    root.setLevel(logging.INFO)
    try:
        log(f"setup: {spec.bookies} bookies and ZooKeeper under {directory}")
        backend.setup()
        with JsonlWriter(history) as writer:
            counts, windows = asyncio.run(_drive(spec, backend, Recorder(writer), log))
    except Exception as e:  # the run could not complete: exit code 2, not a verdict
        error = f"{type(e).__name__}: {e}"
        log(f"run failed: {error}")
    finally:
        with contextlib.suppress(Exception):
            (directory / "logs").mkdir(exist_ok=True)
            for node, text in backend.logs().items():
                (directory / "logs" / f"{node}.log").write_text(text)
        backend.teardown()
        root.removeHandler(client_log)
        client_log.close()

    ops = list(read_jsonl(history)) if history.exists() else []
    checks: dict[str, Any] = {}
    valid: bool | None = None
    if error is None:
        checks = {"linearizable": check_linearizable(ops), "durability": check_durability(ops)}
        valid = all(c["valid"] for c in checks.values())
        with contextlib.redirect_stdout(io.StringIO()):
            check_cli.main([str(history), "--html", str(directory / "timeline.html")])
    result = RunResult(
        seed=spec.seed,
        directory=str(directory),
        valid=valid,
        error=error,
        checks=checks,
        ops=dict(Counter(f"{o.f}:{o.type}" for o in ops if not o.is_nemesis)),
        faults=dict(counts),
        windows=[w.to_json() for w in windows],
        latency_ms=_latencies(ops),
        seconds=round(time.monotonic() - started, 1),
    )
    (directory / "results.json").write_text(json.dumps(asdict(result), indent=2) + "\n")
    return result
