"""Register and key-value histories with unique writes, made to order; anomalies planted.

For tests and benchmarks here and in other projects. :func:`register_history`
simulates clients of registers (``register``: read/write; ``cas-register``:
read/write/cas) or of a string key-value store (``kv``: get/put), one
operation at a time per client. Every operation takes effect at a point
between its invocation and its completion against a real store, so the
history is linearizable by construction. Every write writes a value never
written before, so :mod:`bkref.linearizability.unique` decides it. Some
operations crash (``info``, and the client continues under a new process id),
before or after taking effect; a cas whose expected value is not there fails.

:func:`plant` then adds one anomaly of a kind in :data:`PLANTS` and returns
where, so that a test can check the proof a checker gives names it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from bkref.linearizability.generate import Event
from bkref.linearizability.history import JSON, OpType

MODELS: Final = ("register", "cas-register", "kv")
PLANTS: Final = ("stale-read", "never-written", "future-read", "lost-cas", "opposite-orders")
_INIT: Final[dict[str, JSON]] = {"register": None, "cas-register": None, "kv": ""}


@dataclass
class _Active:
    process: int
    f: str
    key: int
    arg: JSON  # a write's value, a cas's [from, to]
    applied: bool = False
    result: JSON = None  # a read's value
    ok: bool = True  # a cas that found its value


class _Store:
    """The history's vocabulary for one model."""

    def __init__(self, model: str, keys: int) -> None:
        if model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}, not {model!r}")
        self.model = model
        self.kv = model == "kv"
        self.keys = keys
        self.read = "get" if self.kv else "read"
        self.write = "put" if self.kv else "write"
        self.next = 1

    def fresh(self) -> JSON:
        self.next += 1
        return f"v{self.next - 1}" if self.kv else self.next - 1

    def event(self, process: int, typ: OpType, f: str, key: int, value: JSON) -> Event:
        if self.kv:
            return (process, typ, f, None, {"key": f"k{key}", "value": value})
        return (process, typ, f, key if self.keys > 1 else None, value)


def register_history(
    rng: random.Random,
    ops: int,
    clients: int,
    keys: int = 1,
    model: str = "cas-register",
    *,
    reads: float = 0.5,
    cas: float = 0.25,
    crash: float = 0.02,
) -> list[Event]:
    """``ops`` operations of ``clients`` clients on ``keys`` keys, as events in
    real-time order (:func:`bkref.linearizability.generate.to_ops` numbers them).

    ``reads``: the share of reads; ``cas``: of cas (cas-register only; the rest
    are writes); ``crash``: the chance that an operation ends ``info``.
    """
    store = _Store(model, keys)
    state: list[JSON] = [_INIT[model]] * keys
    written: list[list[JSON]] = [[] for _ in range(keys)]
    out: list[Event] = []
    active: list[_Active | None] = [None] * clients
    process = list(range(clients))
    next_process = clients
    issued = 0
    cas = cas if model == "cas-register" else 0.0

    def invoke(c: int) -> None:
        key = rng.randrange(keys)
        x = rng.random()
        if x < reads:
            a = _Active(process[c], store.read, key, None)
        elif x < reads + cas:
            old = written[key]
            frm = state[key] if rng.random() < 0.8 or not old else rng.choice(old)
            a = _Active(process[c], "cas", key, [frm, store.fresh()])
        else:
            a = _Active(process[c], store.write, key, store.fresh())
        out.append(store.event(a.process, "invoke", a.f, key, a.arg))
        active[c] = a

    def apply(a: _Active) -> None:
        a.applied = True
        if a.f == store.read:
            a.result = state[a.key]
        elif a.f == "cas":
            assert isinstance(a.arg, list)
            a.ok = state[a.key] == a.arg[0]
            if a.ok:
                state[a.key] = a.arg[1]
                written[a.key].append(a.arg[1])
        else:
            state[a.key] = a.arg
            written[a.key].append(a.arg)

    def complete(c: int, a: _Active, typ: OpType) -> None:
        nonlocal next_process
        active[c] = None
        if typ == "info":  # the client crashed: it goes on under a new id
            process[c] = next_process
            next_process += 1
        value = a.result if a.f == store.read and typ == "ok" else a.arg
        out.append(store.event(a.process, typ, a.f, a.key, value))

    busy: list[int] = []
    while True:
        if issued < ops:
            c = rng.randrange(clients)
        else:
            busy = [i for i in range(clients) if active[i] is not None]
            if not busy:
                break
            c = rng.choice(busy)
        a = active[c]
        if a is None:
            if issued < ops:
                invoke(c)
                issued += 1
        elif not a.applied:
            if rng.random() < crash / 2:
                complete(c, a, "info")  # crashed before it took effect
            else:
                apply(a)
        elif rng.random() < crash / 2:
            complete(c, a, "info")  # took effect, then crashed
        else:
            complete(c, a, "ok" if a.ok else "fail")
    return out


# ---------------------------------------------------------------- planted anomalies


@dataclass(frozen=True)
class _Op:
    """A paired operation of an event list: positions of its events."""

    key: int
    f: str
    invoke: int
    complete: int  # -1: never completed
    typ: str  # the completion's type ("" if none)
    arg: JSON  # the invocation's value
    result: JSON  # the completion's value


def _unkey(store: _Store, event: Event) -> tuple[int, JSON]:
    _, _, _, ledger, value = event
    if store.kv:
        assert isinstance(value, dict)
        key = value["key"]
        assert isinstance(key, str)
        return int(key[1:]), value["value"]
    return (ledger or 0), value


def _pairs(store: _Store, events: Sequence[Event]) -> list[_Op]:
    pending: dict[int, int] = {}
    ops: list[_Op] = []
    for i, ev in enumerate(events):
        process, typ, f = ev[0], ev[1], ev[2]
        assert isinstance(process, int)
        key, value = _unkey(store, ev)
        if typ == "invoke":
            pending[process] = len(ops)
            ops.append(_Op(key, f, i, -1, "", value, None))
        else:
            j = pending.pop(process)
            o = ops[j]
            ops[j] = _Op(o.key, o.f, o.invoke, i, typ, o.arg, value)
    return ops


def _next_value(store: _Store, events: Sequence[Event]) -> None:
    """Make ``store.fresh`` give values the events do not hold."""
    for ev in events:
        _, value = _unkey(store, ev)
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, int) and not isinstance(v, bool):
                store.next = max(store.next, v + 1)
            elif isinstance(v, str) and v[1:].isdigit():
                store.next = max(store.next, int(v[1:]) + 1)


def plant(
    rng: random.Random, events: Sequence[Event], kind: str, model: str, keys: int = 1
) -> tuple[list[Event], list[int]] | None:
    """A copy of ``events`` (a valid history of :func:`register_history`, same
    ``model`` and ``keys``) with one anomaly of ``kind`` in :data:`PLANTS`, and the
    positions of the planted invocations; None if this history has no place for it.

    - ``stale-read``: a read, after everything, of a value that a write invoked
      after the value's producer completed has replaced;
    - ``never-written``: a read of a value no operation wrote;
    - ``future-read``: a read of a value that completes before its write is invoked;
    - ``lost-cas`` (cas-register): a second successful cas from a value another
      successful cas took;
    - ``opposite-orders``: two concurrent writes at the end, and two clients that
      read their values in opposite orders.
    """
    store = _Store(model, keys)
    _next_value(store, events)
    out = list(events)
    ops = _pairs(store, events)
    p0 = 1 + max((ev[0] for ev in events if isinstance(ev[0], int)), default=0)
    read, write = store.read, store.write
    producers = [
        o
        for o in ops
        if o.typ == "ok" and (o.f == write or o.f == "cas")  # noqa: PLR1714 - two names
    ]

    def value_of(o: _Op) -> JSON:
        if o.f == "cas":
            assert isinstance(o.arg, list)
            return o.arg[1]
        return o.arg

    def pair_at(at: int, p: int, f: str, key: int, arg: JSON, *, result: JSON) -> list[int]:
        out[at:at] = [store.event(p, "invoke", f, key, arg), store.event(p, "ok", f, key, result)]
        return [at]

    if kind == "stale-read":
        latest: dict[int, int] = {}  # key -> the last invocation of an ok write
        for o in ops:
            if o.typ == "ok" and o.f == write:
                latest[o.key] = o.invoke
        choices = [
            (p.key, value_of(p)) for p in producers if p.complete < latest.get(p.key, -1)
        ] + [(key, _INIT[model]) for key in latest]
        if not choices:
            return None
        key, v = rng.choice(choices)
        return out, pair_at(len(out), p0, read, key, None, result=v)
    if kind == "never-written":
        at = rng.randint(0, len(out))
        return out, pair_at(at, p0, read, rng.randrange(keys), None, result=store.fresh())
    if kind == "future-read":
        if not producers:
            return None
        p = rng.choice(producers)
        return out, pair_at(p.invoke, p0, read, p.key, None, result=value_of(p))
    if kind == "lost-cas":
        taken = [o for o in producers if o.f == "cas"]
        if not taken:
            return None
        c = rng.choice(taken)
        assert isinstance(c.arg, list)
        arg = [c.arg[0], store.fresh()]
        return out, pair_at(rng.randint(0, len(out)), p0, "cas", c.key, arg, result=arg)
    if kind == "opposite-orders":
        key, a, b = rng.randrange(keys), store.fresh(), store.fresh()
        at = len(out)
        out += [
            store.event(p0, "invoke", write, key, a),
            store.event(p0 + 1, "invoke", write, key, b),
            store.event(p0, "ok", write, key, a),
            store.event(p0 + 1, "ok", write, key, b),
        ]
        reads = []
        for reader, first, second in ((p0 + 2, a, b), (p0 + 3, b, a)):
            for v in (first, second):
                reads += pair_at(len(out), reader, read, key, None, result=v)
        return out, [at, at + 1, *reads]
    raise ValueError(f"unknown anomaly {kind!r}; known: {PLANTS}")
