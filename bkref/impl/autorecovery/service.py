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
from pathlib import Path

from bkref.impl.autorecovery.auditor import Auditor, AuditorConfig
from bkref.impl.autorecovery.worker import ReplicationWorker, WorkerConfig
from bkref.impl.bookie.config import BookieConfig, load_for_cli
from bkref.impl.bookie.main import cancel_on_signals
from bkref.impl.cli.plants import add_plant_argument, plants_of
from bkref.impl.client.client import BookKeeper
from bkref.impl.client.errors import BKError
from bkref.impl.core.repair import Scheduling
from bkref.impl.meta.underreplication import UnderreplicationManager
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
    ) -> None:
        self.config = config
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
            await asyncio.gather(self.auditor.run(), self.worker.run())
        finally:
            await self.bk.close()


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
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO (default), WARNING, ERROR")
    add_plant_argument(p, "its auditor, replication worker and client")
    args = p.parse_args(argv)
    plants = plants_of(args)
    config = load_for_cli("bkref autorecovery", args.config, args.log_level)
    if config is None:
        return 2

    async def run() -> None:
        cancel_on_signals()
        await AutoRecovery(config, dedicated=args.dedicated, plants=plants).run()

    try:
        asyncio.run(run())
    except asyncio.CancelledError:
        pass
    except BKError as e:
        print(f"bkref autorecovery: {e}", file=sys.stderr)
        return 2
    return 0
