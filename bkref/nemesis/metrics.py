"""A run's numbers from its history: latencies, throughput per second, fault spans.

Pure functions of the history's operations, for ``results.json`` and the
report's charts (:mod:`bkref.nemesis.report`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bkref.linearizability.history import Op, pair

NS = 1_000_000_000


def percentile(xs: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0 <= q < 1) of sorted ``xs``, nearest rank below; 0 if empty."""
    if not xs:
        return 0.0
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def latencies(ops: list[Op]) -> dict[str, dict[str, float]]:
    """Per operation: how many completed ok, and the p50, p99 and max of their latency (ms)."""
    by_f: dict[str, list[float]] = {}
    for o in pair(ops):
        if o.complete is not None and o.status == "ok":
            by_f.setdefault(o.f, []).append((o.complete.time - o.invoke.time) / 1e6)
    out: dict[str, dict[str, float]] = {}
    for f, xs in sorted(by_f.items()):
        xs.sort()
        out[f] = {
            "count": len(xs),
            "p50": round(percentile(xs, 0.5), 2),
            "p99": round(percentile(xs, 0.99), 2),
            "max": round(xs[-1], 2),
        }
    return out


def throughput(ops: list[Op]) -> list[list[int]]:
    """Per second of the run: ok adds, ok reads (and LAC reads), other ok operations."""
    rows: dict[int, list[int]] = {}
    for o in ops:
        if o.is_nemesis or o.type != "ok":
            continue
        row = rows.setdefault(o.time // NS, [0, 0, 0])
        row[0 if o.f == "add" else 1 if o.f in ("read", "read_lac") else 2] += 1
    last = max(rows, default=-1)
    return [[s, *rows.get(s, [0, 0, 0])] for s in range(last + 1)]


def add_latency(ops: list[Op]) -> list[list[float]]:
    """Per second of the run, by invocation: p50 and p99 latency (ms) of acknowledged adds;
    seconds without one repeat zeros, so that a stall shows as a gap in the line."""
    by_second: dict[int, list[float]] = {}
    for o in pair(ops):
        if o.f == "add" and o.status == "ok" and o.complete is not None:
            second = o.invoke.time // NS
            by_second.setdefault(second, []).append((o.complete.time - o.invoke.time) / 1e6)
    rows: list[list[float]] = []
    for s in range(max(by_second, default=-1) + 1):
        xs = sorted(by_second.get(s, []))
        rows.append([s, round(percentile(xs, 0.5), 2), round(percentile(xs, 0.99), 2)])
    return rows


def spans(ops: list[Op]) -> list[dict[str, Any]]:
    """Fault windows in history time (seconds): from each start to its stop (or the heal)."""
    opened: dict[tuple[str, str], float] = {}
    out: list[dict[str, Any]] = []
    end = ops[-1].time / 1e9 if ops else 0.0
    for o in ops:
        if not o.is_nemesis or not isinstance(o.value, dict) or "target" not in o.value:
            continue
        key = (o.f, str(o.value["target"]))
        if o.value.get("event") == "start" and key not in opened:
            opened[key] = o.time / 1e9
        elif o.value.get("event") == "stop" and key in opened and o.value.get("done"):
            out.append(
                {"kind": o.f, "target": key[1], "start": opened.pop(key), "stop": o.time / 1e9}
            )
    out += [{"kind": k, "target": t, "start": at, "stop": end} for (k, t), at in opened.items()]
    return sorted(out, key=lambda x: x["start"])
