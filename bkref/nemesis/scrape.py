"""Scrape every bookie's ``/metrics`` once a second during a run, as Prometheus would, and
turn the samples into per-second series for the report.

The scraper runs in a thread of its own, placed by the backend where the bookies' metrics
ports can be reached and no partition cuts it off (:meth:`Backend.scrape_in`: the admin
namespace, the Docker engine's). A scrape that fails (a bookie killed, paused or out of
reach) is counted and leaves a gap. Series, by second of the run (the history's clock):

- ``add_latency``: p50 and p99 (ms) of the adds acknowledged in that second, over every
  bookie (``bookkeeper_server_ADD_ENTRY``, success="true": the bookie's side of an add);
- ``journal_sync``: p50 and p99 (ms) of the journals' fdatasyncs
  (``bookie_journal_JOURNAL_SYNC``);
- ``under_replicated``: ledgers marked under-replicated, as the AutoRecovery nodes last
  counted them (``bkref_under_replicated_ledgers``, the highest any node reports);
- ``rereplication``: bytes per second the replication workers copied
  (``replication_worker_NUM_BYTES_WRITTEN``).

Quantiles come from the histograms' buckets as Prometheus's ``histogram_quantile`` takes
them: the bucket deltas of the second, summed over bookies, linear within a bucket. A
counter that went down (the bookie restarted) counts from 0 again.
"""

from __future__ import annotations

import math
import threading
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

ADD = "bookkeeper_server_ADD_ENTRY"
SYNC = "bookie_journal_JOURNAL_SYNC"
UNDER_REPLICATED = "bkref_under_replicated_ledgers"
BYTES = "replication_worker_NUM_BYTES_WRITTEN"

Buckets = dict[float, float]  # upper bound -> cumulative count


@dataclass
class Sample:
    """What one scrape of one bookie showed."""

    second: int
    add: Buckets = field(default_factory=dict)
    sync: Buckets = field(default_factory=dict)
    under_replicated: float | None = None
    bytes_written: float | None = None


def parse(text: str, second: int) -> Sample:
    s = Sample(second)
    for family in text_string_to_metric_families(text):
        for m in family.samples:
            if m.name == f"{ADD}_bucket" and m.labels.get("success") == "true":
                s.add[float(m.labels["le"])] = m.value
            elif m.name == f"{SYNC}_bucket":
                s.sync[float(m.labels["le"])] = m.value
            elif m.name == UNDER_REPLICATED:
                s.under_replicated = m.value
            elif m.name == BYTES:
                s.bytes_written = m.value
    return s


def quantile(q: float, buckets: Buckets) -> float | None:
    """``histogram_quantile(q, ...)`` of cumulative ``buckets``; None without observations."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    rank = q * buckets[bounds[-1]]
    lower, below = 0.0, 0.0
    for b in bounds:
        if buckets[b] >= rank:
            if math.isinf(b):
                return lower  # above the highest finite bound: that bound, as Prometheus
            width = buckets[b] - below
            return lower + (b - lower) * ((rank - below) / width if width else 1.0)
        lower, below = b, buckets[b]
    return lower


def _delta(now: Buckets, before: Buckets | None) -> Buckets:
    if before is None or any(now.get(b, 0.0) < v for b, v in before.items()):
        return dict(now)  # first scrape, or a restart reset the histogram
    return {b: v - before.get(b, 0.0) for b, v in now.items()}


def _sum(into: Buckets, add: Buckets) -> None:
    for b, v in add.items():
        into[b] = into.get(b, 0.0) + v


def series(samples: Mapping[str, list[Sample]]) -> dict[str, list[list[float]]]:
    """Per-second series from each bookie's samples (in scrape order)."""
    add: dict[int, Buckets] = {}
    sync: dict[int, Buckets] = {}
    marked: dict[int, float] = {}
    copied: dict[int, float] = {}
    for node_samples in samples.values():
        last_add: Buckets | None = None
        last_sync: Buckets | None = None
        last_bytes: float | None = None
        for s in node_samples:
            if s.add:
                _sum(add.setdefault(s.second, {}), _delta(s.add, last_add))
                last_add = s.add
            if s.sync:
                _sum(sync.setdefault(s.second, {}), _delta(s.sync, last_sync))
                last_sync = s.sync
            if s.under_replicated is not None:
                marked[s.second] = max(marked.get(s.second, 0.0), s.under_replicated)
            if s.bytes_written is not None:
                grew = s.bytes_written - (last_bytes or 0.0)
                copied[s.second] = copied.get(s.second, 0.0) + (
                    s.bytes_written if grew < 0 else grew
                )
                last_bytes = s.bytes_written
    seconds = [*add, *sync, *marked, *copied]
    if not seconds:
        return {}
    span = range(max(seconds) + 1)

    def quantiles(per: dict[int, Buckets]) -> list[list[float]]:
        return [
            [s, round(quantile(0.5, per[s]) or 0.0, 2), round(quantile(0.99, per[s]) or 0.0, 2)]
            for s in span
            if s in per
        ]

    return {
        "add_latency": quantiles(add),
        "journal_sync": quantiles(sync),
        "under_replicated": [[s, marked[s]] for s in span if s in marked],
        "rereplication": [[s, copied[s]] for s in span if s in copied],
    }


class Scraper:
    """Scrapes ``targets`` (node -> base URL) once a second until :meth:`stop`."""

    def __init__(
        self,
        targets: Mapping[str, str],
        clock_ns: Callable[[], int],
        place: Callable[[Callable[[], None]], None],
        period: float = 1.0,
    ) -> None:
        self.targets, self.clock_ns, self.period = dict(targets), clock_ns, period
        self.samples: dict[str, list[Sample]] = {n: [] for n in targets}
        self.ok = self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=place, args=(self._run,), name="metrics-scraper", daemon=True
        )

    def start(self) -> Scraper:
        self._thread.start()
        return self

    def _scrape(self) -> None:
        for node, url in self.targets.items():
            second = self.clock_ns() // 1_000_000_000
            try:
                # http:// only: the targets are the backend's, never user input.
                with urllib.request.urlopen(f"{url}/metrics", timeout=0.5) as r:  # noqa: S310
                    text = r.read().decode()
            except OSError:
                self.failed += 1
                continue
            self.ok += 1
            self.samples[node].append(parse(text, second))

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self._scrape()

    def stop(self) -> dict[str, Any]:
        """Stop (waiting for the thread), and return the series and the scrape counts."""
        self._stop.set()
        self._thread.join(timeout=10.0)
        return {"scrapes": {"ok": self.ok, "failed": self.failed}, **series(self.samples)}
