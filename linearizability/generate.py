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

import collections
import concurrent.futures
import heapq
import itertools
import json
import multiprocessing
import os
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np
from numpy.typing import NDArray

from linearizability.history import JSON, Op, OpType, Process, pair

if TYPE_CHECKING:
    import pyarrow as pa

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


def drop_final_reads(
    ops: Sequence[Op], rng: random.Random, share: float = 1.0, ledgers: Iterable[int] | None = None
) -> list[Op]:
    """A copy of ``ops`` without the final reads (reads invoked after a ledger's
    last ok recovery completed) of a ``share`` of the entries of ``ledgers``
    (default: all), every final read of a chosen entry: a history whose
    durability a checker cannot decide in full. Indices are kept, so the
    anomalies of what is left name the same operations."""
    chosen = None if ledgers is None else set(ledgers)
    operations = pair(ops)
    recovered: dict[int, int] = {}  # ledger -> completion index of its last ok recovery
    for o in operations:
        if o.f == "recover" and o.status == "ok" and o.ledger is not None and o.complete:
            recovered[o.ledger] = o.complete.index
    unread: dict[tuple[int, int], bool] = {}  # (ledger, entry) -> its final reads go
    dropped: set[int] = set()
    for o in operations:
        if (
            o.f == "read"
            and o.ledger in recovered
            and (chosen is None or o.ledger in chosen)
            and o.invoke.index > recovered[o.ledger]
        ):
            key = (o.ledger, o.input["entry"])
            if unread.setdefault(key, rng.random() < share):
                dropped.add(o.invoke.index)
                if o.complete is not None:
                    dropped.add(o.complete.index)
    return [op for op in ops if op.index not in dropped]


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


# ---------------------------------------------------------------- columnar histories
# The simulation above draws one event at a time (about 40k lines/s): 10^8
# lines would take most of an hour. ``columnar_history`` draws each ledger's
# operations as whole arrays instead: times first, then what each operation
# observed at a point between its invocation and completion, so the history is
# linearizable by construction as before. It writes Arrow tables in the
# Parquet layout of :mod:`linearizability.history` (the value column's JSON is
# formatted by array arithmetic, not json.dumps).

TYPES: Final = ("invoke", "ok", "fail", "info")
FS: Final = ("create", "add", "read", "read_lac", "recover")
INVOKE, OK, FAIL, INFO = range(4)
CREATE_F, ADD_F, READ_F, LAC_F, RECOVER_F = range(5)
# value kinds (a template each; LITERAL: JSON text carried as is)
V_NULL, V_CREATE, V_ADD, V_FENCED, V_READ, V_FOUND, V_MISS, V_LAC, V_LAST, V_LITERAL = range(10)
_READERS: Final = 3
_CRASH: Final = 0.05
_LAC_READS: Final = 0.3
_EARLY_END: Final = 0.05  # ledgers whose recovery starts before all adds are sent


@dataclass
class LedgerColumns:
    """One ledger's lines in real-time order, as arrays (``t``: time in [0, 1))."""

    t: NDArray[Any]
    process: NDArray[Any]
    type: NDArray[Any]  # index into TYPES
    f: NDArray[Any]  # index into FS
    ledger: NDArray[Any]  # -1: null (a create's invocation)
    kind: NDArray[Any]  # value template, V_*
    a: NDArray[Any]  # the entry, LAC or last entry the value names
    r: NDArray[Any]  # the random part of an entry's data, "<ledger>.<entry>.<r>"
    literal: NDArray[Any]  # on V_LITERAL rows: index into ``texts``
    texts: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.t)

    def sorted(self) -> LedgerColumns:
        order = np.argsort(self.t, kind="stable")
        names = ("t", "process", "type", "f", "ledger", "kind", "a", "r", "literal")
        columns: dict[str, Any] = {n: getattr(self, n)[order] for n in names}
        return LedgerColumns(**columns, texts=self.texts)

    def ops(self) -> list[Op]:
        """As Ops (index = position), for planting and tests."""
        out = []
        for i in range(len(self)):
            k = int(self.kind[i])
            led = int(self.ledger[i])
            value = _value(k, led, int(self.a[i]), int(self.r[i]))
            if k == V_LITERAL:
                value = json.loads(self.texts[int(self.literal[i])])
            out.append(
                Op(
                    i,
                    1000 * i,
                    int(self.process[i]),
                    TYPES[self.type[i]],
                    FS[self.f[i]],
                    None if led < 0 else led,
                    value,
                )
            )
        return out


def _value(kind: int, ledger: int, a: int, r: int) -> JSON:
    data = f"{ledger}.{a}.{r}"
    values: dict[int, JSON] = {
        V_NULL: None,
        V_CREATE: dict(CREATE_VALUE),
        V_ADD: {"entry": a, "data": data},
        V_FENCED: {"error": "fenced"},
        V_READ: {"entry": a},
        V_FOUND: {"entry": a, "found": True, "data": data},
        V_MISS: {"entry": a, "found": False},
        V_LAC: {"lac": a},
        V_LAST: {"last_entry": a},
        V_LITERAL: None,
    }
    return values[kind]


def columnar_ledger(
    seed: Sequence[int], ledger: int, adds: int, reads: int, first_process: int
) -> LedgerColumns:
    """A campaign-shaped ledger (as ``gen_cli.campaign_ledger`` makes): a create,
    a pipelined writer (a process per add; 5% crash as info; adds that land
    after the fence fail as fenced), three readers of entries and the LAC (a
    crashed reader's process is retired), a recovery that completes, then final
    reads of entries 0..last by a fresh process. ``seed`` fixes it entirely."""
    rng = np.random.default_rng([*seed, ledger])
    # --- the writer: invocation, effect (in entry order) and completion times
    created = 1.0 + rng.exponential(1.0)
    sent = created + np.cumsum(rng.exponential(1.0, adds))
    effect = np.maximum.accumulate(sent + rng.exponential(2.0, adds))
    done = effect + rng.exponential(2.0, adds) + 1e-6
    if adds > 1 and rng.random() < _EARLY_END:
        cut = int(rng.integers(1, adds))
        sent, effect, done = sent[:cut], effect[:cut], done[:cut]
    n_sent = len(sent)
    rec_call = (sent[-1] if n_sent else created) + rng.exponential(1.0)
    rec_effect = rec_call + rng.exponential(1.0)
    applied = int(np.searchsorted(effect, rec_effect))  # effect is non-decreasing
    rec_done = rec_effect + rng.exponential(1.0)
    fenced = np.arange(n_sent) >= applied
    done[fenced] = np.maximum(sent[fenced], rec_effect) + rng.exponential(1.0, n_sent - applied)
    add_crash = ~fenced & (rng.random(n_sent) < _CRASH)
    data_r = rng.integers(0, 999, n_sent)
    add_proc = first_process + 1 + np.arange(n_sent)

    # --- the readers: each a sequence of operations spread over the ledger's life
    reader_of = rng.integers(0, _READERS, reads)
    order = np.argsort(reader_of, kind="stable")
    reader_of = reader_of[order]
    span = rec_done - created
    # (+ a little: an operation and the next of its process never share a time)
    scale = span / max(1.0, 2.0 * reads / _READERS)
    steps = rng.exponential(scale, 2 * reads).reshape(reads, 2) + 1e-6 * scale
    # boundaries: cumulative per reader (gap then duration)
    flat = steps.reshape(-1)
    cum = np.cumsum(flat).reshape(reads, 2)
    first_of = np.searchsorted(reader_of, np.arange(_READERS))
    base = np.zeros(reads)
    if reads:
        starts = np.concatenate(([0.0], cum[:-1, 1]))
        base = starts[first_of[reader_of]]
    r_call = created + cum[:, 0] - base
    r_done = created + cum[:, 1] - base
    r_at = r_call + rng.random(reads) * (r_done - r_call)
    is_lac = rng.random(reads) < _LAC_READS
    invoked = np.searchsorted(sent, r_call, side="right")  # adds sent by the call
    entry = np.minimum((rng.random(reads) * (invoked + 1)).astype(np.int64), invoked)
    exists = np.minimum(np.searchsorted(effect, r_at, side="right"), applied)
    found = entry < exists
    lac = np.maximum(exists - 1 - rng.geometric(0.6, reads) + 1, -1)
    r_crash = rng.random(reads) < _CRASH
    # a crashed reader continues under a fresh process id
    retired: NDArray[np.int64] = np.cumsum(r_crash) - r_crash  # crashes before each row
    if reads:
        retired -= retired[first_of[reader_of]]  # ... of its reader
    r_proc = first_process + n_sent + 3 + reader_of * (reads + 1) + retired

    # --- recovery, then final reads of every entry by one fresh process
    last = applied - 1
    final_proc = first_process + n_sent + 2
    n_final = applied
    ends = [done.max(initial=rec_done), r_done.max(initial=rec_done)]
    final0 = max(rec_done, *ends) + 1.0
    f_call = final0 + 2.0 * np.arange(n_final)
    f_done = f_call + 1.0

    # --- the lines: (t, process, type, f, ledger, kind, a, r)
    n_lines = 2 + 2 * n_sent + 2 * reads + 2 + 2 * n_final
    t = np.empty(n_lines)
    proc = np.empty(n_lines, np.int64)
    typ = np.empty(n_lines, np.int8)
    fc = np.empty(n_lines, np.int8)
    kind = np.empty(n_lines, np.int8)
    a = np.zeros(n_lines, np.int64)
    r = np.zeros(n_lines, np.int64)
    led = np.full(n_lines, ledger, np.int64)
    at = 0

    def put(  # noqa: PLR0917
        times: NDArray[Any] | float,
        process: NDArray[Any] | int,
        ty: NDArray[Any] | int,
        f: int,
        k: NDArray[Any] | int,
        av: NDArray[Any] | int = 0,
        rv: NDArray[Any] | int = 0,
        count: int = 1,
    ) -> None:
        nonlocal at
        s = slice(at, at + count)
        t[s], proc[s], typ[s], fc[s], kind[s], a[s], r[s] = times, process, ty, f, k, av, rv
        at += count

    put(0.0, first_process, INVOKE, CREATE_F, V_CREATE)
    led[0] = -1
    put(created, first_process, OK, CREATE_F, V_CREATE)
    idx = np.arange(n_sent)
    put(sent, add_proc, INVOKE, ADD_F, V_ADD, idx, data_r, n_sent)
    add_type = np.where(fenced, FAIL, np.where(add_crash, INFO, OK))
    add_kind = np.where(fenced, V_FENCED, np.where(add_crash, V_NULL, V_ADD))
    put(done, add_proc, add_type, ADD_F, add_kind, idx, data_r, n_sent)
    r_f = np.where(is_lac, LAC_F, READ_F)
    put(r_call, r_proc, INVOKE, 0, np.where(is_lac, V_NULL, V_READ), entry, 0, reads)
    fc[at - reads : at] = r_f
    r_kind = np.where(is_lac, V_LAC, np.where(found, V_FOUND, V_MISS))
    r_kind = np.where(r_crash, V_NULL, r_kind)
    r_a = np.where(is_lac, lac, entry)
    r_r = data_r[np.minimum(entry, max(n_sent - 1, 0))] if n_sent else 0
    put(r_done, r_proc, np.where(r_crash, INFO, OK), 0, r_kind, r_a, r_r, reads)
    fc[at - reads : at] = r_f
    put(rec_call, final_proc - 1, INVOKE, RECOVER_F, V_NULL)
    put(rec_done, final_proc - 1, OK, RECOVER_F, V_LAST, last)
    fidx = np.arange(n_final)
    put(f_call, final_proc, INVOKE, READ_F, V_READ, fidx, 0, n_final)
    put(f_done, final_proc, OK, READ_F, V_FOUND, fidx, data_r[:n_final], n_final)
    # Rows stay in this order (each invocation before its completion); the
    # batch is sorted by time once, in _merge.
    return LedgerColumns(
        t / (t.max() * (1 + 1e-9)), proc, typ, fc, led, kind, a, r, np.zeros(n_lines, np.int64)
    )


def _digits(v: NDArray[np.int64]) -> NDArray[np.int64]:
    """Decimal digits of |v| (at least 1)."""
    av = np.abs(v)
    nd = np.ones(len(v), np.int64)
    p = 10
    while (more := av >= p).any():
        nd += more
        p *= 10
    return nd


def format_rows(pieces: Sequence[str | NDArray[np.int64]], n: int) -> pa.Array:
    """An Arrow string array whose row i joins the pieces: a literal as is, an
    int64 array's i-th value in decimal. Each piece is laid out as a block of
    bytes with a mask (numbers right-aligned in a block as wide as the widest),
    and the masked bytes of all blocks, read row by row, are the strings: a
    few array operations per piece, where an f-string per row costs ~1 us."""
    import pyarrow as pa

    blocks: list[NDArray[np.uint8]] = []
    masks: list[NDArray[np.bool_]] = []
    for p in pieces:
        if isinstance(p, str):
            b = np.frombuffer(p.encode(), np.uint8)
            blocks.append(np.broadcast_to(b, (n, len(b))))
            masks.append(np.ones((n, len(b)), np.bool_))
            continue
        neg = p < 0
        nd = _digits(p) + neg
        width = int(nd.max(initial=1))
        powers = 10 ** np.arange(width - 1, -1, -1, dtype=np.int64)
        block = (np.abs(p)[:, None] // powers % 10 + 48).astype(np.uint8)
        cols = np.arange(width)
        block[neg, width - nd[neg]] = ord("-")
        blocks.append(block)
        masks.append(cols >= (width - nd)[:, None])
    mask = np.hstack(masks)
    buf = np.hstack(blocks)[mask]
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(mask.sum(axis=1), out=offsets[1:])
    if offsets[-1] >= 2**31:
        raise ValueError("too many bytes for one string array: format fewer rows at a time")
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(buf))


_CREATE_JSON: Final = json.dumps(CREATE_VALUE, separators=(",", ":"))


def _values(kind: NDArray[Any], c: dict[str, NDArray[Any]], texts: Sequence[str]) -> pa.Array:
    """The value column (JSON text) of rows with value kinds ``kind``."""
    import pyarrow as pa

    led, a, r = c["ledger"], c["a"], c["r"]
    data = '"data":"', led, ".", a, ".", r, '"}'
    templates: dict[int, tuple[str | NDArray[Any], ...]] = {
        V_CREATE: (_CREATE_JSON,),
        V_FENCED: ('{"error":"fenced"}',),
        V_ADD: ('{"entry":', a, ",", *data),
        V_READ: ('{"entry":', a, "}"),
        V_FOUND: ('{"entry":', a, ',"found":true,', *data),
        V_MISS: ('{"entry":', a, ',"found":false}'),
        V_LAC: ('{"lac":', a, "}"),
        V_LAST: ('{"last_entry":', a, "}"),
    }
    parts, where = [], []
    for k, template in templates.items():
        s = np.nonzero(kind == k)[0]
        if len(s):
            pieces = [p if isinstance(p, str) else p[s] for p in template]
            parts.append(format_rows(pieces, len(s)))
            where.append(s)
    s = np.nonzero(kind == V_LITERAL)[0]
    if len(s):
        parts.append(pa.array([texts[i] for i in c["literal"][s]], pa.string()))
        where.append(s)
    s = np.nonzero(kind == V_NULL)[0]
    parts.append(pa.nulls(len(s), pa.string()))
    where.append(s)
    perm = np.concatenate(where)
    inverse = np.empty_like(perm)
    inverse[perm] = np.arange(len(perm))
    return pa.concat_arrays(parts).take(pa.array(inverse))


def _merge(ledgers: Sequence[LedgerColumns], first_index: int) -> pa.Table:
    """Several ledgers' lines interleaved by time, as a table of the Parquet layout."""
    import pyarrow as pa

    from linearizability.history import parquet_schema

    names = ("t", "process", "type", "f", "ledger", "kind", "a", "r")
    c = {name: np.concatenate([getattr(x, name) for x in ledgers]) for name in names}
    texts: list[str] = []
    literal = []
    for x in ledgers:
        literal.append(x.literal + len(texts) if x.texts else np.zeros(len(x), np.int64))
        texts.extend(x.texts)
    c["literal"] = np.concatenate(literal)
    order = np.argsort(c["t"], kind="stable")
    c = {name: v[order] for name, v in c.items()}
    n = len(order)
    index = np.arange(first_index, first_index + n, dtype=np.int64)
    led = c["ledger"]
    return pa.table(
        {
            "index": index,
            "time": index * 1000,
            "process": c["process"],
            "type": pa.array(TYPES).take(pa.array(c["type"])),
            "f": pa.array(FS).take(pa.array(c["f"])),
            "ledger": pa.array(led, mask=led < 0),
            "value": _values(c["kind"], c, texts),
        },
        schema=parquet_schema(),
    )


def _from_ops(ops: Sequence[Op]) -> LedgerColumns:
    """A (planted) ledger's Ops as columns whose values are carried as JSON text."""
    n = len(ops)
    texts = [json.dumps(op.value, separators=(",", ":")) for op in ops if op.value is not None]
    kind = np.array([V_NULL if op.value is None else V_LITERAL for op in ops], np.int8)
    return LedgerColumns(
        t=(np.arange(n) + 0.5) / n,
        process=np.array([int(op.process) for op in ops], np.int64),
        type=np.array([TYPES.index(op.type) for op in ops], np.int8),
        f=np.array([FS.index(op.f) for op in ops], np.int8),
        ledger=np.array([-1 if op.ledger is None else op.ledger for op in ops], np.int64),
        kind=kind,
        a=np.zeros(n, np.int64),
        r=np.zeros(n, np.int64),
        literal=np.cumsum(kind == V_LITERAL) - 1,
        texts=texts,
    )


def columnar_history(
    ops: int, ledgers: int, *, seed: int = 0, anomaly: str | None = None
) -> Iterator[pa.Table]:
    """About ``ops`` lines over ``ledgers`` ledgers as Arrow tables (the Parquet
    layout of :func:`linearizability.history.parquet_schema`), ledgers
    interleaved a batch at a time. The same arguments give the same history;
    ``anomaly`` plants one of that kind (:func:`plant`) in one ledger."""
    per_ledger = max(ops // max(ledgers, 1), 8)
    # 7 lines per add: its own 2, 1.5 reads (3), a final read (2)
    adds = max(1, per_ledger // 7)
    reads = adds * 3 // 2
    stride = max(1_000_000, 10 ** len(str(adds + 4 * reads + 10)))
    target = random.Random(seed).randrange(ledgers) + 1 if anomaly else -1
    size = max(1, min(64, 2_000_000 // per_ledger))
    batches = [
        _Batch(seed, range(s, min(s + size, ledgers + 1)), adds, reads, stride, target, anomaly)
        for s in range(1, ledgers + 1, size)
    ]
    workers = min(len(batches), os.cpu_count() or 1, 4)
    index = 0
    if workers < 2:
        for b in batches:
            table = _merge(b(), index)
            index += table.num_rows
            yield table
        return
    # Batches are independent (each ledger has its own seed): draw them in
    # worker processes, a few ahead, and renumber the lines here, in order.
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        pending: collections.deque[concurrent.futures.Future[pa.Table]] = collections.deque()
        todo = iter(batches)
        for b in itertools.islice(todo, workers + 1):
            pending.append(pool.submit(_merged, b))
        while pending:
            table = pending.popleft().result()
            for b in itertools.islice(todo, 1):
                pending.append(pool.submit(_merged, b))
            yield _renumber(table, index)
            index += table.num_rows


@dataclass(frozen=True)
class _Batch:
    """Ledgers drawn and interleaved together."""

    seed: int
    ledgers: range
    adds: int
    reads: int
    stride: int
    target: int
    anomaly: str | None

    def __call__(self) -> list[LedgerColumns]:
        cols = []
        for ledger in self.ledgers:
            first = (ledger - 1) * self.stride
            if ledger == self.target and self.anomaly is not None:
                planted = _planted_columns(
                    self.seed, ledger, self.adds, self.reads, first, self.anomaly
                )
                cols.append(planted)
            else:
                cols.append(columnar_ledger((self.seed,), ledger, self.adds, self.reads, first))
        return cols


def _merged(batch: _Batch) -> pa.Table:
    return _merge(batch(), 0)


def _renumber(table: pa.Table, first: int) -> pa.Table:
    import pyarrow as pa

    index = np.arange(first, first + table.num_rows, dtype=np.int64)
    columns = [pa.array(index), pa.array(index * 1000), *table.columns[2:]]
    return pa.Table.from_arrays(columns, schema=table.schema)


def _planted_columns(  # noqa: PLR0917
    seed: int, ledger: int, adds: int, reads: int, first: int, kind: str
) -> LedgerColumns:
    rng = random.Random(f"{seed}:{ledger}:{kind}")
    for attempt in range(100):
        cols = columnar_ledger((seed, 1 + attempt), ledger, adds, reads, first)
        ops = cols.sorted().ops()
        planted = plant(rng, ops, kind)
        if planted is not None:
            return _from_ops(planted)
    raise ValueError(f"could not plant {kind!r} in 100 generated ledgers; try more ops")


def write_columnar(tables: Iterable[pa.Table], path: Path) -> int:
    """Write tables to one Parquet file (``*.parquet``) or as JSON Lines; the count."""
    import pyarrow.parquet as pq

    from linearizability.history import parquet_schema, write_history

    if path.suffix != ".parquet":

        def rows() -> Iterator[Op]:
            for table in tables:
                for row in table.to_pylist():
                    text = row["value"]
                    yield Op(
                        row["index"],
                        row["time"],
                        row["process"],
                        row["type"],
                        row["f"],
                        row["ledger"],
                        None if text is None else json.loads(text),
                    )

        return write_history(rows(), path)
    n = 0
    # Dictionaries only where values repeat: the others are nearly all distinct.
    dictionary = ["type", "f", "ledger"]
    with pq.ParquetWriter(
        str(path), parquet_schema(), compression="zstd", use_dictionary=dictionary
    ) as writer:
        for table in tables:
            writer.write_table(table, row_group_size=1 << 20)
            n += table.num_rows
    return n
