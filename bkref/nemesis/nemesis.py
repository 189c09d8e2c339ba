"""The nemesis: it walks a run's fault schedule in real time and records what each fault did.

As Jepsen's nemesis, it is a client of the cluster like the workload's, whose
operations go into the same history (process ``nemesis``): each window's
start and stop is recorded when it is invoked and again, with what it did,
when it completes. How a fault starts and stops is its record's business
(:mod:`bkref.nemesis.faults`); the nemesis resolves auditor windows to the node
they hit, keeps the nodes that refused to restart out for the rest of the
run, and turns a node that will not come back into a finding rather than a
crash of the run.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bkref.linearizability.history import NEMESIS, Recorder
from bkref.nemesis.backends.base import Backend, NodeRefusedError
from bkref.nemesis.disk import NothingToCorruptError
from bkref.nemesis.faults import FAULTS, Aim, FaultWindow, Shape, cut_from

Log = Callable[[str], None]


class Nemesis:
    """Applies fault windows to a backend and records what happened (Jepsen's nemesis)."""

    def __init__(self, backend: Backend, rng: random.Random) -> None:
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
        self.writer_killer: Callable[[], int | None] = lambda: None
        self._hit: dict[FaultWindow, str] = {}  # auditor windows: the node each one hit

    # ------------------------------------------------------------ the faults' hands

    def kill_writer(self) -> int | None:
        return self.writer_killer()

    def restart(self, node: str) -> dict[str, Any]:
        if node in self.refused:
            return {"skipped": f"{node} stays down (it refused to start)"}
        self.backend.start(node)
        return {}

    def restart_together(self, nodes: Sequence[str], w: FaultWindow) -> dict[str, Any]:
        def start(node: str) -> str | None:
            try:
                self.backend.start(node)
            except Exception as e:  # refused, or would not come back: a finding either way
                return f"{type(e).__name__}: {e}"
            return None

        with ThreadPoolExecutor(len(nodes) or 1) as pool:
            outcomes = list(pool.map(start, nodes))
        for node, error in zip(nodes, outcomes, strict=True):
            if error is not None:
                self._refused(node, w, error)
        return {}

    def live_bookies(self) -> list[str]:
        return [b for b in self.backend.bookies if b not in self.refused]

    # ------------------------------------------------------------ windows

    def _resolve(self, w: FaultWindow, start: bool) -> tuple[FaultWindow, dict[str, Any]]:
        """An auditor window aimed at the node it hits: the elected auditor at its start."""
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
        b = self.backend
        cut = FAULTS[w.kind].shape is Shape.CUT_FROM_ZOOKEEPER and b.network and b.zookeepers
        return FaultWindow(
            w.start, w.stop, w.kind, node, cut_from(node, b.zookeepers) if cut else ()
        ), out

    def apply(self, w: FaultWindow, event: str) -> dict[str, Any]:
        """Start or stop one window; a dict saying what it did (into the history)."""
        start = event == "start"
        f = FAULTS[w.kind]
        out: dict[str, Any] = {}
        if f.aim is Aim.AUDITOR:
            w, out = self._resolve(w, start)
            if "skipped" in out:
                self.events.append({"kind": w.kind, "target": w.target, "event": event, **out})
                return out
        try:
            out.update((f.start if start else f.stop)(self, w))
        except NodeRefusedError as e:
            out.update(self._refused(w.target, w, str(e)))
        except NothingToCorruptError as e:
            out["skipped"] = str(e)
        except Exception as e:  # a node that will not come back is a finding, not a crash
            if start:
                raise
            out.update(self._refused(w.target, w, f"{type(e).__name__}: {e}"))
        if out:
            self.events.append({"kind": w.kind, "target": w.target, "event": event, **out})
        return out

    def _refused(self, node: str, w: FaultWindow, message: str) -> dict[str, Any]:
        self.refused.add(node)
        expected = FAULTS[w.kind].out_for_good
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

    async def walk(
        self, windows: list[FaultWindow], recorder: Recorder, log: Log, counts: Counter[str]
    ) -> None:
        """Start and stop every window at its instant of the run (from now), in order."""
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
            did = await loop.run_in_executor(self.executor, self.apply, w, event)
            # The fault's completion: a restart or a disk fault takes time, and says what it did.
            recorder.record(NEMESIS, "info", w.kind, None, {**value, "done": True, **did})
            if did:
                log(f"nemesis: {w.kind} {event} {w.target}: {did}")
            if event == "start":
                counts[w.kind] += 1

    def heal(self) -> None:
        """Revert every fault still in force (the heal phase), on the nemesis's thread."""
        self.backend.heal()
