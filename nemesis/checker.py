"""Checkers of a campaign history, composed (Jepsen's ``checker/compose``).

- ``linearizable``: the ledger checker of :mod:`linearizability.ledger_checker`.
- ``durability``: every acknowledged add is present, with its payload, in the
  final reads that follow the ledger's last recovery, and nothing was
  acknowledged or read beyond that close point; a ledger the history cannot
  decide (never recovered, not read back in full) is counted as unknown, never
  as an anomaly (the same check and words as ``bkref check`` and
  ``bkref spark-check``).

Each returns ``{"valid": bool, "anomalies": [...]}`` with anomalies in the
linearizability package's names, each naming the history indices that prove it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from linearizability.durability import check_durability
from linearizability.history import Op
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


def check_history(ops: Sequence[Op]) -> dict[str, dict[str, Any]]:
    """The checks of a campaign's history, by name (the run adds the cluster's)."""
    return {"linearizable": check_linearizable(ops), "durability": check_durability(ops)}


# The durability check lives in linearizability (spark_checks runs the same
# verdict on Spark and may not import nemesis); re-exported here.
__all__ = ["check_durability", "check_history", "check_linearizable"]
