"""A self-contained HTML report of a campaign: verdicts, figures, anomalies, time series.

One page, no network when it is opened: plotly.js is embedded once. The runs are
compared in one table; each run then has one figure whose panels (throughput, add
latency, ledgers awaiting repair) share a time axis with the fault windows shaded
across all of them (:mod:`bkref.nemesis.report_charts`), and a section per check with
every figure it reported and its first anomalies, linked into the run's own timeline
(``timeline.html``, drawn by the linearizability package) where the operations of every
ledger are bars on their process lanes (:mod:`bkref.nemesis.report_checks`).
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from bkref.nemesis.report_charts import figure_html, plotly_js, run_figure
from bkref.nemesis.report_checks import section
from bkref.nemesis.report_html import dig, table, verdict

_CSS = """
body{font:14px system-ui,sans-serif;margin:2em;color:#222;max-width:90em}
h1{font-size:1.4em} h2{font-size:1.15em;margin-top:1.8em} h3{font-size:1em;margin:1em 0 .3em}
table{border-collapse:collapse;margin:.5em 0} td,th{border:1px solid #ddd;padding:3px 8px;
text-align:left} th{background:#f5f5f5} td.n{text-align:right}
.valid{color:#1a7f37;font-weight:600} .invalid{color:#c62828;font-weight:600}
.error{color:#8a6d00;font-weight:600} code{background:#f5f5f5;padding:0 3px}
"""


def _timeline(run: dict[str, Any], out_dir: Path) -> str:
    return Path(run["directory"]).relative_to(out_dir).as_posix() + "/timeline.html"


def _figure(check: dict[str, Any] | None, path: str) -> object:
    value = dig(check, path)
    return "-" if value is None else f"{value:,}" if isinstance(value, int) else value


def _comparison(runs: list[dict[str, Any]], out_dir: Path) -> str:
    rows = []
    for i, r in enumerate(runs):
        checks = r["checks"]
        anomalies = sum(len(c.get("anomalies") or []) for c in checks.values())
        per_second = r.get("throughput") or []  # seconds of the workload, not the run's
        adds = sum(row[1] for row in per_second)
        link = html.escape(_timeline(r, out_dir))
        rows.append(
            [
                f'<a href="#run-{i}">run {i}</a>',
                verdict(r["valid"]),
                f'<a href="{link}">timeline</a>',
                r["seed"],
                f"{sum(r['ops'].values()):,}",
                f"{adds / max(len(per_second), 1):,.0f}",
                ", ".join(f"{k} x{v}" for k, v in sorted(r["faults"].items())) or "none",
                f"{anomalies:,}",
                _figure(checks.get("durability"), "acknowledged"),
                _figure(checks.get("durability"), "unknown_ledgers"),
                _figure(checks.get("trace"), "counts.explained"),
                _figure(checks.get("trace"), "counts.unknown"),
                r["seconds"],
            ]
        )
    return table(
        [
            "run",
            "verdict",
            "timeline",
            "seed",
            "operations",
            "adds per s",
            "faults",
            "anomalies",
            "acknowledged entries",
            "ledgers undecided",
            "trace: explained",
            "trace: unknown",
            "seconds",
        ],
        rows,
        raw=3,
    )


def _run(i: int, r: dict[str, Any], out_dir: Path) -> list[str]:
    timeline = _timeline(r, out_dir)
    parts = [
        f'<h2 id="run-{i}">Run {i} (seed {r["seed"]}): {verdict(r["valid"])} '
        f'<small><a href="{html.escape(timeline)}">timeline</a></small></h2>'
    ]
    if r["error"]:
        parts.append(f"<p class=error>{html.escape(r['error'])}</p>")
    fig = run_figure(r)
    if fig is not None:
        parts.append(figure_html(fig, f"chart-run-{i}"))
    scrapes = (r.get("scraped") or {}).get("scrapes")
    if scrapes:
        parts.append(
            f"<p>The bookies' <code>/metrics</code>, scraped once a second: "
            f"{scrapes['ok']:,} scrapes, {scrapes['failed']:,} failed (a bookie killed, "
            "paused or starting: a gap in its series).</p>"
        )
    for name, check in sorted(r["checks"].items()):
        parts.append(section(name, check, timeline))
    parts.append("<h3>Latency of acknowledged operations</h3>")
    parts.append(
        table(
            ["op", "ok count", "p50 ms", "p99 ms", "max ms"],
            [[f, v["count"], v["p50"], v["p99"], v["max"]] for f, v in r["latency_ms"].items()],
        )
    )
    parts.append("<h3>Fault windows</h3>")
    parts.append(
        table(
            ["fault", "target", "from s", "to s"],
            [[w["kind"], w["target"], w["start"], w["stop"]] for w in r["windows"]],
        )
    )
    if r.get("events"):
        parts.append(
            table(
                ["fault", "target", "event", "what happened"],
                [
                    [
                        e["kind"],
                        e["target"],
                        e["event"],
                        "; ".join(
                            f"{k}: {v}"
                            for k, v in e.items()
                            if k not in {"kind", "target", "event"}
                        ),
                    ]
                    for e in r["events"]
                ],
            )
        )
    return parts


def render(campaign: dict[str, Any], out_dir: Path) -> str:
    runs: list[dict[str, Any]] = campaign["runs"]
    plant = campaign.get("plant")
    parts = [
        "<!doctype html><html><head><meta charset=utf-8><title>bkref campaign</title>",
        f"<style>{_CSS}</style><script>{plotly_js()}</script></head><body>",
        "<h1>bkref campaign</h1>",
        f"<p>{len(runs)} run(s), faults <code>{html.escape(','.join(campaign['faults']))}</code>, "
        f"{campaign['time']} s each, backend <code>{html.escape(campaign['backend'])}</code>"
        + (f", planted bug(s) <code>{html.escape(','.join(plant))}</code>" if plant else "")
        + f". Verdict: {verdict(campaign['valid'])}</p>",
        _comparison(runs, out_dir),
    ]
    for i, r in enumerate(runs):
        parts += _run(i, r, out_dir)
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
