"""Anomalies planted in valid ledger histories, and final reads taken away.

For tests and benchmarks here and in other projects: :func:`plant` puts one
anomaly of a named kind (:data:`bkref.linearizability.anomalies.ANOMALY_KINDS`) into
a valid one-ledger history (:mod:`bkref.linearizability.generate`); the checkers
must find it. :func:`drop_final_reads` makes a history whose durability a
checker cannot decide in full.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Sequence

from bkref.linearizability.history import JSON, Op, OpType, Process, pair


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
