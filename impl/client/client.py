"""The BookKeeper client: create, open (with or without recovery), add, read, close, delete.

Each ledger handle drives a core state machine (writer or recovery) and
performs its actions: requests to bookies, metadata CASes in ZooKeeper (kazoo
is synchronous, so they run in a worker thread), replacement choices. All
state machine calls happen on the event loop's thread.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import random
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kazoo.exceptions import (
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    OperationTimeoutError,
    SessionExpiredError,
)

from impl.client.connection import BookieConnection, BookieUnavailableError
from impl.core.actions import (
    Action,
    AddCompleted,
    CloseCompleted,
    NeedReplacement,
    RecoveryCompleted,
    SendAdd,
    SendRead,
    SendReadLac,
    WriteMetadata,
)
from impl.core.digest import Digest, DigestMismatchError, DigestType, master_key, password_hash
from impl.core.frames import (
    AddRequest,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    Request,
    Response,
    Status,
)
from impl.core.metadata import LedgerMetadata, Segment
from impl.core.placement import NotEnoughBookiesError, choose_ensemble, replace_bookie
from impl.core.planted import validate as validate_plants
from impl.core.reads import read_order
from impl.core.recovery import LedgerRecovery
from impl.core.writer import LedgerWriter
from impl.meta.store import (
    MetadataConflictError,
    MetadataUnavailableError,
    NoSuchLedgerError,
    ZkMetadataStore,
    connect,
)

log = logging.getLogger(__name__)

T = TypeVar("T")
# ZooKeeper could not be asked (as opposed to answering, e.g. "no such node").
ZK_UNAVAILABLE = (ConnectionLoss, ConnectionClosedError, OperationTimeoutError, SessionExpiredError)


TICK = 0.1  # seconds per tick of the core's abstract clock


class BKError(RuntimeError):
    """A ledger operation failed; ``status`` says how."""

    def __init__(self, message: str, status: Status = Status.IO_ERROR) -> None:
        super().__init__(message)
        self.status = status


class ZooKeeperError(BKError, KazooException):  # type: ignore[misc]  # kazoo is untyped
    """ZooKeeper failed during a client operation (connection loss, session expiry, a
    timeout). A BKError whose message says what was being done and whether its outcome
    is known; also a KazooException, so handlers written for kazoo's errors still apply."""


class FencedError(BKError):
    def __init__(self, message: str) -> None:
        super().__init__(message, Status.FENCED)


class NoSuchEntryError(BKError):
    """Every replica asked answered that it does not hold the entry."""

    def __init__(self, message: str) -> None:
        super().__init__(message, Status.NO_SUCH_ENTRY)


class WrongPasswordError(BKError):
    def __init__(self, message: str) -> None:
        super().__init__(message, Status.UNAUTHORIZED)


def _status(resp: Response) -> Status:
    return resp.status


class BookKeeper:
    def __init__(
        self,
        zk_hosts: str,
        root: str = "/ledgers",
        *,
        timeout: float = 10.0,
        add_entry_timeout: float = 5.0,
        connect_timeout: float = 15.0,
        session_timeout: float = 10.0,
        seed: int | None = None,
        zk_call_timeout: float = 30.0,
        plants: frozenset[str] = frozenset(),
    ) -> None:
        self.zk_hosts = zk_hosts
        self.plants = validate_plants(plants)  # planted bugs (test-only) of its writers, recoveries
        self.root = root
        self.timeout = timeout
        self.add_entry_timeout = add_entry_timeout  # BookKeeper's addEntryTimeoutSec
        self.connect_timeout = connect_timeout
        self.session_timeout = session_timeout  # ZooKeeper session (zkTimeout)
        # How long a metadata call waits for a connection to ZooKeeper, then for its answer.
        self.zk_call_timeout = zk_call_timeout
        self.rng = random.Random(seed)
        self._conns: dict[str, BookieConnection] = {}
        self.store: ZkMetadataStore | None = None

    async def start(self) -> BookKeeper:
        try:
            zk = await asyncio.to_thread(
                connect, self.zk_hosts, self.connect_timeout, self.session_timeout
            )
        except Exception as e:  # kazoo raises its own timeout type
            raise BKError(
                f"cannot connect to ZooKeeper at {self.zk_hosts}: {e or type(e).__name__}; "
                "is it running (`bkref cluster status`)?"
            ) from e
        self.store = ZkMetadataStore(zk, self.root)
        return self

    async def __aenter__(self) -> BookKeeper:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        for c in self._conns.values():
            await c.close()
        self._conns.clear()
        if self.store is not None:
            zk = self.store.zk
            await asyncio.to_thread(zk.stop)
            await asyncio.to_thread(zk.close)
            self.store = None

    @property
    def meta(self) -> ZkMetadataStore:
        if self.store is None:
            raise RuntimeError("BookKeeper client not started: call `await bk.start()`")
        return self.store

    def conn(self, bookie: str) -> BookieConnection:
        c = self._conns.get(bookie)
        if c is None:
            c = self._conns[bookie] = BookieConnection(bookie, self.timeout)
        return c

    async def request(self, bookie: str, make: Callable[[int], Request]) -> Response:
        return await self.conn(bookie).request(make)

    async def zk_call(
        self, what: str, fn: Callable[..., T], *args: object, writes: bool = False
    ) -> T:
        """``fn(*args)`` on a worker thread; ZooKeeper being unreachable (connection loss,
        session expiry, a timeout) becomes a :class:`ZooKeeperError` that names ``what``
        failed and, for ``writes``, that its outcome is unknown."""
        then = (
            "it may or may not have happened: read the metadata before retrying"
            if writes
            else "retry once ZooKeeper answers"
        )
        # kazoo queues a call made while it reconnects and never times it out: with
        # ZooKeeper down for good the caller would wait forever. Wait a bounded time
        # for the connection, and for the answer.
        wait = self.zk_call_timeout
        if not await self._zk_connected(wait):
            raise ZooKeeperError(
                f"{what}: no connection to ZooKeeper at {self.zk_hosts} for {wait:g} s; "
                "nothing was sent; retry once ZooKeeper answers"
            )
        try:
            return await asyncio.wait_for(asyncio.to_thread(fn, *args), wait)
        except TimeoutError as e:
            raise ZooKeeperError(
                f"{what}: ZooKeeper at {self.zk_hosts} did not answer in {wait:g} s; {then}"
            ) from e
        except ZK_UNAVAILABLE as e:
            detail = f"{type(e).__name__}{f': {e}' if str(e) else ''}"
            raise ZooKeeperError(
                f"{what}: ZooKeeper at {self.zk_hosts} failed ({detail}); {then}"
            ) from e

    async def _zk_connected(self, wait: float) -> bool:
        zk = self.meta.zk
        deadline = time.monotonic() + wait
        while not zk.connected:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    # ------------------------------------------------------------ ledgers

    async def create_ledger(
        self,
        ensemble: int = 3,
        write_quorum: int = 2,
        ack_quorum: int = 2,
        password: bytes = b"",
        digest: DigestType = DigestType.CRC32C,
    ) -> WriteHandle:
        candidates = await self.zk_call("list writable bookies", self.meta.writable_bookies)
        try:
            bookies = choose_ensemble(candidates, ensemble, rng=self.rng)
        except NotEnoughBookiesError as e:
            raise BKError(str(e)) from e
        md = LedgerMetadata(
            ensemble,
            write_quorum,
            ack_quorum,
            (Segment(0, bookies),),
            digest,
            password_hash(password),
            ctime_ms=int(time.time() * 1000),
            password=password,
        )
        lid, version = await self.zk_call(
            "create ledger metadata", self.meta.create_ledger, md, writes=True
        )
        return WriteHandle(self, lid, md, version, password)

    async def _read_meta(self, ledger_id: int, password: bytes) -> tuple[LedgerMetadata, int]:
        md, version = await self.zk_call(
            f"read ledger {ledger_id}'s metadata", self.meta.read_ledger, ledger_id
        )
        if md.password_hash != password_hash(password):
            raise WrongPasswordError(f"wrong password for ledger {ledger_id}")
        return md, version

    async def open_ledger(
        self, ledger_id: int, password: bytes = b"", *, recovery: bool = True
    ) -> ReadHandle:
        """Open for reading. With ``recovery`` (the default, as BookKeeper's openLedger) an
        open ledger is fenced, its last entry found and written back, and it is closed."""
        md, version = await self._read_meta(ledger_id, password)
        if recovery and not md.is_closed:
            md, version = await self._recover(ledger_id, md, version, password)
        h = ReadHandle(self, ledger_id, md, version, password)
        if md.is_closed:
            h.lac = md.last_entry
        else:
            h.lac = await h.read_lac()
        return h

    async def _recover(
        self, ledger_id: int, md: LedgerMetadata, version: int, password: bytes
    ) -> tuple[LedgerMetadata, int]:
        machine = LedgerRecovery(
            ledger_id, md, version, Digest(md.digest_type, password), plants=self.plants
        )
        done: asyncio.Future[RecoveryCompleted] = asyncio.get_running_loop().create_future()
        driver = _Driver(self, ledger_id, master_key(password), machine)
        driver.on_recovery = done
        machine.start()
        driver.pump()
        result = await done
        if not result.ok:
            raise BKError(result.message)
        log.info(
            "recovered ledger %d: last entry %d, length %d",
            ledger_id,
            result.last_entry,
            result.length,
        )
        return machine.metadata, machine.version

    async def delete_ledger(self, ledger_id: int) -> None:
        await self.zk_call(
            f"delete ledger {ledger_id}", self.meta.delete_ledger, ledger_id, writes=True
        )

    async def list_ledgers(self) -> list[int]:
        return await self.zk_call("list ledgers", self.meta.list_ledgers)


class _Driver:
    """Performs a state machine's actions and feeds it the results."""

    def __init__(
        self, bk: BookKeeper, ledger_id: int, key: bytes, machine: LedgerWriter | LedgerRecovery
    ) -> None:
        self.bk, self.ledger_id, self.key, self.m = bk, ledger_id, key, machine
        self.add_futures: dict[int, asyncio.Future[int]] = {}
        self.on_close: asyncio.Future[CloseCompleted] | None = None
        self.on_recovery: asyncio.Future[RecoveryCompleted] | None = None
        self.failed_bookies: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        t = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    def pump(self) -> None:
        for a in self.m.take_actions():
            self._perform(a)

    def _perform(self, a: Action) -> None:
        if isinstance(a, SendAdd):
            key = self.key
            self.bk.conn(a.bookie).send(
                lambda rid: AddRequest(rid, a.ledger_id, a.entry_id, key, a.body, a.recovery),
                functools.partial(self._add_done, a),
            )
        elif isinstance(a, SendRead):
            self._spawn(self._read(a))
        elif isinstance(a, SendReadLac):
            self._spawn(self._read_lac(a))
        elif isinstance(a, WriteMetadata):
            self._spawn(self._write_metadata(a))
        elif isinstance(a, NeedReplacement):
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
        elif isinstance(a, RecoveryCompleted) and (
            self.on_recovery is not None and not self.on_recovery.done()
        ):
            self.on_recovery.set_result(a)

    def _add_done(
        self, a: SendAdd, resp: Response | None, err: BookieUnavailableError | None
    ) -> None:
        if resp is not None:
            status = resp.status
        else:
            log.warning(
                "add of ledger %d entry %d to %s failed: %s", a.ledger_id, a.entry_id, a.bookie, err
            )
            status = Status.IO_ERROR
        self.m.on_add_response(a.bookie, a.entry_id, status)
        self.pump()

    async def _read(self, a: SendRead) -> None:
        assert isinstance(self.m, LedgerRecovery)
        body = b""
        try:
            resp = await self.bk.request(
                a.bookie,
                lambda rid: ReadRequest(
                    rid, a.ledger_id, a.entry_id, a.fence, self.key if a.fence else b""
                ),
            )
            status = _status(resp)
            if isinstance(resp, ReadResponse):
                body = resp.body
        except BookieUnavailableError:
            status = Status.IO_ERROR
        self.m.on_read_response(a.bookie, a.entry_id, status, body)
        self.pump()

    async def _read_lac(self, a: SendReadLac) -> None:
        assert isinstance(self.m, LedgerRecovery)
        lac = -1
        try:
            resp = await self.bk.request(
                a.bookie,
                lambda rid: ReadLacRequest(rid, a.ledger_id, a.fence, self.key if a.fence else b""),
            )
            status = _status(resp)
            if isinstance(resp, ReadLacResponse):
                lac = resp.lac
        except BookieUnavailableError:
            status = Status.IO_ERROR
        self.m.on_read_lac_response(a.bookie, status, lac)
        self.pump()

    async def _write_metadata(self, a: WriteMetadata) -> None:
        try:
            version = await self.bk.zk_call(
                f"{a.reason} of ledger {self.ledger_id}",
                self.bk.meta.cas_ledger,
                self.ledger_id,
                a.metadata,
                a.expected_version,
                writes=True,
            )
        except (MetadataUnavailableError, ZooKeeperError) as e:
            log.error("ledger %d: %s", self.ledger_id, e)
            self.m.on_metadata_failed(str(e))
        except NoSuchLedgerError as e:  # deleted meanwhile: fail, never hang the caller
            self.m.on_metadata_failed(str(e))
        except KazooException as e:  # any other ZooKeeper error: fail, never hang either
            self.m.on_metadata_failed(f"ZooKeeper failed during the {a.reason}: {e!r}")
        except MetadataConflictError as e:
            log.info(
                "ledger %d: metadata CAS (%s) lost to a concurrent update", self.ledger_id, a.reason
            )
            if e.current is None:
                self.m.on_metadata_conflict(a.metadata, -1)
            else:
                self.m.on_metadata_conflict(e.current, e.version)
        else:
            self.m.on_metadata_written(version)
        self.pump()

    async def _replace(self, a: NeedReplacement) -> None:
        self.failed_bookies.add(a.failed)
        try:
            candidates = await self.bk.zk_call(
                "list writable bookies", self.bk.meta.writable_bookies
            )
            new = replace_bookie(
                a.ensemble, a.failed, candidates, exclude=self.failed_bookies, rng=self.bk.rng
            )
        except (NotEnoughBookiesError, ZooKeeperError) as e:
            # Never leave the ledger waiting on a replacement that will not come.
            self.m.no_replacement(a.failed, str(e))
        else:
            idx = a.ensemble.index(a.failed)
            log.info(
                "ledger %d: replacing failed bookie %s with %s", self.ledger_id, a.failed, new[idx]
            )
            self.m.replace(a.failed, new[idx])
        self.pump()


@dataclass
class ReadStats:
    digest_mismatches: list[tuple[str, int]] = field(default_factory=list)  # (bookie, entry)


class ReadHandle:
    def __init__(
        self,
        bk: BookKeeper,
        ledger_id: int,
        metadata: LedgerMetadata,
        version: int,
        password: bytes,
    ) -> None:
        self.bk = bk
        self.ledger_id = ledger_id
        self.metadata = metadata
        self.version = version
        self.password = password
        self.digest = Digest(metadata.digest_type, password)
        self.lac = metadata.last_entry
        self.stats = ReadStats()

    def current_metadata(self) -> LedgerMetadata:
        return self.metadata

    @property
    def last_entry(self) -> int:
        return self.metadata.last_entry if self.metadata.is_closed else self.lac

    async def read_entry(self, entry_id: int) -> bytes:
        """One entry, from the first replica of its write set whose copy verifies.

        Raises :class:`NoSuchEntryError` only when every replica answered that it does
        not hold the entry; when some could not be asked (down, timed out) or returned a
        corrupt copy, a :class:`BKError` with status IO_ERROR: absence is then unknown."""
        reasons: list[str] = []
        absent = 0
        for bookie in read_order(self.current_metadata(), entry_id):
            try:
                resp = await self.bk.request(
                    bookie, lambda rid: ReadRequest(rid, self.ledger_id, entry_id)
                )
            except BookieUnavailableError as e:
                reasons.append(f"{bookie}: {e}")
                continue
            if isinstance(resp, ReadResponse) and resp.status is Status.OK:
                try:
                    return self.digest.verify(resp.body, self.ledger_id, entry_id).data
                except DigestMismatchError as e:
                    log.warning(
                        "digest mismatch from bookie %s: %s; reading another replica", bookie, e
                    )
                    self.stats.digest_mismatches.append((bookie, entry_id))
                    reasons.append(f"{bookie}: {e}")
                    continue
            reasons.append(f"{bookie}: {resp.status.name}")
            if resp.status in (Status.NO_SUCH_ENTRY, Status.NO_SUCH_LEDGER):
                absent += 1
        detail = "; ".join(reasons)
        if absent == len(reasons):
            raise NoSuchEntryError(
                f"ledger {self.ledger_id} entry {entry_id}: every replica of its write set "
                f"answered that it has no such entry ({detail})"
            )
        raise BKError(
            f"ledger {self.ledger_id} entry {entry_id} unreadable: no replica returned a "
            f"verified copy, and not all of them could say whether they hold it ({detail}); "
            "retry once the bookies are reachable",
            Status.IO_ERROR,
        )

    async def read(self, first: int, last: int, *, concurrency: int = 64) -> list[bytes]:
        """Entries ``first..last`` (inclusive); refuses to read past the last confirmed entry."""
        if last > self.last_entry:
            raise BKError(
                f"ledger {self.ledger_id}: cannot read up to {last}, the last "
                f"confirmed entry is {self.last_entry}",
                Status.NO_SUCH_ENTRY,
            )
        out: list[bytes] = []
        for start in range(first, last + 1, concurrency):
            batch = range(start, min(last, start + concurrency - 1) + 1)
            out += await asyncio.gather(*(self.read_entry(e) for e in batch))
        return out

    async def read_lac(self) -> int:
        """The highest LAC the last ensemble's bookies report (needs quorum coverage)."""
        md = self.current_metadata()
        ens = md.last_segment.ensemble
        results = await asyncio.gather(
            *(self.bk.request(b, lambda rid: ReadLacRequest(rid, self.ledger_id)) for b in ens),
            return_exceptions=True,
        )
        answered: dict[int, int] = {}
        for i, r in enumerate(results):
            if isinstance(r, ReadLacResponse) and r.status in (Status.OK, Status.NO_SUCH_LEDGER):
                answered[i] = r.lac
        if not md.quorum.is_covered(answered):
            raise BKError(
                f"ledger {self.ledger_id}: too few bookies answered the LAC read "
                f"({len(answered)} of {len(ens)})"
            )
        lac = max([*answered.values(), md.last_segment.first_entry - 1, -1])
        if md.is_closed:
            lac = md.last_entry
        self.lac = max(self.lac, lac)
        return lac


class WriteHandle(ReadHandle):
    def __init__(
        self,
        bk: BookKeeper,
        ledger_id: int,
        metadata: LedgerMetadata,
        version: int,
        password: bytes,
    ) -> None:
        super().__init__(bk, ledger_id, metadata, version, password)
        self.writer = LedgerWriter(
            ledger_id,
            metadata,
            version,
            self.digest,
            add_timeout_ticks=max(1, math.ceil(bk.add_entry_timeout / TICK)),
            plants=bk.plants,
        )
        self._driver = _Driver(bk, ledger_id, master_key(password), self.writer)
        self._ticker: asyncio.TimerHandle | None = None

    def _tick(self) -> None:
        """The writer's clock runs while adds are pending."""
        self.writer.tick()
        self._driver.pump()
        self._ticker = (
            asyncio.get_running_loop().call_later(TICK, self._tick) if self.writer.pending else None
        )

    def current_metadata(self) -> LedgerMetadata:
        return self.writer.metadata

    @property
    def last_entry(self) -> int:
        return self.writer.lac

    def add_async(self, data: bytes) -> asyncio.Future[int]:
        """Queue an add; the future completes (in entry order) with the entry id."""
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        entry = self.writer.next_entry
        self._driver.add_futures[entry] = fut
        assigned = self.writer.add(data)
        assert assigned == entry
        self._driver.pump()
        if self._ticker is None and self.writer.pending:
            self._ticker = asyncio.get_running_loop().call_later(TICK, self._tick)
        return fut

    async def add(self, data: bytes) -> int:
        return await self.add_async(data)

    async def add_many(self, items: Sequence[bytes]) -> list[int]:
        return list(await asyncio.gather(*(self.add_async(d) for d in items)))

    async def close(self) -> None:
        """Wait for adds in flight, then close by CAS (fails if someone else closed it
        at another entry)."""
        pending = [f for f in self._driver.add_futures.values() if not f.done()]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        done: asyncio.Future[CloseCompleted] = asyncio.get_running_loop().create_future()
        self._driver.on_close = done
        self.writer.close()
        self._driver.pump()
        result = await done
        if not result.ok:
            if self.writer.state.value == "FENCED":
                raise FencedError(result.message)
            raise BKError(result.message)
        self.metadata = self.writer.metadata
