"""Prometheus metrics and a small HTTP admin API of a bookie process, under BookKeeper's names.

Off unless ``httpServerEnabled`` (BookKeeper's own switch, with ``httpServerPort``);
campaigns turn it on. One server on 127.0.0.1:<httpServerPort> (bkref serves only on
the loopback) answers, as BookKeeper's HTTP server does:

- ``/metrics``: the Prometheus text format, series named as BookKeeper's
  PrometheusMetricsProvider names them (scope and name joined by ``_``, a ``success``
  label on operation latencies);
- ``/heartbeat``: ``OK``;
- ``/api/v1/bookie/info``: free and total space of the ledger directory, in bytes;
- ``/api/v1/bookie/state``: running, read-only, shutting down;
- ``/api/v1/autorecovery/list_under_replicated_ledger``: the ledgers marked
  under-replicated, as a JSON list (404 and BookKeeper's words when there is none).

The series (every latency in milliseconds):

============================================  =========  =====================================
series                                        type       what
============================================  =========  =====================================
``bookkeeper_server_ADD_ENTRY``               histogram  an add, from its frame's decoding to
                                                         its response (after the journal)
``bookkeeper_server_READ_ENTRY``              histogram  a read, decoding to response
``bookie_journal_JOURNAL_SYNC``               histogram  one fdatasync of a group commit
``bookie_journal_JOURNAL_ADD_ENTRY``          histogram  a record, queued to durable
``auditor_NUM_UNDER_REPLICATED_LEDGERS``      summary    per audit: the ledgers it marked
``bkref_auditor_ledger_checks``               counter    periodic ledger checks run
``replication_worker_NUM_ENTRIES_WRITTEN``    counter    entries copied to new replicas
``replication_worker_NUM_BYTES_WRITTEN``      counter    bytes copied to new replicas
``replication_worker_NUM_FULL_OR_PARTIAL_...  counter    ledgers the worker repaired
``bkref_under_replicated_ledgers``            gauge      ledgers marked now (ZooKeeper)
============================================  =========  =====================================

BookKeeper exports its OpStatsLoggers as summaries with quantiles; the Python client's
summaries have none, so bkref's latencies are histograms of the same names (``_bucket``,
``_count``, ``_sum``): ``histogram_quantile`` gives the quantiles. Counters keep
BookKeeper's names exactly (no ``_total``), so they go out untyped. BookKeeper's
NUM_BYTES_WRITTEN is an OpStatsLogger (bytes per fragment); here it is a counter. And
BookKeeper has no gauge of the ledgers marked now: ``bkref_under_replicated_ledgers`` is
bkref's own, read from ZooKeeper at most once a second by each AutoRecovery node.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import (
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
    UnknownMetricFamily,
)
from prometheus_client.registry import Collector

if TYPE_CHECKING:  # the shells import this module: no import cycle at run time
    from bkref.impl.autorecovery.auditor import AuditStats
    from bkref.impl.autorecovery.worker import WorkerStats

log = logging.getLogger(__name__)
disable_created_metrics()  # type: ignore[no-untyped-call]  # BookKeeper has no *_created

MS_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)


class BookieMetrics:
    """The bookie's latencies; ``observe_*`` take seconds and record milliseconds."""

    def __init__(self, registry: CollectorRegistry) -> None:
        def ms(name: str, what: str, labels: tuple[str, ...] = ()) -> Histogram:
            return Histogram(name, what, labels, buckets=MS_BUCKETS, registry=registry)

        self.add_entry = ms("bookkeeper_server_ADD_ENTRY", "add latency (ms)", ("success",))
        self.read_entry = ms("bookkeeper_server_READ_ENTRY", "read latency (ms)", ("success",))
        self.journal_sync = ms("bookie_journal_JOURNAL_SYNC", "journal fdatasync latency (ms)")
        self.journal_add = ms(
            "bookie_journal_JOURNAL_ADD_ENTRY", "journal record, queued to durable (ms)"
        )

    def request(self, kind: str, seconds: float, ok: bool) -> None:
        h = self.add_entry if kind == "add" else self.read_entry
        h.labels(success="true" if ok else "false").observe(seconds * 1000)

    def journal_commit(self, sync_seconds: float | None, waits: list[float]) -> None:
        """One group commit: its fdatasync (None: no sync) and each record's wait."""
        if sync_seconds is not None:
            self.journal_sync.observe(sync_seconds * 1000)
        for w in waits:
            self.journal_add.observe(w * 1000)


class AutoRecoveryCollector(Collector):
    """Reads the node's auditor and worker statistics when scraped: nothing is added to
    their hot paths. ``under_replicated`` is kept fresh by :func:`refresh`."""

    def __init__(self, node: Callable[[], tuple[AuditStats | None, WorkerStats | None]]) -> None:
        self.node = node
        self.under_replicated: int | None = None

    def collect(self) -> Iterator[Metric]:
        audit, work = self.node()
        if audit is not None:
            # BookKeeper's OpStatsLogger of this name takes one value per audit: its count
            # is the audits, its sum the ledgers they marked.
            yield SummaryMetricFamily(
                "auditor_NUM_UNDER_REPLICATED_LEDGERS",
                "per audit: the ledgers it marked under-replicated",
                count_value=audit.audits,
                sum_value=audit.marked,
            )
            yield _counter(
                "bkref_auditor_ledger_checks", "periodic ledger checks run", audit.checks
            )
        if work is not None:
            yield _counter(
                "replication_worker_NUM_ENTRIES_WRITTEN",
                "entries copied to new replicas",
                work.entries,
            )
            yield _counter(
                "replication_worker_NUM_BYTES_WRITTEN", "bytes copied to new replicas", work.bytes
            )
            yield _counter(
                "replication_worker_NUM_FULL_OR_PARTIAL_LEDGERS_REPLICATED",
                "ledgers this worker repaired",
                work.repaired,
            )
        if self.under_replicated is not None:
            yield GaugeMetricFamily(
                "bkref_under_replicated_ledgers",
                "ledgers marked under-replicated in ZooKeeper, at the last look",
                self.under_replicated,
            )


def _counter(name: str, what: str, value: int) -> Metric:
    """A counter under BookKeeper's exact name: the Python client would append ``_total``
    to a counter's, so it goes out untyped, as BookKeeper's own text has no suffix."""
    return UnknownMetricFamily(name, what + " (a counter)", value)


@dataclass
class AdminState:
    """What the admin API answers from, read at each request."""

    ledger_dir: str | None  # None: no bookie in this process (a dedicated AutoRecovery node)
    read_only: Callable[[], bool] = lambda: False
    under_replicated: Callable[[], list[int]] | None = None  # None: no ZooKeeper yet
    stopping: threading.Event = field(default_factory=threading.Event)


NO_UR_LEDGERS = "No under replicated ledgers found"  # BookKeeper's words


class MetricsServer:
    """``/metrics`` and the admin API on 127.0.0.1:``port``, in a daemon thread."""

    def __init__(self, port: int, registry: CollectorRegistry, state: AdminState) -> None:
        self.registry, self.state = registry, state
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                code, ctype, body = server.answer(self.path.split("?", 1)[0])
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                log.debug("http: " + format, *args)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self.port = int(self.httpd.server_address[1])
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, name="http-admin", daemon=True
        )

    def start(self) -> MetricsServer:
        self._thread.start()
        log.info("metrics and admin API on http://127.0.0.1:%d/metrics", self.port)
        return self

    def answer(self, path: str) -> tuple[int, str, bytes]:
        s = self.state
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, generate_latest(self.registry)
        if path == "/heartbeat":
            return 200, "text/plain", b"OK\n"
        if path.startswith("/api/v1/bookie/") and s.ledger_dir is None:
            return 404, "text/plain", b"no bookie runs in this process\n"
        if path == "/api/v1/bookie/info":
            assert s.ledger_dir is not None
            usage = shutil.disk_usage(s.ledger_dir)
            return _json({"freeSpace": usage.free, "totalSpace": usage.total})
        if path == "/api/v1/bookie/state":
            stopping = s.stopping.is_set()
            return _json(
                {
                    "running": not stopping,
                    "readOnly": s.read_only(),
                    "shuttingDown": stopping,
                    "availableForHighPriorityWrites": not stopping,
                }
            )
        if path == "/api/v1/autorecovery/list_under_replicated_ledger":
            if s.under_replicated is None:
                return 503, "text/plain", b"not connected to ZooKeeper yet\n"
            ledgers = s.under_replicated()
            if not ledgers:
                return 404, "text/plain", NO_UR_LEDGERS.encode()
            return _json(sorted(ledgers))
        return 404, "text/plain", f"no such endpoint: {path}\n".encode()

    def close(self) -> None:
        """Stop serving and wait for the server's thread to end."""
        self.state.stopping.set()
        if self._thread.is_alive():
            self.httpd.shutdown()
            self._thread.join()
        self.httpd.server_close()


def _json(value: object) -> tuple[int, str, bytes]:
    return 200, "application/json", json.dumps(value).encode()


def refresh(
    period: float, read: Callable[[], int], into: AutoRecoveryCollector, stop: threading.Event
) -> None:
    """Keep ``into.under_replicated`` at most ``period`` seconds old, until ``stop``; a
    failed read leaves the last value (ZooKeeper out of reach)."""
    while not stop.is_set():
        try:
            into.under_replicated = read()
        except Exception as e:  # a lost session, a partition: the next look retries
            log.debug("under-replicated count: %r", e)
        stop.wait(period)
