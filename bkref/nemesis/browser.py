"""The report as a browser shows it: headless Chromium (Debian's ``chromium``), for a
screenshot beside the report and for the test that the page works.

:func:`inspect` opens a copy of the page with two scripts added (an error listener
first, a probe last) and reads back what the probe found: script errors, each chart's
points per trace, and every pair of chart annotations whose boxes overlap on screen.
Chromium runs with ``--no-sandbox`` (its sandbox needs a user namespace that root and
containers often lack) on a local file only: nothing is fetched.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

WIDTH = 1400
CANDIDATES = ("chromium", "chromium-browser", "google-chrome")

_ERRORS = """<script>window.__bkref_errors=[];
addEventListener('error',e=>__bkref_errors.push(String(e.message||e)));
addEventListener('unhandledrejection',e=>__bkref_errors.push(String(e.reason)));</script>"""

# Runs once the page and its charts are drawn; writes its findings into an attribute of
# <body>, which --dump-dom prints.
_PROBE = """<script>addEventListener('load',()=>setTimeout(()=>{
const charts=[...document.querySelectorAll('.plotly-graph-div')].map(gd=>{
 const boxes=[...gd.querySelectorAll('g.annotation')].map(a=>{const r=a.getBoundingClientRect();
  return {text:a.textContent,l:r.left,r:r.right,t:r.top,b:r.bottom};});
 const overlaps=[];
 for(let i=0;i<boxes.length;i++)for(let j=i+1;j<boxes.length;j++){const a=boxes[i],b=boxes[j];
  if(a.l<b.r-1&&b.l<a.r-1&&a.t<b.b-1&&b.t<a.b-1)overlaps.push([a.text,b.text]);}
 const axes=Object.keys(gd._fullLayout||{}).filter(k=>/^xaxis\\d*$/.test(k))
  .map(k=>gd._fullLayout[k].range);
 return {id:gd.id,points:(gd.data||[]).map(t=>(t.x||[]).length),annotations:boxes.length,
  overlaps:overlaps,xranges:axes};});
document.body.setAttribute('data-bkref-probe',JSON.stringify({errors:window.__bkref_errors,
 charts:charts}));},500));</script>"""


class BrowserError(RuntimeError):
    pass


def find_chromium() -> str | None:
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    exe = find_chromium()
    if exe is None:
        raise BrowserError(
            "no Chromium found (chromium, chromium-browser or google-chrome): "
            "`make setup` installs Debian's chromium"
        )
    argv = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args]
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as e:
        raise BrowserError(f"Chromium did not finish within {timeout:.0f} s: {argv}") from e


def screenshot(page: Path, png: Path, height: int = 2400, timeout: float = 120) -> Path:
    """A PNG of ``page`` in a window :data:`WIDTH` px wide."""
    proc = _run(
        [
            f"--window-size={WIDTH},{height}",
            "--virtual-time-budget=10000",
            f"--screenshot={png}",
            page.resolve().as_uri(),
        ],
        timeout,
    )
    if not png.exists():
        raise BrowserError(f"Chromium wrote no screenshot (exit {proc.returncode}): {proc.stderr}")
    return png


def inspect(page: Path, timeout: float = 120) -> dict[str, Any]:
    """Open an instrumented copy of ``page`` and return what the probe saw:
    ``{"errors": [...], "charts": [{"id", "points", "annotations", "overlaps",
    "xranges"}]}``."""
    text = page.read_text()
    probe = page.with_name(page.stem + ".probe.html")
    probe.write_text(
        text.replace("<head>", "<head>" + _ERRORS, 1).replace("</body>", _PROBE + "</body>", 1)
    )
    try:
        proc = _run(
            [
                f"--window-size={WIDTH},2400",
                "--virtual-time-budget=10000",
                "--dump-dom",
                probe.resolve().as_uri(),
            ],
            timeout,
        )
    finally:
        probe.unlink(missing_ok=True)
    found = re.search(r'data-bkref-probe="([^"]*)"', proc.stdout)
    if found is None:
        raise BrowserError(
            f"the page's probe did not run (exit {proc.returncode}); stderr: {proc.stderr[-500:]}"
        )
    result: dict[str, Any] = json.loads(html.unescape(found.group(1)))
    return result
