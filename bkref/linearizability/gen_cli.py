"""Generate synthetic ledger histories: valid ones, or with one anomaly planted.

    bkref gen-history --ops N --ledgers L [--anomaly KIND] [--seed S] --out PATH

Each ledger (a pipelined writer, concurrent readers, crashes) ends as a
campaign's ledgers do: a recovery, then final reads of every entry up to the
recovered last entry, so that both the ledger checker and the durability check
apply. Ledgers are drawn a batch at a time and their operations interleaved
within a batch, so histories of 10^8 operations stream to disk in bounded
memory. By default whole ledgers are drawn as arrays, in parallel
(:func:`bkref.linearizability.columnar.columnar_history`, about 10^8 lines in 5
minutes on 2 cores); ``--simulate`` runs the event-by-event simulation
(:func:`bkref.linearizability.generate.ledger_history`, ~40k lines/s) that
:func:`generate` gives the tests.
``--anomaly`` plants one anomaly of that kind (the ledger checker's names) in
one ledger chosen at random. PATH ending in ``.parquet`` is written as Parquet,
anything else as JSON Lines.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final

from bkref.linearizability.anomalies import ANOMALY_KINDS
from bkref.linearizability.columnar import columnar_history, write_columnar
from bkref.linearizability.generate import Event, interleave, ledger_history, to_ops
from bkref.linearizability.history import Op
from bkref.linearizability.history_files import write_history
from bkref.linearizability.plant import plant
from bkref.spec.cli_args import positive_int

BATCH: Final = 64  # ledgers simulated and interleaved together
PROCESSES_PER_LEDGER: Final = 1_000_000


def _entries(events: Sequence[Event]) -> dict[int, str]:
    """The data each entry id was written with (ids are unique in a simulation)."""
    return {
        v["entry"]: v["data"]
        for _, typ, f, _, v in events
        if f == "add" and typ == "invoke" and isinstance(v, dict)
    }


def _last_recovered(events: Sequence[Event]) -> int | None:
    last = None
    for _, typ, f, _, v in events:
        if f == "recover" and typ == "ok" and isinstance(v, dict):
            last = v["last_entry"]
    return last


def campaign_ledger(rng: random.Random, ledger: int, adds: int, reads: int) -> list[Event]:
    """One ledger as a campaign leaves it: its life, a recovery that completed,
    and final reads of entries 0..last by a fresh process."""
    first = (ledger - 1) * PROCESSES_PER_LEDGER
    while True:
        events = ledger_history(
            rng, ledger=ledger, adds=adds, reads=reads, end="recover", first_process=first
        )
        last = _last_recovered(events)
        if last is not None:  # the recovery itself may have crashed (info): simulate again
            break
    data = _entries(events)
    reader = max(int(p) for p, *_ in events) + 1
    for e in range(last + 1):
        events.append((reader, "invoke", "read", ledger, {"entry": e}))
        events.append((reader, "ok", "read", ledger, {"entry": e, "found": True, "data": data[e]}))
    return events


def _planted(rng: random.Random, ledger: int, adds: int, reads: int, kind: str) -> list[Event]:
    for _ in range(100):
        ops = plant(rng, to_ops(campaign_ledger(rng, ledger, adds, reads)), kind)
        if ops is not None:
            return [(op.process, op.type, op.f, op.ledger, op.value) for op in ops]
    raise ValueError(f"could not plant {kind!r} in 100 simulated ledgers; try more ops")


def generate(ops: int, ledgers: int, *, seed: int = 0, anomaly: str | None = None) -> Iterator[Op]:
    """About ``ops`` operations (history lines) over ``ledgers`` ledgers."""
    rng = random.Random(seed)
    per_ledger = max(ops // max(ledgers, 1), 8)
    adds = max(1, per_ledger * 2 // 7)  # about 7 lines per add: itself, 1.5 reads, a final read
    reads = adds * 3 // 2
    target = rng.randrange(ledgers) + 1 if anomaly else -1
    index = 0
    for start in range(1, ledgers + 1, BATCH):
        batch = []
        for ledger in range(start, min(start + BATCH, ledgers + 1)):
            if ledger == target:
                assert anomaly is not None
                batch.append(_planted(rng, ledger, adds, reads, anomaly))
            else:
                batch.append(campaign_ledger(rng, ledger, adds, reads))
        for op in interleave(rng, batch):
            yield op._replace(index=index, time=1000 * index)
            index += 1


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bkref gen-history",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog=f"anomaly kinds: {', '.join(ANOMALY_KINDS)}",
    )
    p.add_argument(
        "--ops", type=positive_int, required=True, help="about this many history lines (>= 1)"
    )
    p.add_argument("--ledgers", type=positive_int, default=10, help="ledgers (>= 1; default 10)")
    p.add_argument("--anomaly", choices=ANOMALY_KINDS, help="plant one anomaly of this kind")
    p.add_argument("--seed", type=int, default=0, help="the seed of the whole history")
    p.add_argument("--out", type=Path, required=True, help="*.parquet for Parquet, else JSON Lines")
    p.add_argument(
        "--simulate",
        action="store_true",
        help="draw events one at a time (the slower simulation that tests use) "
        "instead of whole ledgers as arrays",
    )
    return p


def main(argv: list[str]) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:  # usage errors (printed by argparse): 2; --help: 0
        return e.code if isinstance(e.code, int) else 2
    if args.out.is_dir() or not args.out.parent.is_dir():
        print(
            f"bkref gen-history: --out {args.out}: expected a file in an existing directory",
            file=sys.stderr,
        )
        return 2
    started = time.monotonic()
    try:
        if args.simulate:
            n = write_history(
                generate(args.ops, args.ledgers, seed=args.seed, anomaly=args.anomaly), args.out
            )
        else:
            tables = columnar_history(args.ops, args.ledgers, seed=args.seed, anomaly=args.anomaly)
            n = write_columnar(tables, args.out)
    except (OSError, ValueError) as e:
        print(f"bkref gen-history: {e}", file=sys.stderr)
        return 2
    took = time.monotonic() - started
    planted = f", {args.anomaly} planted" if args.anomaly else ""
    print(
        f"wrote {n:,} ops over {args.ledgers} ledgers to {args.out} "
        f"(seed {args.seed}{planted}; {took:.1f} s)"
    )
    return 0
