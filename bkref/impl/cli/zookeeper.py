"""Start, inspect and stop a private ZooKeeper (standalone or ensemble) on 127.0.0.1."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bkref.impl.cli.args import positive_float, positive_int
from bkref.impl.cluster.zookeeper import ZooKeeperEnsemble, ZooKeeperError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bkref zookeeper",
        description=(
            "Run Debian's ZooKeeper as bkref's own processes (never the system service), "
            "with a private config and data dir under --dir. `start` returns once the "
            "ensemble serves and prints its connection string; `stop` stops the servers "
            "it started, by PID."
        ),
        epilog="exit status: 0 done, 2 ZooKeeper failed, bad arguments or no usable "
        "state in --dir (nothing started there, or its state file cannot be read)",
    )
    sub = p.add_subparsers(dest="action", required=True)
    start = sub.add_parser("start", help="start a standalone server or an ensemble")
    start.add_argument("--dir", type=Path, required=True, help="directory for configs, data, logs")
    start.add_argument(
        "--size", type=positive_int, default=1, help="servers in the ensemble (default 1)"
    )
    start.add_argument(
        "--timeout",
        type=positive_float,
        default=60.0,
        help="seconds (> 0) to wait for it to serve (default 60)",
    )
    status = sub.add_parser("status", help="show every server with its address, PID and mode")
    status.add_argument("--dir", type=Path, required=True)
    status.add_argument("--json", action="store_true", help="machine-readable output")
    stop = sub.add_parser("stop", help="stop every server started in --dir")
    stop.add_argument("--dir", type=Path, required=True)
    return p


def _bad(message: str) -> int:
    print(f"bkref zookeeper: {message}", file=sys.stderr)
    return 2


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.dir.exists() and not args.dir.is_dir():
        return _bad(f"--dir {args.dir}: not a directory")
    try:
        if args.action == "start":
            ensemble = ZooKeeperEnsemble(directory=args.dir, size=args.size)
            try:
                ensemble.start(timeout=args.timeout)
            except BaseException:
                ensemble.stop()
                raise
            print(ensemble.connection_string)
            return 0
        try:
            ensemble = ZooKeeperEnsemble.load(args.dir)
        except ZooKeeperError as e:  # nothing there, or a state file it cannot read
            return _bad(str(e))
        if args.action == "stop":
            ensemble.stop()
            print(f"stopped {len(ensemble.servers)} ZooKeeper server(s) in {args.dir}")
            return 0
        rows = [
            {
                "server_id": s.server_id,
                "address": s.address,
                "pid": s.pid,
                "mode": ensemble.mode(s.server_id) if s.pid is not None else "stopped",
            }
            for s in ensemble.servers.values()
        ]
        if args.json:
            print(json.dumps({"connection_string": ensemble.connection_string, "servers": rows}))
        else:
            print(f"connection string: {ensemble.connection_string}")
            for r in rows:
                print(f"  zk{r['server_id']}  {r['address']:<22} pid {r['pid']!s:<8} {r['mode']}")
        return 0
    except ZooKeeperError as e:
        print(f"bkref zookeeper: {e}", file=sys.stderr)
        return 2
