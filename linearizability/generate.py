"""Ledger histories made to order: valid ones by simulation, bad ones by planting.

For tests and benchmarks here and in other projects (a checker's test helper
belongs in the package). ``ledger_history`` simulates one ledger's clients
against the sequential ledger model: a pipelined writer (one process per add
in flight), concurrent readers reading entries and the LAC, crashes (``info``),
and a close by the writer or a recovery that fences it. LAC reads behave as
BookKeeper's readLastAddConfirmed may: a reader can be told less than an
earlier reader was, and less than the last entry after a close. Every operation takes
effect at a point between its invocation and completion, so the result is
linearizable by construction. ``plant`` then adds one anomaly of a named kind.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Final

from linearizability.history import JSON, Op, OpType, Process

CREATE_VALUE: Final = {"ensemble": 3, "write_quorum": 2, "ack_quorum": 2}


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
    out: list[tuple[Process, OpType, str, int | None, JSON]] = field(default_factory=list)
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
) -> list[tuple[Process, OpType, str, int | None, JSON]]:
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


def to_ops(events: Sequence[tuple[Process, OpType, str, int | None, JSON]]) -> list[Op]:
    """Give events indices and times, in order."""
    return [Op(i, 1000 * i, p, t, f, led, v) for i, (p, t, f, led, v) in enumerate(events)]


def interleave(
    rng: random.Random, histories: Sequence[Sequence[tuple[Process, OpType, str, int | None, JSON]]]
) -> list[Op]:
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


# ---------------------------------------------------------------- planting anomalies


def _reindex(ops: Sequence[Op]) -> list[Op]:
    return [op._replace(index=i, time=1000 * i) for i, op in enumerate(ops)]


def _completions(ops: Sequence[Op], f: str, typ: str = "ok") -> Iterator[tuple[int, Op]]:
    for i, op in enumerate(ops):
        if op.f == f and op.type == typ:
            yield i, op


def plant(rng: random.Random, ops: Sequence[Op], kind: str) -> list[Op] | None:
    """A copy of a valid one-ledger history with one anomaly of ``kind`` planted,
    or None if this history has no place for it (try another)."""
    ops = list(ops)
    process = max(int(op.process) for op in ops if op.process != "nemesis") + 1
    led = next((op.ledger for op in ops if op.ledger is not None), 1)

    def pair_ops(f: str, inp: JSON, typ: OpType, out: JSON) -> list[Op]:
        return [Op(0, 0, process, "invoke", f, led, inp), Op(0, 0, process, typ, f, led, out)]

    def insert(at: int, new: list[Op]) -> list[Op]:
        return _reindex([*ops[:at], *new, *ops[at:]])

    acked = [(i, op) for i, op in _completions(ops, "add")]
    closes = [(i, op) for f in ("close", "recover") for i, op in _completions(ops, f)]
    if kind == "stale-read" and acked:
        i, op = rng.choice(acked)
        e = op.value["entry"]
        return insert(i + 1, pair_ops("read", {"entry": e}, "ok", {"entry": e, "found": False}))
    if kind == "divergent-read" and acked:
        i, op = rng.choice(acked)
        e, d = op.value["entry"], op.value["data"]
        found = {"entry": e, "found": True, "data": d + "!"}
        return insert(i + 1, pair_ops("read", {"entry": e}, "ok", found))
    if kind == "duplicate" and acked:
        i, op = rng.choice(acked)
        return insert(i + 1, pair_ops("add", op.value, "ok", op.value))
    if kind == "future-read" and acked:
        i, op = rng.choice(acked)
        e = op.value["entry"]
        inv = next(j for j in range(i) if ops[j].process == op.process and ops[j].type == "invoke")
        found = {"entry": e, "found": True, "data": op.value["data"]}
        return insert(inv, pair_ops("read", {"entry": e}, "ok", found))
    if kind == "nonmonotonic":
        # An add acknowledged before the add of the entry below it was sent:
        # move the whole add of entry e - 1 to just after the ack of entry e.
        # (A LAC that goes back is not an anomaly: LAC reads are a lower bound.)
        sent = {
            op.value["entry"]: j
            for j, op in enumerate(ops)
            if op.f == "add" and op.type == "invoke"
        }
        pairs = [(i, op.value["entry"]) for i, op in acked if op.value["entry"] - 1 in sent]
        if not pairs:
            return None
        i, e = rng.choice(pairs)
        j = sent[e - 1]
        moved = [j, *[k for k in range(j + 1, len(ops)) if ops[k].process == ops[j].process][:1]]
        kept = [(k, op) for k, op in enumerate(ops) if k not in moved]
        return _reindex(
            [op for k, op in kept if k <= i]
            + [ops[k] for k in moved]
            + [op for k, op in kept if k > i]
        )
    if not closes:
        return None
    ci, close = closes[0]
    last = close.value["last_entry"]
    if kind == "lost-write":
        if not any(op.value["entry"] == last for _, op in acked):
            return None
        ops[ci] = close._replace(value={"last_entry": last - 1})
        for j in range(ci + 1, len(ops)):  # later closes agree, so only the loss shows
            if ops[j].f in ("close", "recover") and ops[j].type == "ok":
                ops[j] = ops[j]._replace(value={"last_entry": last - 1})
        return _reindex(ops)
    if kind == "read-of-truncated-entry":
        inv = next(
            j for j in range(ci) if ops[j].process == close.process and ops[j].type == "invoke"
        )
        e = last + 1
        add = {"entry": e, "data": "unacked"}
        writer = [Op(0, 0, process + 1, "invoke", "add", led, add)]
        read = pair_ops("read", {"entry": e}, "ok", {"entry": e, "found": True, "data": "unacked"})
        return insert(inv, writer + read)
    if kind == "ack-after-fence":
        add = {"entry": last + 1, "data": "late"}
        return insert(ci + 1, pair_ops("add", add, "ok", add))
    if kind == "disagreeing-closes":
        return insert(ci + 1, pair_ops("recover", None, "ok", {"last_entry": last + 1}))
    if kind == "skip":
        if last < 1:
            return None
        e = rng.randrange(last)  # below the last entry, which the close proves
        drop: set[int] = set()
        open_at: dict[Process, int] = {}
        for i, op in enumerate(ops):
            if op.type == "invoke":
                open_at[op.process] = i
                if op.f in ("add", "read") and _names(op, e):
                    drop.add(i)
            elif open_at.pop(op.process, -1) in drop:
                drop.add(i)  # the completion of an operation on entry e
        return _reindex([op for i, op in enumerate(ops) if i not in drop])
    return None


def _names(op: Op, e: int) -> bool:
    return isinstance(op.value, dict) and op.value.get("entry") == e
