"""Ledger handles: what an application reads and writes a ledger through.

A :class:`ReadHandle` reads entries and the LAC through the readers of
:mod:`bkref.impl.core.reads`; a :class:`WriteHandle` adds and closes through a
:class:`bkref.impl.core.writer.LedgerWriter`, whose actions the
:class:`bkref.impl.client.driver.Driver` performs.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from bkref.impl.client.driver import TICK, Client, Driver, run_entry_reader, run_lac_reader
from bkref.impl.client.errors import BKError, FencedError, NoSuchEntryError
from bkref.impl.core.actions import CloseCompleted
from bkref.impl.core.digest import Digest, master_key
from bkref.impl.core.frames import Status
from bkref.impl.core.metadata import LedgerMetadata
from bkref.impl.core.reads import EntryReader, LacReader
from bkref.impl.core.writer import LedgerWriter, WriterState

__all__ = ["ReadHandle", "ReadStats", "WriteHandle"]

log = logging.getLogger(__name__)


@dataclass
class ReadStats:
    digest_mismatches: list[tuple[str, int]] = field(default_factory=list)  # (bookie, entry)


class ReadHandle:
    def __init__(
        self,
        bk: Client,
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

    def on_metadata(self, metadata: LedgerMetadata, version: int) -> None:
        """A version of the ledger's metadata from the client's watch. A newer one replaces
        the handle's; once it is closed, its last entry is the handle's LAC, lower or
        higher than the one learned from bookies (BookKeeper's ``setLedgerMetadata``)."""
        if version <= self.version:
            return
        self.metadata, self.version = metadata, version
        if metadata.is_closed:
            self.lac = metadata.last_entry

    @property
    def last_entry(self) -> int:
        return self.metadata.last_entry if self.metadata.is_closed else self.lac

    async def read_entry(self, entry_id: int) -> bytes:
        """One entry, from the first replica of its write set whose copy verifies.

        Raises :class:`NoSuchEntryError` only when the replicas that answered "no such
        entry" prove it absent (they cover its write set: Wq - Aq + 1 of them); when
        too few could say (down, timed out, a corrupt copy), a :class:`BKError` with
        status IO_ERROR: absence is then unknown."""
        reader = EntryReader(self.ledger_id, self.current_metadata(), entry_id, self.digest)
        done = await run_entry_reader(self.bk, reader)
        for bookie, why in done.digest_mismatches:
            log.warning("digest mismatch from bookie %s: %s; read another replica", bookie, why)
            self.stats.digest_mismatches.append((bookie, entry_id))
        if done.status is Status.OK:
            return done.data
        if done.status is Status.NO_SUCH_ENTRY:
            raise NoSuchEntryError(done.message)
        raise BKError(done.message, done.status)

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
        done = await run_lac_reader(self.bk, LacReader(self.ledger_id, self.current_metadata()))
        if not done.ok:
            raise BKError(done.message)
        self.lac = max(self.lac, done.lac)
        return done.lac


_ADDING = (WriterState.OPEN, WriterState.CHANGING_ENSEMBLE)


class WriteHandle(ReadHandle):
    def __init__(
        self,
        bk: Client,
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
        self._driver = Driver(bk, ledger_id, master_key(password), self.writer)
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
        lac, state = self.writer.lac, self.writer.state
        assigned = self.writer.add(data)
        assert assigned == entry
        self._driver.pump()
        if self._driver.tracer is not None and state in _ADDING:
            # Queued during an ensemble change, it goes out when the change lands.
            self._driver._step("writer_sends_add", entry=entry, lac=lac)
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
            if self.writer.state is WriterState.FENCED:
                raise FencedError(result.message)
            raise BKError(result.message)
        self.metadata = self.writer.metadata
