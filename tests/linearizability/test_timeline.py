"""The HTML timeline is one self-contained page with lanes, bars and the window."""

from __future__ import annotations

import math

from bkref.linearizability.timeline import MAX_BARS, Bar, Section, anchor, render


def test_page_has_lanes_bars_window_and_no_network() -> None:
    bars = [
        Bar("0", 0, 3, "add(0, 'a')", "ok"),
        Bar("1", 1, 2, "read(0) -> not found", "ok", hot=True),
        Bar("2", 4, math.inf, "recover() -> ?", "info"),
    ]
    page = render("t", [Section("ledger 1", "invalid", bars, ["stale-read: ..."], (1, 2))])
    assert page.startswith("<!doctype html>")
    assert page.count('class="op ') == 3
    assert 'class="op ok hot"' in page
    assert 'class="op info"' in page
    assert 'class="window"' in page
    assert "http" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "<script>" in page
    assert "<style>" in page


def test_big_sections_show_the_bars_around_the_failure() -> None:
    bars = [Bar(str(i % 7), i * 2, i * 2 + 1, "x", "ok", hot=(i == 5000)) for i in range(10_000)]
    page = render("t", [Section("ledger 1", "invalid", bars, [], (10_000, 10_001))])
    assert page.count('class="op ') <= MAX_BARS + 1
    assert "hot" in page
    assert "around the failure" in page


def test_each_section_is_an_anchor_the_campaign_report_links_to() -> None:
    bars = [Bar("0", 0, 1, "add(0, 'a')", "ok")]
    page = render("t", [Section("ledger 12", "valid", bars, [], None)])
    assert anchor("ledger 12") == "ledger-12"
    assert "<details id='ledger-12'>" in page  # valid: closed until its link opens it
    assert "location.hash" in page
