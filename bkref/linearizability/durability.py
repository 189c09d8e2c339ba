"""The durability check of a history: acknowledged adds against the final reads.

A campaign ends every ledger with a recovery (open with recovery, which fences
and closes it) followed by final reads of its entries. Durability is decided
against that ending:

- every acknowledged add is present, with its payload, in the final reads that
  follow the ledger's last recovery (``lost-write``: a final read found no such
  entry; ``divergent-read``: it found other data);
- nothing was acknowledged or read beyond the last entry that recovery fixed
  (``lost-write``, ``read-of-truncated-entry``): decided by the recovery alone,
  with or without final reads;
- no entry id carries two payloads: two acknowledged adds of one entry
  (``duplicate``), or two final reads of one entry with different data
  (``divergent-read``): decided with or without a recovery.

A history need not have that ending (a workload may never recover a ledger, or
never read it back). What it cannot decide is not judged: a ledger with an
acknowledged entry at or below its close point that no final read answered for
is **durability unknown**, with one of :data:`UNKNOWN_REASONS`, and is never
reported as an anomaly. Unknown ledgers leave the verdict valid (no anomaly);
:func:`describe` says how many there are and why.

"Last" is in invocation order, as the history's pairing lists operations. The
anomaly kinds are the ledger checker's, and the kinds and messages are those of
:mod:`bkref.linearizability.anomalies`; each anomaly names the history indices
(invocations) that prove it. The result is a dict: ``valid`` (no anomaly),
``acknowledged`` (entries), ``final_reads`` (entries found by a final read),
``ledgers`` (with an acknowledged entry), ``counts`` and ``anomalies`` (at most
:data:`MAX_ANOMALIES` listed, ``counts`` has them all), ``unknown_ledgers``,
``unknown`` (ledgers per reason) and ``unknown_examples`` (at most
:data:`MAX_ANOMALIES`, by ledger id).
``spark_checks`` decides the same on Spark for histories too large for one
process, and its tests hold the two together.
"""

from __future__ import annotations

import gc
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from typing import Any, Final

from bkref.linearizability import anomalies as msg
from bkref.linearizability.history import Op

MAX_ANOMALIES: Final = 200
NEVER_RECOVERED: Final = "never recovered"
NOT_READ_BACK: Final = "recovered but not read back"
READ_IN_PART: Final = "read back only in part"
# Why a ledger's durability is unknown, in the order a ledger reaches them.
UNKNOWN_REASONS: Final = (NEVER_RECOVERED, NOT_READ_BACK, READ_IN_PART)


def unknown_reason(recovered: bool, unread: int, read: int) -> str | None:
    """Why a ledger is not judged: ``unread`` acknowledged entries at or below
    its close point have no final read, ``read`` have one (None: judged)."""
    if not recovered:
        return NEVER_RECOVERED
    if not unread:
        return None
    return READ_IN_PART if read else NOT_READ_BACK


class Durability:
    """The durability check as an accumulator: :meth:`feed` it a history's lines
    in order (``bkref check`` taps the ledger checker's stream, so the file is
    read once), then :meth:`result`. It keeps the acknowledged adds, the ok
    recoveries and the ok reads as tuples, not the history."""

    def __init__(self) -> None:
        self._pending: dict[object, Op] = {}  # process -> its open invocation
        self._adds: list[tuple[int, int, int, str]] = []  # invocation, ledger, entry, data
        # ledger -> (invocation index, completion index, last entry) of its last ok recovery
        self._recover: dict[int, tuple[int, int, int]] = {}
        # ledger, entry, invocation index, data (None: "no such entry")
        self._reads: list[tuple[int, int, int, str | None]] = []

    def feed(self, op: Op) -> None:
        if op.is_nemesis:
            return
        if op.type == "invoke":
            self._pending[op.process] = op
            return
        inv = self._pending.pop(op.process, None)
        ledger = op.ledger  # the completion's, as pairing reads it
        if inv is None or op.type != "ok" or ledger is None:
            return
        out = op.value
        if op.f == "add":
            self._adds.append((inv.index, ledger, out["entry"], out["data"]))
        elif op.f == "recover":
            last = self._recover.get(ledger)
            if last is None or inv.index > last[0]:
                self._recover[ledger] = (inv.index, op.index, out["last_entry"])
        elif op.f == "read":
            data = out["data"] if out.get("found") else None
            self._reads.append((ledger, out["entry"], inv.index, data))

    def result(self) -> dict[str, Any]:
        # Only acyclic tuples and dicts are made here: the cyclic collector would
        # only rescan the growing heap (as in the ledger checker).
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return _decide(self._adds, self._recover, self._reads)
        finally:
            if was_enabled:
                gc.enable()


def check_durability(ops: Iterable[Op]) -> dict[str, Any]:
    """Acknowledged entries against the final reads after each ledger's last recovery."""
    check = Durability()
    for op in ops:
        check.feed(op)
    return check.result()


def _decide(
    adds: list[tuple[int, int, int, str]],
    last_recover: dict[int, tuple[int, int, int]],
    reads: list[tuple[int, int, int, str | None]],
) -> dict[str, Any]:
    acked: dict[tuple[int, int], tuple[str, int]] = {}  # (ledger, entry) -> (data, add index)
    first_ack: dict[tuple[int, int], int] = {}  # (ledger, entry) -> the first ack's add index
    duplicates: list[tuple[int, int, int, int]] = []  # ledger, entry, first add, another add
    for index, ledger, entry, data in sorted(adds):  # invocation order: the last ack counts
        key = (ledger, entry)
        if key in first_ack:
            duplicates.append((*key, first_ack[key], index))
        else:
            first_ack[key] = index
        acked[key] = (data, index)
    final: dict[tuple[int, int], tuple[str, int]] = {}  # the last final read that found it
    answered: set[tuple[int, int]] = set()  # a final read answered, found or not
    first_final: dict[tuple[int, int], tuple[str, int]] = {}
    two_payloads: list[tuple[int, int, str, int, str, int]] = []
    for ledger, entry, index, found in sorted(reads, key=lambda r: r[2]):
        if ledger not in last_recover or index <= last_recover[ledger][1]:
            continue
        key = (ledger, entry)
        answered.add(key)
        if found is None:
            continue
        read = (found, index)
        first = first_final.setdefault(key, read)
        if first[0] != read[0]:
            two_payloads.append((*key, *first, *read))
        final[key] = read

    anomalies: list[dict[str, Any]] = []
    # ledger -> [acknowledged entries, unread ones at or below the close point, read ones]
    tally: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0])

    def report(message: msg.Message, ledger: int, indices: list[int], **fields: object) -> None:
        text = message.render(**fields)
        anomalies.append({"kind": message.kind, "ledger": ledger, "ops": indices, "message": text})

    for (ledger, entry), (data, add_index) in sorted(acked.items()):
        counts = tally[ledger]
        counts[0] += 1
        if ledger not in last_recover:
            continue  # undecided: never recovered
        recover_index, _, last = last_recover[ledger]
        if entry > last:
            report(
                msg.LOST_BEYOND_CLOSE,
                ledger,
                [add_index, recover_index],
                e=entry,
                f="recovery",
                closed_at=last,
            )
            continue
        if (ledger, entry) not in answered:
            counts[1] += 1  # undecided: no final read answered for it
            continue
        counts[2] += 1
        if (ledger, entry) not in final:
            report(msg.LOST_UNREAD, ledger, [add_index, recover_index], e=entry)
        elif final[(ledger, entry)][0] != data:
            got, read_index = final[(ledger, entry)]
            report(
                msg.READ_BACK_OTHER_DATA,
                ledger,
                [add_index, read_index],
                e=entry,
                data=data,
                read=got,
            )
    for (ledger, entry), (_, read_index) in sorted(final.items()):
        recover_index, _, last = last_recover[ledger]
        if entry > last:
            report(
                msg.READ_BACK_BEYOND_RECOVERY,
                ledger,
                [read_index, recover_index],
                e=entry,
                last=last,
            )
    for ledger, entry, first_index, other_index in sorted(duplicates):
        report(msg.DUPLICATE_ADDS, ledger, [first_index, other_index], e=entry)
    for ledger, entry, data, index, other, other_index in sorted(two_payloads):
        report(msg.READ_BACK_TWICE, ledger, [index, other_index], e=entry, read=data, other=other)
    unknown: list[dict[str, Any]] = []
    for ledger, (n, unread, answered_n) in sorted(tally.items()):
        recovered = ledger in last_recover
        reason = unknown_reason(recovered, unread, answered_n)
        if reason is not None:
            left = unread if recovered else n
            unknown.append({"ledger": ledger, "reason": reason, "acknowledged": n, "unread": left})
    return {
        "valid": not anomalies,
        "acknowledged": len(acked),
        "final_reads": len(final),
        "ledgers": len(tally),
        "counts": dict(Counter(a["kind"] for a in anomalies)),
        "anomalies": anomalies[:MAX_ANOMALIES],
        "unknown_ledgers": len(unknown),
        "unknown": dict(Counter(u["reason"] for u in unknown)),
        "unknown_examples": unknown[:MAX_ANOMALIES],
    }


def describe(result: Mapping[str, Any]) -> str:
    """The durability verdict in one line, the same words on every path (``bkref
    check``, ``bkref spark-check``, the campaign): from :func:`check_durability`'s
    result, or the same fields computed on Spark."""
    n = sum(result["counts"].values())
    unknown = result["unknown_ledgers"]
    if n:
        head = f"durability: {n:,} anomalies"
    elif unknown:
        head = "durability: no anomaly in what the history decides"
    else:
        head = "durability: valid, every acknowledged entry read back"
    figures = (
        f"{result['acknowledged']:,} acknowledged entries in {result['ledgers']:,} ledgers, "
        f"{result['final_reads']:,} found by final reads"
    )
    if not unknown:
        return f"{head} ({figures})"
    why = ", ".join(
        f"{reason}: {result['unknown'][reason]:,}"
        for reason in UNKNOWN_REASONS
        if result["unknown"].get(reason)
    )
    return (
        f"{head} ({figures}); unknown for {unknown:,} of {result['ledgers']:,} ledgers "
        f"({why}): a ledger is judged only when it was recovered and then every "
        "acknowledged entry read back"
    )
