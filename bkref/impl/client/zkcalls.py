"""The client's calls to ZooKeeper: ledger metadata reads, creates, CASes and deletes.

kazoo is synchronous, so each call runs on a worker thread, bounded in time: kazoo
queues a call made while it reconnects and never times it out, so with ZooKeeper
down for good a caller would wait forever. A call first waits (up to
``call_timeout``, on the injected clock) for a connection, then (up to the same, an
I/O timeout on the event loop) for the answer.

kazoo's errors end here: ZooKeeper unreachable, or refusing a call, becomes a
:class:`ZooKeeperError` that names what was being done, says whether it may have
happened and what to do, and keeps kazoo's error as ``__cause__``. The metadata
store's own answers (no such ledger, a lost CAS) pass through: the driver turns
them into events of the core's state machines.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from kazoo.exceptions import (
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    OperationTimeoutError,
    SessionExpiredError,
)
from kazoo.protocol.states import ZnodeStat

from bkref.impl.client.errors import CreateOutcomeUnknownError, ZooKeeperError
from bkref.impl.clock import SYSTEM_CLOCK, Clock
from bkref.impl.core.metadata import LedgerMetadata
from bkref.impl.meta import layout as paths
from bkref.impl.meta.store import MetadataUnavailableError, ZkMetadataStore, connect

__all__ = ["ZkCalls"]

T = TypeVar("T")

# ZooKeeper could not be asked (as opposed to answering, e.g. "no such node").
ZK_UNAVAILABLE = (ConnectionLoss, ConnectionClosedError, OperationTimeoutError, SessionExpiredError)

CONNECTED_POLL = 0.05  # seconds between looks at kazoo's connection state


class ZkCalls:
    """One client's ZooKeeper session and the metadata calls it makes."""

    def __init__(
        self,
        hosts: str,
        root: str = "/ledgers",
        *,
        connect_timeout: float = 15.0,
        session_timeout: float = 10.0,
        call_timeout: float = 30.0,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.hosts = hosts
        self.root = root
        self.connect_timeout = connect_timeout
        self.session_timeout = session_timeout  # ZooKeeper session (zkTimeout)
        # How long a call waits for a connection to ZooKeeper, then for its answer.
        self.call_timeout = call_timeout
        self.clock = clock
        self._store: ZkMetadataStore | None = None

    async def start(self) -> None:
        try:
            zk = await asyncio.to_thread(
                connect, self.hosts, self.connect_timeout, self.session_timeout
            )
        except Exception as e:  # kazoo's start timeout is no KazooException
            raise ZooKeeperError(
                f"cannot connect to ZooKeeper at {self.hosts}: {e or type(e).__name__}; "
                "is it running (`bkref cluster status`)?"
            ) from e
        self._store = ZkMetadataStore(zk, self.root, clock=self.clock)

    async def stop(self) -> None:
        if self._store is not None:
            zk = self._store.zk
            self._store = None
            await asyncio.to_thread(zk.stop)
            await asyncio.to_thread(zk.close)

    @property
    def started(self) -> bool:
        return self._store is not None

    @property
    def store(self) -> ZkMetadataStore:
        if self._store is None:
            raise RuntimeError("BookKeeper client not started: call `await bk.start()`")
        return self._store

    # ------------------------------------------------------------ the calls

    async def writable_bookies(self) -> dict[str, str]:
        return await self.call("list writable bookies", self.store.writable_bookies)

    async def read_ledger(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        return await self.call(
            f"read ledger {ledger_id}'s metadata", self.store.read_ledger, ledger_id
        )

    async def create_ledger(self, metadata: LedgerMetadata) -> tuple[int, int]:
        """A new ledger id, then its metadata (version 0). A metadata write that was sent
        and not answered raises :class:`CreateOutcomeUnknownError` with the id: the ledger
        may exist, and the caller's trace must say which ledger it may have made."""
        while True:
            lid = await self.call("allocate a ledger id", self.store.new_ledger_id)
            what = f"create ledger {lid}'s metadata"
            try:
                created = await self.call(
                    what, self.store.create_ledger_at, lid, metadata, writes=True
                )
            except NotSentError:
                raise
            except ZooKeeperError as e:
                raise CreateOutcomeUnknownError(str(e), lid) from e
            if created:
                return lid, 0

    async def cas_ledger(
        self, ledger_id: int, metadata: LedgerMetadata, version: int, reason: str
    ) -> tuple[int, bool]:
        """CAS ``ledger_id``'s metadata from ``version``: the new version, and whether it
        was read back after a lost connection (``ZkMetadataStore.cas_ledger_resolved``);
        the store's MetadataConflictError and NoSuchLedgerError pass through."""
        return await self.call(
            f"{reason} of ledger {ledger_id}",
            self.store.cas_ledger_resolved,
            ledger_id,
            metadata,
            version,
            writes=True,
        )

    async def delete_ledger(self, ledger_id: int) -> None:
        await self.call(
            f"delete ledger {ledger_id}", self.store.delete_ledger, ledger_id, writes=True
        )

    async def list_ledgers(self) -> list[int]:
        return await self.call("list ledgers", self.store.list_ledgers)

    async def watch_ledger(
        self, ledger_id: int, on_change: Callable[[LedgerMetadata, int], None]
    ) -> None:
        """Call ``on_change(metadata, version)`` on the running event loop with the ledger's
        metadata now and after every change, until the ledger is closed or deleted (a
        read handle's metadata listener, as BookKeeper's ``ReadOnlyLedgerHandle``)."""
        loop = asyncio.get_running_loop()
        store = self.store

        def changed(data: bytes | None, stat: ZnodeStat | None) -> bool | None:
            if data is None or stat is None:
                return False  # deleted: nothing more to watch
            try:
                md = LedgerMetadata.deserialize(data)
                loop.call_soon_threadsafe(on_change, md, int(stat.version))
            except (ValueError, RuntimeError):  # undecodable, or the loop is gone
                return False
            return False if md.is_closed else None

        await self.call(
            f"watch ledger {ledger_id}'s metadata",
            store.zk.DataWatch,
            paths.ledger_path(self.root, ledger_id),
            changed,
        )

    async def call(self, what: str, fn: Callable[..., T], *args: object, writes: bool = False) -> T:
        """``fn(*args)`` on a worker thread. ZooKeeper unreachable (no connection,
        connection loss, session expiry, no answer in time) or refusing the call becomes
        a :class:`ZooKeeperError` that names ``what`` failed and, for ``writes``, that
        its outcome is unknown."""
        then = (
            "it may or may not have happened: read the metadata before retrying"
            if writes
            else "retry once ZooKeeper answers"
        )
        wait = self.call_timeout
        if not await self.connected(wait):
            raise NotSentError(
                f"{what}: no connection to ZooKeeper at {self.hosts} for {wait:g} s; "
                "nothing was sent; retry once ZooKeeper answers"
            )
        try:
            return await asyncio.wait_for(asyncio.to_thread(fn, *args), wait)
        except TimeoutError as e:
            raise ZooKeeperError(
                f"{what}: ZooKeeper at {self.hosts} did not answer in {wait:g} s; {then}"
            ) from e
        except ZK_UNAVAILABLE as e:
            raise ZooKeeperError(
                f"{what}: ZooKeeper at {self.hosts} failed ({_detail(e)}); {then}"
            ) from e
        except MetadataUnavailableError as e:  # the store's CAS gave up on a lost connection
            raise ZooKeeperError(f"{what}: {e}") from e
        except KazooException as e:
            refused = (
                then
                if writes
                else f"check that a cluster is set up under {self.root} (`bkref cluster status`)"
            )
            raise ZooKeeperError(
                f"{what}: ZooKeeper at {self.hosts} refused it ({_detail(e)}); {refused}"
            ) from e

    async def connected(self, wait: float) -> bool:
        """Whether kazoo is connected, waiting up to ``wait`` seconds of the clock for it."""
        zk = self.store.zk
        deadline = self.clock.monotonic_ms() + round(wait * 1000)
        while not zk.connected:
            if self.clock.monotonic_ms() >= deadline:
                return False
            await asyncio.sleep(CONNECTED_POLL)
        return True


class NotSentError(ZooKeeperError):
    """No connection to ZooKeeper: the call was not sent, so it did not happen."""


def _detail(e: BaseException) -> str:
    return f"{type(e).__name__}{f': {e}' if str(e) else ''}"
