"""Run one bookie: `bkref bookie --config FILE` (TOML, BookKeeper's parameter names)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry

from bkref.impl import eventloop
from bkref.impl.bookie.config import BookieConfig, ConfigError, load_for_cli
from bkref.impl.bookie.cookie import CookieMismatchError
from bkref.impl.bookie.server import Bookie
from bkref.impl.cli.plants import add_plant_argument, plants_of
from bkref.impl.meta.underreplication import UnderreplicationManager
from bkref.impl.metrics import AdminState, BookieMetrics, MetricsServer
from bkref.impl.trace import Tracer, new_node_tracer


def cancel_on_signals() -> asyncio.AbstractEventLoop:
    """SIGTERM and SIGINT cancel the running task: a clean stop. Returns the loop."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    loop.add_signal_handler(signal.SIGINT, task.cancel)
    return loop


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="bkref bookie",
        description=(
            "Run a bookie on 127.0.0.1: journal, entry logs and index under the configured "
            "directories, registered in ZooKeeper. SIGTERM stops it cleanly; SIGHUP re-reads "
            "the disk-usage thresholds."
        ),
    )
    p.add_argument("--config", type=Path, required=True, help="TOML bookie config")
    p.add_argument(
        "--autorecovery",
        action="store_true",
        help="also run AutoRecovery (auditor election and a replication worker) in this "
        "process, as autoRecoveryDaemonEnabled=true does",
    )
    p.add_argument(
        "--dump",
        type=Path,
        metavar="FILE",
        help="do not serve: append what this (stopped) bookie stores to FILE as JSON Lines "
        "(bookie, ledger, entry, digest), the input of replication audits, and exit",
    )
    p.add_argument(
        "--trace",
        type=Path,
        metavar="DIR",
        help="write the protocol steps this bookie takes (the spec's action names, one JSON "
        "line each) to DIR/trace-<bookie id>.jsonl, and its AutoRecovery's, a new node at "
        "each start, to DIR/trace-autorecovery-<bookie id>-<k>.jsonl, for `bkref trace "
        "check` (default: off)",
    )
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO (default), WARNING, ERROR")
    add_plant_argument(p, "this bookie's storage and its AutoRecovery")
    args = p.parse_args(argv)
    plants = plants_of(args)
    config = load_for_cli("bkref bookie", args.config, args.log_level)
    if config is None:
        return 2
    if args.dump is not None:
        from bkref.impl.bookie.dump import dump

        if args.dump.is_dir() or not args.dump.parent.is_dir():
            print(
                f"bkref bookie: --dump {args.dump}: expected a file in an existing directory",
                file=sys.stderr,
            )
            return 2
        n = dump(config, args.dump)
        print(f"{config.bookie_id}: {n} entries dumped to {args.dump}")
        return 0
    tracer = None
    if args.trace is not None:
        if args.trace.exists() and not args.trace.is_dir():
            print(f"bkref bookie: --trace {args.trace}: not a directory", file=sys.stderr)
            return 2
        tracer = Tracer(args.trace, config.bookie_id)
    registry = CollectorRegistry() if config.httpServerEnabled else None
    metrics = None if registry is None else BookieMetrics(registry)
    bookie = Bookie(config, plants=plants, tracer=tracer, metrics=metrics)
    http: MetricsServer | None = None
    try:
        bookie.open_storage_and_register()
    except CookieMismatchError as e:
        print(f"bkref bookie: refusing to start: {e}", file=sys.stderr)
        bookie.close()
        return 3
    except Exception as e:
        print(f"bkref bookie: cannot start {config.bookie_id}: {e}", file=sys.stderr)
        bookie.close()
        return 2
    if tracer is not None and tracer.restarted:  # its file existed: a stop or a crash before
        assert bookie.storage is not None
        # What the replay brought back, per ledger: entries as a hex mask (bit e: entry e).
        ledgers = {
            str(lg): {"entries": hex(mask), "fenced": fenced, "lac": lac}
            for lg, (mask, fenced, lac) in bookie.storage.contents().items()
        }
        tracer.step("bookie_restarts", bookie=config.bookie_id, ledgers=ledgers)
    if registry is not None:
        assert bookie.store is not None
        urm = UnderreplicationManager(bookie.store.zk, config.zkLedgersRootPath)
        state = AdminState(
            config.ledgerDirectories[0],
            read_only=lambda: bookie.core.read_only,
            under_replicated=urm.ledger_ids,
        )
        try:
            http = MetricsServer(config.httpServerPort, registry, state).start()
        except OSError as e:
            print(
                f"bkref bookie: cannot serve metrics on port {config.httpServerPort}: {e}",
                file=sys.stderr,
            )
            bookie.close()
            return 2

    async def run() -> None:
        loop = cancel_on_signals()

        def hup() -> None:
            try:
                bookie.reload(BookieConfig.load(args.config))
            except ConfigError as e:
                logging.getLogger(__name__).error("SIGHUP: %s", e)

        loop.add_signal_handler(signal.SIGHUP, hup)
        if args.autorecovery or config.autoRecoveryDaemonEnabled:
            from bkref.impl.autorecovery.service import AutoRecovery

            # Its client is a node of its own in the trace, a new one at each start of
            # the process, so that the request ids of a restarted process are not taken
            # for the last one's (by a start count: in a container the pid repeats).
            ar_tracer = (
                None
                if args.trace is None
                else new_node_tracer(args.trace, f"autorecovery-{config.bookie_id}")
            )
            ar = AutoRecovery(config, plants=plants, tracer=ar_tracer, registry=registry)
            await asyncio.gather(bookie.serve(), ar.run())
        else:
            await bookie.serve()

    try:
        eventloop.run(run())
    except asyncio.CancelledError:
        pass
    except OSError as e:
        print(f"bkref bookie: cannot serve on port {config.bookiePort}: {e}", file=sys.stderr)
        return 2
    finally:
        if http is not None:
            http.close()
        bookie.close()
    return 0
