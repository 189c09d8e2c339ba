"""Run a local cluster: ZooKeeper plus N bookie processes (`up`, `status`, `down`)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from impl.cluster.local import ClusterError, LocalCluster
from impl.cluster.zookeeper import ZooKeeperError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bkref cluster",
        description=(
            "A private ZooKeeper and N bookies on 127.0.0.1, each with its own data dirs and "
            "port under --dir. `up` returns once every bookie is registered; `down` stops every "
            "process it started, by PID."
        ),
    )
    sub = p.add_subparsers(dest="action", required=True)
    up = sub.add_parser("up", help="start ZooKeeper and the bookies")
    up.add_argument("--bookies", type=int, default=3)
    up.add_argument("--dir", type=Path, required=True)
    up.add_argument("--timeout", type=float, default=90.0)
    up.add_argument(
        "--autorecovery",
        action="store_true",
        help="run AutoRecovery (auditor election and a replication worker) in every bookie",
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
    import tomllib

    out: dict[str, object] = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        out.update(tomllib.loads(f"{key} = {value}"))
    return out


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.action == "up":
            if args.bookies < 1:
                print("bkref cluster: --bookies must be at least 1", file=sys.stderr)
                return 2
            cluster = LocalCluster(args.dir, _overrides(args.set), autorecovery=args.autorecovery)
            try:
                cluster.up(args.bookies, timeout=args.timeout)
            except BaseException:
                cluster.down()
                raise
            print(cluster.zk_hosts)
            return 0
        cluster = LocalCluster.load(args.dir)
        if args.action == "status":
            rows = cluster.status()
            if args.json:
                print(json.dumps({"zookeeper": cluster.zk_hosts, "processes": rows}, indent=2))
            else:
                print(f"zookeeper connect string: {cluster.zk_hosts}")
                for r in rows:
                    state = "running" if r["alive"] else "stopped"
                    print(f"{r['role']:<10} {r['address']:<22} pid {r['pid'] or '-':<8} {state}")
            return 0 if all(r["alive"] for r in rows) else 1
        cluster.down()
        print(f"stopped every process of the cluster in {args.dir}")
        return 0
    except (ClusterError, ZooKeeperError) as e:
        print(f"bkref cluster: {e}", file=sys.stderr)
        return 1
