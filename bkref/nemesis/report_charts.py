"""A run's time series as one Plotly figure: every panel on the same time axis, the fault
windows shaded across all of them and labelled in lanes that never overlap.

The report embeds plotly.js once (:func:`plotly_js`), so the page needs no network when
it is opened. The panels are stacked subplots whose x axes are matched: zooming one
zooms all, and every panel spans the same seconds, from the run's start to the last
sample of any series or the end of the last fault window.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go
import plotly.offline
from plotly.subplots import make_subplots

from bkref.nemesis.faults import FAULTS
from bkref.nemesis.report_html import dig

WIDTH = 1300  # px: fits a 1400 px window beside the page's margin
MARGIN = {"l": 70, "r": 30, "b": 60}
LABEL_PX_PER_CHAR = 7.5  # 11 px system-ui text is narrower; an overestimate only spreads lanes
LANE_PX = 16
PANEL_PX = 170


@dataclass(frozen=True)
class Series:
    name: str
    column: int  # the value's column in the run's rows ([second, v1, v2, ...])
    colour: str


@dataclass(frozen=True)
class Panel:
    """One subplot: a run field of per-second rows and the series drawn from it;
    ``field`` may be dotted (``scraped.add_latency``: the bookies' /metrics)."""

    field: str
    title: str
    unit: str
    series: tuple[Series, ...]
    instead_of: str | None = None  # a panel this one replaces when it has data

    def rows(self, run: dict[str, Any]) -> list[list[float]]:
        rows = dig(run, self.field)
        return rows if isinstance(rows, list) else []


PANELS = (
    Panel(
        "throughput",
        "acknowledged operations",
        "per second",
        (Series("adds", 1, "#1a7f37"), Series("reads", 2, "#1565c0")),
    ),
    Panel(
        "add_latency",
        "add latency (by second of invocation)",
        "ms",
        (Series("add p50", 1, "#1a7f37"), Series("add p99", 2, "#c62828")),
    ),
    Panel(
        "scraped.add_latency",
        "add latency at the bookies (/metrics: bookkeeper_server_ADD_ENTRY)",
        "ms",
        (Series("bookie add p50", 1, "#00897b"), Series("bookie add p99", 2, "#ef6c00")),
    ),
    Panel(
        "scraped.journal_sync",
        "journal fdatasync (/metrics: bookie_journal_JOURNAL_SYNC)",
        "ms",
        (Series("fdatasync p50", 1, "#5d4037"), Series("fdatasync p99", 2, "#d81b60")),
    ),
    Panel(
        "under_replicated",
        "ledgers marked under-replicated (ZooKeeper, sampled by the campaign)",
        "ledgers",
        (Series("under-replicated", 1, "#6a1b9a"),),
    ),
    Panel(
        "scraped.under_replicated",
        "ledgers marked under-replicated (/metrics: bkref_under_replicated_ledgers)",
        "ledgers",
        (Series("under-replicated", 1, "#6a1b9a"),),
        instead_of="under_replicated",
    ),
    Panel(
        "scraped.rereplication",
        "re-replication (/metrics: replication_worker_NUM_BYTES_WRITTEN)",
        "bytes per second",
        (Series("copied", 1, "#283593"),),
    ),
)


def panels_of(run: dict[str, Any]) -> list[Panel]:
    """The panels with data, a panel's replacement taking its place."""
    have = [p for p in PANELS if p.rows(run)]
    replaced = {p.instead_of for p in have}
    return [p for p in have if p.field not in replaced]


def plotly_js() -> str:
    """plotly.js itself, for one inline ``<script>`` per page."""
    return str(plotly.offline.get_plotlyjs())


def axis_end(run: dict[str, Any]) -> float:
    """The seconds every panel spans: to the last sample or fault window, whichever ends last."""
    ends = [max((r[0] + 1.0 for r in p.rows(run)), default=0.0) for p in PANELS]
    ends += [float(sp["stop"]) for sp in run.get("spans") or []]
    return max([*ends, 1.0])


@dataclass(frozen=True)
class Label:
    text: str
    x: float  # seconds: the label's anchor
    anchor: str  # "left" (starts at x) or "right" (ends at x)
    lane: int  # 0 is nearest the plot


def fault_labels(spans: Sequence[dict[str, Any]], seconds: float) -> list[Label]:
    """A label per fault window, at its start, in the first lane where it overlaps no other
    (widths estimated from the text at :data:`LABEL_PX_PER_CHAR`); one that would run off
    the right edge ends at the edge instead."""
    plot_px = WIDTH - MARGIN["l"] - MARGIN["r"]
    lanes: list[float] = []  # the right end (px) of the last label in each lane
    out: list[Label] = []
    for sp in sorted(spans, key=lambda s: float(s["start"])):
        text = f"{sp['kind']} {sp['target']}"
        width = LABEL_PX_PER_CHAR * len(text) + 8
        x0 = plot_px * float(sp["start"]) / seconds
        anchor, x = "left", float(sp["start"])
        if x0 + width > plot_px:
            anchor, x, x0 = "right", seconds, plot_px - width
        lane = next((i for i, end in enumerate(lanes) if end <= x0), len(lanes))
        lanes[lane : lane + 1] = [x0 + width]
        out.append(Label(text, x, anchor, lane))
    return out


def run_figure(run: dict[str, Any]) -> go.Figure | None:
    """The run's panels with data, on one time axis; None when it has no series at all."""
    panels = panels_of(run)
    if not panels:
        return None
    seconds = axis_end(run)
    spans: list[dict[str, Any]] = run.get("spans") or []
    labels = fault_labels(spans, seconds)
    lanes = 1 + max((lb.lane for lb in labels), default=-1)
    fig = make_subplots(
        rows=len(panels),
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.08,
        subplot_titles=[p.title for p in panels],
    )
    for row, p in enumerate(panels, start=1):
        rows = p.rows(run)
        for s in p.series:
            fig.add_trace(
                go.Scatter(
                    x=[r[0] + 0.5 for r in rows],  # the middle of its second
                    y=[r[s.column] for r in rows],
                    name=f"{s.name} ({p.unit})",
                    mode="lines",
                    line={"color": s.colour, "width": 1.5},
                    hovertemplate=f"%{{y}} {p.unit} at %{{x:.1f}} s<extra>{s.name}</extra>",
                ),
                row=row,
                col=1,
            )
        fig.update_yaxes(title_text=p.unit, rangemode="tozero", row=row, col=1)
    fig.update_xaxes(range=[0, seconds], showticklabels=True, ticksuffix=" s")
    fig.update_xaxes(title_text="seconds since the run started", row=len(panels), col=1)
    for sp in spans:
        colour = FAULTS[sp["kind"]].colour if sp["kind"] in FAULTS else "#bdbdbd"
        fig.add_vrect(
            x0=float(sp["start"]),
            x1=max(float(sp["stop"]), float(sp["start"]) + seconds / 400),
            fillcolor=colour,
            opacity=0.25,
            line_width=0,
            layer="below",
            row="all",
            col=1,
        )
    for lb in labels:
        kind = lb.text.split(" ", 1)[0]
        fig.add_annotation(
            x=lb.x,
            y=1,
            xref="x",
            yref="paper",
            yanchor="bottom",
            xanchor=lb.anchor,
            yshift=24 + LANE_PX * lb.lane,
            text=lb.text,
            showarrow=False,
            font={"size": 11, "color": FAULTS[kind].colour if kind in FAULTS else "#757575"},
        )
    fig.update_layout(
        width=WIDTH,
        height=PANEL_PX * len(panels) + 140 + LANE_PX * lanes,
        margin={**MARGIN, "t": 50 + LANE_PX * lanes},
        template="plotly_white",
        legend={"orientation": "h", "y": -0.12 * 3 / len(panels)},
        hovermode="x unified",
    )
    return fig


def figure_html(fig: go.Figure, div_id: str) -> str:
    """The figure as a ``<div>`` and its script, plotly.js not included."""
    return str(
        fig.to_html(
            full_html=False,
            include_plotlyjs=False,
            div_id=div_id,
            config={"displaylogo": False, "responsive": False},
        )
    )
