"""bkref's recovery clients in the refinement driver: one ``LedgerRecovery`` per spec client.

Each spec recovery client ``c`` is one ``LedgerRecovery`` at a time, the core
that bkref's client runs for ``open_ledger(recover=True)``. A spec step of
client ``c`` is the call that makes that core take it:

- ``recovery_client_starts_recovery``: a new ``LedgerRecovery`` on the stored
  metadata; its IN_RECOVERY mark runs at once (a conflict with the writer's
  ensemble change starts it over, as bkref's does);
- answers to its requests arrive through the driver's bookie steps
  (:meth:`RecoveryClients.get`, :meth:`RecoveryClients.actions`);
- ``recovery_client_changes_ensemble``: the timeout is an error answer for the
  write-back, then the replacement the spec chose;
- ``recovery_client_closes_ledger``: the close CAS the core asked for, held
  until this step;
- ``recovery_client_gives_up`` (D18): the bookies the spec has down answer its
  outstanding requests with errors, as a refused connection does; the core
  fails, as BookKeeper's ``LedgerRecoveryOp`` fails its open. Its requests
  still in flight become orphans (delivered, answers dropped) and the client
  is idle until it starts again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bkref.impl.core.actions import (
    NeedReplacement,
    RecoveryCompleted,
    SendRead,
    SendReadLac,
    WriteMetadata,
)
from bkref.impl.core.digest import Digest
from bkref.impl.core.frames import Status
from bkref.impl.core.recovery import LedgerRecovery, RecoveryPhase
from bkref.refine.driver import ImplementationError
from bkref.spec import protocol as sp
from bkref.spec.protocol import Label

if TYPE_CHECKING:
    from bkref.refine.bkref_driver import BkrefDriver

ORPHAN = -2  # InFlight.sender of a request whose recovery attempt gave up


class CannotTakeStepError(Exception):
    """The implementation has no way to take this spec step now (the reason)."""


class RecoveryClients:
    """The config's recovery clients, driven through spec steps (method names are the steps)."""

    def __init__(self, d: BkrefDriver, clients: int) -> None:
        self.d = d
        self.recoveries: list[LedgerRecovery | None] = [None] * clients
        # Per client, the close CAS it asked for (held for the spec's close step).
        self.close: list[WriteMetadata | None] = [None] * clients
        # The last read each client sent, by (client, bookie, entry; -1: fencing).
        self.last_request: dict[tuple[int, int, int], SendRead | SendReadLac] = {}

    def get(self, c: int) -> LedgerRecovery:
        rc = self.recoveries[c]
        if rc is None:
            raise CannotTakeStepError(f"no recovery client {c} yet")
        return rc

    def actions(self, c: int) -> None:
        """Post client ``c``'s requests, hold its close CAS for the spec's close step."""
        rc = self.get(c)
        for a in self.d.post(c, rc.take_actions()):
            if isinstance(a, WriteMetadata):
                self.close[c] = a
            elif isinstance(a, RecoveryCompleted):
                if not a.ok:
                    raise ImplementationError(f"recovery client {c} failed: {a.message}")
            else:
                raise ImplementationError(f"recovery asked for {a}, which no spec step is")

    # ------------------------------------------------------------ spec steps

    def recovery_client_starts_recovery(self, c: int) -> tuple[Label, ...]:
        d = self.d
        md, version = d.store.read_ledger(d.ledger_id)
        rc = LedgerRecovery(
            d.ledger_id, md, version, Digest(md.digest_type, md.password), plants=d.plants
        )
        self.recoveries[c] = rc
        rc.start()
        for _ in range(10):  # a conflict (the writer changed its ensemble) starts over
            marks = [a for a in d.post(c, rc.take_actions()) if isinstance(a, WriteMetadata)]
            if not marks:
                break
            d.cas(marks[0], rc.on_metadata_written, rc.on_metadata_conflict)
        return ()

    def recovery_client_completes_fencing(self, _c: int) -> tuple[Label, ...]:
        raise CannotTakeStepError("recovery starts reading as soon as fencing covers the ensemble")

    def recovery_client_retries_request(self, c: int, b: int) -> tuple[Label, ...]:
        rc = self.get(c)
        key = (c, b, -1) if rc.phase is RecoveryPhase.FENCING else (c, b, rc.reading)
        req = self.last_request.get(key)
        if req is None:
            raise CannotTakeStepError(f"recovery client {c} sent nothing to b{b} for {key[2]}")
        self.d.post(c, [req])
        return ()

    def recovery_client_gives_up(self, c: int) -> tuple[Label, ...]:
        d = self.d
        rc = self.get(c)
        # The spec's error answers: bkref's client answers a request to a bookie whose
        # connection is refused with IO_ERROR at once. Every bookie the recovery still
        # waits for is down (the spec's guard), so each of them answers so.
        md = rc.read_metadata
        if rc.phase is RecoveryPhase.FENCING:
            ens, fenced = md.last_segment.ensemble, rc.fencing_answers()
            waiting = [ens[i] for i in range(len(ens)) if i not in fenced]
            for name in waiting:
                rc.on_read_lac_response(name, Status.IO_ERROR, -1)
        else:
            e = rc.reading
            ens, negatives = md.ensemble_for(e), rc.read_negatives()
            waiting = [ens[i] for i in rc.quorum.write_set(e) if i not in negatives]
            for name in waiting:
                rc.on_read_response(name, e, Status.IO_ERROR, b"")
        rc.take_actions()  # to the application: the open failed
        if rc.phase is not RecoveryPhase.FAILED or any(
            d.bookies[d.index[name]].up == sp.UP for name in waiting
        ):
            raise ImplementationError(
                f"recovery client {c} is {rc.phase.value} after error answers from "
                f"{', '.join(waiting)}; the spec's recovery gave up"
            )
        # As the spec's step: the attempt's requests to bookies that are not up failed with
        # the connection; the rest are still delivered, their answers heard by nobody.
        kept = []
        for f in d.inflight:
            if f.sender == c:
                if d.bookies[f.msg[1]].up != sp.UP:
                    continue
                f.sender, f.msg = ORPHAN, (*f.msg[:4], sp.ORPHAN)
            kept.append(f)
        d.inflight = kept
        self.recoveries[c] = None
        self.last_request = {k: v for k, v in self.last_request.items() if k[0] != c}
        d.used[sp.B_GIVE_UP] += 1
        return ()

    def recovery_client_changes_ensemble(self, c: int, failed: int, new: int) -> tuple[Label, ...]:
        # The spec's timeout: a write-back to ``failed`` unanswered and no longer in flight.
        # bkref's recovery learns of it as an error answer for that entry, as its client
        # shell reports a lost connection.
        d = self.d
        rc = self.get(c)
        if self.close[c] is not None:
            # bkref's recovery computes its close when the last write-back reaches ack
            # quorum, and the spec offers no replacement after that (D21, settled in
            # recovery_client_changes_ensemble): reaching here is a disagreement to count.
            raise CannotTakeStepError("recovery already asked to close (D21)")
        name = d.bookies[failed].name
        waiting = [
            e
            for e, acked in sorted(rc.writeback_acks().items())
            if name in (ens := rc.metadata.ensemble_for(e))
            and ens.index(name) in rc.quorum.write_set(e)
            and ens.index(name) not in acked
            and not any(f.msg[:3] == (sp.ADD, failed, e) and f.msg[4] == c + 1 for f in d.inflight)
        ]
        if not waiting:
            raise CannotTakeStepError(f"no write-back to b{failed} is unanswered")
        before = d.sent_by(c)
        rc.on_add_response(name, waiting[0], Status.IO_ERROR)
        for a in d.post(c, rc.take_actions()):
            if not isinstance(a, NeedReplacement):
                raise ImplementationError(f"recovery asked for {a} instead of a replacement")
            rc.replace(a.failed, d.bookies[new].name)
        self.actions(c)
        return d.resends(before, c, "recovery_client_resends_add", (c,))

    def recovery_client_resends_add(self, _c: int, e: int, b: int) -> tuple[Label, ...]:
        # bkref's recovery re-sends as it replaces a bookie (the follow-ups of that step),
        # and only entries not yet at ack quorum, as BookKeeper's pending adds. The spec
        # also lets it copy an entry already at Aq to the new bookie: harmless, not done.
        raise CannotTakeStepError("recovery re-sends only when it replaces a bookie")

    def recovery_client_closes_ledger(self, c: int) -> tuple[Label, ...]:
        if self.close[c] is None:
            raise CannotTakeStepError(f"recovery client {c} has not asked to close")
        rc = self.get(c)
        # A close that conflicts with a worker's swap is retried on the new version at once:
        # the spec's close merges in the same step. One that finds the ledger closed by
        # another client ends there, reporting that close.
        while (cas := self.close[c]) is not None:
            self.close[c] = None
            self.d.cas(cas, rc.on_metadata_written, rc.on_metadata_conflict)
            self.actions(c)
        return ()
