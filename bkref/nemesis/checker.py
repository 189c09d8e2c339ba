"""Checkers of a campaign history, composed (Jepsen's ``checker/compose``).

- ``linearizable``: the ledger checker of :mod:`bkref.linearizability.ledger_checker`.
- ``durability``: every acknowledged add is present, with its payload, in the
  final reads that follow the ledger's last recovery, and nothing was
  acknowledged or read beyond that close point; a ledger the history cannot
  decide (never recovered, not read back in full) is counted as unknown, never
  as an anomaly (the same check and words as ``bkref check`` and
  ``bkref spark-check``).

Two more check the cluster rather than the history:

- ``replication``: after the heal, the cluster converged (every ledger closed and
  repaired) and a dump of every bookie holds each entry on its whole write set
  (:func:`check_replication`).
- ``cluster``: no node refused to restart but after a fault that takes it out for
  good (a wiped disk, which its cookie must refuse: :func:`check_cluster`).

And, in a run with ``--trace``, one checks the protocol rather than what clients saw:

- ``trace``: the nodes' logged protocol steps, replayed ledger by ledger through the
  spec (``bkref trace check``, :func:`check_traces`); a ledger it cannot decide is
  counted as unknown with its reason, never as an anomaly.

Each returns ``{"valid": bool, "anomalies": [...]}`` with anomalies in the
linearizability package's names, each naming the history indices that prove it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bkref.linearizability.anomalies import (
    MISSING_AFTER_CONVERGENCE,
    NOT_CONVERGED,
    TRACE_STEP_NOT_ALLOWED,
)
from bkref.linearizability.durability import check_durability
from bkref.linearizability.history import Op
from bkref.linearizability.ledger_checker import check_ledgers
from bkref.linearizability.replication import audit as audit_replication


def check_linearizable(ops: Sequence[Op]) -> dict[str, Any]:
    result = check_ledgers(ops)
    anomalies = [a.to_json() for a in result.anomalies]
    return {
        "valid": result.valid,
        "ledgers": len(result.ledgers),
        "counts": dict(result.counts),
        "anomalies": anomalies,
    }


def check_history(ops: Sequence[Op]) -> dict[str, dict[str, Any]]:
    """The checks of a campaign's history, by name (the run adds the cluster's)."""
    return {"linearizable": check_linearizable(ops), "durability": check_durability(ops)}


def check_replication(
    after: dict[str, Any], entries: list[dict[str, Any]], directory: Path
) -> dict[str, Any]:
    """The replication audit of the bookies' dumps (``entries``) against the ledgers'
    metadata after convergence (``after``, from the run's convergence phase); writes the
    metadata it audited to ``directory/dumps/ledgers.jsonl``."""
    ledgers = after.get("ledgers", [])
    with (directory / "dumps" / "ledgers.jsonl").open("w") as f:
        for row in ledgers:
            f.write(json.dumps(row) + "\n")
    result = audit_replication(entries, ledgers)
    anomalies = list(result["anomalies"])
    # With Wq = Aq every entry of a closed ledger is on its whole write set, in a correct
    # cluster, and stays there through crashes, since a bookie fsyncs before it answers
    # and a repair copies before it records; only a fault that destroys fsynced data
    # (VICTIM_KINDS) can take a replica away. So once the cluster converged, a replica
    # the full check finds missing was lost by the protocol or a repair, even if the
    # repair it then triggered has put the entries back (as it may: the replica moves
    # to a bookie that may still hold them).
    anomalies.extend(
        {
            "kind": "under-replicated",
            "ledger": m["ledger"],
            "bookies": m["bookies"],
            "message": MISSING_AFTER_CONVERGENCE.render(
                ledger=m["ledger"], bookies=", ".join(m["bookies"])
            ),
        }
        for m in after.get("missing_after_convergence", [])
    )
    if not after.get("converged"):
        anomalies.insert(
            0,
            {
                "kind": "not-repaired-after-heal",
                "tasks_left": after.get("tasks_left"),
                "naming_down_bookies": after.get("naming_down_bookies"),
                "not_closed": after.get("not_closed"),
                "message": NOT_CONVERGED.render(seconds=after.get("seconds")),
            },
        )
    return {
        "valid": bool(after.get("converged")) and result["valid"] and not anomalies,
        "converge_seconds": after.get("seconds"),
        "full_check_marked": after.get("full_check_marked"),
        "entries_audited": result["entries_audited"],
        "counts": result["counts"],
        "anomalies": anomalies,
    }


def check_cluster(events: list[dict[str, Any]]) -> dict[str, Any]:
    """A node that refused to restart, not after a fault that takes it out for good, is a
    finding (the nemesis's ``events``)."""
    anomalies: list[dict[str, Any]] = [
        {
            "kind": "node-refused-to-start",
            "ledger": None,
            "ops": [],
            "message": f"{e['target']} refused to restart after {e['kind']}: {e['message']}",
        }
        for e in events
        if e.get("event") == "refused" and not e.get("expected")
    ]
    return {"valid": not anomalies, "anomalies": anomalies}


def reason_kind(reason: str) -> str:
    """Why a ledger is unknown, without what differs between ledgers: a node's step
    (``node #seq action(args)``) and numbers; its first clause."""
    text = re.sub(r"\S+ #\d+( \w+\([^)]*\))?", "<step>", reason)
    text = re.sub(r"[\w.-]+:\d+", "<bookie>", text)
    text = re.sub(r"\d[\d,.]*", "N", text)
    return text.split(";")[0][:100]


def check_traces(trace_dir: Path, budget: float) -> dict[str, Any]:
    """``bkref trace check`` on a run's traces, in a process of its own (its wall time
    and peak memory are the check's alone); raises if the check could not run."""
    out = trace_dir.parent / "trace-check.json"
    argv = [sys.executable, "-m", "bkref.tracecheck.cli", "check", str(trace_dir)]
    argv += ["--budget", str(budget), "--json", str(out)]
    started = time.monotonic()
    with (trace_dir.parent / "trace-check.txt").open("wb") as report:
        proc = subprocess.Popen(argv, stdout=report, stderr=subprocess.PIPE)
        assert proc.stderr is not None
        with proc.stderr:
            err = proc.stderr.read().decode(errors="replace").strip()
        # wait4, not wait: the rusage is the check's own (its peak memory).
        _pid, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = code = os.waitstatus_to_exitcode(status)
    seconds = time.monotonic() - started
    if code not in (0, 1, 2) or not out.exists():
        raise RuntimeError(f"the trace check failed (exit {code}): {err or 'no output'}")
    verdicts = json.loads(out.read_text())
    anomalies = [
        {
            "kind": TRACE_STEP_NOT_ALLOWED.kind,
            "ledger": v["ledger"],
            "step": v["event"],
            "message": TRACE_STEP_NOT_ALLOWED.render(event=v["event"], reason=v["reason"]),
        }
        for v in verdicts
        if v["verdict"] == "violation"
    ]
    undecided = [v for v in verdicts if v["verdict"] == "unknown"]
    unknown = Counter(reason_kind(v["reason"]) for v in undecided)
    return {
        "valid": not anomalies,
        "anomalies": anomalies,
        "counts": {
            "ledgers": len(verdicts),
            "explained": sum(1 for v in verdicts if v["verdict"] == "explained"),
            "violation": len(anomalies),
            "unknown": sum(unknown.values()),
            "steps": sum(v["steps"] for v in verdicts),
        },
        "unknown_reasons": dict(unknown.most_common(10)),
        "unknown_ledgers": [{"ledger": v["ledger"], "reason": v["reason"]} for v in undecided[:20]],
        "seconds": round(seconds, 1),
        "peak_mib": round(usage.ru_maxrss / 1024, 1),  # ru_maxrss is in KiB on Linux
    }


# The durability check lives in linearizability (spark_checks runs the same
# verdict on Spark and may not import nemesis); re-exported here.
__all__ = [
    "check_cluster",
    "check_durability",
    "check_history",
    "check_linearizable",
    "check_replication",
    "check_traces",
]
