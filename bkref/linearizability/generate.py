"""Ledger histories made to order, by simulation: valid by construction.

For tests and benchmarks here and in other projects (a checker's test helper
belongs in the package). ``ledger_history`` simulates one ledger's clients
against the sequential ledger model: a pipelined writer (one process per add
in flight), concurrent readers reading entries and the LAC, crashes (``info``),
and a close by the writer or a recovery that fences it. LAC reads behave as
BookKeeper's readLastAddConfirmed may: a reader can be told less than an
earlier reader was, and less than the last entry after a close. Every operation takes
effect at a point between its invocation and completion, so the result is
linearizable by construction. :func:`bkref.linearizability.plant.plant` then adds one
anomaly of a named kind; :mod:`bkref.linearizability.columnar` draws whole ledgers
as arrays, for histories of 10^8 lines.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Final, TypeAlias

from bkref.linearizability.history import JSON, Op, OpType, Process

CREATE_VALUE: Final = {"ensemble": 3, "write_quorum": 2, "ack_quorum": 2}
# One line of a history before it has an index and a time: (process, type, f, ledger, value).
Event: TypeAlias = tuple[Process, OpType, str, int | None, JSON]


@dataclass
class _Active:
    process: int
    f: str
    value: JSON  # the invocation's value
    applied: bool = False
    result: JSON = None
    entry: int = -1  # adds


@dataclass
class _Sim:
    rng: random.Random
    ledger: int
    next_process: int
    out: list[Event] = field(default_factory=list)
    entries: list[str] = field(default_factory=list)
    lac: int = -1  # the highest LAC any reader was told
    closed: bool = False

    def emit(self, a: _Active, typ: OpType, value: JSON, ledger: int | None = -1) -> None:
        self.out.append((a.process, typ, a.f, self.ledger if ledger == -1 else ledger, value))

    def fresh(self) -> int:
        self.next_process += 1
        return self.next_process - 1


def ledger_history(
    rng: random.Random,
    *,
    ledger: int = 1,
    adds: int = 20,
    reads: int = 20,
    readers: int = 3,
    in_flight: int = 5,
    end: str | None = "recover",
    create: bool = True,
    crash: float = 0.05,
    first_process: int = 0,
    end_early: float = 0.02,
) -> list[Event]:
    """One ledger's history as (process, type, f, ledger, value) in real-time order.

    ``end``: ``"recover"`` (another client opens with recovery, fencing the
    writer), ``"close"`` (the writer closes) or None (left open); at each step
    it starts with probability ``end_early`` before the adds are all sent.
    """
    sim = _Sim(rng, ledger, first_process)
    active: list[_Active] = []
    unapplied_adds: list[tuple[int, int]] = []  # heap of (entry, id(active)) still to take effect
    by_id: dict[int, _Active] = {}
    next_entry = 0
    reads_left = reads
    ready = not create
    ender: _Active | None = None
    if create:
        c = _Active(sim.fresh(), "create", CREATE_VALUE)
        sim.emit(c, "invoke", CREATE_VALUE, ledger=None)
        active.append(c)
    free_readers = [sim.fresh() for _ in range(readers)]

    def complete(a: _Active) -> None:
        active.remove(a)
        if a.f == "create":
            sim.emit(a, "ok", CREATE_VALUE)
        elif rng.random() < crash:
            sim.emit(a, "info", None)
            if a.f in ("read", "read_lac"):
                free_readers.append(sim.fresh())  # the crashed reader's id is retired
            return
        else:
            sim.emit(a, "ok", a.result)
        if a.f in ("read", "read_lac"):
            free_readers.append(a.process)

    def apply(a: _Active) -> None:
        a.applied = True
        n = len(sim.entries)
        if a.f == "create":
            return
        if a.f == "add":
            sim.entries.append(a.value["data"])
            a.result = a.value
        elif a.f == "read":
            e = a.value["entry"]
            found = e < n
            a.result = {"entry": e, "found": found, **({"data": sim.entries[e]} if found else {})}
        elif a.f == "read_lac":
            # A LAC is a hint, a lower bound on the entries that exist: mostly
            # at least what readers were told before, but sometimes less (the
            # reader reached other bookies), and after close not always the
            # last entry.
            told = n - 1 if sim.closed else sim.lac
            if rng.random() < 0.3:
                v = rng.randint(max(-1, told - 2), n - 1)  # may go back or lag the close
            else:
                v = rng.randint(told, n - 1)
            sim.lac = max(sim.lac, v)
            a.result = {"lac": v}
        else:
            sim.closed = True
            a.result = {"last_entry": n - 1}

    def apply_next_add() -> None:
        _, key = heapq.heappop(unapplied_adds)
        apply(by_id[key])

    while True:
        moves: list[Callable[[], None]] = []
        adds_in_flight = sum(1 for a in active if a.f == "add")
        if ready and next_entry < adds and not sim.closed and adds_in_flight < in_flight:

            def invoke_add() -> None:
                nonlocal next_entry
                value = {"entry": next_entry, "data": f"{ledger}.{next_entry}.{rng.randrange(999)}"}
                a = _Active(sim.fresh(), "add", value, entry=next_entry)
                next_entry += 1
                sim.emit(a, "invoke", value)
                active.append(a)
                by_id[id(a)] = a
                heapq.heappush(unapplied_adds, (a.entry, id(a)))

            moves += [invoke_add] * 3
        if ready and reads_left and free_readers:

            def invoke_read() -> None:
                nonlocal reads_left
                reads_left -= 1
                p = free_readers.pop(rng.randrange(len(free_readers)))
                if rng.random() < 0.3:
                    a = _Active(p, "read_lac", None)
                else:
                    a = _Active(p, "read", {"entry": rng.randint(0, next_entry)})
                sim.emit(a, "invoke", a.value)
                active.append(a)

            moves += [invoke_read] * 2
        if ready and end and ender is None and (next_entry >= adds or rng.random() < end_early):

            def invoke_end() -> None:
                nonlocal ender
                ender = _Active(sim.fresh(), end or "recover", None)
                sim.emit(ender, "invoke", None)
                active.append(ender)

            moves.append(invoke_end)
        if unapplied_adds and not sim.closed:
            # Adds take effect in entry order; the lowest one may go now.
            moves += [apply_next_add] * 2
        for a in active:
            if not a.applied and a.f != "add":
                moves.append(partial(apply, a))
            elif a.applied:
                moves.append(partial(complete, a))
        if sim.closed:
            # The writer learns it is fenced: pending adds that did not take effect fail.
            for a in active:
                if a.f == "add" and not a.applied:
                    moves.append(partial(_fail_fenced, sim, active, a))
        if not moves:
            break
        rng.choice(moves)()
        if not ready and create and not active:
            ready = True
    return sim.out


def _fail_fenced(sim: _Sim, active: list[_Active], a: _Active) -> None:
    active.remove(a)
    sim.emit(a, "fail", {"error": "fenced"})


def to_ops(events: Sequence[Event]) -> list[Op]:
    """Give events indices and times, in order."""
    return [Op(i, 1000 * i, p, t, f, led, v) for i, (p, t, f, led, v) in enumerate(events)]


def interleave(rng: random.Random, histories: Sequence[Sequence[Event]]) -> list[Op]:
    """Merge several ledgers' histories at random, keeping each one's order."""
    cursors = [0] * len(histories)
    live = [i for i, h in enumerate(histories) if h]
    merged = []
    while live:
        k = rng.randrange(len(live))
        i = live[k]
        merged.append(histories[i][cursors[i]])
        cursors[i] += 1
        if cursors[i] == len(histories[i]):
            live.pop(k)
    return to_ops(merged)


def many_ledgers(
    rng: random.Random, ledgers: int, ops_per_ledger: int, **kwargs: float | str | None
) -> list[Op]:
    """``ledgers`` ledgers of about ``ops_per_ledger`` ops each, interleaved."""
    histories = []
    for i in range(ledgers):
        half = ops_per_ledger // 2
        histories.append(
            ledger_history(
                rng,
                ledger=i + 1,
                adds=half * 2 // 5,
                reads=half * 3 // 5,
                first_process=i * 1_000_000,
                **kwargs,  # type: ignore[arg-type]
            )
        )
    return interleave(rng, histories)
