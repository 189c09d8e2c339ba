"""Each check's section of the campaign report: its verdict, every figure it reported under
a name a reader knows, and its first anomalies with links into the run's timeline.

A check's result is the dict of :mod:`bkref.nemesis.checker`. Figures named in
:data:`FIGURES` come first, in that order, with their words; any other scalar field is
shown too, under its own name, so a figure a check gains is never hidden. A mapping of
counts (anomalies by kind, unknown ledgers by reason) is spelled out, or says "none".
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

from bkref.linearizability.durability import describe
from bkref.nemesis.report_html import dig, table, verdict

FIRST_ANOMALIES = 10

# (check, field, words): a dotted field reads into a mapping ("counts.explained").
FIGURES: dict[str, tuple[tuple[str, str], ...]] = {
    "linearizable": (("ledgers", "ledgers checked"),),
    "durability": (
        ("acknowledged", "acknowledged entries"),
        ("ledgers", "ledgers"),
        ("final_reads", "entries found by the final reads"),
        ("unknown_ledgers", "ledgers the history cannot decide"),
    ),
    "replication": (
        ("converge_seconds", "seconds to converge after the heal"),
        ("entries_audited", "entries audited on every bookie of their write set"),
        ("full_check_marked", "replicas marked by the final full ledger check"),
    ),
    "trace": (
        ("counts.ledgers", "ledgers traced"),
        ("counts.explained", "explained by the spec"),
        ("counts.violation", "with a step the spec does not allow"),
        ("counts.unknown", "unknown (the spec could not decide)"),
        ("counts.steps", "protocol steps replayed"),
        ("seconds", "check time (s)"),
        ("peak_mib", "check's peak memory (MiB)"),
    ),
}
# Fields shown otherwise: the verdict, the anomaly table, the mappings and lists below.
_NOT_FIGURES = {"valid", "anomalies", "counts", "unknown", "unknown_reasons"}
_MAPPINGS = {
    "unknown": "unknown ledgers by reason",
    "unknown_reasons": "unknown ledgers by reason",
}
_EXAMPLES = {"unknown_examples": "unknown ledgers, first few", "unknown_ledgers": "unknown ledgers"}


def _number(v: object) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:,.1f}"
    return str(v)


def figures(name: str, check: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(words, value) of every figure the check reported, the named ones first."""
    out: list[tuple[str, str]] = []
    named = FIGURES.get(name, ())
    for path, words in named:
        v = dig(check, path)
        if v is not None and not isinstance(v, Mapping | list):
            out.append((words, _number(v)))
    known = {path.split(".")[0] for path, _ in named}
    for key, v in check.items():
        if key in known or key in _NOT_FIGURES or key in _EXAMPLES:
            continue
        if not isinstance(v, Mapping | list) and v is not None:
            out.append((key.replace("_", " "), _number(v)))
    if name != "trace":
        out.append(("anomalies", _counts(check.get("counts") or _by_kind(check))))
    for key, words in _MAPPINGS.items():
        if isinstance(check.get(key), Mapping) and check[key]:
            out.append((words, _counts(check[key])))
    return out


def _by_kind(check: Mapping[str, Any]) -> dict[str, int]:
    kinds: dict[str, int] = {}
    for a in check.get("anomalies") or []:
        kinds[a["kind"]] = kinds.get(a["kind"], 0) + 1
    return kinds


def _counts(counts: Mapping[str, Any]) -> str:
    if not counts or not any(counts.values()):
        return "none"
    return ", ".join(f"{k} {_number(v)}" for k, v in sorted(counts.items()) if v)


def _ledger_link(ledger: object, timeline: str) -> str:
    if not isinstance(ledger, int):
        return "-"
    return f'<a href="{html.escape(timeline)}#ledger-{ledger}">ledger {ledger}</a>'


def _witnesses(a: Mapping[str, Any]) -> str:
    """History anomalies name the operations that prove them; replication and cluster
    anomalies name entries, bookies or nodes instead: show whatever this one has."""
    if "ops" in a:
        return html.escape(f"ops {a['ops']}")
    rest = {k: v for k, v in a.items() if k not in ("kind", "ledger", "ops", "message")}
    return html.escape(", ".join(f"{k} {v}" for k, v in rest.items()))


def section(name: str, check: Mapping[str, Any], timeline: str) -> str:
    """The check's verdict, figures and first anomalies; ``timeline`` is the run's
    timeline page, relative to the report."""
    parts = [f"<h3>{html.escape(name)}: {verdict(check.get('valid'))}</h3>"]
    if name == "durability" and "acknowledged" in check:
        parts.append(f"<p>{html.escape(describe(check))}</p>")
    parts.append(table(["figure", "value"], figures(name, check)))
    anomalies: list[Mapping[str, Any]] = check.get("anomalies") or []
    if anomalies:
        shown = anomalies[:FIRST_ANOMALIES]
        more = len(anomalies) - len(shown)
        parts.append(
            f"<p>First {len(shown)} of {len(anomalies):,} anomalies"
            + (f" ({more:,} more in results.json)" if more else "")
            + ":</p>"
        )
        parts.append(
            table(
                ["kind", "ledger", "witnesses", "what"],
                [
                    [
                        html.escape(str(a["kind"])),
                        _ledger_link(a.get("ledger"), timeline),
                        _witnesses(a),
                        html.escape(str(a.get("message", ""))),
                    ]
                    for a in shown
                ],
                raw=4,  # escaped above, links kept
            )
        )
    for key, words in _EXAMPLES.items():
        examples = check.get(key)
        if isinstance(examples, list) and examples:
            parts.append(f"<p>{html.escape(words)}:</p>")
            parts.append(
                table(
                    ["ledger", "why"],
                    [
                        [
                            _ledger_link(e.get("ledger"), timeline),
                            html.escape(str(e.get("reason", e.get("why", "")))),
                        ]
                        for e in examples[:FIRST_ANOMALIES]
                    ],
                    raw=2,
                )
            )
    return "\n".join(parts)
