"""`bkref shell` commands for AutoRecovery, after BookKeeper's shell of the same names."""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from collections.abc import Callable
from typing import Any

from bkref.impl.autorecovery.auditor import check_replicas
from bkref.impl.autorecovery.replicator import LedgerRepair, recover_bookie
from bkref.impl.autorecovery.status import cluster_status
from bkref.impl.cli.args import int_range, non_negative_int, positive_float
from bkref.impl.client.client import BookKeeper
from bkref.impl.meta.underreplication import UnderreplicationManager

COMMANDS = (
    "listunderreplicated",
    "autorecovery",
    "whoisauditor",
    "triggeraudit",
    "checkledgers",
    "lostbookierecoverydelay",
    "recover",
    "decommission",
    "status",
)

Printer = Callable[[argparse.Namespace, object, str], None]


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:  # noqa: ANN401 - argparse's private subparsers type
    lu = sub.add_parser(
        "listunderreplicated",
        parents=[common],
        help="under-replicated ledgers, most at risk first, with bad replicas and lock holders",
    )
    lu.add_argument("--missing-replica", help="only ledgers missing this bookie")
    a = sub.add_parser(
        "autorecovery", parents=[common], help="enable, disable or show AutoRecovery"
    )
    a.add_argument("action", choices=["enable", "disable", "status"])
    sub.add_parser("whoisauditor", parents=[common], help="the elected auditor and its epoch")
    sub.add_parser("triggeraudit", parents=[common], help="make the auditor audit every ledger now")
    cl = sub.add_parser(
        "checkledgers",
        parents=[common],
        help="read every replica of every closed segment now and mark those missing entries",
    )
    cl.add_argument(
        "--percentage",
        type=int_range(0, 100),
        default=100,
        help="percent (0 to 100) of each replica's entries to read besides its first and "
        "last (100)",
    )
    d = sub.add_parser(
        "lostbookierecoverydelay",
        parents=[common],
        help="get or set the seconds the auditor waits after losing one bookie",
    )
    d.add_argument("action", choices=["get", "set"])
    d.add_argument("seconds", type=non_negative_int, nargs="?")
    r = sub.add_parser(
        "recover",
        parents=[common],
        help="re-replicate every ledger with a segment on BOOKIE (open ones are fenced first)",
    )
    r.add_argument("bookie")
    r.add_argument("--target", help="copy to this bookie (default: by placement rules)")
    dc = sub.add_parser(
        "decommission",
        parents=[common],
        help="move every replica off BOOKIE, wait until none is left, then delete its cookie",
    )
    dc.add_argument("bookie")
    dc.add_argument(
        "--timeout", type=positive_float, default=3600.0, help="seconds (> 0) to wait (3600)"
    )
    st = sub.add_parser(
        "status",
        parents=[common],
        help="replica health: cluster totals, --ledger L, --per-ledger or --bookies",
    )
    g = st.add_mutually_exclusive_group()
    g.add_argument("--ledger", type=non_negative_int, help="one ledger's health, replicas and task")
    g.add_argument("--per-ledger", action="store_true", help="every ledger's health")
    g.add_argument("--bookies", action="store_true", help="ledgers and entries per bookie")


def _repair_line(r: LedgerRepair) -> str:
    if r.message and not r.fragments:
        return f"ledger {r.ledger_id}: FAILED: {r.message}"
    moved = ", ".join(
        f"segment {f.segment} {f.bookie} -> {f.target} ({f.entries} entries)"
        if not f.skipped
        else f"segment {f.segment} {f.bookie}: skipped: {f.skipped}"
        for f in r.fragments
    )
    return f"ledger {r.ledger_id}: {'done' if r.complete else 'INCOMPLETE'}: {moved or 'nothing'}"


async def run(bk: BookKeeper, args: argparse.Namespace, out: Printer) -> int:
    urm = UnderreplicationManager(bk.meta.zk, bk.root)
    await asyncio.to_thread(urm.ensure_layout)
    if args.cmd == "listunderreplicated":
        tasks = await asyncio.to_thread(urm.tasks)
        rows = []
        for t, _v in sorted(tasks, key=lambda tv: (tv[0].priority, tv[0].ctime_ms)):
            if args.missing_replica and args.missing_replica not in t.replicas:
                continue
            rows.append(
                {
                    "ledger": t.ledger_id,
                    "replicas": {b: r.value for b, r in t.replicas.items()},
                    "priority": t.priority,
                    "failures": t.failures,
                    "ctime": t.ctime_ms,
                    "lock_holder": await asyncio.to_thread(urm.lock_holder, t.ledger_id),
                }
            )
        text = "\n".join(
            f"{r['ledger']}\treplicas {r['replicas']}\tlive replicas {r['priority']}"
            f"\tfailures {r['failures']}\tlocked by {r['lock_holder'] or '-'}"
            for r in rows
        )
        out(args, rows, text or "(no under-replicated ledgers)")
        return 0
    if args.cmd == "autorecovery":
        if args.action != "status":
            await asyncio.to_thread(urm.set_enabled, args.action == "enable")
        enabled = await asyncio.to_thread(urm.is_enabled)
        out(args, {"enabled": enabled}, f"AutoRecovery is {'enabled' if enabled else 'disabled'}")
        return 0
    if args.cmd == "whoisauditor":
        a = await asyncio.to_thread(urm.auditor)
        if a is None:
            out(args, None, "no auditor elected (is any autorecovery node running?)")
            return 1
        out(args, {"auditor": a.node_id, "epoch": a.epoch}, f"{a.node_id} (epoch {a.epoch})")
        return 0
    if args.cmd == "triggeraudit":
        delay = await asyncio.to_thread(urm.lost_bookie_recovery_delay, 0)
        await asyncio.to_thread(urm.set_lost_bookie_recovery_delay, delay)
        out(args, {"triggered": True}, "audit triggered")
        return 0
    if args.cmd == "checkledgers":
        if not 0 <= args.percentage <= 100:
            print("bkref shell: --percentage must be between 0 and 100", file=sys.stderr)
            return 2
        marked = len(await check_replicas(bk, urm, args.percentage, random.Random()))
        out(args, {"marked": marked}, f"{marked} ledger(s) marked under-replicated")
        return 0
    if args.cmd == "lostbookierecoverydelay":
        if args.action == "set":
            if args.seconds is None or args.seconds < 0:
                print("bkref shell: `set` needs a number of seconds >= 0", file=sys.stderr)
                return 2
            await asyncio.to_thread(urm.set_lost_bookie_recovery_delay, args.seconds)
        delay = await asyncio.to_thread(urm.lost_bookie_recovery_delay, 0)
        out(args, {"lostBookieRecoveryDelay": delay}, f"lostBookieRecoveryDelay: {delay} s")
        return 0
    if args.cmd == "recover":
        results = await recover_bookie(
            bk,
            args.bookie,
            target=args.target,
            progress=None if args.json else lambda r: print(_repair_line(r), flush=True),
        )
        ok = all(r.complete for r in results)
        if args.json:
            out(args, [_repair_json(r) for r in results], "")
        else:
            print(
                f"{sum(r.complete for r in results)} of {len(results)} ledgers re-replicated "
                f"off {args.bookie}; {sum(r.bytes for r in results)} bytes copied"
            )
        return 0 if ok else 1
    if args.cmd == "decommission":
        return await _decommission(bk, urm, args, out)
    return await _status(bk, urm, args, out)


def _repair_json(r: LedgerRepair) -> dict[str, Any]:
    return {
        "ledger": r.ledger_id,
        "complete": r.complete,
        "message": r.message,
        "fragments": [f.__dict__ for f in r.fragments],
    }


async def _decommission(
    bk: BookKeeper, urm: UnderreplicationManager, args: argparse.Namespace, out: Printer
) -> int:
    await asyncio.to_thread(urm.set_decommissioning, args.bookie, True)
    delay = await asyncio.to_thread(urm.lost_bookie_recovery_delay, 0)
    await asyncio.to_thread(urm.set_lost_bookie_recovery_delay, delay)  # audit now
    deadline = time.monotonic() + args.timeout
    while True:
        left = [
            s.ledger_id
            for s in (await asyncio.to_thread(cluster_status, bk.meta, urm)).ledgers
            if args.bookie in s.bookies
        ]
        if not left:
            break
        if time.monotonic() > deadline:
            print(
                f"bkref shell decommission: {len(left)} ledgers still use {args.bookie} after "
                f"{args.timeout:.0f} s (e.g. {left[:5]}); is AutoRecovery enabled and running? "
                "The bookie stays marked as decommissioning; run the command again to wait more.",
                file=sys.stderr,
            )
            return 2
        if not args.json:
            print(f"waiting: {len(left)} ledgers still use {args.bookie}", flush=True)
        await asyncio.sleep(2.0)
    await asyncio.to_thread(bk.meta.delete_cookie, args.bookie)
    await asyncio.to_thread(urm.set_decommissioning, args.bookie, False)
    out(
        args,
        {"decommissioned": args.bookie},
        f"{args.bookie} decommissioned: no ledger uses it and its cookie is deleted; stop it now",
    )
    return 0


async def _status(
    bk: BookKeeper, urm: UnderreplicationManager, args: argparse.Namespace, out: Printer
) -> int:
    st = await asyncio.to_thread(cluster_status, bk.meta, urm, args.ledger)
    if args.ledger is not None:
        s = st.ledgers[0]
        out(args, s.to_json(), "\n".join(f"{k}: {v}" for k, v in s.to_json().items()))
    elif args.per_ledger:
        rows = [s.to_json() for s in st.ledgers]
        text = "\n".join(
            f"{r['ledger']}\t{r['state']}\t{r['health']}\tlive replicas {r['live_replicas']}"
            f"/{r['write_quorum']}" + (f"\t{r['underreplicated']}" if r["underreplicated"] else "")
            for r in rows
        )
        out(args, rows, text or "(no ledgers)")
    elif args.bookies:
        text = "\n".join(
            f"{b}\t{row['state']}{' (decommissioning)' if row['decommissioning'] else ''}"
            f"\track {row['rack']}\tledgers {row['ledgers']}\tentries {row['entries']}"
            for b, row in sorted(st.bookies.items())
        )
        out(args, st.bookies, text or "(no bookies)")
    else:
        totals = st.totals()
        out(args, totals, "\n".join(f"{k}: {v}" for k, v in totals.items()))
    return 0
