"""The BookKeeper client: create, open (with or without recovery), add, read, close, delete.

:class:`BookKeeper` holds what a client shares between its ledgers: the connections
to bookies, the ZooKeeper session (:mod:`.zkcalls`), placement's random source and
the clock. The ledger handles and the driver of the core's machines are in
:mod:`.driver`, the errors in :mod:`.errors`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from bkref.impl.client.connection import BookieConnection
from bkref.impl.client.driver import recover
from bkref.impl.client.errors import BKError, CreateOutcomeUnknownError, WrongPasswordError
from bkref.impl.client.handles import ReadHandle, WriteHandle
from bkref.impl.client.zkcalls import ZkCalls
from bkref.impl.clock import SYSTEM_CLOCK, Clock
from bkref.impl.core.digest import DigestType, password_hash
from bkref.impl.core.frames import Request, Response
from bkref.impl.core.metadata import LedgerMetadata, Segment
from bkref.impl.core.placement import NotEnoughBookiesError, choose_ensemble
from bkref.impl.core.planted import validate as validate_plants
from bkref.impl.meta.store import ZkMetadataStore
from bkref.impl.trace import Tracer


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
        clock: Clock = SYSTEM_CLOCK,
        plants: frozenset[str] = frozenset(),
        tracer: Tracer | None = None,
    ) -> None:
        self.zk_hosts = zk_hosts
        # Protocol steps of its writers and recoveries, for trace validation (off: None).
        self.tracer = tracer
        self.plants = validate_plants(plants)  # planted bugs (test-only) of its writers, recoveries
        self.root = root
        self.timeout = timeout  # a bookie request's (the connection's I/O timeout)
        self.add_entry_timeout = add_entry_timeout  # BookKeeper's addEntryTimeoutSec
        self.clock = clock
        self.rng = random.Random(seed)
        self.closed = False  # close() began: a request failing from now on failed by it
        self._conns: dict[str, BookieConnection] = {}
        self.zk_calls = ZkCalls(
            zk_hosts,
            root,
            connect_timeout=connect_timeout,
            session_timeout=session_timeout,
            call_timeout=zk_call_timeout,
            clock=clock,
        )

    async def start(self) -> BookKeeper:
        await self.zk_calls.start()
        return self

    async def __aenter__(self) -> BookKeeper:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        self.closed = True
        for c in self._conns.values():
            await c.close()
        self._conns.clear()
        await self.zk_calls.stop()

    @property
    def meta(self) -> ZkMetadataStore:
        """The metadata store, for callers that use ZooKeeper directly (AutoRecovery)."""
        return self.zk_calls.store

    def conn(self, bookie: str) -> BookieConnection:
        c = self._conns.get(bookie)
        if c is None:
            c = self._conns[bookie] = BookieConnection(bookie, self.timeout, tracer=self.tracer)
        return c

    async def request(self, bookie: str, make: Callable[[int], Request]) -> Response:
        return await self.conn(bookie).request(make)

    # ------------------------------------------------------------ ledgers

    async def create_ledger(
        self,
        ensemble: int = 3,
        write_quorum: int = 2,
        ack_quorum: int = 2,
        password: bytes = b"",
        digest: DigestType = DigestType.CRC32C,
        *,
        bookies: Sequence[str] | None = None,
    ) -> WriteHandle:
        """A new ledger on ``ensemble`` bookies chosen by the placement policy, or on
        ``bookies`` when given (a fixed placement, for tests and tools: each must be a
        writable bookie, and there must be ``ensemble`` of them, all distinct)."""
        candidates = await self.zk_calls.writable_bookies()
        if bookies is not None:
            chosen = tuple(bookies)
            unknown = [b for b in chosen if b not in candidates]
            if len(set(chosen)) != ensemble or len(chosen) != ensemble or unknown:
                raise BKError(
                    f"cannot place a ledger of ensemble size {ensemble} on {list(chosen)}: "
                    f"need {ensemble} distinct writable bookies"
                    + (f"; not writable: {unknown}" if unknown else "")
                )
        else:
            try:
                chosen = choose_ensemble(candidates, ensemble, rng=self.rng)
            except NotEnoughBookiesError as e:
                raise BKError(str(e)) from e
        md = LedgerMetadata(
            ensemble,
            write_quorum,
            ack_quorum,
            (Segment(0, chosen),),
            digest,
            password_hash(password),
            ctime_ms=self.clock.wall_ms(),
            password=password,
        )
        try:
            lid, version = await self.zk_calls.create_ledger(md)
        except CreateOutcomeUnknownError as e:
            # The ledger may exist (a recovery may close it later); the trace says which,
            # so that the check replays its creation as a step that may have happened.
            self._trace_create(e.ledger_id, chosen, write_quorum, ack_quorum, "unknown")
            raise
        self._trace_create(lid, chosen, write_quorum, ack_quorum)
        return WriteHandle(self, lid, md, version, password)

    def _trace_create(
        self, lid: int, ensemble: tuple[str, ...], wq: int, aq: int, outcome: str | None = None
    ) -> None:
        if self.tracer is not None:
            known = {} if outcome is None else {"outcome": outcome}
            self.tracer.step(
                "writer_creates_ledger",
                ledger=lid,
                ensemble=list(ensemble),
                write_quorum=wq,
                ack_quorum=aq,
                version=0,
                **known,
            )

    async def _read_meta(self, ledger_id: int, password: bytes) -> tuple[LedgerMetadata, int]:
        md, version = await self.zk_calls.read_ledger(ledger_id)
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
            md, version = await recover(self, ledger_id, md, version, password)
        h = ReadHandle(self, ledger_id, md, version, password)
        if md.is_closed:
            h.lac = md.last_entry
        else:
            # The handle follows the metadata from its open on, as BookKeeper's does (its
            # listener is registered before the LAC read), and takes the close when it lands.
            await self.zk_calls.watch_ledger(ledger_id, h.on_metadata)
            h.lac = await h.read_lac()
        return h

    async def delete_ledger(self, ledger_id: int) -> None:
        await self.zk_calls.delete_ledger(ledger_id)

    async def list_ledgers(self) -> list[int]:
        return await self.zk_calls.list_ledgers()
