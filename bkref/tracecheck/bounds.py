"""The spec config a ledger's projected trace is checked in: bounds as large as the
trace needs, and a budget for every fault it may imply (none is logged: crashes,
session expiries, lost messages, failed repairs, lock losses)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bkref.spec.config import Config
from bkref.tracecheck.autorecovery import LOCK_LOST
from bkref.tracecheck.load import Line
from bkref.tracecheck.names import ADD, MARKS, RELEASE

if TYPE_CHECKING:
    from bkref.tracecheck.project import Key, LedgerTrace, Send


def trace_config(lt: LedgerTrace, create: Line, sends: dict[Key, Send]) -> Config:
    """Bounds as large as the trace needs; budgets for every fault it may imply."""
    # An add made during an ensemble change is queued with no send (its line's `sends` is
    # empty): it counts too, or the spec's writer could not make it.
    added = [int(e.line["entry"]) for lane in lt.lanes for e in lane if e.line.action == ADD]
    entries = max([s.entry for s in sends.values()] + added + [0]) + 2
    restarts = sum(1 for lane in lt.lanes for e in lane if e.kind == "restart")
    handles = sum(1 for lane in lt.lanes for e in lane if e.kind == "handle")
    ens = len(create["ensemble"])
    actions = {e.line.action for lane in lt.lanes for e in lane}
    autorecovery = any(a.startswith("worker_") or a in MARKS for a in actions)
    bookies = max(len(lt.bookies), ens)
    return Config(
        name=f"trace of ledger {lt.ledger}",
        description="bounds taken from a recorded trace",
        bookies=bookies,
        ensemble=ens,
        write_quorum=int(create["write_quorum"]),
        ack_quorum=int(create["ack_quorum"]),
        entries=entries,
        pipeline=entries,
        recovery_clients=max(1, len(lt.recoveries)),
        losses=len(sends) + handles,
        reply_losses=True,
        # A bookie the auditor marks lost has crashed, or its session expired while it ran:
        # neither is logged.
        crashes=restarts + (bookies if autorecovery else 0),
        session_losses=sum(
            list(e.line["replicas"].values()).count("LOST") if e.line.action in MARKS else 1
            for lane in lt.lanes
            for e in lane
            if e.line.action in MARKS or e.kind == "expire" or e.marked_after
        ),
        autorecovery=autorecovery,
        workers=bookies if autorecovery else 1,  # worker w runs beside bookie bookies-1-w
        periodic_check="auditor_checks_ledger_replicas" in actions,
        # Any release may be of a repair whose copy failed (a busy slot, no answer).
        repair_failures=sum(1 for lane in lt.lanes for e in lane if e.line.action == RELEASE),
        lock_losses=sum(1 for lane in lt.lanes for e in lane if e.line.action == LOCK_LOST),
        reduce_dead_requests=False,
        bounded=False,
    )
