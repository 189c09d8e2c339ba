"""Registers and key-value stores whose writes are unique: linearizability without search.

When every write of a key writes a value never written before (and never the
initial value), each value read names the one operation that produced it, and
deciding linearizability becomes a matter of ordering intervals: Gibbons and
Korach ("Testing shared memories", SIAM Journal on Computing, 1997) showed
that for a read/write register with such writes the problem is polynomial,
and gave the rule in terms of clusters (a write and the reads of its value):
the history is linearizable iff no read completes before its write is
invoked, no two "forward zones" overlap, and no "backward zone" lies inside a
forward zone. This module decides the same in O(n log n) per key, and extends
the rule to compare-and-set, whose successful calls chain values together.

Per key (the model's partition; ``fail`` operations are already dropped):

1. Every value has one producer: the initial value, a write (``put``) or a
   ``cas(x -> v)``. Reads with an unknown outcome constrain nothing and are
   dropped; so is a producer with an unknown outcome whose value no kept
   operation observes (had it taken effect, removing it would leave a
   linearization). An observed one happened, at some time after its invocation.
2. A value read that no operation produced, two successful cas from one
   value, or a cycle of cas no write leads to: not linearizable at once.
3. A successful ``cas(x -> v)`` makes ``v`` the immediate successor of ``x``:
   the values form chains, each headed by a written value (or the initial
   value, whose chain comes first). In a linearization each value holds over
   one segment of time: its producer takes effect at the start, its reads
   within. For a value v: ``lo(v)`` the producer's invocation, ``hi(v)`` the
   earliest completion among its producer and its reads (v must be in place by
   then), ``a(v)`` the latest invocation among its reads and the cas that
   reads it (v is current until after it). A chain v0..vm is feasible alone iff
   for each i, ``max(lo(v0..vi), a(v0..v(i-1))) < hi(vi)``. Chain j then has a
   deadline ``D = min hi`` (it must start before) and a release ``K = max of its
   lo and a`` (what follows it must start after).
4. Chains in order c1, c2, ... fit iff every chain's D exceeds the K of every
   chain before it. The initial chain is first; the others are ordered from
   the end, greedily: any chain whose D exceeds the K of all others left can
   be last (removing chains only loosens the rest), and only two candidates need
   trying, the one with the largest D and the one with the largest K. When
   neither can be last, the two chains with the largest K must each come before
   the other: the proof is the four operations that say so.

For plain registers this is Gibbons and Korach's rule: a chain is a cluster,
its D and K bound the cluster's zone, and a forward zone (D < K) that
overlaps another, or holds a backward zone, is a pair of chains each needing
to come before the other.

Most keys need no more than a check of one candidate order: without cas every chain
is one value, and forward chains (D < K) by D merged with the others by K is an order
that fits whenever any does (Gibbons and Korach: forward zones do not overlap, and no
backward zone lies inside one). ``_witness`` builds and checks that order with array
passes; only where it fails (or there is cas) does the step-by-step decision run,
which finds the proof.

:func:`check` decides a whole history, or raises :class:`NotApplicable`
naming the first key whose writes are not unique (its reason is one line); with
``search_others`` (``bkref check --engine auto``) it hands such keys to the search
instead, and each key's result says which engine decided it.
"""

from __future__ import annotations

import gc
import heapq
import math
import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

from bkref.linearizability import wgl
from bkref.linearizability.history import Operation
from bkref.linearizability.models import MODELS, UNKNOWN, Model

SUPPORTED: Final = frozenset({"register", "cas-register", "kv"})
_READS: Final = frozenset({"read", "get"})
_WRITES: Final = frozenset({"write", "put"})
_INIT: Final = -1  # the initial value's producer: no operation
_NEED: Final = "--engine unique needs unique writes"


class NotApplicable(ValueError):
    """The history is not one this engine decides; the message says why, in one line."""


@dataclass(slots=True)
class _Chain:
    """Values linked by successful cas, from a written value (or the initial one)."""

    head: int  # the first value
    length: int = 0
    d: float = math.inf  # it must start before this completion (deadline)
    d_value: int = 0  # the value that sets it
    k: float = -math.inf  # what follows must start after this invocation (release)
    k_op: int = _INIT  # the op invoked then
    k_value: int = 0  # the value it observed or produced


class _InvalidError(Exception):
    def __init__(self, proof: Sequence[int], reason: str) -> None:
        super().__init__(reason)
        self.proof = tuple(dict.fromkeys(p for p in proof if p != _INIT))
        self.reason = reason


def _initial(model: Model) -> Hashable:
    if model.name not in SUPPORTED:
        raise NotApplicable(
            f"--engine unique checks the register, cas-register and kv models, not {model.name}"
        )
    (init,) = model.init(())
    return init  # type: ignore[no-any-return]


def applies(model: Model | str, operations: Iterable[Operation]) -> str | None:
    """None if :func:`check` decides this history, else the reason it does not."""
    m = MODELS[model] if isinstance(model, str) else model
    try:
        init = _initial(m)
        for key, calls in wgl.partition(m, operations).items():
            _values(key, calls, init)
    except NotApplicable as e:
        return str(e)
    return None


def check(
    model: Model | str,
    operations: Iterable[Operation],
    *,
    budget: float | None = None,
    search_others: bool = False,
    jobs: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> wgl.CheckResult:
    """Decide linearizability as :func:`wgl.check` does, without search.

    Raises :class:`NotApplicable` (before deciding any key) when the model is not a
    register or key-value store, or when a key's writes are not unique unless
    ``search_others``: then such keys go to :func:`wgl.search_parts` (with ``jobs`` and
    ``progress``) after the others are decided. Past ``budget`` seconds the keys not yet
    decided are unknown."""
    started = time.monotonic()
    m = MODELS[model] if isinstance(model, str) else model
    init = _initial(m)
    # The check allocates a few objects per operation and no cycles: the
    # collector would only rescan the history, again and again (a third of the time).
    collecting = gc.isenabled()
    gc.disable()
    try:
        parts = sorted(
            wgl.partition(m, operations).items(), key=lambda kv: kv[1][0].call if kv[1] else 0
        )
        deadline = math.inf if budget is None else started + budget
        results: dict[int, wgl.PartitionResult] = {}
        others: list[int] = []  # keys whose writes are not unique
        producers: dict[int, dict[Hashable, int]] = {}
        for n, (key, calls) in enumerate(parts):
            try:
                producers[n] = _values(key, calls, init)
            except NotApplicable:
                if not search_others:
                    raise
                others.append(n)
        for n, values in producers.items():
            key, calls = parts[n]
            if time.monotonic() > deadline:
                results[n] = wgl.PartitionResult(
                    key, "unknown", tuple(calls), note="out of time", engine="unique"
                )
            else:
                results[n] = _decide(m, key, calls, init, values)
    finally:
        if collecting:
            gc.enable()
    if others:
        searched = wgl.search_parts(
            m, [parts[n] for n in others], deadline, jobs=jobs, progress=progress
        )
        results.update(zip(others, searched, strict=True))
    ordered = [results[n] for n in range(len(parts))]
    return wgl.CheckResult(m.name, wgl.overall(ordered), ordered, time.monotonic() - started)


# ---------------------------------------------------------------- step 1: producers


def _values(key: Hashable, calls: Sequence[wgl.Call], init: Hashable) -> dict[Hashable, int]:
    """Each value's producer (position in calls; the initial value's is _INIT), or
    NotApplicable. Reads are not looked at here."""
    producers: dict[Hashable, int] = {init: _INIT}
    for i, c in enumerate(calls):
        f, arg, _ = c.input
        if f in _READS:
            continue
        if f in _WRITES:
            v = arg
        elif f == "cas":
            v = arg[1]
        else:
            raise NotApplicable(
                f"key {key!r}: op {c.call} is {f!r}: --engine unique decides reads, writes "
                "and cas only"
            )
        try:
            before = producers.setdefault(v, i)
        except TypeError:
            raise NotApplicable(f"key {key!r}: op {c.call} writes an unhashable value") from None
        if before == _INIT:
            raise NotApplicable(f"key {key!r}: op {c.call} writes the initial value {v!r}: {_NEED}")
        if before != i:
            raise NotApplicable(
                f"key {key!r}: value {v!r} is written twice (op {calls[before].call} and "
                f"op {c.call}): {_NEED}"
            )
    return producers


# ---------------------------------------------------------------- steps 2-4: the decision


def _decide(
    model: Model,
    key: Hashable,
    calls: Sequence[wgl.Call],
    init: Hashable,
    producers: dict[Hashable, int],
) -> wgl.PartitionResult:
    started = time.monotonic()
    try:
        order = _witness(calls, producers)
        if order is None:
            order = _Decision(model, calls, init, producers).run()
    except _InvalidError as bad:
        return wgl.PartitionResult(
            key,
            "invalid",
            tuple(calls),
            blocked=bad.proof[0] if bad.proof else None,
            seconds=time.monotonic() - started,
            proof=bad.proof,
            reason=bad.reason,
            engine="unique",
        )
    return wgl.PartitionResult(
        key,
        "valid",
        tuple(calls),
        tuple(order),
        seconds=time.monotonic() - started,
        engine="unique",
    )


def _witness(calls: Sequence[wgl.Call], producers: dict[Hashable, int]) -> list[int] | None:
    """A linearization of a key with reads and writes only (no cas), guessed in a few
    array passes and checked; None when there is cas or the guess fails, and then
    :class:`_Decision` decides. The guess is sure to hold when the key is linearizable,
    so this only makes the common case fast: each value's chain is itself, and, by
    Gibbons and Korach's rule, ordering forward chains (D < K) by D and the others by
    K, merged, is an order where every chain starts before its deadline when any is."""
    n = len(calls)
    if n == 0:
        return None
    call_t, ret_t, inputs, _ = zip(*calls, strict=True)
    f, arg, out = zip(*inputs, strict=True)
    if "cas" in f:
        return None
    ids: dict[Hashable, int] = {v: k for k, v in enumerate(producers)}  # initial value: 0
    nv = len(ids)
    ids[UNKNOWN] = -1  # a read whose outcome is unknown: it constrains nothing
    get = ids.get
    # Each op's value: what a read observed (a register's read of None observed the
    # initial value), what a write wrote; -2 for a value no operation wrote.
    vid = np.fromiter(
        [get(x if o is None else o, -2) for x, o in zip(arg, out, strict=True)], np.int64, n
    )
    if (vid == -2).any():
        return None
    call = np.array(call_t, np.float64)
    ret = np.array(ret_t, np.float64)
    write = np.zeros(n, np.bool_)
    write[list(producers.values())[1:]] = True  # every producer but the initial value's
    read = ~write & (vid >= 0)
    rv = vid[read]
    observed = np.zeros(nv, np.bool_)
    observed[rv] = True
    wv = vid[write]
    lo = np.full(nv, -np.inf)
    lo[wv] = call[write]
    hi = np.full(nv, np.inf)
    np.minimum.at(hi, rv, ret[read])
    hi[wv] = np.minimum(hi[wv], ret[write])
    a = np.full(nv, -np.inf)
    np.maximum.at(a, rv, call[read])
    # An unknown-outcome write no read observed is left out (as if it never happened).
    kept = observed | np.isfinite(hi)
    kept[0] = True
    if (lo[kept] >= hi[kept]).any():
        return None  # a value read before it was written: _Decision says which
    d, k = hi, np.maximum(lo, a)
    rest = np.flatnonzero(kept[1:]) + 1
    chains = np.concatenate(([0], rest[np.argsort(np.where(d[rest] < k[rest], d[rest], k[rest]))]))
    if (d[chains[1:]] <= np.maximum.accumulate(k[chains])[:-1]).any():
        return None
    # Each chain's producer, then its reads, in invocation order.
    rank = np.empty(nv, np.int64)
    rank[chains] = np.arange(len(chains))
    pos = np.flatnonzero(read | (write & kept[np.maximum(vid, 0)]))
    order = np.lexsort((pos, ~write[pos], rank[vid[pos]]))
    return pos[order].tolist()  # type: ignore[no-any-return]


class _Decision:
    """One key's decision. Values are numbered in the order of ``producers`` (the
    initial value is 0); per value, arrays hold what the history says of it."""

    def __init__(
        self,
        model: Model,
        calls: Sequence[wgl.Call],
        init: Hashable,
        producers: dict[Hashable, int],
    ) -> None:
        self.model = model
        self.calls = calls
        self.ids = {v: n for n, v in enumerate(producers)}
        self.values = list(producers)
        self.prod = list(producers.values())  # producer position, or _INIT
        nv = len(self.prod)
        self.lo = [-math.inf] * nv  # the producer's invocation
        self.hi = [math.inf] * nv  # in place before this completion ...
        self.hi_op = [_INIT] * nv  # ... of this op
        self.a = [-math.inf] * nv  # current until after this invocation ...
        self.a_op = [_INIT] * nv  # ... of this op
        self.reads: dict[int, list[int]] = {}  # value -> positions of its ok reads
        self.succ = [-1] * nv  # the value a successful cas made of it
        self.succ_op = [-1] * nv  # that cas
        self.kept = [False] * nv

    def desc(self, i: int) -> str:
        """An operation as the reports name it: ``[invocation index] what``."""
        return f"[{self.calls[i].call}] {self.model.describe(self.calls[i].input)}"

    def run(self) -> list[int]:
        self._observe()
        heads = self._chains()
        first, rest = heads[0], heads[1:]
        self._after_initial(first, rest)
        order = [first, *reversed(self._order(rest))]
        out: list[int] = []
        for chain in order:
            v = chain.head
            while v != -1:
                if self.prod[v] != _INIT:
                    out.append(self.prod[v])
                out += self.reads.get(v, ())
                v = self.succ[v]
        return out

    # step 1: who observes what; which unknown-outcome producers happened
    def _observe(self) -> None:
        calls, ids, prod = self.calls, self.ids, self.prod
        hi, hi_op, a, a_op, reads = self.hi, self.hi_op, self.a, self.a_op, self.reads
        cas: list[tuple[int, int, int]] = []  # (position, from, to) of cas that happened
        info_cas: dict[int, int] = {}  # value -> position of the unknown cas producing it
        observed = [False] * len(prod)
        for i, c in enumerate(calls):
            f, arg, out = c.input
            if f in _READS:
                if out is UNKNOWN:
                    continue
                v = ids.get(out, -1)
                if v == -1:  # calls are in invocation order: the earliest such read
                    raise _InvalidError(
                        [i], f"{self.desc(i)} observed {out!r}, which no operation wrote"
                    )
                seen = reads.get(v)
                if seen is None:
                    reads[v] = [i]
                    observed[v] = True
                else:
                    seen.append(i)
                if c.ret < hi[v]:
                    hi[v], hi_op[v] = c.ret, i
                if c.call > a[v]:
                    a[v], a_op[v] = c.call, i
            elif f == "cas":
                frm = ids.get(arg[0], -1)
                if c.ret == math.inf:
                    info_cas[ids[arg[1]]] = i
                elif frm == -1:
                    raise _InvalidError(
                        [i], f"{self.desc(i)} observed {arg[0]!r}, which no operation wrote"
                    )
                else:
                    cas.append((i, frm, ids[arg[1]]))
                    observed[frm] = True
        # An unknown-outcome cas happened iff a kept op observes its value; it then
        # observed the value it took.
        stack = [v for v in info_cas if observed[v]]
        while stack:
            i = info_cas[stack.pop()]
            frm = ids.get(calls[i].input[1][0], -1)
            if frm == -1:
                raise _InvalidError(
                    [i], f"{self.desc(i)} took {calls[i].input[1][0]!r}, which no operation wrote"
                )
            cas.append((i, frm, ids[calls[i].input[1][1]]))
            if not observed[frm]:
                observed[frm] = True
                if frm in info_cas:
                    stack.append(frm)
        kept = self.kept
        for v, p in enumerate(prod):
            if p == _INIT:
                kept[v] = True
                continue
            c = calls[p]
            if c.ret == math.inf and not observed[v]:
                continue  # unknown outcome, unobserved: as if it never happened
            kept[v] = True
            self.lo[v] = c.call
            if c.ret < hi[v]:
                hi[v], hi_op[v] = c.ret, p
        for i, frm, to in sorted(cas):
            if self.succ_op[frm] != -1:
                j = self.succ_op[frm]
                raise _InvalidError(
                    [j, i],
                    f"{self.desc(j)} and {self.desc(i)} both took effect on "
                    f"{self.values[frm]!r}: only one can follow it",
                )
            self.succ[frm], self.succ_op[frm] = to, i
            t = calls[i].call
            if t > a[frm]:
                a[frm], a_op[frm] = t, i

    # steps 2-3: chains
    def _chains(self) -> list[_Chain]:
        """The chains, the initial value's first, each checked alone and summed up."""
        calls, prod, kept = self.calls, self.prod, self.kept
        chains: list[_Chain] = []
        placed = 0
        for v, p in enumerate(prod):
            if kept[v] and (p == _INIT or calls[p].input[0] != "cas"):
                chain = self._summarise(v)
                placed += chain.length
                chains.append(chain)
        if placed < sum(kept):
            # Values no write leads to: their cas form cycles (each value has one
            # producer and at most one successor). Show one cycle.
            inside = [False] * len(prod)
            for chain in chains:
                v = chain.head
                while v != -1:
                    inside[v] = True
                    v = self.succ[v]
            start = next(v for v in range(len(prod)) if kept[v] and not inside[v])
            cycle, v = [], start
            while True:
                cycle.append(self.succ_op[v])
                v = self.succ[v]
                if v == start:
                    break
            names = ", ".join(self.desc(i) for i in cycle[:4])
            raise _InvalidError(
                cycle,
                f"{names}{' ...' if len(cycle) > 4 else ''}: a cycle of cas no write leads to",
            )
        return chains

    def _summarise(self, head: int) -> _Chain:
        """Check the chain from ``head`` alone; its deadline D and release K."""
        lo, hi, hi_op, a, a_op, prod = self.lo, self.hi, self.hi_op, self.a, self.a_op, self.prod
        chain = _Chain(head)
        floor, floor_op = -math.inf, _INIT  # max of lo(v0..vi) and a(v0..v(i-1))
        v = head
        while v != -1:
            chain.length += 1
            if lo[v] > floor:
                floor, floor_op = lo[v], prod[v]
            if floor >= hi[v]:
                raise _InvalidError(
                    [hi_op[v], floor_op],
                    f"{self.values[v]!r} must be in place before {self.desc(hi_op[v])} "
                    f"completed [{int(hi[v])}], but not before {self.desc(floor_op)} was "
                    "invoked, later",
                )
            if hi[v] < chain.d:
                chain.d, chain.d_value = hi[v], v
            if lo[v] > chain.k:
                chain.k, chain.k_op, chain.k_value = lo[v], prod[v], v
            if a[v] > chain.k:
                chain.k, chain.k_op, chain.k_value = a[v], a_op[v], v
            if a[v] > floor:
                floor, floor_op = a[v], a_op[v]
            v = self.succ[v]
        return chain

    # step 4: the order of chains
    def _after_initial(self, first: _Chain, rest: list[_Chain]) -> None:
        if not rest:
            return
        j = min(rest, key=lambda c: c.d)
        if j.d <= first.k:
            raise _InvalidError(
                [self.hi_op[j.d_value], first.k_op],
                f"{self._must(j)}, but {self._still(first)}",
            )

    def _order(self, chains: list[_Chain]) -> list[_Chain]:
        """The chains from last to first, or _InvalidError with a pair that must each
        precede the other."""
        by_d = [(-c.d, n) for n, c in enumerate(chains)]
        by_k = [(-c.k, n) for n, c in enumerate(chains)]
        heapq.heapify(by_d)
        heapq.heapify(by_k)
        gone = [False] * len(chains)
        out: list[_Chain] = []

        def top(heap: list[tuple[float, int]]) -> int:
            while gone[heap[0][1]]:
                heapq.heappop(heap)
            return heap[0][1]

        def second() -> int:
            """The chain with the largest K but the largest one's."""
            kept = heapq.heappop(by_k)
            n = top(by_k)
            heapq.heappush(by_k, kept)
            return n

        while len(out) < len(chains):
            last = top(by_d)
            if len(out) < len(chains) - 1:
                k = top(by_k)
                k2 = second()
                if chains[last].d <= chains[k2 if last == k else k].k:
                    # The largest D cannot be last; then only the largest K may be.
                    if last == k or chains[k].d <= chains[k2].k:
                        self._cycle(chains[k], chains[k2])
                    last = k
            gone[last] = True
            out.append(chains[last])
        return out

    def _cycle(self, k: _Chain, k2: _Chain) -> None:
        # Each must come before the other: k must start before k2 is over, and
        # k2 must start before k is over.
        assert k.d <= k2.k, "the greedy failed without a 2-cycle"
        assert k2.d <= k.k, "the greedy failed without a 2-cycle"
        raise _InvalidError(
            [self.hi_op[k.d_value], k2.k_op, self.hi_op[k2.d_value], k.k_op],
            f"{self._must(k)}, but {self._still(k2)}; and {self._must(k2)}, but {self._still(k)}",
        )

    def _must(self, chain: _Chain) -> str:
        """Why the chain must have started by its deadline."""
        v = chain.d_value
        return f"{self.values[v]!r} must be in place before {self.desc(self.hi_op[v])} completed"

    def _still(self, chain: _Chain) -> str:
        """Why the chain is not over until after its release."""
        v, op = chain.k_value, chain.k_op
        if op == self.prod[v]:
            return f"{self.desc(op)} was invoked later, to write {self.values[v]!r}"
        return f"{self.desc(op)} was invoked later and still saw {self.values[v]!r}"
