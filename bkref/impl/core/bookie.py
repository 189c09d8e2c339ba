"""A bookie's request handling, without I/O: decide, then the shell persists and replies.

Per ledger a bookie keeps its master key (set by the first add or fence, then
checked on every add and fence), whether it is fenced, the highest LAC
piggybacked on its entries and its highest entry. A decision lists journal
records that must be durable BEFORE the reply is sent (an add is acknowledged
only once journaled; a fence only once the fence is journaled, or a restart
could forget it and let the old writer in again).
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from bkref.impl.core.digest import peek_fields
from bkref.impl.core.frames import (
    AddRequest,
    AddResponse,
    ErrorResponse,
    FrameError,
    Message,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    Response,
    Status,
)


@dataclass(slots=True)
class LedgerInfo:
    master_key: bytes
    fenced: bool = False
    lac: int = -1
    last_entry: int = -1
    # Fenced, and the fence's journal record not yet durable (``on_durable``).
    fence_pending: bool = False


@dataclass(frozen=True, slots=True)
class JournalAdd:
    ledger_id: int
    entry_id: int
    body: bytes


@dataclass(frozen=True, slots=True)
class JournalMasterKey:
    ledger_id: int
    master_key: bytes


@dataclass(frozen=True, slots=True)
class JournalFence:
    ledger_id: int


JournalRecord = JournalAdd | JournalMasterKey | JournalFence


@dataclass(frozen=True, slots=True)
class BookieDecision:
    records: tuple[JournalRecord, ...] = ()  # persist (journal + fsync) before replying
    reply: Response | None = None  # send once ``records`` are durable
    read: ReadRequest | None = None  # look the entry up, then call ``read_result``


class BookieCore:
    def __init__(
        self, ledgers: dict[int, LedgerInfo] | None = None, *, read_only: bool = False
    ) -> None:
        self.ledgers: dict[int, LedgerInfo] = ledgers if ledgers is not None else {}
        self.read_only = read_only

    def handle(self, req: Message) -> BookieDecision:
        """Decide on one decoded message. Each request type has its handler; anything
        else (a response frame, a type this bookie does not know) is the peer's error:
        a BAD_REQUEST reply that names it, and nothing persisted."""
        if isinstance(req, AddRequest):
            return self._add(req)
        if isinstance(req, ReadRequest):
            return self._read(req)
        if isinstance(req, ReadLacRequest):
            return self._read_lac(req)
        return self._bad_request(req)

    def _bad_request(self, msg: object) -> BookieDecision:
        rid = getattr(msg, "request_id", 0)
        return BookieDecision(
            reply=ErrorResponse(
                rid if isinstance(rid, int) else 0,
                Status.BAD_REQUEST,
                f"a bookie accepts add, read and read-LAC requests, not {type(msg).__name__}",
            )
        )

    def on_frame_error(self, err: FrameError) -> ErrorResponse:
        return ErrorResponse(err.request_id, err.status, err.reason)

    def read_result(self, req: ReadRequest, body: bytes | None) -> ReadResponse:
        if body is None:
            status = (
                Status.NO_SUCH_ENTRY if req.ledger_id in self.ledgers else (Status.NO_SUCH_LEDGER)
            )
            return ReadResponse(req.request_id, status, req.ledger_id, req.entry_id)
        return ReadResponse(req.request_id, Status.OK, req.ledger_id, req.entry_id, body)

    # ------------------------------------------------------------ requests

    def _check_key(self, ledger_id: int, key: bytes) -> tuple[list[JournalRecord], Status]:
        """Records to persist for a first contact, and OK or UNAUTHORIZED."""
        if not key:
            return [], Status.UNAUTHORIZED
        info = self.ledgers.get(ledger_id)
        if info is None:
            self.ledgers[ledger_id] = LedgerInfo(key)
            return [JournalMasterKey(ledger_id, key)], Status.OK
        if not hmac.compare_digest(info.master_key, key):
            return [], Status.UNAUTHORIZED
        return [], Status.OK

    def _add(self, req: AddRequest) -> BookieDecision:
        def reply(status: Status) -> BookieDecision:
            return BookieDecision(
                reply=AddResponse(req.request_id, status, req.ledger_id, req.entry_id)
            )

        if self.read_only:
            return reply(Status.READ_ONLY)
        try:
            ledger_id, entry_id, lac, _length = peek_fields(req.body)
        except ValueError as e:
            return BookieDecision(reply=ErrorResponse(req.request_id, Status.BAD_REQUEST, str(e)))
        if ledger_id != req.ledger_id or entry_id != req.entry_id:
            return BookieDecision(
                reply=ErrorResponse(
                    req.request_id,
                    Status.BAD_REQUEST,
                    f"add for ledger {req.ledger_id} entry {req.entry_id} carries an entry of "
                    f"ledger {ledger_id} entry {entry_id}",
                )
            )
        records, status = self._check_key(req.ledger_id, req.master_key)
        if status is not Status.OK:
            return reply(status)
        info = self.ledgers[req.ledger_id]
        if info.fenced and not req.recovery:
            return reply(Status.FENCED)
        info.lac = max(info.lac, lac)
        info.last_entry = max(info.last_entry, req.entry_id)
        records.append(JournalAdd(req.ledger_id, req.entry_id, req.body))
        return BookieDecision(
            records=tuple(records),
            reply=AddResponse(req.request_id, Status.OK, req.ledger_id, req.entry_id),
        )

    def _fence(self, ledger_id: int, key: bytes) -> tuple[list[JournalRecord], Status]:
        """Fence ``ledger_id``. A fence request is answered only once the fence is
        durable, the first one's and every one after it while the first one's journal
        record is not: the fence is journaled again (after the first in the journal's
        order, so its fsync says both are durable). Answered at once, a later request
        told a recovery the bookie was fenced while a crash could still forget it; a
        soak run's trace check caught one (`came back unfenced`). BookKeeper's
        ``LedgerDescriptorImpl.fenceAndLogInJournal`` has a later fence request wait on
        the first one's journal write (apache/bookkeeper 9590a97f)."""
        records, status = self._check_key(ledger_id, key)
        info = self.ledgers.get(ledger_id)
        if status is Status.OK and info is not None and (not info.fenced or info.fence_pending):
            info.fenced = info.fence_pending = True
            records.append(JournalFence(ledger_id))
        return records, status

    def on_durable(self, records: tuple[JournalRecord, ...]) -> None:
        """The shell made ``records`` durable (journaled and synced)."""
        for r in records:
            if isinstance(r, JournalFence) and r.ledger_id in self.ledgers:
                self.ledgers[r.ledger_id].fence_pending = False

    def _read(self, req: ReadRequest) -> BookieDecision:
        records: list[JournalRecord] = []
        if req.fence:
            records, status = self._fence(req.ledger_id, req.master_key)
            if status is not Status.OK:
                return BookieDecision(
                    reply=ReadResponse(req.request_id, status, req.ledger_id, req.entry_id)
                )
        elif req.ledger_id not in self.ledgers:
            return BookieDecision(reply=self.read_result(req, None))
        return BookieDecision(records=tuple(records), read=req)

    def _read_lac(self, req: ReadLacRequest) -> BookieDecision:
        records: list[JournalRecord] = []
        if req.fence:
            records, status = self._fence(req.ledger_id, req.master_key)
            if status is not Status.OK:
                return BookieDecision(
                    reply=ReadLacResponse(req.request_id, status, req.ledger_id, -1, -1)
                )
        info = self.ledgers.get(req.ledger_id)
        if info is None:
            return BookieDecision(
                reply=ReadLacResponse(req.request_id, Status.NO_SUCH_LEDGER, req.ledger_id, -1, -1)
            )
        return BookieDecision(
            records=tuple(records),
            reply=ReadLacResponse(
                req.request_id, Status.OK, req.ledger_id, info.lac, info.last_entry
            ),
        )
