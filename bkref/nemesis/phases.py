"""The phases of one run between setup and the checks: safety, heal, final, convergence.

2. safety: the workload runs while the nemesis walks its fault schedule;
3. heal: every fault is reverted (the schedule closes all windows) and the
   writers finish their ledgers (close, or crash and get recovered);
4. final: every ledger is recovered and read back in full;
5. convergence (with AutoRecovery): the cluster must repair every ledger,
   then pass a full read of every replica (and repair what that finds); then
   every bookie is stopped and what it stores dumped, for the replication audit.

Setup (1) and the checks and report (6) are the runner's (:mod:`bkref.nemesis.runner`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kazoo.exceptions import KazooException

from bkref.impl.autorecovery.auditor import check_replicas
from bkref.impl.bookie.config import BookieConfig
from bkref.impl.client.client import BookKeeper
from bkref.impl.core.metadata import LedgerMetadata
from bkref.impl.meta.store import NoSuchLedgerError
from bkref.impl.meta.underreplication import UnderreplicationManager
from bkref.impl.trace import Tracer
from bkref.linearizability.history import NEMESIS, Recorder
from bkref.nemesis.backends.base import Backend
from bkref.nemesis.faults import VICTIM_KINDS, FaultWindow
from bkref.nemesis.generator import ScheduleSpec, schedule
from bkref.nemesis.nemesis import Log, Nemesis
from bkref.nemesis.scrape import Scraper
from bkref.nemesis.workload import Workload

if TYPE_CHECKING:
    from bkref.nemesis.runner import RunSpec


@dataclass
class Phases:
    """What the phases leave for the checks and the report."""

    counts: Counter[str]  # fault windows opened, by kind
    windows: list[FaultWindow]
    after: dict[str, Any]  # the convergence phase's findings ({} without AutoRecovery)
    under_replicated: list[list[int]]  # [second, ledgers marked] over the run
    # The bookies' /metrics, scraped once a second (bkref.nemesis.scrape): series by name.
    scraped: dict[str, Any] = field(default_factory=dict)


async def drive(  # noqa: PLR0917 (one run's parts, each used once)
    spec: RunSpec,
    backend: Backend,
    recorder: Recorder,
    log: Log,
    nemesis: Nemesis,
    rng: random.Random,
    directory: Path,
) -> Phases:
    """The safety, heal, final and convergence phases, on a cluster that is set up."""
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
    plants = frozenset(spec.plant)
    # The client half of a planted bug (recovery, the writer) runs in this process.
    tracer = None if backend.trace_dir is None else Tracer(backend.trace_dir, "client")
    bk = BookKeeper(backend.zk_connect, seed=rng.getrandbits(64), plants=plants, tracer=tracer)
    await bk.start()
    nemesis.find_auditor = _auditor_finder(bk, backend)
    sampler = _TaskSampler(UnderreplicationManager(bk.meta.zk, bk.root), recorder.elapsed_ns)
    sampler.start()
    targets = backend.metrics_targets()
    scraper = Scraper(targets, recorder.elapsed_ns, backend.scrape_in).start() if targets else None
    scraped: dict[str, Any] = {}
    try:
        workload = Workload(
            bk,
            recorder,
            spec.workload,
            random.Random(rng.getrandbits(64)),
            zk=backend.zk_connect,
            writer_log=directory / "writers.log",
            plants=plants,
            trace_dir=backend.trace_dir,
        )
        nemesis.writer_killer = workload.kill_writer
        stop = asyncio.Event()
        log(f"safety phase: {spec.duration:.0f} s, {len(windows)} fault windows")
        work = asyncio.create_task(workload.run(stop))
        await nemesis.walk(windows, recorder, log, counts)
        remaining = spec.duration - max((w.stop for w in windows), default=0.0)
        await asyncio.sleep(max(0.0, remaining))
        recorder.record(NEMESIS, "info", "heal", None, {"event": "start"})
        await asyncio.get_running_loop().run_in_executor(nemesis.executor, nemesis.heal)
        log("heal phase: faults reverted; writers finish their ledgers")
        stop.set()
        await work
        log(f"final phase: recovering and reading back {len(workload.ledgers)} ledgers")
        await workload.final_reads()
        after: dict[str, Any] = {}
        if spec.autorecovery:
            after = await _convergence(spec, bk, counts, rng, log)
    finally:
        sampler.stop()
        if scraper is not None:
            scraped = scraper.stop()
        await bk.close()
        if tracer is not None:
            tracer.close()
    return Phases(counts, windows, after, sampler.series(), scraped)


async def _convergence(
    spec: RunSpec, bk: BookKeeper, counts: Counter[str], rng: random.Random, log: Log
) -> dict[str, Any]:
    log("convergence: waiting for AutoRecovery to repair every ledger")
    after = await converge(bk, spec.converge_timeout)
    if after["converged"]:
        # Then every replica read in full, as an operator would before trusting the
        # cluster: with Aq < Wq a crash can leave an acknowledged entry on only Aq
        # bookies, a gap only a check that reads it finds. Its repairs converge too.
        urm = UnderreplicationManager(bk.meta.zk, bk.root)
        found = await check_replicas(bk, urm, 100, random.Random(rng.getrandbits(64)))
        marked = len(found)
        log(f"convergence: the full replica check marked {marked} ledger(s)")
        wq_is_aq = {r["ledger"] for r in after["ledgers"] if r["write_quorum"] == r["ack_quorum"]}
        if marked:
            first = after["seconds"]
            after = await converge(bk, spec.converge_timeout)
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
    return after


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


def _auditor_finder(bk: BookKeeper, backend: Backend) -> Callable[[], str | None]:
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


async def converge(bk: BookKeeper, timeout: float) -> dict[str, Any]:
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


def dump_bookies(backend: Backend, out: Path, log: Log) -> list[dict[str, Any]]:
    """Stop every bookie and read what each stores (``bkref bookie --dump``)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    for node, config in backend.bookie_configs().items():
        with contextlib.suppress(Exception):
            backend.kill(node)
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "bkref.impl.bookie",
                "--config",
                str(config),
                "--dump",
                str(out),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            log(f"dump of {node} failed: {done.stderr.strip()[-500:]}")
    return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
