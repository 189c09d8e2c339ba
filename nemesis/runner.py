"""The campaign runner: cluster up, workload under faults, heal, final reads, checks, report.

One run, in phases (TigerBeetle's VOPR and Jepsen both separate them):

1. setup: a fresh cluster from the backend;
2. safety: the workload runs while the nemesis walks its fault schedule;
3. heal: every fault is reverted (the schedule closes all windows) and the
   writers finish their ledgers (close, or crash and get recovered);
4. final: every ledger is recovered and read back in full;
5. check and report: linearizability and durability verdicts, written with
   the history to the run's directory; then teardown, always.

One seed drives the fault schedule, the disk faults' choices and the
workload's choices; a failing run prints "reproduce with --seed N". Timing
still differs between runs (real processes, real disks), so a seed reproduces
the schedule, not the interleaving.

Besides the history's checks, the run checks the cluster itself: a node that
refuses to restart is expected only after its disk was wiped (its cookie no
longer matches); any other refusal is a finding (``node-refused-to-start``).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kazoo.exceptions import KazooException

from impl.autorecovery.auditor import check_replicas
from impl.bookie.config import BookieConfig
from impl.client.client import BookKeeper
from impl.core.metadata import LedgerMetadata
from impl.core.planted import ENV as PLANT_ENV
from impl.meta.store import NoSuchLedgerError
from impl.meta.underreplication import UnderreplicationManager
from linearizability import check_cli
from linearizability.history import JSON, NEMESIS, Op, OpType, Process, Recorder, pair
from linearizability.history_files import JsonlWriter, read_jsonl
from linearizability.replication import audit as audit_replication
from nemesis.checker import check_history
from nemesis.db import ClusterBackend, NodeRefusedError
from nemesis.disk import NothingToCorruptError
from nemesis.generator import (
    AUDITOR_KINDS,
    DEFAULT_KINDS,
    VICTIM_KINDS,
    FaultWindow,
    Grudge,
    ScheduleSpec,
    freeze_grudge,
    schedule,
)
from nemesis.partition import complete_grudge
from nemesis.workload import Workload, WorkloadSpec

Log = Callable[[str], None]
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


def _try_start(backend: ClusterBackend) -> Callable[[str], str | None]:
    def start(node: str) -> str | None:
        try:
            backend.start(node)
        except Exception as e:  # refused, or would not come back: a finding either way
            return f"{type(e).__name__}: {e}"
        return None

    return start


class _Nemesis:
    """Applies fault windows to a backend and records what happened (Jepsen's nemesis)."""

    def __init__(self, backend: ClusterBackend, rng: random.Random) -> None:
        self.backend = backend
        self.rng = rng
        # A thread of its own: the client's calls (kazoo blocks while ZooKeeper is cut
        # off) may hold every thread of asyncio's default pool, and the heal must not
        # wait for them.
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="nemesis")
        self.events: list[dict[str, Any]] = []
        self.refused: set[str] = set()
        # The elected auditor's node, or None; set once the run's client has a session.
        self.find_auditor: Callable[[], str | None] = lambda: None
        # kill -9 a writer process of the workload; its pid (None: none is running).
        self.kill_writer: Callable[[], int | None] = lambda: None
        self._hit: dict[FaultWindow, str] = {}  # auditor windows: the node each one hit

    def _auditor_window(self, w: FaultWindow, start: bool) -> tuple[FaultWindow, dict[str, Any]]:
        """Resolve an auditor window to the node it hits: the elected auditor at its start."""
        if start:
            node = self.find_auditor()
            if node is None:
                return w, {"skipped": "no auditor is elected"}
            self._hit[w] = node
        elif w not in self._hit:
            return w, {"skipped": "the start hit nothing"}
        node = self._hit[w] if start else self._hit.pop(w)
        out: dict[str, Any] = {"auditor": node}
        if not start:
            out["elected_meanwhile"] = self.find_auditor()
        kind = "kill" if w.kind == "kill-auditor" else "expire"
        grudge: Grudge = ()
        if kind == "expire" and self.backend.network and self.backend.zookeepers:
            grudge = freeze_grudge(complete_grudge([[node], list(self.backend.zookeepers)]))
        return FaultWindow(w.start, w.stop, kind, node, grudge), out

    def apply(self, w: FaultWindow, event: str) -> dict[str, Any]:
        """Start or stop one window; a dict saying what it did (into the history)."""
        start = event == "start"
        label = w.kind  # an auditor window is recorded under its own kind
        out: dict[str, Any] = {}
        if w.kind in AUDITOR_KINDS:
            w, out = self._auditor_window(w, start)
            if "skipped" in out:
                self.events.append({"kind": w.kind, "target": w.target, "event": event, **out})
                return out
        b, kind, target = self.backend, w.kind, w.target
        try:
            if kind == "kill-writer":  # the workload starts another writer by itself
                if start:
                    pid = self.kill_writer()
                    out.update({"pid": pid} if pid else {"skipped": "no writer process"})
            elif kind in ("kill", "lose-unsynced", "truncate", "wipe") and not start:
                if target in self.refused:
                    out["skipped"] = f"{target} stays down (it refused to start)"
                else:
                    b.start(target)
            elif kind == "kill":
                b.kill(target)
            elif kind == "pause":
                (b.pause if start else b.resume)(target)
            elif kind == "partition" or (kind == "expire" and w.grudge):
                if start:
                    b.partition(w.grudge_dict())
                else:
                    b.heal()
            elif kind == "expire":  # no network of namespaces: a pause past the session timeout
                (b.pause if start else b.resume)(target)
            elif kind == "lose-unsynced":
                b.lose_unsynced(target)
            elif kind == "power-loss":
                live = [x for x in b.bookies if x not in self.refused]
                if start:
                    for x in live:
                        b.lose_unsynced(x)
                else:  # the machines come back together, as after a power cut
                    with ThreadPoolExecutor(len(live) or 1) as pool:
                        outcomes = list(pool.map(_try_start(b), live))
                    for x, error in zip(live, outcomes, strict=True):
                        if error is not None:
                            self._refused(x, w, error)
            elif kind in ("flip", "truncate", "wipe"):
                if start:
                    out["did"] = b.corrupt(target, kind, self.rng)
            else:
                raise ValueError(f"unknown fault kind {kind!r}")
        except NodeRefusedError as e:
            out.update(self._refused(target, w, str(e)))
        except NothingToCorruptError as e:
            out["skipped"] = str(e)
        except Exception as e:  # a node that will not come back is a finding, not a crash
            if start:
                raise
            out.update(self._refused(target, w, f"{type(e).__name__}: {e}"))
        if out:
            self.events.append({"kind": label, "target": target, "event": event, **out})
        return out

    def _refused(self, node: str, w: FaultWindow, message: str) -> dict[str, Any]:
        self.refused.add(node)
        expected = w.kind == "wipe"
        self.events.append(
            {
                "kind": w.kind,
                "target": node,
                "event": "refused",
                "expected": expected,
                "message": message[-600:],
            }
        )
        return {"refused": True, "expected": expected}


async def _nemesis(
    nemesis: _Nemesis,
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
        value: dict[str, Any] = {"target": w.target, "event": event}
        recorder.record(NEMESIS, "info", w.kind, None, value)
        log(f"nemesis: {w.kind} {event} {w.target}")
        did = await asyncio.get_running_loop().run_in_executor(
            nemesis.executor, nemesis.apply, w, event
        )
        # The fault's completion: a restart or a disk fault takes time, and says what it did.
        recorder.record(NEMESIS, "info", w.kind, None, {**value, "done": True, **did})
        if did:
            log(f"nemesis: {w.kind} {event} {w.target}: {did}")
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


async def _drive(  # noqa: PLR0917 (one run's parts, each used once)
    spec: RunSpec,
    backend: ClusterBackend,
    recorder: Recorder,
    log: Log,
    nemesis: _Nemesis,
    rng: random.Random,
    directory: Path,
) -> tuple[Counter[str], list[FaultWindow], dict[str, Any], list[list[int]]]:
    windows = schedule(
        ScheduleSpec(
            duration=spec.duration,
            kinds=spec.faults,
            targets=tuple(backend.bookies),
            zookeepers=tuple(backend.zookeepers),
            network=tuple(backend.network),
            clients=tuple(backend.clients),
            expire_length=backend.session_timeout + 4.0,
            mean_interval=spec.interval,
            min_length=spec.fault_length[0],
            max_length=spec.fault_length[1],
        ),
        rng.getrandbits(64),
    )
    counts: Counter[str] = Counter()
    bk = BookKeeper(backend.zk_connect, seed=rng.getrandbits(64))
    await bk.start()
    nemesis.find_auditor = _auditor_finder(bk, backend)
    sampler = _TaskSampler(UnderreplicationManager(bk.meta.zk, bk.root), recorder.elapsed_ns)
    sampler.start()
    try:
        workload = Workload(
            bk,
            recorder,
            spec.workload,
            random.Random(rng.getrandbits(64)),
            zk=backend.zk_connect,
            writer_log=directory / "writers.log",
        )
        nemesis.kill_writer = workload.kill_writer
        stop = asyncio.Event()
        log(f"safety phase: {spec.duration:.0f} s, {len(windows)} fault windows")
        work = asyncio.create_task(workload.run(stop))
        await _nemesis(nemesis, windows, recorder, log, counts)
        remaining = spec.duration - max((w.stop for w in windows), default=0.0)
        await asyncio.sleep(max(0.0, remaining))
        recorder.record(NEMESIS, "info", "heal", None, {"event": "start"})
        await asyncio.get_running_loop().run_in_executor(nemesis.executor, backend.heal)
        log("heal phase: faults reverted; writers finish their ledgers")
        stop.set()
        await work
        log(f"final phase: recovering and reading back {len(workload.ledgers)} ledgers")
        await workload.final_reads()
        after: dict[str, Any] = {}
        if spec.autorecovery:
            log("convergence: waiting for AutoRecovery to repair every ledger")
            after = await _converge(bk, spec.converge_timeout)
            if after["converged"]:
                # Then every replica read in full, as an operator would before trusting the
                # cluster: with Aq < Wq a crash can leave an acknowledged entry on only Aq
                # bookies, a gap only a check that reads it finds. Its repairs converge too.
                urm = UnderreplicationManager(bk.meta.zk, bk.root)
                found = await check_replicas(bk, urm, 100, random.Random(rng.getrandbits(64)))
                marked = len(found)
                log(f"convergence: the full replica check marked {marked} ledger(s)")
                wq_is_aq = {
                    r["ledger"] for r in after["ledgers"] if r["write_quorum"] == r["ack_quorum"]
                }
                if marked:
                    first = after["seconds"]
                    after = await _converge(bk, spec.converge_timeout)
                    after["seconds"] = round(first + after["seconds"], 1)
                after["full_check_marked"] = marked
                if not VICTIM_KINDS & set(counts):
                    after["missing_after_convergence"] = [
                        {"ledger": m.ledger_id, "bookies": sorted(m.replicas)}
                        for m in found
                        if m.ledger_id in wq_is_aq
                    ]
            log(
                f"convergence: {'done' if after['converged'] else 'NOT converged'} "
                f"after {after['seconds']} s"
            )
    finally:
        sampler.stop()
        await bk.close()
    return counts, windows, after, sampler.series()


class _TaskSampler:
    """Counts the ledgers marked under-replicated once a second, in a thread of its own,
    for the report's re-replication chart. While ZooKeeper is out of reach a count may
    block or fail: those seconds keep the last count (one thread, so calls never pile up)."""

    def __init__(self, urm: UnderreplicationManager, clock: Callable[[], int]) -> None:
        self.urm, self.clock = urm, clock
        self.counts: dict[int, int] = {}  # second of the run -> ledgers marked
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="task-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _sample(self) -> None:
        with contextlib.suppress(KazooException):  # out of reach: no sample this second
            n = len(self.urm.ledger_ids())
            self.counts[self.clock() // 1_000_000_000] = n

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self._sample()

    def stop(self) -> None:
        """Stop sampling, with one last sample: the state the run ends in."""
        self._stop.set()
        self._thread.join(timeout=5.0)
        if not self._thread.is_alive():
            self._sample()

    def series(self) -> list[list[int]]:
        """[second, ledgers marked] for every second up to the last sample."""
        out: list[list[int]] = []
        last = 0
        for second in range(max(self.counts, default=-1) + 1):
            last = self.counts.get(second, last)
            out.append([second, last])
        return out


def _auditor_finder(bk: BookKeeper, backend: ClusterBackend) -> Callable[[], str | None]:
    """Which node the elected auditor runs in (its vote names its bookie's id)."""
    urm = UnderreplicationManager(bk.meta.zk, bk.root)
    nodes = {
        BookieConfig.load(cfg).bookie_id: node for node, cfg in backend.bookie_configs().items()
    }

    def find() -> str | None:
        try:
            auditor = urm.auditor()
        except KazooException:
            return None
        return None if auditor is None else nodes.get(auditor.node_id)

    return find


def _ledger_row(lid: int, md: LedgerMetadata) -> dict[str, Any]:
    """A ledger's metadata as the replication audit reads it (``ledgers`` table)."""
    return {
        "ledger": lid,
        "state": md.state.value,
        "last_entry": md.last_entry,
        "ensemble_size": md.ensemble_size,
        "write_quorum": md.write_quorum,
        "ack_quorum": md.ack_quorum,
        "segments": [
            {"first_entry": seg.first_entry, "ensemble": list(seg.ensemble)} for seg in md.segments
        ],
    }


async def _converge(bk: BookKeeper, timeout: float) -> dict[str, Any]:
    """Wait until no task is left, every ledger is closed and no ledger names a bookie
    that is not registered: the cluster has converged after the heal."""
    urm = UnderreplicationManager(bk.meta.zk, bk.root)
    started = time.monotonic()
    while True:
        tasks = await asyncio.to_thread(urm.tasks)
        live = {b.bookie_id for b in await asyncio.to_thread(bk.meta.bookies)}
        rows: list[dict[str, Any]] = []
        stale: list[int] = []
        unclosed: list[int] = []
        for lid in await bk.list_ledgers():
            try:
                md, _ = await asyncio.to_thread(bk.meta.read_ledger, lid)
            except NoSuchLedgerError:
                continue
            rows.append(_ledger_row(lid, md))
            if md.bookies() - live:
                stale.append(lid)
            if not md.is_closed:
                unclosed.append(lid)
        elapsed = round(time.monotonic() - started, 1)
        converged = not tasks and not stale and not unclosed
        if converged or elapsed > timeout:
            return {
                "converged": converged,
                "seconds": elapsed,
                "tasks_left": [t.ledger_id for t, _ in tasks][:50],
                "naming_down_bookies": stale[:50],
                "not_closed": unclosed[:50],
                "ledgers": rows,
            }
        await asyncio.sleep(1.0)


def _dump_bookies(backend: ClusterBackend, out: Path, log: Log) -> list[dict[str, Any]]:
    """Stop every bookie and read what each stores (``bkref bookie --dump``)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    for node, config in backend.bookie_configs().items():
        with contextlib.suppress(Exception):
            backend.kill(node)
        done = subprocess.run(
            [sys.executable, "-m", "impl.bookie", "--config", str(config), "--dump", str(out)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            log(f"dump of {node} failed: {done.stderr.strip()[-500:]}")
    return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []


def _check_replication(
    after: dict[str, Any], entries: list[dict[str, Any]], directory: Path
) -> dict[str, Any]:
    ledgers = after.get("ledgers", [])
    with (directory / "dumps" / "ledgers.jsonl").open("w") as f:
        for row in ledgers:
            f.write(json.dumps(row) + "\n")
    result = audit_replication(entries, ledgers)
    anomalies = list(result["anomalies"])
    # With Wq = Aq every entry of a closed ledger is on its whole write set, in a correct
    # cluster, and stays there through crashes, since a bookie fsyncs before it answers
    # and a repair copies before it records; only a fault that destroys fsynced data
    # (VICTIM_KINDS) can take a replica away. So once the cluster converged, a replica
    # the full check finds missing was lost by the protocol or a repair, even if the
    # repair it then triggered has put the entries back (as it may: the replica moves
    # to a bookie that may still hold them).
    anomalies.extend(
        {
            "kind": "under-replicated",
            "ledger": m["ledger"],
            "bookies": m["bookies"],
            "message": f"ledger {m['ledger']} (Wq = Aq): after the cluster converged "
            f"the full replica check found replicas missing on {', '.join(m['bookies'])}",
        }
        for m in after.get("missing_after_convergence", [])
    )
    if not after.get("converged"):
        anomalies.insert(
            0,
            {
                "kind": "not-repaired-after-heal",
                "tasks_left": after.get("tasks_left"),
                "naming_down_bookies": after.get("naming_down_bookies"),
                "not_closed": after.get("not_closed"),
                "message": f"the cluster did not converge within {after.get('seconds')} s",
            },
        )
    return {
        "valid": bool(after.get("converged")) and result["valid"] and not anomalies,
        "converge_seconds": after.get("seconds"),
        "full_check_marked": after.get("full_check_marked"),
        "entries_audited": result["entries_audited"],
        "counts": result["counts"],
        "anomalies": anomalies,
    }


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


def _throughput(ops: list[Op]) -> list[list[int]]:
    """Per second of the run: ok adds, ok reads (and LAC reads), other ok operations."""
    rows: dict[int, list[int]] = {}
    for o in ops:
        if o.is_nemesis or o.type != "ok":
            continue
        row = rows.setdefault(o.time // 1_000_000_000, [0, 0, 0])
        row[0 if o.f == "add" else 1 if o.f in ("read", "read_lac") else 2] += 1
    last = max(rows, default=-1)
    return [[s, *rows.get(s, [0, 0, 0])] for s in range(last + 1)]


def _add_latency(ops: list[Op]) -> list[list[float]]:
    """Per second of the run, by invocation: p50 and p99 latency (ms) of acknowledged adds;
    seconds without one repeat zeros, so that a stall shows as a gap in the line."""
    by_second: dict[int, list[float]] = {}
    for o in pair(ops):
        if o.f == "add" and o.status == "ok" and o.complete is not None:
            second = o.invoke.time // 1_000_000_000
            by_second.setdefault(second, []).append((o.complete.time - o.invoke.time) / 1e6)
    rows: list[list[float]] = []
    for s in range(max(by_second, default=-1) + 1):
        xs = sorted(by_second.get(s, []))
        if not xs:
            rows.append([s, 0.0, 0.0])
            continue
        rows.append([s, xs[len(xs) // 2], xs[min(len(xs) - 1, int(0.99 * len(xs)))]])
    return [[r[0], round(r[1], 2), round(r[2], 2)] for r in rows]


def _spans(ops: list[Op]) -> list[dict[str, Any]]:
    """Fault windows in history time (seconds): from each start to its stop (or the heal)."""
    opened: dict[tuple[str, str], float] = {}
    spans: list[dict[str, Any]] = []
    end = ops[-1].time / 1e9 if ops else 0.0
    for o in ops:
        if not o.is_nemesis or not isinstance(o.value, dict) or "target" not in o.value:
            continue
        key = (o.f, str(o.value["target"]))
        if o.value.get("event") == "start" and key not in opened:
            opened[key] = o.time / 1e9
        elif o.value.get("event") == "stop" and key in opened and o.value.get("done"):
            spans.append(
                {"kind": o.f, "target": key[1], "start": opened.pop(key), "stop": o.time / 1e9}
            )
    spans += [{"kind": k, "target": t, "start": at, "stop": end} for (k, t), at in opened.items()]
    return sorted(spans, key=lambda x: x["start"])


def _check_cluster(events: list[dict[str, Any]]) -> dict[str, Any]:
    """A node that refused to restart without a wiped disk is a finding."""
    anomalies: list[dict[str, Any]] = [
        {
            "kind": "node-refused-to-start",
            "ledger": None,
            "ops": [],
            "message": f"{e['target']} refused to restart after {e['kind']}: {e['message']}",
        }
        for e in events
        if e.get("event") == "refused" and not e.get("expected")
    ]
    return {"valid": not anomalies, "anomalies": anomalies}


def run_once(
    spec: RunSpec,
    backend: ClusterBackend,
    directory: Path,
    log: Log,
    progress: Progress = _quiet,
) -> RunResult:
    """One run of the campaign; always tears the cluster down (also on Ctrl-C)."""
    started = time.monotonic()
    directory.mkdir(parents=True, exist_ok=True)
    history = directory / "history.jsonl"
    error: str | None = None
    after: dict[str, Any] = {}
    entries: list[dict[str, Any]] = []
    counts: Counter[str] = Counter()
    windows: list[FaultWindow] = []
    tasks: list[list[int]] = []
    # The client's warnings (a failed bookie, an ensemble change) belong in the
    # run's log, not on the terminal between the progress lines.
    client_log = logging.FileHandler(directory / "client.log")
    client_log.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.addHandler(client_log)
    root.setLevel(logging.INFO)
    rng = random.Random(spec.seed)
    nemesis = _Nemesis(backend, random.Random(rng.getrandbits(64)))
    # The client half of a planted bug (recovery) runs in this process.
    saved_plant = os.environ.get(PLANT_ENV)
    if spec.plant:
        os.environ[PLANT_ENV] = ",".join(spec.plant)
    else:
        os.environ.pop(PLANT_ENV, None)
    try:
        log(
            f"setup: {spec.bookies} bookies and ZooKeeper ({backend.name} backend) under "
            f"{directory}" + (f"; planted bug(s): {', '.join(spec.plant)}" if spec.plant else "")
        )
        backend.setup()
        with JsonlWriter(history) as writer:
            recorder = _CountingRecorder(writer, progress)
            counts, windows, after, tasks = backend.run_client(
                lambda: asyncio.run(_drive(spec, backend, recorder, log, nemesis, rng, directory))
            )
        if after:
            log("replication audit: stopping the bookies and dumping what each stores")
            entries = _dump_bookies(backend, directory / "dumps" / "entries.jsonl", log)
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
            if saved_plant is None:
                os.environ.pop(PLANT_ENV, None)
            else:
                os.environ[PLANT_ENV] = saved_plant

    ops = list(read_jsonl(history)) if history.exists() else []
    checks: dict[str, Any] = {}
    valid: bool | None = None
    if error is None:
        checks = {**check_history(ops), "cluster": _check_cluster(nemesis.events)}
        if after:
            checks["replication"] = _check_replication(after, entries, directory)
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
        backend=backend.name,
        plant=list(spec.plant),
        events=nemesis.events,
        throughput=_throughput(ops),
        add_latency=_add_latency(ops),
        spans=_spans(ops),
        under_replicated=tasks,
    )
    (directory / "results.json").write_text(json.dumps(asdict(result), indent=2) + "\n")
    return result
