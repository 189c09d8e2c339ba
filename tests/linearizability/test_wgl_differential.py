"""The search against linearizability's definition, on small random histories.

The reference below knows nothing of linked lists, candidate order or bitsets:
it tries every operation that real time lets come next, memoising the
(linearized set, states) pairs that failed. Both must agree on every verdict;
a valid verdict's linearization must replay through the model, and an invalid
one must name the operation it could not place after a linearizable prefix.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence
from typing import Any

import pytest

from bkref.linearizability import wgl
from bkref.linearizability.history import JSON, Op, Operation, OpType, pair
from bkref.linearizability.models import CAS_REGISTER, KV, REGISTER, Model


def _reference(model: Model, calls: Sequence[wgl.Call]) -> bool:
    """Is there an order of all known ops and some unknown ones, each after
    every op that completed before it was invoked, that the model allows?"""
    known = frozenset(i for i, c in enumerate(calls) if c.ret != math.inf)
    failed: set[tuple[frozenset[int], frozenset[Any]]] = set()

    def extend(done: frozenset[int], states: frozenset[Any]) -> bool:
        if known <= done:
            return True
        if (done, states) in failed:
            return False
        for i, c in enumerate(calls):
            if i in done or any(calls[j].ret < c.call for j in known - done):
                continue
            after: set[Any] = set()
            for s in states:
                after |= model.step(s, c.input) or set()
            if after and extend(done | {i}, frozenset(after)):
                return True
        failed.add((done, states))
        return False

    return extend(frozenset(), frozenset(model.init([c.input for c in calls])))


def _replays(model: Model, calls: Sequence[wgl.Call], order: Sequence[int]) -> bool:
    """``order`` respects real time and the model accepts it step by step."""
    if len(set(order)) != len(order):
        return False
    states = frozenset(model.init([c.input for c in calls]))
    for pos, i in enumerate(order):
        later = order[pos + 1 :]
        if any(calls[j].ret < calls[i].call for j in later):
            return False
        after: set[Any] = set()
        for s in states:
            after |= model.step(s, calls[i].input) or set()
        if not after:
            return False
        states = frozenset(after)
    return True


def _history(rng: random.Random, model: Model) -> list[Operation]:
    """A few processes, each one op at a time, every op taking effect at a random
    point of its interval (so the history is linearizable), then perhaps one
    read's answer changed (a planted anomaly) and some outcomes made unknown."""
    n_ops, procs = rng.randint(2, 7), rng.randint(1, 3)
    kv = model is KV
    free = [rng.random() for _ in range(procs)]
    ops: list[dict[str, Any]] = []
    for _ in range(n_ops):
        p = min(range(procs), key=free.__getitem__)
        t0 = free[p]
        t1 = t0 + rng.random()
        free[p] = t1 + rng.random() * 0.3
        fs = ["read", "write"] + (["cas"] if model is CAS_REGISTER else [])
        f = rng.choice(["get", "put", "append"] if kv else fs)
        arg: Any = str(rng.randint(0, 2)) if kv else rng.randint(0, 2)
        if f == "cas":
            arg = [rng.choice([None, 0, 1]), rng.randint(0, 2)]
        ops.append({"p": p, "t0": t0, "t1": t1, "te": rng.uniform(t0, t1), "f": f, "arg": arg})
    state: Any = "" if kv else None
    for o in sorted(ops, key=lambda o: o["te"]):
        o["type"] = "ok"
        if o["f"] in ("read", "get"):
            o["out"] = state
        elif o["f"] == "cas":
            if state == o["arg"][0]:
                state = o["arg"][1]
            else:
                o["type"] = "fail"
        else:
            state = state + o["arg"] if o["f"] == "append" else o["arg"]
    reads = [o for o in ops if o["f"] in ("read", "get")]
    if reads and rng.random() < 0.5:
        rng.choice(reads)["out"] = str(rng.randint(0, 2)) if kv else rng.choice([None, 0, 1, 2])
    for o in ops:
        if rng.random() < 0.15:
            o["type"] = "info"  # its outcome unknown, whether it happened or not
    events: list[tuple[float, int, OpType, str, JSON]] = []
    for o in ops:
        inv: JSON = {"key": "k", "value": o["arg"] if o["f"] != "get" else None} if kv else None
        if not kv and o["f"] != "read":
            inv = o["arg"]
        out: JSON = inv
        if o["f"] in ("read", "get") and o["type"] == "ok":
            out = {"key": "k", "value": o["out"]} if kv else o["out"]
        events.append((o["t0"], o["p"], "invoke", o["f"], inv))
        events.append((o["t1"], o["p"], o["type"], o["f"], out))
    events.sort(key=lambda e: e[0])
    return pair(Op(i, i, p, t, f, None, v) for i, (_, p, t, f, v) in enumerate(events))


@pytest.mark.parametrize("model", [REGISTER, CAS_REGISTER, KV], ids=lambda m: m.name)
def test_the_search_agrees_with_the_definition(model: Model) -> None:
    rng = random.Random(2026)
    verdicts = {True: 0, False: 0}
    for _ in range(300):
        ops = _history(rng, model)
        for calls in wgl.partition(model, ops).values():
            expected = _reference(model, calls)
            verdicts[expected] += 1
            for m in _variants(model):
                got = wgl.search(m, calls)
                assert got.verdict == ("valid" if expected else "invalid"), (calls, m.name)
                if expected:
                    assert _replays(model, calls, got.linearization)
                else:
                    assert got.blocked is not None
                    assert got.blocked not in got.linearization
                    assert _replays(model, calls, got.linearization)
    assert min(verdicts.values()) > 50, verdicts
    print(verdicts)  # both verdicts well represented


def _variants(model: Model) -> list[Model]:
    """The model, then over sets of states (no ``step1``), then also without
    the shortcut for reads."""
    sets = dataclasses.replace(model, step1=None)
    return [model, sets, dataclasses.replace(sets, is_read=None)]
