"""The driver that runs the core's machines for ledger handles (:mod:`bkref.impl.client.handles`).

Every decision is the core's: the writer's (:class:`bkref.impl.core.writer.LedgerWriter`:
adds, ensemble changes, close), the recovery's (:class:`bkref.impl.core.recovery.LedgerRecovery`)
and the readers' (:mod:`bkref.impl.core.reads`: when a read proves an entry absent, when
LAC answers cover the ensemble). This module only moves bytes: it performs their
actions (requests to bookies, metadata calls through :class:`ZkCalls`, replacement
choices) and feeds the answers back. All machine calls happen on the event loop's
thread.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import random
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from bkref.impl.client.connection import BookieConnection, BookieUnavailableError
from bkref.impl.client.errors import (
    BKError,
    FencedError,
    WrongPasswordError,
    ZooKeeperError,
)
from bkref.impl.client.zkcalls import ZkCalls
from bkref.impl.core.actions import (
    Action,
    AddCompleted,
    CloseCompleted,
    LocalProtocolError,
    NeedReplacement,
    ReadCompleted,
    ReadLacCompleted,
    RecoveryCompleted,
    SendAdd,
    SendRead,
    SendReadLac,
    WriteMetadata,
)
from bkref.impl.core.digest import Digest, master_key, peek_header
from bkref.impl.core.frames import (
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    Request,
    Response,
    Status,
    encode_add,
)
from bkref.impl.core.metadata import LedgerMetadata
from bkref.impl.core.placement import NotEnoughBookiesError, replace_bookie
from bkref.impl.core.reads import EntryReader, LacReader
from bkref.impl.core.recovery import LedgerRecovery, RecoveryPhase
from bkref.impl.core.writer import LedgerWriter, WriterState
from bkref.impl.meta.store import MetadataConflictError, NoSuchLedgerError
from bkref.impl.trace import REPLACEMENT, STOPPED, Tracer

__all__ = [
    "TICK",
    "Client",
    "Driver",
    "recover",
    "run_entry_reader",
    "run_lac_reader",
]

log = logging.getLogger(__name__)

_RECOVERIES = itertools.count()  # names this process's recoveries in traces

# Seconds per tick of the writer's abstract clock. The ticks come from the event
# loop's timer, not from the injected Clock: they time out adds a bookie left
# unanswered (addEntryTimeoutSec), an I/O timeout like the connection's own.
TICK = 0.1


class Client(Protocol):
    """What the driver and the handles use of :class:`bkref.impl.client.client.BookKeeper`."""

    @property
    def zk_calls(self) -> ZkCalls: ...

    @property
    def rng(self) -> random.Random: ...

    @property
    def add_entry_timeout(self) -> float: ...

    @property
    def plants(self) -> frozenset[str]: ...

    @property
    def tracer(self) -> Tracer | None: ...

    @property
    def closed(self) -> bool: ...

    def conn(self, bookie: str) -> BookieConnection: ...

    async def request(self, bookie: str, make: Callable[[int], Request]) -> Response: ...


class Driver:
    """Performs a writer's or a recovery's actions and feeds it the results."""

    def __init__(
        self, bk: Client, ledger_id: int, key: bytes, machine: LedgerWriter | LedgerRecovery
    ) -> None:
        self.bk, self.ledger_id, self.key, self.m = bk, ledger_id, key, machine
        self.add_futures: dict[int, asyncio.Future[int]] = {}
        self.on_close: asyncio.Future[CloseCompleted] | None = None
        self.on_recovery: asyncio.Future[RecoveryCompleted] | None = None
        self.failed_bookies: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        # Tracing (off: None): the requests sent while performing one event's actions,
        # logged with the spec step that event is (docs/notes/trace-validation.md).
        self.tracer = bk.tracer
        self.rc: str | None = None  # a recovery's name in the trace, set by recover()
        self._sent: list[dict[str, object]] = []
        # Bookies the machine decided to replace while performing an event's actions:
        # logged after the event's own step, which caused the decision (``_held``).
        self._decided: list[str] = []
        self._held = False

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        t = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    def pump(self) -> None:
        for a in self.m.take_actions():
            self._perform(a)
        if self._decided and not self._held:
            self._log_decisions()

    def _pump_held(self) -> None:
        """:meth:`pump`, holding the log of its ensemble-change decisions (tracing)."""
        self._held = True
        try:
            self.pump()
        finally:
            self._held = False

    def _perform(self, a: Action) -> None:
        if isinstance(a, SendAdd):
            lid, key, body, rec = a.ledger_id, self.key, a.body, a.recovery
            rid = self.bk.conn(a.bookie).send(
                lambda rid: encode_add(rid, lid, a.entry_id, key, body, recovery=rec),
                functools.partial(self._add_done, a),
            )
            if self.tracer is not None:
                lac = peek_header(a.body).lac
                self._note_send("add", a.bookie, rid, entry=a.entry_id, lac=lac)
        elif isinstance(a, SendRead):
            fence, key = a.fence, self.key if a.fence else b""
            rid, answer = self.bk.conn(a.bookie).start(
                lambda rid: ReadRequest(rid, a.ledger_id, a.entry_id, fence, key)
            )
            if self.tracer is not None:
                self._note_send("read", a.bookie, rid, entry=a.entry_id, fence=fence)
            self._spawn(self._read(a, rid, answer))
        elif isinstance(a, SendReadLac):
            fence, key = a.fence, self.key if a.fence else b""
            rid, answer = self.bk.conn(a.bookie).start(
                lambda rid: ReadLacRequest(rid, a.ledger_id, fence, key)
            )
            if self.tracer is not None:
                self._note_send("lac_read", a.bookie, rid, fence=fence)
            self._spawn(self._read_lac(a, rid, answer))
        elif isinstance(a, WriteMetadata):
            self._spawn(self._write_metadata(a))
        elif isinstance(a, NeedReplacement):
            if self.tracer is not None:
                self._decided.append(a.failed)
            self._spawn(self._replace(a))
        elif isinstance(a, AddCompleted):
            fut = self.add_futures.pop(a.entry_id, None)
            if fut is not None and not fut.done():
                if a.status is Status.OK:
                    fut.set_result(a.entry_id)
                elif a.status is Status.FENCED:
                    fut.set_exception(FencedError(a.message or f"ledger {self.ledger_id} fenced"))
                elif a.status is Status.UNAUTHORIZED:
                    fut.set_exception(WrongPasswordError(a.message))
                else:
                    fut.set_exception(BKError(a.message or a.status.name, a.status))
        elif isinstance(a, CloseCompleted):
            if self.on_close is not None and not self.on_close.done():
                self.on_close.set_result(a)
        elif isinstance(a, RecoveryCompleted):
            if self.tracer is not None and not a.ok:
                # It takes no more steps: the answers it gets from now on go unheard.
                self._log(STOPPED, reason=a.message[:200])
            if self.on_recovery is not None and not self.on_recovery.done():
                self.on_recovery.set_result(a)

    def _add_done(
        self, a: SendAdd, resp: Response | None, err: BookieUnavailableError | None
    ) -> None:
        if resp is not None:
            status = resp.status
        else:
            # Once the client is closing, its own close broke the connection: not a warning.
            (log.debug if self.bk.closed else log.warning)(
                "add of ledger %d entry %d to %s failed: %s", a.ledger_id, a.entry_id, a.bookie, err
            )
            status = Status.IO_ERROR
        self.m.on_add_response(a.bookie, a.entry_id, status)
        if self.tracer is None:
            self.pump()
            return
        self._pump_held()
        if resp is not None:
            who = "recovery_client" if a.recovery else "writer"
            self._step(
                f"{who}_receives_add_response",
                bookie=a.bookie,
                rid=resp.request_id,
                entry=a.entry_id,
                status=status.name,
            )
        self._log_decisions()

    async def _read(self, a: SendRead, rid: int, fut: asyncio.Future[Response]) -> None:
        if not isinstance(self.m, LedgerRecovery):
            raise LocalProtocolError(f"ledger {self.ledger_id}: a writer asked for a read")
        body = b""
        try:
            resp = await fut
            status = resp.status
            if isinstance(resp, ReadResponse):
                body = resp.body
        except BookieUnavailableError:
            status = Status.IO_ERROR
        self.m.on_read_response(a.bookie, a.entry_id, status, body)
        if self.tracer is None:
            self.pump()
            return
        self._pump_held()
        # Its write-backs and the next reads are part of the spec's step (the sends).
        self._step(
            "recovery_client_receives_read_response",
            bookie=a.bookie,
            rid=rid,
            entry=a.entry_id,
            status=status.name,
        )
        self._log_decisions()

    async def _read_lac(self, a: SendReadLac, rid: int, fut: asyncio.Future[Response]) -> None:
        if not isinstance(self.m, LedgerRecovery):
            raise LocalProtocolError(f"ledger {self.ledger_id}: a writer asked for a LAC read")
        lac = -1
        try:
            resp = await fut
            status = resp.status
            if isinstance(resp, ReadLacResponse):
                lac = resp.lac
        except BookieUnavailableError:
            status = Status.IO_ERROR
        fencing = self.m.phase is RecoveryPhase.FENCING
        self.m.on_read_lac_response(a.bookie, status, lac)
        if self.tracer is None:
            self.pump()
            return
        self._pump_held()
        reads = self._take_sent()
        self._step(
            "recovery_client_receives_fencing_response",
            bookie=a.bookie,
            rid=rid,
            lac=lac,
            status=status.name,
        )
        if fencing and self.m.phase is not RecoveryPhase.FENCING:
            self._sent = reads
            self._step("recovery_client_completes_fencing")
        self._log_decisions()

    async def _write_metadata(self, a: WriteMetadata) -> None:
        before = self._phase()
        outcome = "written"
        read_back = False
        try:
            version, read_back = await self.bk.zk_calls.cas_ledger(
                self.ledger_id, a.metadata, a.expected_version, a.reason
            )
        except ZooKeeperError as e:  # unreachable or refused: the outcome is unknown
            log.error("ledger %d: %s", self.ledger_id, e)
            outcome = "unknown"
            self.m.on_metadata_failed(str(e))
        except NoSuchLedgerError as e:  # deleted meanwhile: fail, never hang the caller
            outcome = "unknown"
            self.m.on_metadata_failed(str(e))
        except MetadataConflictError as e:
            outcome = "conflict"
            log.info(
                "ledger %d: metadata CAS (%s) lost to a concurrent update", self.ledger_id, a.reason
            )
            if e.current is None:
                self.m.on_metadata_conflict(a.metadata, -1)
            else:
                self.m.on_metadata_conflict(e.current, e.version)
        else:
            self.m.on_metadata_written(version)
        if self.tracer is None:
            self.pump()
            return
        self._pump_held()
        self._trace_metadata(before, outcome, read_back)
        self._log_decisions()

    async def _replace(self, a: NeedReplacement) -> None:
        self.failed_bookies.add(a.failed)
        chosen: str | None = None
        # A closed client's requests fail because it closed their connections, not because
        # the bookie failed; and it can no longer ask ZooKeeper for another.
        why = "the client was closed" if self.bk.closed else None
        if why is None:
            try:
                candidates = await self.bk.zk_calls.writable_bookies()
                new = replace_bookie(
                    a.ensemble, a.failed, candidates, exclude=self.failed_bookies, rng=self.bk.rng
                )
            except (NotEnoughBookiesError, ZooKeeperError) as e:
                why = str(e)
            else:
                chosen = new[a.ensemble.index(a.failed)]
                log.info(
                    "ledger %d: replacing failed bookie %s with %s",
                    self.ledger_id,
                    a.failed,
                    chosen,
                )
                self.m.replace(a.failed, chosen)
        if why is not None:
            # Never leave the ledger waiting on a replacement that will not come.
            self.m.no_replacement(a.failed, why)
        if self.tracer is None:
            self.pump()
            return
        self._pump_held()  # a recovery resends its write-backs to the new bookie now
        resends = self._take_sent()
        # The change was logged when it was decided; this names the bookie chosen.
        self._log(REPLACEMENT, failed=a.failed, new=chosen)
        self._sent = resends
        who = "writer" if isinstance(self.m, LedgerWriter) else "recovery_client"
        self._trace_resends(f"{who}_resends_add")
        self._log_decisions()

    # ------------------------------------------------------------ tracing

    def _note_send(self, kind: str, bookie: str, rid: int, **args: object) -> None:
        self._sent.append({"kind": kind, "bookie": bookie, "rid": rid, **args})

    def _take_sent(self) -> list[dict[str, object]]:
        sent, self._sent = self._sent, []
        return sent

    def _step(self, action: str, **args: object) -> None:
        """Log one spec step of this writer or recovery, with the requests it sent."""
        self._log(action, **args, sends=self._take_sent())

    def _log(self, action: str, **args: object) -> None:
        assert self.tracer is not None
        who = {"rc": self.rc} if self.rc is not None else {}
        self.tracer.step(action, ledger=self.ledger_id, **who, **args)

    def _log_decisions(self) -> None:
        """The ensemble changes decided (the spec's step: acks are held from here on;
        the replacement is named by the ``replacement`` line that follows)."""
        who = "writer" if isinstance(self.m, LedgerWriter) else "recovery_client"
        for failed in self._decided:
            self._step(f"{who}_changes_ensemble", failed=failed)
        self._decided.clear()

    def _trace_resends(self, action: str) -> None:
        """Each request sent to a bookie that joined a write set is a step of its own."""
        for send in self._take_sent():
            self._sent = [send]
            self._step(action, entry=send["entry"], bookie=send["bookie"])

    def _phase(self) -> str:
        return self.m.state.value if isinstance(self.m, LedgerWriter) else self.m.phase.value

    def _trace_metadata(self, before: str, outcome: str, read_back: bool = False) -> None:
        """The spec step a metadata CAS's outcome is, if any (a retry is none). A write
        ``read_back`` after a lost connection says so: the stored metadata it found may be
        another client's identical write."""
        after = self._phase()
        extra = {"read_back": True} if read_back else {}
        if isinstance(self.m, LedgerWriter):
            if before == WriterState.CHANGING_ENSEMBLE.value:
                if outcome == "conflict":
                    if after != WriterState.FENCED.value:
                        return  # a worker's change: retried on the new version
                    outcome = "withdrawn"
                resends = self._take_sent()
                self._step("writer_completes_ensemble_change", outcome=outcome)
                self._sent = resends
                self._trace_resends("writer_resends_add")
            elif before == WriterState.CLOSING.value and after != before:
                if outcome == "conflict":
                    outcome = "closed" if after == WriterState.CLOSED.value else "withdrawn"
                else:
                    outcome = "closed" if outcome == "written" else outcome
                self._step("writer_closes_ledger", outcome=outcome, last=self.m.lac, **extra)
            return
        if before == RecoveryPhase.MARKING.value and after == RecoveryPhase.FENCING.value:
            self._step("recovery_client_starts_recovery")
        elif before == RecoveryPhase.CLOSING.value and after != before:
            if outcome == "conflict":
                outcome = "lost"  # another recovery closed it first
            else:
                outcome = "closed" if outcome == "written" else outcome
            self._step(
                "recovery_client_closes_ledger", outcome=outcome, last=self.m.last_entry, **extra
            )


async def recover(
    bk: Client, ledger_id: int, metadata: LedgerMetadata, version: int, password: bytes
) -> tuple[LedgerMetadata, int]:
    """Fence ``ledger_id``, find its last entry, write it back and close the ledger;
    returns the closed metadata and its version."""
    machine = LedgerRecovery(
        ledger_id, metadata, version, Digest(metadata.digest_type, password), plants=bk.plants
    )
    done: asyncio.Future[RecoveryCompleted] = asyncio.get_running_loop().create_future()
    driver = Driver(bk, ledger_id, master_key(password), machine)
    driver.on_recovery = done
    if driver.tracer is not None:
        driver.rc = f"{driver.tracer.node}/{ledger_id}#{next(_RECOVERIES)}"
    machine.start()
    driver.pump()
    if driver.tracer is not None and machine.phase is RecoveryPhase.FENCING:
        driver._step("recovery_client_starts_recovery")  # found IN_RECOVERY: no CAS
    result = await done
    if not result.ok:
        raise BKError(result.message)
    log.info(
        "recovered ledger %d: last entry %d, length %d", ledger_id, result.last_entry, result.length
    )
    return machine.metadata, machine.version


# ---------------------------------------------------------------- readers


async def run_entry_reader(bk: Client, reader: EntryReader) -> ReadCompleted:
    """Run ``reader``: ask the bookies it names, one at a time, feed it their answers."""
    reader.start()
    while True:
        actions = reader.take_actions()
        if not actions:
            raise LocalProtocolError(f"reader of ledger {reader.ledger_id}: stalled")
        for a in actions:
            if isinstance(a, ReadCompleted):
                return a
            try:
                resp = await bk.request(
                    a.bookie, functools.partial(_read_request, a.ledger_id, a.entry_id)
                )
            except BookieUnavailableError as e:
                reader.on_bookie_unavailable(a.bookie, str(e))
                continue
            if isinstance(resp, ReadResponse):
                reader.on_read_response(a.bookie, resp.status, resp.body)
            else:  # an error frame, or an answer to another question: no copy
                reader.on_read_response(a.bookie, _not_ok(resp.status))


async def run_lac_reader(bk: Client, reader: LacReader) -> ReadLacCompleted:
    """Run ``reader``: ask the bookies it names at once, feed it each answer."""
    reader.start()
    asking: set[asyncio.Task[None]] = set()

    async def ask(a: SendReadLac) -> None:
        try:
            resp = await bk.request(a.bookie, functools.partial(_read_lac_request, a.ledger_id))
        except BookieUnavailableError as e:
            reader.on_bookie_unavailable(a.bookie, str(e))
            return
        if isinstance(resp, ReadLacResponse):
            reader.on_read_lac_response(a.bookie, resp.status, resp.lac)
        else:
            reader.on_read_lac_response(a.bookie, _not_ok(resp.status), -1)

    loop = asyncio.get_running_loop()
    try:
        while True:
            for a in reader.take_actions():
                if isinstance(a, ReadLacCompleted):
                    return a
                asking.add(loop.create_task(ask(a)))
            if not asking:
                raise LocalProtocolError(f"LAC reader of ledger {reader.ledger_id}: stalled")
            done, asking = await asyncio.wait(asking, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                t.result()  # a misused reader raises here
    finally:
        for t in asking:
            t.cancel()


def _read_request(ledger_id: int, entry_id: int, rid: int) -> ReadRequest:
    return ReadRequest(rid, ledger_id, entry_id)


def _read_lac_request(ledger_id: int, rid: int) -> ReadLacRequest:
    return ReadLacRequest(rid, ledger_id)


def _not_ok(status: Status) -> Status:
    """The status of a response that carries no answer: an OK there is the peer's error."""
    return Status.IO_ERROR if status is Status.OK else status
