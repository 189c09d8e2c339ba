"""Run a local cluster: ZooKeeper plus N bookie processes (`up`, `status`, `down`)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bkref.impl.bookie.config import BookieConfig, ConfigError
from bkref.impl.cli.args import positive_float, positive_int
from bkref.impl.cluster.local import ClusterError, LocalCluster
from bkref.impl.cluster.zookeeper import ZooKeeperError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bkref cluster",
        description=(
            "A private ZooKeeper and N bookies on 127.0.0.1, each with its own data dirs and "
            "port under --dir. `up` returns once every bookie is registered; `down` stops every "
            "process it started, by PID."
        ),
        epilog="exit status: 0 done (status: every process runs), 1 status: a process is "
        "down, 2 a start or stop failed, bad arguments or no usable state in --dir",
    )
    sub = p.add_subparsers(dest="action", required=True)
    up = sub.add_parser("up", help="start ZooKeeper and the bookies")
    up.add_argument("--bookies", type=positive_int, default=3, help="bookies (default 3)")
    up.add_argument("--dir", type=Path, required=True)
    up.add_argument(
        "--timeout", type=positive_float, default=90.0, help="seconds (> 0) to wait (default 90)"
    )
    up.add_argument(
        "--autorecovery",
        action="store_true",
        help="run AutoRecovery (auditor election and a replication worker) in every bookie",
    )
    up.add_argument(
        "--metrics",
        action="store_true",
        help="every bookie serves /metrics and the admin API (httpServerEnabled) on a "
        "port of its own; `status` shows where",
    )
    up.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="bookie config parameter for every bookie (TOML value), repeatable",
    )
    st = sub.add_parser("status", help="every process with its role, address and PID")
    st.add_argument("--dir", type=Path, required=True)
    st.add_argument("--json", action="store_true")
    down = sub.add_parser("down", help="stop every process started in --dir")
    down.add_argument("--dir", type=Path, required=True)
    return p


def _overrides(pairs: list[str]) -> dict[str, object]:
    """``--set KEY=VALUE`` pairs, each checked as a bookie config parameter;
    ConfigError names the bad one."""
    import tomllib

    out: dict[str, object] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise ConfigError(f"--set {pair!r}: expected KEY=VALUE (a TOML value)")
        try:
            parsed = tomllib.loads(f"{key} = {value}")
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"--set {pair!r}: not a TOML key and value ({e})") from None
        BookieConfig.from_dict(parsed, f"--set {pair!r}")  # a known name, of the right type
        out.update(parsed)
    return out


def _bad(message: str) -> int:
    print(f"bkref cluster: {message}", file=sys.stderr)
    return 2


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.dir.exists() and not args.dir.is_dir():
        return _bad(f"--dir {args.dir}: not a directory")
    try:
        if args.action == "up":
            try:
                overrides = _overrides(args.set)
            except ConfigError as e:
                return _bad(str(e))
            cluster = LocalCluster(
                args.dir, overrides, autorecovery=args.autorecovery, metrics=args.metrics
            )
            try:
                cluster.up(args.bookies, timeout=args.timeout)
            except BaseException:
                cluster.down()
                raise
            print(cluster.zk_hosts)
            return 0
        try:
            cluster = LocalCluster.load(args.dir)
        except (ClusterError, ZooKeeperError) as e:  # nothing there, or unreadable state
            return _bad(str(e))
        if args.action == "status":
            rows = cluster.status()
            if args.json:
                print(json.dumps({"zookeeper": cluster.zk_hosts, "processes": rows}, indent=2))
            else:
                print(f"zookeeper connect string: {cluster.zk_hosts}")
                for r in rows:
                    state = "running" if r["alive"] else "stopped"
                    where = f"  {r['metrics']}/metrics" if "metrics" in r else ""
                    print(
                        f"{r['role']:<10} {r['address']:<22} pid {r['pid'] or '-':<8} {state}"
                        + where
                    )
            return 0 if all(r["alive"] for r in rows) else 1
        cluster.down()
        print(f"stopped every process of the cluster in {args.dir}")
        return 0
    except (ClusterError, ZooKeeperError) as e:
        print(f"bkref cluster: {e}", file=sys.stderr)
        return 2
