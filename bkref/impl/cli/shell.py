"""Admin shell, after `bookkeeper shell`: inspection, a smoke test, and AutoRecovery's
commands (listunderreplicated, autorecovery, whoisauditor, triggeraudit,
lostbookierecoverydelay, recover, decommission, status)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from kazoo.exceptions import KazooException

from bkref.impl import eventloop
from bkref.impl.autorecovery import shell as ar_shell
from bkref.impl.cli.args import non_negative_int, positive_float, positive_int
from bkref.impl.cli.plants import add_plant_argument, plants_of
from bkref.impl.client.client import BookKeeper
from bkref.impl.client.errors import BKError
from bkref.impl.core.digest import DigestType
from bkref.impl.meta.store import NoSuchLedgerError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bkref shell",
        description=(
            "Inspect and exercise a bkref cluster through ZooKeeper, after `bookkeeper shell`. "
            "Exit code is non-zero on failure."
        ),
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--zk", required=True, help="ZooKeeper connection string")
    common.add_argument("--root", default="/ledgers", help="zkLedgersRootPath")
    common.add_argument("--json", action="store_true", help="machine-readable output")
    common.add_argument(
        "--zk-timeout",
        type=positive_float,
        default=15.0,
        help="seconds (> 0) to wait for ZooKeeper (default 15)",
    )
    add_plant_argument(common, "this shell's client (its writes, recoveries and repairs)")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("listbookies", parents=[common], help="registered bookies (rw and ro)")
    sub.add_parser("listledgers", parents=[common], help="every ledger id")
    m = sub.add_parser("ledgermetadata", parents=[common], help="one ledger's metadata")
    m.add_argument("ledger", type=non_negative_int)
    r = sub.add_parser("readledger", parents=[common], help="read a ledger's entries")
    r.add_argument("ledger", type=non_negative_int)
    r.add_argument("--password", default="", help="the ledger's password")
    r.add_argument("--first", type=non_negative_int, default=0, help="first entry (default 0)")
    r.add_argument(
        "--last", type=non_negative_int, default=None, help="last entry (default: the last)"
    )
    r.add_argument(
        "--no-recovery",
        action="store_true",
        help="do not recover an open ledger (read up to its LAC)",
    )
    t = sub.add_parser(
        "simpletest",
        parents=[common],
        help="write a ledger, read it back, close it; say whether all matched",
    )
    t.add_argument("--ensemble", "-e", type=positive_int, default=3, help="E (default 3)")
    t.add_argument("--write-quorum", "-w", type=positive_int, default=2, help="Wq <= E (default 2)")
    t.add_argument("--ack-quorum", "-a", type=positive_int, default=2, help="Aq <= Wq (default 2)")
    t.add_argument("--entries", "-n", type=non_negative_int, default=100, help="(default 100)")
    ar_shell.add_parsers(sub, common)
    return p


def _print(args: argparse.Namespace, obj: object, text: str) -> None:
    print(json.dumps(obj, indent=2) if args.json else text)


async def _run(args: argparse.Namespace) -> int:
    async with BookKeeper(
        args.zk, args.root, connect_timeout=args.zk_timeout, plants=plants_of(args)
    ) as bk:
        if args.cmd == "listbookies":
            infos = await asyncio.to_thread(bk.meta.bookies)
            rows = [{"bookie": b.bookie_id, "rack": b.rack, "readonly": b.readonly} for b in infos]
            text = "\n".join(
                f"{r['bookie']}  rack {r['rack']}  {'read-only' if r['readonly'] else 'writable'}"
                for r in rows
            )
            _print(args, rows, text or "(no bookies registered)")
            return 0
        if args.cmd == "listledgers":
            ids = await bk.list_ledgers()
            _print(args, ids, "\n".join(map(str, ids)) or "(no ledgers)")
            return 0
        if args.cmd == "ledgermetadata":
            md, version = await asyncio.to_thread(bk.meta.read_ledger, args.ledger)
            obj = {"ledger": args.ledger, "version": version, **md.to_json()}
            text = "\n".join(f"{k}: {v}" for k, v in obj.items())
            _print(args, obj, text)
            return 0
        if args.cmd == "readledger":
            h = await bk.open_ledger(
                args.ledger, args.password.encode(), recovery=not args.no_recovery
            )
            last = h.last_entry if args.last is None else args.last
            data = await h.read(args.first, last) if last >= args.first else []
            entries = [
                {"entry": args.first + i, "data": d.decode("utf-8", "backslashreplace")}
                for i, d in enumerate(data)
            ]
            _print(
                args,
                {"ledger": args.ledger, "last_entry": h.last_entry, "entries": entries},
                "\n".join(f"{e['entry']}\t{e['data']}" for e in entries),
            )
            return 0
        if args.cmd in ar_shell.COMMANDS:
            return await ar_shell.run(bk, args, _print)
        return await _simpletest(bk, args)


async def _simpletest(bk: BookKeeper, args: argparse.Namespace) -> int:
    pw = b"simpletest"
    h = await bk.create_ledger(
        args.ensemble, args.write_quorum, args.ack_quorum, pw, DigestType.CRC32C
    )
    payload = [f"simpletest entry {i}".encode() for i in range(args.entries)]
    await h.add_many(payload)
    await h.close()
    r = await bk.open_ledger(h.ledger_id, pw, recovery=False)
    got = await r.read(0, r.last_entry) if args.entries else []
    ok = got == payload and r.last_entry == args.entries - 1
    obj = {
        "ledger": h.ledger_id,
        "entries": args.entries,
        "last_entry": r.last_entry,
        "ensemble": list(h.metadata.last_segment.ensemble),
        "matched": ok,
    }
    _print(
        args,
        obj,
        f"ledger {h.ledger_id}: wrote {args.entries} entries, read back "
        f"{len(got)}: {'all matched' if ok else 'MISMATCH'}",
    )
    return 0 if ok else 1


COMMANDS = (
    "listbookies",
    "listledgers",
    "ledgermetadata",
    "readledger",
    "simpletest",
    *ar_shell.COMMANDS,
)


def _command_first(argv: list[str]) -> list[str]:
    """Accept ``--zk X listbookies`` as well as ``listbookies --zk X``."""
    for i, token in enumerate(argv):
        if token in COMMANDS:
            return [token, *argv[:i], *argv[i + 1 :]]
    return argv


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(_command_first(argv))
    if args.cmd == "simpletest" and not args.ensemble >= args.write_quorum >= args.ack_quorum:
        parser.error(
            f"simpletest needs E >= Wq >= Aq, got -e {args.ensemble} -w {args.write_quorum} "
            f"-a {args.ack_quorum}"
        )
    if args.cmd == "lostbookierecoverydelay" and args.action == "set" and args.seconds is None:
        parser.error("lostbookierecoverydelay set needs SECONDS (>= 0)")
    try:
        return eventloop.run(_run(args))
    except NoSuchLedgerError as e:
        print(f"bkref shell: {e}", file=sys.stderr)
        return 2
    except BKError as e:
        print(f"bkref shell {args.cmd}: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        print(f"bkref shell {args.cmd}: {e}", file=sys.stderr)
        return 2
    except KazooException as e:
        print(
            f"bkref shell {args.cmd}: ZooKeeper failed mid-operation ({e!r}); the "
            "operation may or may not have happened",
            file=sys.stderr,
        )
        return 2
