"""Checkers of a campaign history, composed (Jepsen's ``checker/compose``).

- ``linearizable``: the ledger checker of :mod:`linearizability.ledger_checker`.
- ``durability``: every acknowledged add is present, with its payload, in the
  final reads that follow the ledger's last recovery, and nothing was
  acknowledged or read beyond that close point.

Each returns ``{"valid": bool, "anomalies": [...]}`` with anomalies in the
linearizability package's names, each naming the history indices that prove it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from linearizability.history import Op, pair
from linearizability.ledger_checker import check_ledgers


def check_linearizable(ops: Sequence[Op]) -> dict[str, Any]:
    result = check_ledgers(ops)
    anomalies = [a.to_json() for a in result.anomalies]
    return {
        "valid": result.valid,
        "ledgers": len(result.ledgers),
        "counts": dict(result.counts),
        "anomalies": anomalies,
    }


def check_durability(ops: Sequence[Op]) -> dict[str, Any]:
    """Acknowledged entries against the final reads after each ledger's last recovery."""
    operations = pair(ops)
    acked: dict[tuple[int, int], tuple[str, int]] = {}  # (ledger, entry) -> (data, add index)
    # ledger -> (invocation index, completion index, last entry) of its last ok recovery
    last_recover: dict[int, tuple[int, int, int]] = {}
    for o in operations:
        if o.status != "ok" or o.ledger is None or o.complete is None:
            continue
        if o.f == "add":
            acked[(o.ledger, o.output["entry"])] = (o.output["data"], o.invoke.index)
        elif o.f == "recover":
            last_recover[o.ledger] = (o.invoke.index, o.complete.index, o.output["last_entry"])
    final: dict[tuple[int, int], tuple[str, int]] = {}
    for o in operations:
        if o.f != "read" or o.status != "ok" or o.ledger not in last_recover:
            continue
        if o.invoke.index > last_recover[o.ledger][1] and o.output.get("found"):
            final[(o.ledger, o.output["entry"])] = (o.output["data"], o.invoke.index)

    anomalies: list[dict[str, Any]] = []

    def report(kind: str, ledger: int, indices: list[int], message: str) -> None:
        anomalies.append({"kind": kind, "ledger": ledger, "ops": indices, "message": message})

    for (ledger, entry), (data, add_index) in sorted(acked.items()):
        if ledger not in last_recover:
            report(
                "lost-write",
                ledger,
                [add_index],
                f"entry {entry} was acknowledged but "
                f"ledger {ledger} was never recovered, so it could not be read back",
            )
            continue
        recover_index, _, last = last_recover[ledger]
        if entry > last:
            report(
                "lost-write",
                ledger,
                [add_index, recover_index],
                f"entry {entry} was acknowledged but recovery closed the ledger at {last}",
            )
        elif (ledger, entry) not in final:
            report(
                "lost-write",
                ledger,
                [add_index, recover_index],
                f"entry {entry} was acknowledged but no final read found it",
            )
        elif final[(ledger, entry)][0] != data:
            report(
                "divergent-read",
                ledger,
                [add_index, final[(ledger, entry)][1]],
                f"entry {entry} was acknowledged as {data!r} but read back as "
                f"{final[(ledger, entry)][0]!r}",
            )
    for (ledger, entry), (_, read_index) in sorted(final.items()):
        recover_index, _, last = last_recover[ledger]
        if entry > last:
            report(
                "read-of-truncated-entry",
                ledger,
                [read_index, recover_index],
                f"entry {entry} was read after recovery closed the ledger at {last}",
            )
    return {
        "valid": not anomalies,
        "acknowledged": len(acked),
        "final_reads": len(final),
        "counts": dict(Counter(a["kind"] for a in anomalies)),
        "anomalies": anomalies[:200],
    }
