"""Per-second series from scraped /metrics: quantiles as Prometheus takes them, counters
that a restart resets, a bookie out of reach, and a scraper that scrapes a real server."""

from __future__ import annotations

import time

import pytest
from prometheus_client import CollectorRegistry

from bkref.impl.metrics import AdminState, BookieMetrics, MetricsServer
from bkref.nemesis.scrape import Sample, Scraper, parse, quantile, series

INF = float("inf")


def test_quantiles_interpolate_within_a_bucket_as_histogram_quantile_does() -> None:
    buckets = {1.0: 0.0, 2.0: 50.0, 4.0: 100.0, INF: 100.0}
    assert quantile(0.5, buckets) == 2.0
    assert quantile(0.25, buckets) == pytest.approx(1.5)
    assert quantile(0.75, buckets) == pytest.approx(3.0)
    assert quantile(0.99, {1.0: 0.0, INF: 10.0}) == 1.0  # above the top bound: that bound
    assert quantile(0.5, {1.0: 0.0, INF: 0.0}) is None  # nothing observed


def test_series_sum_bookies_per_second_and_a_restart_counts_from_zero() -> None:
    a = [
        Sample(0, add={1.0: 10.0, 10.0: 10.0, INF: 10.0}, bytes_written=0.0),
        Sample(1, add={1.0: 10.0, 10.0: 20.0, INF: 20.0}, bytes_written=500.0),
        Sample(2, add={1.0: 2.0, 10.0: 2.0, INF: 2.0}, bytes_written=100.0),  # restarted
    ]
    b = [Sample(1, add={1.0: 0.0, 10.0: 10.0, INF: 10.0}, under_replicated=3.0)]
    out = series({"bookie-0": a, "bookie-1": b})
    seconds = [row[0] for row in out["add_latency"]]
    assert seconds == [0, 1, 2]
    # Second 1: bookie-0 added 10 adds in (1, 10] ms, bookie-1 its first 10 there too.
    assert out["add_latency"][1][1] == pytest.approx(5.5)
    assert out["add_latency"][2][1] == pytest.approx(0.5)  # 2 adds below 1 ms after restart
    assert out["rereplication"] == [[0, 0.0], [1, 500.0], [2, 100.0]]
    assert out["under_replicated"] == [[1, 3.0]]
    assert out["journal_sync"] == []


def test_a_scraper_reads_a_real_server_and_counts_a_target_out_of_reach() -> None:
    registry = CollectorRegistry()
    metrics = BookieMetrics(registry)
    server = MetricsServer(0, registry, AdminState(None)).start()
    try:
        for _ in range(4):
            metrics.request("add", 0.003, ok=True)
        started = time.monotonic_ns()
        targets = {
            "bookie-0": f"http://127.0.0.1:{server.port}",
            "bookie-1": "http://127.0.0.1:9",  # discard: nothing listens
        }
        scraper = Scraper(targets, lambda: time.monotonic_ns() - started, lambda f: f(), 0.05)
        scraper.start()
        time.sleep(0.5)
        out = scraper.stop()
    finally:
        server.close()
    assert out["scrapes"]["ok"] >= 2
    assert out["scrapes"]["failed"] >= 2
    (second, p50, p99) = out["add_latency"][0]
    assert second == 0
    assert 2.5 <= p50 <= 5.0  # 3 ms, inside the (2.5, 5] bucket
    assert p99 <= 5.0


def test_parse_takes_only_the_series_it_plots() -> None:
    text = (
        'bookkeeper_server_ADD_ENTRY_bucket{success="true",le="1.0"} 3.0\n'
        'bookkeeper_server_ADD_ENTRY_bucket{success="false",le="1.0"} 7.0\n'
        "bkref_under_replicated_ledgers 4.0\n"
        "replication_worker_NUM_BYTES_WRITTEN 1024.0\n"
    )
    s = parse(text, 5)
    assert (s.second, s.add, s.under_replicated, s.bytes_written) == (5, {1.0: 3.0}, 4.0, 1024.0)
