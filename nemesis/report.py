"""A self-contained HTML report of a campaign: verdicts, anomalies, faults, latencies.

Inline CSS only, no scripts from the network: the file opens anywhere. Each
run links to its own timeline (``timeline.html``, drawn by the
linearizability package) where the operations of every ledger are bars on
their process lanes.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

_CSS = """
body{font:14px system-ui,sans-serif;margin:2em;color:#222;max-width:70em}
h1{font-size:1.4em} h2{font-size:1.1em;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0} td,th{border:1px solid #ddd;padding:3px 8px;
text-align:left} th{background:#f5f5f5} .valid{color:#1a7f37;font-weight:600}
.invalid{color:#c62828;font-weight:600} .error{color:#8a6d00;font-weight:600}
code{background:#f5f5f5;padding:0 3px}
"""


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


def render(campaign: dict[str, Any], out_dir: Path) -> str:
    runs: list[dict[str, Any]] = campaign["runs"]
    parts = [
        f"<!doctype html><meta charset=utf-8><title>bkref campaign</title><style>{_CSS}</style>",
        "<h1>bkref campaign</h1>",
        f"<p>{len(runs)} run(s), faults <code>{html.escape(','.join(campaign['faults']))}</code>, "
        f"{campaign['time']} s each, backend <code>{html.escape(campaign['backend'])}</code>. "
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
        for name, check in sorted(r["checks"].items()):
            counts = html.escape(str(check.get("counts", {})))
            parts.append(f"<p>{html.escape(name)}: {_verdict(check)} {counts}</p>")
            if check["anomalies"]:
                parts.append(
                    _table(
                        ["kind", "ledger", "operations (history indices)", "what"],
                        [
                            [a["kind"], a["ledger"], a["ops"], a["message"]]
                            for a in check["anomalies"][:50]
                        ],
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
    return "\n".join(parts) + "\n"
