"""An AutoRecovery node: the auditor elector and a replication worker, on one event loop.

Runs in its own process (``bkref autorecovery --config FILE``), beside a bookie or on
a dedicated node, or inside a bookie process (``bkref bookie --autorecovery``).
The configuration is the bookie's TOML file, as BookKeeper's AutoRecoveryMain reads
bk_server.conf: its ZooKeeper settings, its bookie id (the worker's local bookie,
unless dedicated) and the AutoRecovery parameters.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys
import threading
from pathlib import Path

from prometheus_client import CollectorRegistry

from bkref.impl import eventloop
from bkref.impl.autorecovery.auditor import Auditor, AuditorConfig
from bkref.impl.autorecovery.worker import ReplicationWorker, WorkerConfig
from bkref.impl.bookie.config import BookieConfig, load_for_cli
from bkref.impl.bookie.main import cancel_on_signals
from bkref.impl.cli.plants import add_plant_argument, plants_of
from bkref.impl.client.client import BookKeeper
from bkref.impl.client.errors import BKError
from bkref.impl.core.repair import Scheduling
from bkref.impl.meta.underreplication import UnderreplicationManager
from bkref.impl.metrics import AdminState, AutoRecoveryCollector, MetricsServer, refresh
from bkref.impl.trace import Tracer

log = logging.getLogger(__name__)


class AutoRecovery:
    def __init__(
        self,
        config: BookieConfig,
        *,
        dedicated: bool = False,
        plants: frozenset[str] = frozenset(),
        tracer: Tracer | None = None,
        registry: CollectorRegistry | None = None,
        admin: AdminState | None = None,
    ) -> None:
        self.config = config
        self.registry = registry  # /metrics of its process (None: not served)
        self.admin = admin  # its process's admin API, if this node serves one
        self.plants = plants  # planted bugs (test-only) of its auditor, worker and client
        self.local = None if dedicated else config.bookie_id
        # One node in the trace: its client's recoveries, its auditor's and worker's steps.
        self.tracer = tracer
        self.node_id = (
            f"autorecovery-{socket.gethostname()}-{os.getpid()}" if dedicated else config.bookie_id
        )
        self.bk = BookKeeper(
            config.zkServers,
            config.zkLedgersRootPath,
            session_timeout=config.zkTimeout / 1000,
            plants=plants,
            tracer=tracer,  # the protocol steps of its recoveries (trace validation)
        )
        self.auditor: Auditor | None = None
        self.worker: ReplicationWorker | None = None
        self._stop_export = threading.Event()

    async def run(self) -> None:
        await self.bk.start()
        try:
            c = self.config
            urm = UnderreplicationManager(self.bk.meta.zk, c.zkLedgersRootPath)
            await asyncio.to_thread(urm.ensure_layout)
            self.auditor = Auditor(
                self.bk,
                urm,
                self.node_id,
                AuditorConfig(
                    c.lostBookieRecoveryDelay,
                    c.auditorPeriodicCheckInterval,
                    c.auditorPeriodicBookieCheckInterval,
                    c.auditorLedgerVerificationPercentage,
                ),
                plants=self.plants,
                tracer=self.tracer,
            )
            self.worker = ReplicationWorker(
                self.bk,
                urm,
                self.node_id,
                self.local,
                WorkerConfig(
                    c.openLedgerRereplicationGracePeriod,
                    c.rwRereplicateBackoffMs,
                    c.repairSlotsPerBookie,
                    Scheduling(c.repairDeprioritizeAfterFailures, c.repairPromoteAfterMs),
                ),
                plants=self.plants,
                tracer=self.tracer,
            )
            log.info(
                "autorecovery %s started (local bookie: %s)", self.node_id, self.local or "none"
            )
            if self.registry is not None:
                self._export(urm)
            await asyncio.gather(self.auditor.run(), self.worker.run())
        finally:
            self._stop_export.set()
            await self.bk.close()

    def _export(self, urm: UnderreplicationManager) -> None:
        """Its auditor's and worker's statistics in /metrics, with the ledgers marked
        under-replicated counted once a second by a thread of its own."""
        assert self.registry is not None
        auditor, worker = self.auditor, self.worker
        collector = AutoRecoveryCollector(
            lambda: (
                auditor.stats if auditor is not None else None,
                worker.stats if worker is not None else None,
            )
        )
        self.registry.register(collector)
        if self.admin is not None:
            self.admin.under_replicated = urm.ledger_ids
        threading.Thread(
            target=refresh,
            args=(1.0, lambda: len(urm.ledger_ids()), collector, self._stop_export),
            name="under-replicated-count",
            daemon=True,
        ).start()


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="bkref autorecovery",
        description=(
            "Run an AutoRecovery node: it takes part in the auditor election and runs a "
            "replication worker. Reads the bookie's TOML config (ZooKeeper settings and "
            "AutoRecovery parameters such as lostBookieRecoveryDelay, "
            "openLedgerRereplicationGracePeriod, auditorPeriodicCheckInterval). Beside a "
            "bookie the worker copies to that bookie; with --dedicated it copies to bookies "
            "the placement rules choose. SIGTERM stops it."
        ),
    )
    p.add_argument("--config", type=Path, required=True, help="bookie TOML config")
    p.add_argument(
        "--dedicated",
        action="store_true",
        help="not beside a bookie: copy to any bookie that fits the placement rules",
    )
    p.add_argument(
        "--http-port",
        type=int,
        metavar="PORT",
        help="serve /metrics, /heartbeat and /api/v1/autorecovery/list_under_replicated_ledger "
        "on 127.0.0.1:PORT (default: off; a bookie with --autorecovery serves them on its "
        "httpServerPort)",
    )
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO (default), WARNING, ERROR")
    add_plant_argument(p, "its auditor, replication worker and client")
    args = p.parse_args(argv)
    plants = plants_of(args)
    config = load_for_cli("bkref autorecovery", args.config, args.log_level)
    if config is None:
        return 2

    registry = None if args.http_port is None else CollectorRegistry()
    admin = AdminState(None)
    http: MetricsServer | None = None
    if registry is not None:
        try:
            http = MetricsServer(args.http_port, registry, admin).start()
        except (OSError, OverflowError) as e:
            print(
                f"bkref autorecovery: cannot serve on port {args.http_port}: {e}", file=sys.stderr
            )
            return 2

    async def run() -> None:
        cancel_on_signals()
        node = AutoRecovery(
            config, dedicated=args.dedicated, plants=plants, registry=registry, admin=admin
        )
        await node.run()

    try:
        eventloop.run(run())
    except asyncio.CancelledError:
        pass
    except BKError as e:
        print(f"bkref autorecovery: {e}", file=sys.stderr)
        return 2
    finally:
        if http is not None:
            http.close()
    return 0
