"""A self-contained HTML report of a campaign: verdicts, anomalies, faults, latencies.

Inline CSS and SVG only, no scripts from the network: the file opens
anywhere. Each run has a chart of throughput over time (acknowledged adds
and reads per second) with its fault windows shaded and labelled, and links
to its own timeline (``timeline.html``, drawn by the linearizability
package) where the operations of every ledger are bars on their process
lanes.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bkref.linearizability.durability import describe
from bkref.nemesis.faults import FAULTS

_CSS = """
body{font:14px system-ui,sans-serif;margin:2em;color:#222;max-width:70em}
h1{font-size:1.4em} h2{font-size:1.1em;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0} td,th{border:1px solid #ddd;padding:3px 8px;
text-align:left} th{background:#f5f5f5} .valid{color:#1a7f37;font-weight:600}
.invalid{color:#c62828;font-weight:600} .error{color:#8a6d00;font-weight:600}
code{background:#f5f5f5;padding:0 3px} svg text{font:11px system-ui,sans-serif}
"""

# The two throughput lines, the add latencies, and the ledgers awaiting repair; each
# fault kind's windows are shaded in its record's colour (nemesis.faults).
_LINES = (("adds", 1, "#1a7f37"), ("reads", 2, "#1565c0"))
_LATENCY_LINES = (("add p50", 1, "#1a7f37"), ("add p99", 2, "#c62828"))
_TASK_LINES = (("ledgers marked under-replicated", 1, "#6a1b9a"),)


def _verdict(run: dict[str, Any]) -> str:
    if run["valid"] is None:
        return '<span class="error">could not run</span>'
    return (
        '<span class="valid">valid</span>'
        if run["valid"]
        else '<span class="invalid">INVALID</span>'
    )


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _chart(
    run: dict[str, Any],
    rows: Sequence[Sequence[float]],
    lines: Sequence[tuple[str, int, str]],
    unit: str,
    *,
    width: int = 900,
    height: int = 220,
) -> str:
    """Series per second of the run (``rows``: second, values...) with the fault windows
    shaded (inline SVG)."""
    spans: list[dict[str, Any]] = run.get("spans") or []
    if not rows:
        return ""
    left, top, bottom = 50, 10, 40
    plot_w, plot_h = width - left - 10, height - top - bottom
    seconds = max(len(rows), max((sp["stop"] for sp in spans), default=0.0), 1.0)
    peak = max(max(r[c] for _, c, _ in lines) for r in rows) or 1

    def x(t: float) -> float:
        return left + plot_w * t / seconds

    def y(v: float) -> float:
        return top + plot_h * (1 - v / peak)

    parts = [f'<svg width="{width}" height="{height}" role="img">']
    lanes: list[float] = []  # the end of the last label in each label row
    for sp in spans:
        x0, x1 = x(sp["start"]), x(max(sp["stop"], sp["start"] + seconds / 400))
        colour = FAULTS[sp["kind"]].colour if sp["kind"] in FAULTS else "#bdbdbd"
        label = html.escape(f"{sp['kind']} {sp['target']}")
        lane = next((i for i, end in enumerate(lanes) if end < x0), len(lanes))
        lanes[lane : lane + 1] = [x0 + 7 * len(label)]
        parts.append(
            f'<rect x="{x0:.1f}" y="{top}" width="{x1 - x0:.1f}" height="{plot_h}" '
            f'fill="{colour}" fill-opacity="0.25"><title>{label}: {sp["start"]:.1f}-'
            f"{sp['stop']:.1f} s</title></rect>"
            f'<text x="{x0 + 2:.1f}" y="{top + 12 + 12 * (lane % 4)}" '
            f'fill="{colour}">{label}</text>'
        )
    for name, column, colour in lines:
        points = " ".join(f"{x(r[0] + 0.5):.1f},{y(r[column]):.1f}" for r in rows)
        parts.append(
            f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="1.5">'
            f"<title>{name} ({unit})</title></polyline>"
        )
    axis_y = top + plot_h
    parts.append(
        f'<line x1="{left}" y1="{axis_y}" x2="{left + plot_w}" y2="{axis_y}" stroke="#999"/>'
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{axis_y}" stroke="#999"/>'
        f'<text x="{left - 4}" y="{top + 10}" text-anchor="end">{peak:g}</text>'
        f'<text x="{left - 4}" y="{axis_y}" text-anchor="end">0</text>'
    )
    step = max(1, round(seconds / 10))
    parts.extend(
        f'<text x="{x(t):.1f}" y="{axis_y + 14}" text-anchor="middle">{t}</text>'
        for t in range(0, int(seconds) + 1, step)
    )
    legend = " ".join(
        f'<tspan fill="{colour}">&#9632; {name} ({unit})</tspan>' for name, _, colour in lines
    )
    parts.append(
        f'<text x="{left}" y="{height - 6}">seconds into the run; {legend}; '
        "shaded: fault windows</text></svg>"
    )
    return "".join(parts)


def _anomaly_row(a: dict[str, Any]) -> list[object]:
    """History anomalies name the operations that prove them; replication and cluster
    anomalies name entries, bookies or nodes instead: show whatever this one has."""
    rest = {k: v for k, v in a.items() if k not in ("kind", "ledger", "ops", "message")}
    witnesses = f"ops {a['ops']}" if "ops" in a else ", ".join(f"{k} {v}" for k, v in rest.items())
    return [a["kind"], a.get("ledger", "-"), witnesses, a.get("message", "")]


def render(campaign: dict[str, Any], out_dir: Path) -> str:
    runs: list[dict[str, Any]] = campaign["runs"]
    parts = [
        f"<!doctype html><meta charset=utf-8><title>bkref campaign</title><style>{_CSS}</style>",
        "<h1>bkref campaign</h1>",
        f"<p>{len(runs)} run(s), faults <code>{html.escape(','.join(campaign['faults']))}</code>, "
        f"{campaign['time']} s each, backend <code>{html.escape(campaign['backend'])}</code>"
        + (
            f", planted bug(s) <code>{html.escape(','.join(campaign['plant']))}</code>"
            if campaign.get("plant")
            else ""
        )
        + ". "
        f"Verdict: {_verdict({'valid': campaign['valid']})}</p>",
        _table(
            ["run", "seed", "verdict", "ops", "faults", "seconds", "timeline"],
            [
                [
                    i,
                    r["seed"],
                    "valid"
                    if r["valid"]
                    else ("could not run" if r["valid"] is None else "INVALID"),
                    sum(r["ops"].values()),
                    ", ".join(f"{k} x{v}" for k, v in sorted(r["faults"].items())) or "none",
                    r["seconds"],
                    Path(r["directory"]).relative_to(out_dir).as_posix() + "/timeline.html",
                ]
                for i, r in enumerate(runs)
            ],
        ),
    ]
    for i, r in enumerate(runs):
        parts.append(f"<h2>Run {i} (seed {r['seed']}): {_verdict(r)}</h2>")
        if r["error"]:
            parts.append(f"<p class=error>{html.escape(r['error'])}</p>")
        parts.append(_chart(r, r.get("throughput") or [], _LINES, "per second"))
        parts.append(_chart(r, r.get("add_latency") or [], _LATENCY_LINES, "ms"))
        # Re-replication: the count rises while bookies are lost and falls to 0 as the
        # replication workers repair, past the heal and through the convergence phase.
        parts.append(_chart(r, r.get("under_replicated") or [], _TASK_LINES, "ledgers"))
        for name, check in sorted(r["checks"].items()):
            counts = html.escape(str(check.get("counts", {})))
            parts.append(f"<p>{html.escape(name)}: {_verdict(check)} {counts}</p>")
            if name == "durability" and check.get("unknown_ledgers"):
                parts.append(f"<p>{html.escape(describe(check))}</p>")
            if check["anomalies"]:
                parts.append(
                    _table(
                        ["kind", "ledger", "witnesses", "what"],
                        [_anomaly_row(a) for a in check["anomalies"][:50]],
                    )
                )
        parts.append(
            _table(
                ["op", "ok count", "p50 ms", "p99 ms", "max ms"],
                [[f, v["count"], v["p50"], v["p99"], v["max"]] for f, v in r["latency_ms"].items()],
            )
        )
        parts.append(
            _table(
                ["fault", "target", "from s", "to s"],
                [[w["kind"], w["target"], w["start"], w["stop"]] for w in r["windows"]],
            )
        )
        if r.get("events"):
            parts.append(
                _table(
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
    return "\n".join(parts) + "\n"
