"""The bookie server: asyncio TCP on 127.0.0.1, the core decides, storage persists.

Per request: the core returns journal records and a reply; the records are
applied and journaled, and the reply is sent only after the journal's fsync
(callbacks from the journal thread come back through ``call_soon_threadsafe``).
A malformed frame gets an error response; one whose length cannot be trusted
also closes the connection. Nothing a peer sends can stop the server.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import shutil
import threading
import time
from pathlib import Path

from bkref.impl.bookie.config import BookieConfig
from bkref.impl.bookie.cookie import verify_or_create
from bkref.impl.bookie.registration import Registration
from bkref.impl.clock import SYSTEM_CLOCK, Clock
from bkref.impl.core.bookie import BookieCore, BookieDecision
from bkref.impl.core.frames import (
    AddRequest,
    ErrorResponse,
    FrameDecoder,
    FrameError,
    Message,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    Response,
    Status,
    encode,
)
from bkref.impl.meta.store import NoSuchLedgerError, ZkMetadataStore, connect
from bkref.impl.meta.underreplication import UnderreplicationManager
from bkref.impl.metrics import BookieMetrics
from bkref.impl.storage.bookie_storage import BookieStorage
from bkref.impl.trace import Tracer

log = logging.getLogger(__name__)


class Bookie:
    def __init__(
        self,
        config: BookieConfig,
        *,
        plants: frozenset[str] = frozenset(),
        clock: Clock = SYSTEM_CLOCK,
        tracer: Tracer | None = None,
        metrics: BookieMetrics | None = None,
    ) -> None:
        self.config = config
        # Latencies for /metrics (off: None); a request's arrival, by its object's id.
        self.metrics = metrics
        self._arrived: dict[int, float] = {}
        self.tracer = tracer  # protocol steps, for trace validation (off: None)
        self._decided: dict[int, int] = {}  # traced request (its id) -> when the core decided
        self._looked_up: dict[int, Response] = {}  # fencing read (its id) -> its answer
        self.plants = plants  # planted bugs (test-only) of its storage and AutoRecovery
        # When compaction is due and when a redundant ledger has waited long enough.
        self.clock = clock
        self.bookie_id = config.bookie_id
        self.storage: BookieStorage | None = None
        self.core = BookieCore()
        self.store: ZkMetadataStore | None = None
        self.registration: Registration | None = None
        self._server: asyncio.Server | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self.frame_errors = 0
        # Journal callbacks arrive on the journal thread; one loop wake-up per batch.
        self._durable: collections.deque[
            tuple[Message, BookieDecision, _Out, BaseException | None]
        ] = collections.deque()
        self._wakeup_pending = False
        self._wakeup_lock = threading.Lock()
        self._to_persist: list[tuple[Message, BookieDecision, _Out]] = []
        self._redundant_since: dict[int, float] = {}  # over-replicated ledger -> first seen

    # ------------------------------------------------------------ lifecycle

    def open_storage_and_register(self) -> None:
        """Check cookies, replay the journal, register. Raises with a clear message."""
        c = self.config
        zk = connect(
            c.zkServers, timeout=c.zkTimeout / 1000 + 5, session_timeout=c.zkTimeout / 1000
        )
        self.store = ZkMetadataStore(zk, c.zkLedgersRootPath)
        self.store.ensure_layout()
        verify_or_create(self.store, self.bookie_id, c.journalDirectory, c.ledgerDirectories)
        self.storage = BookieStorage(
            Path(c.journalDirectory), Path(c.ledgerDirectories[0]), c.storage(), plants=self.plants
        )
        self.core = BookieCore(self.storage.ledger_infos())
        if self.metrics is not None:
            self.storage.journal.on_commit = self.metrics.journal_commit
        self.registration = Registration(self.store, self.bookie_id, c.rack, self.tracer)

    async def serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.check_disk()
        assert self.registration is not None
        # Registered before it listens, as BookKeeper's bookie is (``BookieImpl.start``
        # registers, then ``BookieServer.start`` starts the Netty server; apache/bookkeeper
        # 9590a97f): a restarted bookie serves no request while the auditor and the workers
        # still take it for lost, which the spec's restart (registered and serving at
        # once) assumes. Until then a client's connect is refused, as for a bookie down.
        await asyncio.to_thread(self.registration.register, self.core.read_only)
        self._server = await asyncio.start_server(
            self._connection, "127.0.0.1", self.config.bookiePort
        )
        for name, fn in (("sync", self._sync_loop), ("gc", self._gc_loop)):
            t = threading.Thread(target=fn, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        asyncio.get_running_loop().create_task(self._disk_loop())
        log.info("bookie %s serving (rack %s)", self.bookie_id, self.config.rack)
        print(f"bookie {self.bookie_id} serving", flush=True)
        async with self._server:
            await self._server.serve_forever()

    def close(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.close()
        for t in self._threads:
            t.join(timeout=10)
        if self.storage is not None:
            j = self.storage.journal
            log.info(
                "journal: %d records in %d group commits (%.1f per commit), %.1f ms "
                "queued + committed per record on average",
                j.records,
                j.batches,
                j.records / max(j.batches, 1),
                1000 * j.wait_seconds / max(j.records, 1),
            )
            self.storage.close()
        if self.store is not None:
            self.store.zk.stop()
            self.store.zk.close()

    # ------------------------------------------------------------ background work

    def _now(self) -> float:
        """Seconds on the server's clock (the GC wait itself is a real-time poll)."""
        return self.clock.monotonic_ms() / 1000

    def _sync_loop(self) -> None:
        """The sync thread: checkpoint every flushInterval."""
        while not self._stop.wait(self.config.flushInterval / 1000):
            try:
                assert self.storage is not None
                self.storage.checkpoint()
            except Exception:
                log.exception("checkpoint failed; will retry")

    def _gc_loop(self) -> None:
        c = self.config
        last_minor = last_major = self._now()
        while not self._stop.wait(c.gcWaitTime / 1000):
            now = self._now()
            threshold = 0.0
            if (
                c.majorCompactionThreshold > 0
                and c.majorCompactionInterval > 0
                and (now - last_major >= c.majorCompactionInterval)
            ):
                threshold, last_major, last_minor = c.majorCompactionThreshold, now, now
            elif (
                c.minorCompactionThreshold > 0
                and c.minorCompactionInterval > 0
                and (now - last_minor >= c.minorCompactionInterval)
            ):
                threshold, last_minor = c.minorCompactionThreshold, now
            try:
                self.garbage_collect(threshold)
            except Exception:
                log.exception("garbage collection failed; will retry")

    def garbage_collect(self, threshold: float) -> None:
        assert self.storage is not None
        assert self.store is not None
        candidates = self.storage.ledger_ids()  # before the listing: see garbage_collect
        live = set(self.store.list_ledgers())
        urm = UnderreplicationManager(self.store.zk, self.config.zkLedgersRootPath)
        locked = self._overreplicated(urm, candidates & live)
        try:
            r = self.storage.garbage_collect(live - set(locked), candidates, threshold)
        finally:
            for lid in locked:
                urm.unlock(lid)
        if r.deleted_ledgers and self._loop is not None:
            # The core (on the event loop's thread) forgets them too.
            gone = list(r.deleted_ledgers)
            self._loop.call_soon_threadsafe(
                lambda: [self.core.ledgers.pop(lid, None) for lid in gone]
            )
        if r.deleted_ledgers or r.deleted_logs or r.compacted_logs:
            log.info(
                "gc: deleted ledgers %s, removed entry logs %s, compacted %s "
                "(threshold %.2f), %d bytes reclaimed",
                r.deleted_ledgers,
                r.deleted_logs,
                r.compacted_logs,
                threshold,
                r.bytes_reclaimed,
            )

    def _overreplicated(self, urm: UnderreplicationManager, ledgers: set[int]) -> list[int]:
        """Closed ledgers stored here that no segment names (left behind when this bookie
        was repaired away while down): published as REDUNDANT, and after
        ``gcOverreplicatedLedgerWaitTime`` returned, locked, for deletion. The ledger's
        under-replication lock keeps a repair that is copying here right now (before its
        metadata CAS) from losing its copy, and the metadata is read again under it."""
        assert self.store is not None
        now = self._now()
        redundant: set[int] = set()
        for lid in ledgers:
            try:
                md, _ = self.store.read_ledger(lid)
            except NoSuchLedgerError:
                continue
            if md.is_closed and self.bookie_id not in md.bookies():
                redundant.add(lid)
        self._redundant_since = {lid: self._redundant_since.get(lid, now) for lid in redundant}
        urm.set_redundant(self.bookie_id, sorted(redundant))
        wait = self.config.gcOverreplicatedLedgerWaitTime / 1000
        locked: list[int] = []
        for lid, since in sorted(self._redundant_since.items()):
            if now - since < wait or not urm.try_lock(lid, f"gc-{self.bookie_id}"):
                continue
            try:
                md, _ = self.store.read_ledger(lid)
                still = md.is_closed and self.bookie_id not in md.bookies()
            except NoSuchLedgerError:
                still = True
            if still:
                locked.append(lid)
                del self._redundant_since[lid]
            else:
                urm.unlock(lid)
        if locked:
            log.info("gc: deleting over-replicated ledgers %s (no segment names us)", locked)
            urm.set_redundant(self.bookie_id, sorted(self._redundant_since))
        return locked

    def disk_usage(self) -> float:
        u = shutil.disk_usage(self.config.ledgerDirectories[0])
        return u.used / u.total

    def check_disk(self) -> bool:
        """Switch read-only above diskUsageThreshold, back below diskUsageLwmThreshold."""
        c = self.config
        usage = self.disk_usage()
        want = self.core.read_only
        if usage > c.diskUsageThreshold and c.readOnlyModeEnabled:
            want = True
        elif usage < c.diskUsageLwmThreshold:
            want = False
        if want != self.core.read_only:
            log.warning(
                "disk usage %.3f (threshold %.3f, low-water %.3f): going %s",
                usage,
                c.diskUsageThreshold,
                c.diskUsageLwmThreshold,
                "read-only" if want else "writable",
            )
            self.core.read_only = want
            return True
        return False

    async def _disk_loop(self) -> None:
        while not self._stop.is_set():
            await asyncio.sleep(self.config.diskCheckInterval / 1000)
            if self.check_disk() and self.registration is not None:
                await asyncio.to_thread(self.registration.register, self.core.read_only)

    def reload(self, config: BookieConfig) -> None:
        """SIGHUP: take the disk thresholds from a re-read config (others need a restart)."""
        from dataclasses import replace

        self.config = replace(
            self.config,
            diskUsageThreshold=config.diskUsageThreshold,
            diskUsageLwmThreshold=config.diskUsageLwmThreshold,
            diskCheckInterval=config.diskCheckInterval,
        )
        log.info(
            "reloaded disk thresholds: %.3f / %.3f",
            config.diskUsageThreshold,
            config.diskUsageLwmThreshold,
        )

    # ------------------------------------------------------------ connections

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        out = _Out(writer)
        peer = out.peer
        dec = FrameDecoder(self.config.nettyMaxFrameSizeBytes + 1024)
        try:
            while True:
                data = await reader.read(256 * 1024)
                if not data:
                    break
                for item in dec.feed(data):
                    if isinstance(item, FrameError):
                        self.frame_errors += 1
                        log.warning(
                            "bad frame from %s: %s%s",
                            peer,
                            item.reason,
                            " (closing the connection)" if item.fatal else "",
                        )
                        out.send(self.core.on_frame_error(item))
                        if item.fatal:
                            out.flush()
                            await writer.drain()
                            return
                    else:  # the core answers a response frame BAD_REQUEST
                        self._dispatch(item, out)
                if writer.transport.get_write_buffer_size() > 4 * 1024 * 1024:
                    await writer.drain()
            # The peer finished sending: answer what it already asked, then close.
            await out.drained(timeout=10.0)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception:
            log.exception("connection from %s failed; closing it", peer)
        finally:
            writer.close()

    def _dispatch(self, req: Message, out: _Out) -> None:
        if self.metrics is not None and isinstance(req, AddRequest | ReadRequest):
            self._arrived[id(req)] = time.perf_counter()
        if self.tracer is not None:
            # When the core decided: a fence takes effect here, its reply waits for the
            # journal, and adds refused meanwhile are answered (and logged) before it.
            self._decided[id(req)] = time.monotonic_ns()
        d = self.core.handle(req)
        if d.read is not None and self._to_persist:
            # The core has accepted adds this turn that storage has not applied yet.
            # A read must see every add accepted before it (as BookKeeper's ledger
            # storage takes an entry before the journal does): a fencing read that
            # missed one answered "no such entry", and with Wq = Aq that negative let
            # a recovery close the ledger before an entry its writer then saw
            # acknowledged. So apply (and hand to the journal) what is pending now.
            self._persist_batch()
        if not d.records:
            self._reply(req, d, out, None)
            return
        if d.read is not None:
            # A fencing read whose fence goes to the journal looks its entry up now, and
            # its answer waits for the fence: as BookKeeper's ReadEntryProcessor reads the
            # entry right after fenceLedger, before the fence is durable. Looked up at the
            # answer instead, it returned an entry added after it was decided (a soak run's
            # trace check: "b1 lacks e42; the bookie answered found").
            self._looked_up[id(req)] = self._read_now(d.read)
        # Requests decoded in one event-loop turn are journaled as one append.
        if not self._to_persist:
            asyncio.get_running_loop().call_soon(self._persist_batch)
        self._to_persist.append((req, d, out))
        out.inflight += 1

    def _persist_batch(self) -> None:
        batch, self._to_persist = self._to_persist, []
        if not batch:  # already persisted early, for a read (see _dispatch)
            return
        assert self.storage is not None
        records = tuple(r for _, d, _ in batch for r in d.records)

        def durable(err: BaseException | None) -> None:
            with self._wakeup_lock:
                self._durable.extend((req, d, out, err) for req, d, out in batch)
                if self._wakeup_pending:
                    return
                self._wakeup_pending = True
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._drain_durable)

        try:
            self.storage.persist(records, durable)
        except OSError as e:
            for req, d, out in batch:
                out.inflight -= 1
                self._reply(req, d, out, e)

    def _drain_durable(self) -> None:
        with self._wakeup_lock:
            batch, self._durable = self._durable, collections.deque()
            self._wakeup_pending = False
        for req, d, out, err in batch:
            out.inflight -= 1
            if err is None:
                self.core.on_durable(d.records)
            self._reply(req, d, out, err)

    def _reply(self, req: Message, d: BookieDecision, out: _Out, err: BaseException | None) -> None:
        arrived = self._arrived.pop(id(req), None) if self.metrics is not None else None
        looked_up = self._looked_up.pop(id(req), None)
        if out.writer.is_closing() and self.tracer is None:
            return
        resp: Response | None
        if err is not None:
            rid = (
                d.read.request_id
                if d.read is not None
                else (d.reply.request_id if d.reply is not None else 0)
            )
            resp = ErrorResponse(rid, Status.IO_ERROR, f"journal write failed: {err}")
        elif d.read is not None:
            resp = looked_up or self._read_now(d.read)
        else:
            resp = d.reply
        if resp is not None and arrived is not None and self.metrics is not None:
            kind = "add" if isinstance(req, AddRequest) else "read"
            self.metrics.request(kind, time.perf_counter() - arrived, resp.status is Status.OK)
        if resp is not None:
            if self.tracer is not None:
                # Logged even if the client is gone: the step happened, its answer is lost.
                self._trace(req, resp, out)
            if not out.writer.is_closing():
                out.send(resp)

    def _read_now(self, read: ReadRequest) -> Response:
        assert self.storage is not None
        try:
            body = self.storage.read_entry(read.ledger_id, read.entry_id)
        except OSError as e:
            return ErrorResponse(read.request_id, Status.IO_ERROR, f"read failed: {e}")
        return self.core.read_result(read, body)

    def _trace(self, req: Message, resp: Response, out: _Out) -> None:
        """The spec step this reply ends: the bookie's step is its answer, sent once
        what it stored is durable. Adds of every client, and fencing reads; a read
        without a fence is no spec step of the bookie's (the recovery client that
        sent one logs it; plain reads are outside the spec)."""
        assert self.tracer is not None
        link = {
            "rid": resp.request_id,
            "peer": out.peer,
            "status": resp.status.name,
            "decided": self._decided.pop(id(req), None),
        }
        if isinstance(req, AddRequest):
            self.tracer.step(
                "bookie_handles_add",
                bookie=self.bookie_id,
                ledger=req.ledger_id,
                entry=req.entry_id,
                recovery=req.recovery,
                **link,
            )
        elif isinstance(req, ReadLacRequest) and req.fence:
            lac = resp.lac if isinstance(resp, ReadLacResponse) else None
            self.tracer.step(
                "bookie_handles_fencing_lac_read",
                bookie=self.bookie_id,
                ledger=req.ledger_id,
                lac=lac,
                **link,
            )
        elif isinstance(req, ReadRequest) and req.fence:
            self.tracer.step(
                "bookie_handles_recovery_read",
                bookie=self.bookie_id,
                ledger=req.ledger_id,
                entry=req.entry_id,
                found=resp.status is Status.OK,
                **link,
            )


class _Out:
    """A connection's outgoing frames, written once per event-loop turn."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        # The client's end, "ip:port": with a request id it names one request (traces).
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self._buf: list[bytes] = []
        self.inflight = 0  # requests waiting for the journal

    async def drained(self, timeout: float) -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        while self.inflight and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.005)
        self.flush()
        await self.writer.drain()

    def send(self, resp: Response) -> None:
        if not self._buf:
            asyncio.get_running_loop().call_soon(self.flush)
        self._buf.append(encode(resp))

    def flush(self) -> None:
        data, self._buf = b"".join(self._buf), []
        if data and not self.writer.is_closing():
            self.writer.write(data)
