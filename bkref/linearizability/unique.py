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

:func:`check` decides a whole history, or raises :class:`NotApplicable`
naming the first key whose writes are not unique (its reason is one line);
``bkref check --engine auto`` then checks the whole history by the search.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

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


@dataclass
class _Value:
    """One value of a key and what the history says about its time in place."""

    value: Hashable
    producer: int  # position in calls, or _INIT
    lo: float = -math.inf  # the producer's invocation
    lo_op: int = _INIT
    hi: float = math.inf  # it must be in place before this completion
    hi_op: int = _INIT
    a: float = -math.inf  # it stays current until after this invocation
    a_op: int = _INIT
    reads: list[int] = field(default_factory=list)  # positions of ok reads of it
    succ: int = -1  # position of the cas that reads it, if any


@dataclass
class _Chain:
    values: list[_Value]
    d: float = math.inf
    d_value: _Value | None = None
    k: float = -math.inf
    k_op: int = _INIT
    k_value: _Value | None = None


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
    model: Model | str, operations: Iterable[Operation], *, budget: float | None = None
) -> wgl.CheckResult:
    """Decide linearizability as :func:`wgl.check` does, without search.

    Raises :class:`NotApplicable` (before deciding any key) when a key's writes are not
    unique or the model is not a register or key-value store. Past ``budget`` seconds
    the keys not yet decided are unknown."""
    started = time.monotonic()
    m = MODELS[model] if isinstance(model, str) else model
    init = _initial(m)
    parts = sorted(
        wgl.partition(m, operations).items(), key=lambda kv: kv[1][0].call if kv[1] else 0
    )
    prepared = [(key, calls, _values(key, calls, init)) for key, calls in parts]
    deadline = math.inf if budget is None else started + budget
    results = []
    for key, calls, values in prepared:
        if time.monotonic() > deadline:
            results.append(wgl.PartitionResult(key, "unknown", tuple(calls), note="out of time"))
            continue
        results.append(_decide(m, key, calls, init, values))
    verdicts = {r.verdict for r in results}
    verdict: wgl.Verdict = (
        "invalid" if "invalid" in verdicts else "unknown" if "unknown" in verdicts else "valid"
    )
    return wgl.CheckResult(m.name, verdict, results, time.monotonic() - started)


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
        )
    return wgl.PartitionResult(
        key, "valid", tuple(calls), tuple(order), seconds=time.monotonic() - started
    )


class _Decision:
    def __init__(
        self,
        model: Model,
        calls: Sequence[wgl.Call],
        init: Hashable,
        producers: dict[Hashable, int],
    ) -> None:
        self.model = model
        self.calls = calls
        self.init = init
        self.producers = producers

    def desc(self, i: int) -> str:
        """An operation as the reports name it: ``[invocation index] what``."""
        return f"[{self.calls[i].call}] {self.model.describe(self.calls[i].input)}"

    def run(self) -> list[int]:
        values = self._observe()
        chains = self._chains(values)
        for chain in chains:
            self._summarise(chain)
        first, rest = chains[0], chains[1:]
        self._after_initial(first, rest)
        last_first = self._order(rest)
        order = [first, *reversed(last_first)]
        return [
            i
            for chain in order
            for v in chain.values
            for i in ([] if v.producer == _INIT else [v.producer]) + v.reads
        ]

    # step 1: who observes what; which unknown-outcome producers happened
    def _observe(self) -> dict[Hashable, _Value]:
        calls = self.calls
        reads: dict[Hashable, list[int]] = {}
        cas_ok: list[int] = []
        for i, c in enumerate(calls):
            f, _, out = c.input
            if f in _READS:
                if out is not UNKNOWN:
                    reads.setdefault(out, []).append(i)
            elif f == "cas" and c.ret != math.inf:
                cas_ok.append(i)
        # An unknown-outcome producer happened iff a kept operation observes its
        # value; a kept cas observes the value it read.
        happened: set[int] = set(cas_ok)
        observed = list(reads) + [calls[i].input[1][0] for i in cas_ok]
        seen: set[Hashable] = set()
        while observed:
            v = observed.pop()
            if v in seen:
                continue
            seen.add(v)
            p = self.producers.get(v)
            if p is None:
                # Read (or read by a cas) and never written: the earliest such op.
                who = min(reads.get(v, []) + [i for i in happened if calls[i].input[1][0] == v])
                raise _InvalidError(
                    [who], f"{self.desc(who)} observed {v!r}, which no operation wrote"
                )
            if p != _INIT and calls[p].input[0] == "cas" and p not in happened:
                happened.add(p)
                observed.append(calls[p].input[1][0])
        values: dict[Hashable, _Value] = {}
        for v, p in self.producers.items():
            if p == _INIT or calls[p].ret != math.inf or v in seen:
                values[v] = self._value(v, p, reads.get(v, []))
        for i in sorted(happened):
            frm = calls[i].input[1][0]
            x = values[frm]
            if x.succ != -1:
                raise _InvalidError(
                    [x.succ, i],
                    f"{self.desc(x.succ)} and {self.desc(i)} both took effect on {frm!r}: "
                    "only one can follow it",
                )
            x.succ = i
            t = calls[i].call
            if t > x.a:
                x.a, x.a_op = t, i
        return values

    def _value(self, v: Hashable, p: int, reads: list[int]) -> _Value:
        calls = self.calls
        value = _Value(v, p, reads=reads)
        if p != _INIT:  # the initial value is in place from the start
            value.lo, value.lo_op = calls[p].call, p
            value.hi, value.hi_op = calls[p].ret, p
        for r in reads:
            c = calls[r]
            if c.ret < value.hi:
                value.hi, value.hi_op = c.ret, r
            if c.call > value.a:
                value.a, value.a_op = c.call, r
        return value

    # step 2-3: chains
    def _chains(self, values: dict[Hashable, _Value]) -> list[_Chain]:
        """The chains, the initial value's first."""
        calls = self.calls
        chains: list[_Chain] = []
        placed = 0
        heads = [values[self.init]] + [
            v
            for v in values.values()
            if v.producer != _INIT and calls[v.producer].input[0] != "cas"
        ]
        for head in heads:
            chain = [head]
            while chain[-1].succ != -1:
                chain.append(values[calls[chain[-1].succ].input[1][1]])
            placed += len(chain)
            chains.append(_Chain(chain))
        if placed < len(values):
            # Values no write leads to: their cas form cycles (each value has one
            # producer and at most one successor). Show one cycle.
            inside = {id(v) for c in chains for v in c.values}
            start = next(v for v in values.values() if id(v) not in inside)
            cycle, v = [], start
            while True:
                cycle.append(v.producer)
                v = values[calls[v.producer].input[1][0]]
                if v is start:
                    break
            cycle.reverse()
            names = ", ".join(self.desc(i) for i in cycle[:4])
            raise _InvalidError(
                cycle,
                f"{names}{' ...' if len(cycle) > 4 else ''}: a cycle of cas no write leads to",
            )
        return chains

    def _summarise(self, chain: _Chain) -> None:
        """Check the chain alone; its deadline D and release K."""
        floor, floor_op = -math.inf, _INIT  # max of lo(v0..vi) and a(v0..v(i-1))
        for v in chain.values:
            if v.lo > floor:
                floor, floor_op = v.lo, v.lo_op
            if floor >= v.hi:
                raise _InvalidError(
                    [v.hi_op, floor_op],
                    f"{v.value!r} must be in place before {self.desc(v.hi_op)} completed "
                    f"[{int(v.hi)}], but not before {self.desc(floor_op)} was invoked, later",
                )
            if v.hi < chain.d:
                chain.d, chain.d_value = v.hi, v
            for t, op in ((v.lo, v.lo_op), (v.a, v.a_op)):
                if t > chain.k:
                    chain.k, chain.k_op, chain.k_value = t, op, v
            if v.a > floor:
                floor, floor_op = v.a, v.a_op

    # step 4: the order of chains
    def _after_initial(self, first: _Chain, rest: list[_Chain]) -> None:
        if not rest:
            return
        j = min(rest, key=lambda c: c.d)
        if j.d <= first.k:
            raise _InvalidError(
                [self._d_op(j), first.k_op],
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
        # Each must come before the other: k ends after k2 must have started, and
        # k2 ends after k must have started.
        assert k.d <= k2.k, "the greedy failed without a 2-cycle"
        assert k2.d <= k.k, "the greedy failed without a 2-cycle"
        raise _InvalidError(
            [self._d_op(k), k2.k_op, self._d_op(k2), k.k_op],
            f"{self._must(k)}, but {self._still(k2)}; and {self._must(k2)}, but {self._still(k)}",
        )

    def _d_op(self, chain: _Chain) -> int:
        assert chain.d_value is not None
        return chain.d_value.hi_op

    def _must(self, chain: _Chain) -> str:
        """Why the chain must have started by its deadline."""
        v = chain.d_value
        assert v is not None
        return f"{v.value!r} must be in place before {self.desc(v.hi_op)} completed"

    def _still(self, chain: _Chain) -> str:
        """Why the chain is not over until after its release."""
        v, op = chain.k_value, chain.k_op
        assert v is not None
        if op == v.producer:
            return f"{self.desc(op)} was invoked later, to write {v.value!r}"
        return f"{self.desc(op)} was invoked later and still saw {v.value!r}"
