"""The campaign report in a real browser (headless Chromium, 1400 px wide): no script
error, every chart drawn with data on one time axis, no two labels on top of each other;
the screenshot is saved beside the report (report.png)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bkref.nemesis.browser import find_chromium, inspect, screenshot
from bkref.nemesis.report import render
from tests.nemesis.test_report import campaign

pytestmark = pytest.mark.skipif(
    find_chromium() is None, reason="no Chromium here: `make setup` installs Debian's chromium"
)


def test_the_report_draws_every_chart_on_one_time_axis_without_errors(tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    page.write_text(render(campaign(tmp_path, runs=2), tmp_path))
    seen = inspect(page)
    assert seen["errors"] == []
    assert [c["id"] for c in seen["charts"]] == ["chart-run-0", "chart-run-1"]
    for chart in seen["charts"]:
        # Seven traces (adds, reads, the clients' two add latencies, the bookies' two from
        # /metrics, the ledgers under-replicated from /metrics), each with its points.
        assert chart["points"] == [60, 60, 55, 55, 58, 58, 70], chart
        # Four panels, one axis: every x range is the run's 0-72 s (its longest series).
        assert chart["xranges"] == [[0, 72]] * 4, chart
        # Four panel titles and four fault labels; the overlapping windows'
        # ("lose-unsynced bookie-4" and "pause bookie-4") in two lanes.
        assert chart["annotations"] == 8, chart
        assert chart["overlaps"] == [], chart
    png = screenshot(page, tmp_path / "report.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 20_000  # a page of charts, not a blank window
