"""A ledger writer in a process of its own, so that a campaign can kill -9 it.

The campaign's workload drives it over stdin/stdout, one JSON object per line,
and records the history itself: it records an add's invocation *before* it
sends the command and its completion *after* it reads the answer, so every
operation's interval in the history contains the real one (as Jepsen's
clients do with a remote database). When the process dies, its adds still in
flight have unknown outcomes and its ledger is left open for recovery: the
writer crash BookKeeper's fencing exists for, with no close and no goodbye.

Commands (one ledger at a time):

Every command carries an ``id`` that its answer repeats.

- ``{"op": "create", "ensemble": E, "write_quorum": Wq, "ack_quorum": Aq}``
  -> ``{"ledger": L}`` or ``{"error": ...}``
- ``{"op": "add", "data": "..."}`` -> ``{"entry": E}``, ``{"fenced": true}`` or
  ``{"error": ...}``, when the add completes (in entry order); several adds may
  be in flight
- ``{"op": "close"}`` -> ``{"last_entry": N}`` or ``{"error": ...}``

End of stdin: the process exits without closing its ledger. Log lines go to
stderr (the campaign appends them to the run's ``writers.log``).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from bkref.impl import eventloop
from bkref.impl.cli.plants import add_plant_argument, plants_of
from bkref.impl.client.client import BookKeeper
from bkref.impl.client.errors import FencedError
from bkref.impl.client.handles import WriteHandle
from bkref.impl.trace import Tracer

OP_TIMEOUT = 20.0


def _say(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def _serve(
    zk: str, password: bytes, plants: frozenset[str], tracer: Tracer | None = None
) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    handle: WriteHandle | None = None
    async with BookKeeper(zk, plants=plants, tracer=tracer) as bk:
        while line := await reader.readline():
            cmd = json.loads(line)
            op = cmd["op"]
            try:
                if op == "create":
                    handle = await asyncio.wait_for(
                        bk.create_ledger(
                            cmd["ensemble"], cmd["write_quorum"], cmd["ack_quorum"], password
                        ),
                        OP_TIMEOUT,
                    )
                    _say({"op": op, "id": cmd["id"], "ledger": handle.ledger_id})
                elif op == "add" and handle is not None:
                    fut = handle.add_async(cmd["data"].encode())
                    fut.add_done_callback(functools.partial(_added, cmd["id"]))
                elif op == "close" and handle is not None:
                    await asyncio.wait_for(handle.close(), OP_TIMEOUT)
                    last = handle.current_metadata().last_entry
                    _say({"op": op, "id": cmd["id"], "last_entry": last})
                else:
                    _say({"op": op, "id": cmd.get("id"), "error": "no ledger, or unknown op"})
            except Exception as e:  # reported to the driver, which records the outcome
                _say({"op": op, "id": cmd.get("id"), "error": f"{type(e).__name__}: {e}"[:200]})


def _added(k: int, fut: asyncio.Future[int]) -> None:
    exc = fut.exception()
    if exc is None:
        _say({"op": "add", "id": k, "entry": fut.result()})
    elif isinstance(exc, FencedError):
        _say({"op": "add", "id": k, "fenced": True})
    else:
        _say({"op": "add", "id": k, "error": f"{type(exc).__name__}: {exc}"[:200]})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bkref.nemesis.writer_proc",
        description="a ledger writer driven over stdin/stdout by a campaign (see the module doc)",
    )
    p.add_argument("--zk", required=True, help="ZooKeeper connect string")
    p.add_argument("--password", default="bkref-campaign", help="the ledgers' password")
    add_plant_argument(p, "this writer's client (its adds and ensemble changes)")
    p.add_argument(
        "--trace",
        type=Path,
        default=None,
        help="log the writer's protocol steps in DIR/trace-writer-<pid>.jsonl",
    )
    args = p.parse_args(argv)
    plants = plants_of(args)
    logging.basicConfig(
        level=logging.WARNING,
        format="%(asctime)s writer[%(process)d] %(levelname)s %(name)s: %(message)s",
    )
    # One line per process, so that its log can be told from the next one's.
    sys.stderr.write(f"writer process {os.getpid()} started, ZooKeeper {args.zk}\n")
    sys.stderr.flush()
    tracer = None if args.trace is None else Tracer(args.trace, f"writer-{os.getpid()}")
    try:
        eventloop.run(_serve(args.zk, args.password.encode(), plants, tracer))
    finally:
        if tracer is not None:
            tracer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
