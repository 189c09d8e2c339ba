"""History format throughput: JSON Lines and Parquet, read and write, vs. raw json."""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from bkref.linearizability.history import Op
from bkref.linearizability.history_files import read_jsonl, read_parquet, write_jsonl, write_parquet

TITLE = "History format: read and write throughput"


def _ops(n: int) -> Iterator[Op]:
    """A writer's pipelined adds with concurrent readers, as a campaign records them."""
    for i in range(n // 2):
        p = i % 64
        yield Op(2 * i, 1000 * i, p, "invoke", "add", 1, {"entry": i, "data": f"d{i}"})
        yield Op(2 * i + 1, 1000 * i + 500, p, "ok", "add", 1, {"entry": i, "data": f"d{i}"})


def _rate(n: int, seconds: float) -> str:
    return f"{n / seconds / 1e3:,.0f} k ops/s"


def run(quick: bool) -> str:
    n = 20_000 if quick else 1_000_000
    rows = ["| what | ops | seconds | rate |", "|---|---:|---:|---:|"]
    with tempfile.TemporaryDirectory() as d:
        jsonl, parquet = Path(d) / "h.jsonl", Path(d) / "h.parquet"
        steps: list[tuple[str, Callable[[], int]]] = [
            ("write JSON Lines", lambda: write_jsonl(_ops(n), jsonl)),
            ("write Parquet", lambda: write_parquet(_ops(n), parquet)),
            (
                "baseline: json.loads of every line",
                lambda: sum(1 for _ in map(json.loads, jsonl.open())),
            ),
            ("read + validate JSON Lines", lambda: sum(1 for _ in read_jsonl(jsonl))),
            (
                "read JSON Lines, no validation",
                lambda: sum(1 for _ in read_jsonl(jsonl, check=False)),
            ),
            ("read + validate Parquet", lambda: sum(1 for _ in read_parquet(parquet))),
        ]
        for label, fn in steps:
            t = time.perf_counter()
            fn()
            s = time.perf_counter() - t
            rows.append(f"| {label} | {n:,} | {s:.2f} | {_rate(n, s)} |")
        mib = {p.suffix: p.stat().st_size / 2**20 for p in (jsonl, parquet)}
    sizes = f"JSON Lines {mib['.jsonl']:.1f} MiB, Parquet {mib['.parquet']:.1f} MiB"
    return "\n".join(rows) + f"\n\nFile sizes: {sizes}.\n"
