"""The replication audit in one process: the reference for ``bkref/spark_checks/replication.py``.

Inputs are the two tables of a bookie dump (documented in
``bkref/spark_checks/replication.py``): ``entries`` rows ``{"bookie", "ledger", "entry",
"digest"}``, one per entry a bookie stores, and ``ledgers`` rows with each ledger's
final metadata (``state``, ``last_entry``, ``ensemble_size``, ``write_quorum``,
``segments``). Every entry of every CLOSED ledger must be stored on each bookie of
its write set (round-robin striping over its segment's ensemble), and those replicas
must hold the same entry: the dump's ``digest`` is a content fingerprint (ids, length
and data; a recovery's write-back piggybacks its own LAC, as BookKeeper's does, so
copies need not be the same bytes), and a flipped byte changes it. Anomalies, with
the names and messages the Spark job uses (:mod:`bkref.linearizability.anomalies`):

- ``under-replicated``: a bookie of the entry's write set does not store it;
- ``digest-mismatch``: the copies on the entry's write set differ.

Copies on other bookies are not replicas: they are left over from before a repair or
an ensemble change moved the segment (BookKeeper's GC drops such over-replicated
ledgers later), and no read or repair goes to them. A byte flipped in one of them (a
campaign's flip fault hit one, a 30-minute campaign's seed 401) loses nothing.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from bkref.linearizability import anomalies as msg

MAX_REPORTED = 100  # anomalies listed in full; the counts cover all


def _write_set(entry: int, ensemble: list[str], wq: int) -> list[str]:
    e = len(ensemble)
    return [ensemble[(entry + i) % e] for i in range(wq)]


def _copies(replicas: Mapping[str, str]) -> str:
    """``bookie=digest`` of each replica, in digest order (as the Spark audit lists them)."""
    return ", ".join(f"{b}={d}" for d, b in sorted((d, b) for b, d in replicas.items()))


def audit(
    entries: Iterable[Mapping[str, Any]], ledgers: Iterable[Mapping[str, Any]]
) -> dict[str, Any]:
    copies: dict[tuple[int, int], dict[str, str]] = defaultdict(dict)
    for row in entries:
        copies[(int(row["ledger"]), int(row["entry"]))][str(row["bookie"])] = str(row["digest"])
    anomalies: list[dict[str, Any]] = []
    counts: dict[str, int] = defaultdict(int)
    audited = 0

    def report(message: msg.Message, words: dict[str, object], **fields: Any) -> None:  # noqa: ANN401
        """Count an anomaly; list it (``fields``, and ``words`` rendered) while there is room."""
        counts[message.kind] += 1
        if len(anomalies) < MAX_REPORTED:
            text = message.render(**words)
            anomalies.append({"kind": message.kind, **fields, "message": text})

    for md in ledgers:
        if md["state"] != "CLOSED":
            continue
        lid = int(md["ledger"])
        segments = sorted(md["segments"], key=lambda s: int(s["first_entry"]))
        for i, seg in enumerate(segments):
            first = int(seg["first_entry"])
            last = (
                int(segments[i + 1]["first_entry"]) - 1
                if i + 1 < len(segments)
                else int(md["last_entry"])
            )
            for entry in range(first, last + 1):
                audited += 1
                held = copies.get((lid, entry), {})
                replicas: dict[str, str] = {}
                for bookie in _write_set(entry, list(seg["ensemble"]), int(md["write_quorum"])):
                    if bookie not in held:
                        words = {"e": entry, "ledger": lid, "bookie": bookie}
                        report(msg.NOT_ON_WRITE_SET, words, ledger=lid, entry=entry, bookie=bookie)
                    else:
                        replicas[bookie] = held[bookie]
                if len(set(replicas.values())) > 1:
                    words = {"e": entry, "ledger": lid, "copies": _copies(replicas)}
                    report(msg.REPLICAS_DIFFER, words, ledger=lid, entry=entry, copies=replicas)
    return {
        "valid": not counts,
        "entries_audited": audited,
        "counts": dict(counts),
        "anomalies": anomalies,
    }
