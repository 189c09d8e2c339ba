"""The jobs' outputs: Parquet tables, a JSON summary and a short HTML page.

``OUT/anomalies/`` (Parquet): one row per anomaly: ``check`` (linearizable,
durability, replication), ``run``, ``ledger``, ``kind`` (the names of
:mod:`bkref.linearizability.ledger_checker`; ``nonlinearizable`` for the generic
checker; ``under-replicated`` and ``digest-mismatch`` for the audit), ``ops``
(history indices of the invocations that prove it) and ``message``.
``OUT/ledgers/``: per ledger its operations, entries, last entry if closed and
anomalies. ``OUT/keys/`` (generic models): per key its verdict.
``OUT/replication/``: the audit's findings with entry, bookies and digests.
``OUT/summary.json`` and ``OUT/index.html``: the figures below.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bkref.linearizability.durability import describe

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

PERCENTILES = (0.5, 0.95, 0.99)


def latency(paired: DataFrame) -> dict[str, dict[str, float]]:
    """Per op kind (``f``), latencies of operations that completed ok, in ms.
    ``paired``: the paired operations, or the ledger model's frame (its ``dt``)."""
    from pyspark.sql import functions as sf

    if "dt" in paired.columns:
        ok, ms = sf.col("dt").isNotNull(), sf.col("dt") / 1e6
    else:
        ok, ms = sf.col("ctype") == "ok", (sf.col("t_ret") - sf.col("t_call")) / 1e6
    rows = (
        paired.where(ok & sf.col("problem").isNull())
        .groupBy("f")
        .agg(
            sf.count(sf.lit(1)).alias("count"),
            sf.percentile_approx(ms, list(PERCENTILES), 1000).alias("p"),
            sf.max(ms).alias("max"),
        )
        .orderBy("f")
        .collect()
    )
    out: dict[str, dict[str, float]] = {}
    for r in rows:
        figures: dict[str, float] = {"count": r["count"]}
        for q, v in zip(PERCENTILES, r["p"], strict=True):
            figures[f"p{round(q * 100)}"] = round(float(v), 3)
        figures["max"] = round(float(r["max"]), 3)
        out[r["f"]] = figures
    return out


def counts(anomalies: DataFrame) -> dict[str, dict[str, int]]:
    rows = anomalies.groupBy("check", "kind").count().collect()
    out: dict[str, dict[str, int]] = {}
    for r in sorted(rows, key=lambda r: (r["check"], r["kind"])):
        out.setdefault(r["check"], {})[r["kind"]] = r["count"]
    return out


def write_json(summary: dict[str, Any], out: Path) -> Path:
    path = out / "summary.json"
    path.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return path


def write_html(summary: dict[str, Any], examples: list[dict[str, Any]], out: Path) -> Path:
    e = html.escape
    verdict = summary["verdict"]
    color = {"valid": "#1a7f37", "invalid": "#cf222e"}.get(verdict, "#9a6700")
    parts = [
        "<!doctype html><meta charset='utf-8'><title>bkref spark-check</title>",
        "<style>body{font:14px system-ui,sans-serif;margin:2em;max-width:70em}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;"
        "padding:.2em .6em;text-align:right}th{background:#f4f4f4}"
        "td.l,th.l{text-align:left}</style>",
        f"<h1>bkref spark-check: <span style='color:{color}'>{e(verdict)}</span></h1>",
        f"<p>{e(str(summary['path']))} &middot; model {e(summary['model'])} &middot; "
        f"master {e(summary['master'])} &middot; {summary['seconds']:.1f} s</p>",
        "<table><tr><th class=l>history</th><th>value</th></tr>",
    ]
    parts.extend(
        f"<tr><td class=l>{label}</td><td>{summary[label]:,}</td></tr>"
        for label in ("runs", "ops", "operations", "ledgers", "keys")
        if label in summary
    )
    parts.append("</table>")
    if "durability" in summary:
        parts.append(f"<p>{e(describe(summary['durability']))}</p>")
    parts.append("<h2>Anomalies</h2>")
    found = summary["anomalies"]
    if not any(found.values()):
        parts.append("<p>none</p>")
    else:
        parts.append("<table><tr><th class=l>check</th><th class=l>kind</th><th>count</th></tr>")
        for check, kinds in found.items():
            for kind, n in kinds.items():
                parts.append(
                    f"<tr><td class=l>{e(check)}</td><td class=l>{e(kind)}</td><td>{n:,}</td></tr>"
                )
        parts.append("</table>")
    if examples:
        parts.append(
            "<h2>First anomalies</h2><table><tr><th class=l>check</th><th class=l>run</th>"
            "<th>ledger</th><th class=l>kind</th><th class=l>ops</th><th class=l>message</th></tr>"
        )
        parts.extend(
            f"<tr><td class=l>{e(a['check'])}</td><td class=l>{e(str(a['run']))}</td>"
            f"<td>{a['ledger'] if a['ledger'] is not None else ''}</td>"
            f"<td class=l>{e(a['kind'])}</td><td class=l>{e(str(a['ops']))}</td>"
            f"<td class=l>{e(a['message'] or '')}</td></tr>"
            for a in examples
        )
        parts.append("</table>")
    lat = summary.get("latency_ms", {})
    if lat:
        parts.append("<h2>Latency of ok operations (ms)</h2><table><tr><th class=l>f</th>")
        cols = ["count", *(f"p{round(q * 100)}" for q in PERCENTILES), "max"]
        parts.append("".join(f"<th>{c}</th>" for c in cols) + "</tr>")
        for f, figures in lat.items():
            cells = "".join(f"<td>{figures[c]:,}</td>" for c in cols)
            parts.append(f"<tr><td class=l>{e(f)}</td>{cells}</tr>")
        parts.append("</table>")
    parts.append(
        "<p>Tables (Parquet) beside this page: anomalies/, ledgers/ or keys/, replication/; "
        "figures in summary.json.</p>"
    )
    path = out / "index.html"
    path.write_text("\n".join(parts) + "\n")
    return path
