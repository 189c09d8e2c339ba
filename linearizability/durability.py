"""The durability check of a history: acknowledged adds against the final reads.

A campaign ends every ledger with a recovery (open with recovery, which fences
and closes it) followed by final reads of its entries. Durability then means:

- every acknowledged add is present, with its payload, in the final reads that
  follow the ledger's last recovery (``lost-write``, ``divergent-read``);
- nothing was acknowledged or read beyond the last entry that recovery fixed
  (``lost-write``, ``read-of-truncated-entry``);
- no entry id carries two payloads: two acknowledged adds of one entry
  (``duplicate``), or two final reads of one entry with different data
  (``divergent-read``).

"Last" is in invocation order, as the history's pairing lists operations. The
anomaly names are the ledger checker's (:mod:`linearizability.ledger_checker`);
each anomaly names the history indices (invocations) that prove it. The result
is ``{"valid", "acknowledged", "final_reads", "counts", "anomalies"}`` with at
most :data:`MAX_ANOMALIES` anomalies listed (``counts`` has them all).
``spark_checks`` decides the same on Spark for histories too large for one
process, and its tests hold the two together.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any, Final

from linearizability.history import Op, pair

MAX_ANOMALIES: Final = 200


def check_durability(ops: Iterable[Op]) -> dict[str, Any]:
    """Acknowledged entries against the final reads after each ledger's last recovery."""
    operations = pair(ops)
    acked: dict[tuple[int, int], tuple[str, int]] = {}  # (ledger, entry) -> (data, add index)
    first_ack: dict[tuple[int, int], int] = {}  # (ledger, entry) -> the first ack's add index
    duplicates: list[tuple[int, int, int, int]] = []  # ledger, entry, first add, another add
    # ledger -> (invocation index, completion index, last entry) of its last ok recovery
    last_recover: dict[int, tuple[int, int, int]] = {}
    for o in operations:
        if o.status != "ok" or o.ledger is None or o.complete is None:
            continue
        if o.f == "add":
            key = (o.ledger, o.output["entry"])
            if key in first_ack:
                duplicates.append((*key, first_ack[key], o.invoke.index))
            else:
                first_ack[key] = o.invoke.index
            acked[key] = (o.output["data"], o.invoke.index)
        elif o.f == "recover":
            last_recover[o.ledger] = (o.invoke.index, o.complete.index, o.output["last_entry"])
    final: dict[tuple[int, int], tuple[str, int]] = {}
    first_final: dict[tuple[int, int], tuple[str, int]] = {}
    two_payloads: list[tuple[int, int, str, int, str, int]] = []
    for o in operations:
        if o.f != "read" or o.status != "ok" or o.ledger not in last_recover:
            continue
        if o.invoke.index > last_recover[o.ledger][1] and o.output.get("found"):
            key = (o.ledger, o.output["entry"])
            read = (o.output["data"], o.invoke.index)
            first = first_final.setdefault(key, read)
            if first[0] != read[0]:
                two_payloads.append((*key, *first, *read))
            final[key] = read

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
    for ledger, entry, first_index, other_index in sorted(duplicates):
        report(
            "duplicate",
            ledger,
            [first_index, other_index],
            f"two adds of entry {entry} were acknowledged",
        )
    for ledger, entry, data, index, other, other_index in sorted(two_payloads):
        report(
            "divergent-read",
            ledger,
            [index, other_index],
            f"entry {entry} was read back as {data!r} and as {other!r}",
        )
    return {
        "valid": not anomalies,
        "acknowledged": len(acked),
        "final_reads": len(final),
        "counts": dict(Counter(a["kind"] for a in anomalies)),
        "anomalies": anomalies[:MAX_ANOMALIES],
    }
