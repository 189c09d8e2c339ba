"""A self-contained HTML timeline of a history, in the spirit of Porcupine's.

One section per ledger (or key), one lane per process, each operation a bar
from its invocation to its completion (to the right edge if its outcome is
unknown). The x axis is the order of events in that section (history indices
ranked), so a ledger inside a big interleaved history is still readable. The
failing window is shaded and the operations that prove a violation are drawn
in red; hovering a bar shows the operation. For the generic search, ``#k``
marks the k-th operation of the longest linearization it found. Inline CSS and JS only: the file
opens anywhere without a network.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

MAX_BARS = 600  # per section; beyond that, the bars around the window are shown

_CSS = """
body{font:13px system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.3em} h2{font-size:1.05em;margin:1.2em 0 .3em}
details{border:1px solid #ddd;border-radius:6px;padding:.4em .8em;margin:.6em 0}
summary{cursor:pointer} .valid{color:#1a7f37} .invalid{color:#c62828} .unknown{color:#8a6d00}
svg{display:block;margin:.4em 0;overflow:visible}
rect.op{stroke:#555;stroke-width:.6} rect.ok{fill:#cfe8d5} rect.fail{fill:#f3d0d0}
rect.info{fill:#e4e4e4;stroke-dasharray:3 2} rect.hot{stroke:#c62828;stroke-width:2.2}
rect.window{fill:#ffcdd2;opacity:.45} rect.op:hover{fill:#ffe082}
text{font-size:10px;pointer-events:none} text.lane{fill:#666}
text.order{font-size:8px;fill:#1565c0}
#tip{position:fixed;pointer-events:none;background:#fffde7;border:1px solid #aaa;
 padding:3px 6px;border-radius:4px;display:none;font-size:12px;max-width:40em}
ul.notes{margin:.2em 0 .2em 1.2em;padding:0}
"""

_JS = """
const opened=()=>{const d=location.hash&&document.getElementById(location.hash.slice(1));
 if(d&&d.tagName==='DETAILS'){d.open=true;d.scrollIntoView();}};
addEventListener('hashchange',opened);opened();
const tip=document.getElementById('tip');
document.querySelectorAll('rect.op').forEach(r=>{
 r.addEventListener('mousemove',e=>{tip.textContent=r.dataset.d;tip.style.display='block';
  tip.style.left=(e.clientX+12)+'px';tip.style.top=(e.clientY+12)+'px';});
 r.addEventListener('mouseleave',()=>{tip.style.display='none';});});
"""


@dataclass(frozen=True)
class Bar:
    process: str
    call: int  # history index of the invocation
    ret: float  # history index of the completion; inf if unknown
    label: str
    status: str  # ok, fail or info
    hot: bool = False  # one of the operations that prove a violation
    order: int | None = None  # its place in the (partial) linearization found, from 1


@dataclass
class Section:
    title: str
    verdict: str  # valid, invalid, unknown
    bars: list[Bar]
    notes: list[str] = field(default_factory=list)
    window: tuple[int, float] | None = None  # history indices of the failing window


def _visible(section: Section) -> tuple[list[Bar], str]:
    bars = sorted(section.bars, key=lambda b: b.call)
    if len(bars) <= MAX_BARS:
        return bars, ""
    centre = section.window[0] if section.window else bars[0].call
    hot = [i for i, b in enumerate(bars) if b.hot]
    mid = hot[0] if hot else next((i for i, b in enumerate(bars) if b.call >= centre), 0)
    lo = max(0, mid - MAX_BARS // 2)
    shown = bars[lo : lo + MAX_BARS]
    shown += [b for b in bars if b.hot and b not in shown]
    return shown, f"showing {len(shown)} of {len(bars)} operations, around the failure"


def _svg(section: Section) -> str:
    bars, note = _visible(section)
    if not bars:
        return "<p>(no operations)</p>"
    points = sorted(
        {b.call for b in bars}
        | {int(b.ret) for b in bars if b.ret != math.inf}
        | ({section.window[0]} if section.window else set())
        | ({int(section.window[1])} if section.window and section.window[1] != math.inf else set())
    )
    rank = {p: i for i, p in enumerate(points)}
    step, lane_h, left = 14, 22, 90
    end = len(points)
    lanes = sorted({b.process for b in bars}, key=lambda p: (len(p), p))
    lane_of = {p: i for i, p in enumerate(lanes)}
    width = left + step * (end + 1)
    height = lane_h * len(lanes) + 10
    out = [f'<svg width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg">']
    if section.window is not None:
        x0 = left + step * rank[section.window[0]]
        w_end = section.window[1]
        x1 = left + step * (rank[int(w_end)] if w_end != math.inf else end)
        out.append(
            f'<rect class="window" x="{x0}" y="0" width="{max(x1 - x0, 4)}" height="{height}"/>'
        )
    for p, i in lane_of.items():
        out.append(f'<text class="lane" x="0" y="{i * lane_h + 15}">{html.escape(p)}</text>')
    for b in bars:
        x = left + step * rank[b.call]
        x_end = left + step * (rank[int(b.ret)] if b.ret != math.inf else end)
        y = lane_of[b.process] * lane_h + 3
        cls = f"op {b.status}" + (" hot" if b.hot else "")
        place = f", linearized #{b.order}" if b.order is not None else ""
        detail = html.escape(
            f"[{b.call}] process {b.process}: {b.label} ({b.status}{place})", quote=True
        )
        w = max(x_end - x, 6)
        out.append(
            f'<rect class="{cls}" x="{x}" y="{y}" width="{w}" height="{lane_h - 6}" '
            f'rx="3" data-d="{detail}"/>'
        )
        if w > 7 * len(b.label):
            out.append(f'<text x="{x + 3}" y="{y + 12}">{html.escape(b.label)}</text>')
        if b.order is not None:
            out.append(f'<text class="order" x="{x}" y="{y - 1}">#{b.order}</text>')
    out.append("</svg>")
    if note:
        out.insert(0, f"<p><em>{html.escape(note)}</em></p>")
    return "\n".join(out)


def anchor(title: str) -> str:
    """A section's id in the page: ``ledger 3`` is ``#ledger-3`` (the campaign report
    links its anomalies here)."""
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def render(title: str, sections: Sequence[Section], summary: Iterable[str] = ()) -> str:
    """The whole page; invalid sections first and open."""
    ordered = sorted(sections, key=lambda s: (s.verdict != "invalid", s.title))
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    parts += [f"<p>{html.escape(line)}</p>" for line in summary]
    for s in ordered:
        is_open = " open" if s.verdict != "valid" else ""
        parts.append(
            f"<details id='{anchor(s.title)}'{is_open}><summary><b>{html.escape(s.title)}</b> "
            f"<span class='{s.verdict}'>{s.verdict}</span> ({len(s.bars)} operations)</summary>"
        )
        if s.notes:
            parts.append("<ul class='notes'>")
            parts += [f"<li>{html.escape(n)}</li>" for n in s.notes]
            parts.append("</ul>")
        parts.append(_svg(s))
        parts.append("</details>")
    parts.append(f"<div id='tip'></div><script>{_JS}</script></body></html>")
    return "\n".join(parts)
