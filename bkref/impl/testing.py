"""Helpers for tests that run bkref for real; usable by other projects' tests.

- Clusters: :class:`Clusters` makes local clusters (real bookie processes on a real
  ZooKeeper) and stops them all when the test ends; :func:`index_of`,
  :func:`lose_bookie`, :func:`shell` and :func:`logged` act on one or watch it;
  :func:`clients` opens clients of one, :func:`zookeeper_view` a view of its metadata.
- Waiting: :func:`eventually` polls a condition, sync or async, up to a deadline.
- Ledgers: :func:`write_closed_ledgers` and :func:`ledger_on` write them;
  :func:`replicas`, :func:`holds_any`, :func:`assert_fully_replicated` and
  :func:`assert_bookie_holds` read them back from each bookie directly, digest checked.
- Faults: :func:`corrupt_replica` leaves one replica of an entry whose digest fails;
  :func:`repaired_off` and :func:`replica_moved` say when AutoRecovery has dealt with it.

No pytest here (it is not a dependency of the package): failures are
``AssertionError``s, which pytest reports as any other. The ZooKeeper fixtures
are in :mod:`bkref.impl.cluster.pytest_plugin`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType

from bkref.impl.client.client import BookKeeper
from bkref.impl.client.connection import BookieConnection, BookieUnavailableError
from bkref.impl.cluster.local import LocalCluster
from bkref.impl.cluster.process import wait_until
from bkref.impl.core.digest import Digest, DigestMismatchError, DigestType, master_key
from bkref.impl.core.frames import AddRequest, ReadRequest, ReadResponse, Status
from bkref.impl.core.metadata import LedgerMetadata
from bkref.impl.meta.store import ZkMetadataStore, connect
from bkref.impl.meta.underreplication import UnderreplicationManager

Ledgers = dict[int, list[bytes]]
"""Ledger id -> its entries, in order, as written."""

Condition = Callable[[], bool | Awaitable[bool]]

# ------------------------------------------------------------------ clusters


class Clusters:
    """``make(n, autorecovery=False, **bookie_config)``: a local cluster of ``n`` bookies
    in its own directory under ``directory``; every cluster made is stopped on exit.

    With ``zk_connect`` (a connection string, with a chroot so that clusters do not
    see each other's znodes) the bookies register there; without it each cluster
    starts a ZooKeeper of its own::

        with Clusters(tmp_path, zk_connect) as make:
            cluster = make(5, autorecovery=True, zkTimeout=4000)
    """

    def __init__(self, directory: Path, zk_connect: str | None = None) -> None:
        self.directory = directory
        self.zk_connect = zk_connect
        self.made: list[LocalCluster] = []

    def __call__(
        self,
        bookies: int,
        *,
        autorecovery: bool = False,
        trace_dir: Path | None = None,
        metrics: bool = False,
        **overrides: object,
    ) -> LocalCluster:
        cluster = LocalCluster(
            self.directory / f"cluster{len(self.made)}",
            dict(overrides),
            autorecovery=autorecovery,
            trace_dir=trace_dir,
            metrics=metrics,
        )
        self.made.append(cluster)  # before up(): a cluster half started is stopped too
        cluster.up(bookies, zk_connect=self.zk_connect)
        return cluster

    def __enter__(self) -> Clusters:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with contextlib.ExitStack() as stack:  # each one stopped, even if another fails to
            for cluster in self.made:
                stack.callback(cluster.down)


def index_of(cluster: LocalCluster, bookie_id: str) -> int:
    """The index of the cluster's bookie ``bookie_id`` (``host:port``)."""
    return next(b.index for b in cluster.bookies if b.bookie_id == bookie_id)


def lose_bookie(
    cluster: LocalCluster, store: ZkMetadataStore, bookie_id: str, timeout: float = 30.0
) -> None:
    """SIGKILL the bookie, then wait until its registration is gone (its ZooKeeper
    session expired): from then on the auditor sees it lost."""
    cluster.kill_bookie(index_of(cluster, bookie_id))

    def gone() -> bool:
        return bookie_id not in {b.bookie_id for b in store.bookies()}

    assert wait_until(gone, timeout, 0.2), f"{bookie_id} still registered after {timeout} s"


def shell(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    """``bkref shell ARGS --zk <the cluster's ZooKeeper>`` in a new process, output captured."""
    return subprocess.run(
        [sys.executable, "-m", "bkref.impl.cli.main", "shell", *args, "--zk", cluster.zk_hosts],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def logged(cluster: LocalCluster, text: str) -> Callable[[], bool]:
    """A condition: some bookie's log holds ``text`` more often than when this was called."""

    def count() -> int:
        return sum(b.log_path.read_text().count(text) for b in cluster.bookies)

    before = count()
    return lambda: count() > before


@contextlib.asynccontextmanager
async def clients(zk_hosts: str, n: int) -> AsyncIterator[list[BookKeeper]]:
    """``n`` BookKeeper clients of the cluster, each with a ZooKeeper session of its own
    (as separate writer, reader or worker processes have), closed on exit."""
    async with contextlib.AsyncExitStack() as stack:
        yield [await stack.enter_async_context(BookKeeper(zk_hosts)) for _ in range(n)]


@contextlib.contextmanager
def zookeeper_view(zk_hosts: str) -> Iterator[tuple[ZkMetadataStore, UnderreplicationManager]]:
    """A ZooKeeper session of the test's own on the cluster's metadata and AutoRecovery
    state (under ``/ledgers``), closed on exit."""
    zk = connect(zk_hosts)
    try:
        yield ZkMetadataStore(zk), UnderreplicationManager(zk)
    finally:
        zk.stop()
        zk.close()


# ------------------------------------------------------------------ waiting


async def eventually(condition: Condition, timeout: float, interval: float = 0.05) -> bool:
    """Poll ``condition`` until it holds (True) or ``timeout`` seconds pass (False); it is
    tried at least once. A plain function runs on a worker thread, as it may block (a
    ZooKeeper read, a subprocess) while the event loop serves the test's clients; an
    ``async`` one, or one that returns an awaitable, is awaited."""
    deadline = time.monotonic() + timeout
    while True:
        if inspect.iscoroutinefunction(condition):
            held = await condition()
        else:
            got = await asyncio.to_thread(condition)
            held = await got if inspect.isawaitable(got) else got
        if held:
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(interval)


# ------------------------------------------------------------------ ledgers


async def write_closed_ledgers(
    bk: BookKeeper,
    count: int,
    entries: int,
    password: bytes,
    *,
    size: int = 100,
    bookies: Sequence[str] | None = None,
) -> Ledgers:
    """``count`` ledgers (E = 3, Wq = 2, Aq = 2) of ``entries`` entries of about ``size``
    bytes each, written and closed; placed on ``bookies`` when given."""
    out: Ledgers = {}
    for n in range(count):
        h = await bk.create_ledger(3, 2, 2, password, bookies=bookies)
        data = [b"%d:%d:" % (n, i) + b"x" * size for i in range(entries)]
        await h.add_many(data)
        await h.close()
        out[h.ledger_id] = data
    return out


async def ledger_on(
    bk: BookKeeper, must: str, avoid: set[str], entries: int, password: bytes
) -> Ledgers:
    """A closed ledger whose ensemble holds ``must`` and none of ``avoid``: placed, not
    drawn, so that the test does not depend on placement's luck."""
    others = sorted(set(await bk.zk_calls.writable_bookies()) - avoid - {must})
    bk.rng.shuffle(others)  # varied placement, each one valid
    if len(others) < 2:
        raise AssertionError(f"no ensemble of 3 with {must} and without {avoid}: too few bookies")
    return await write_closed_ledgers(bk, 1, entries, password, bookies=[must, *others[:2]])


def read_request(ledger: int, entry: int) -> Callable[[int], ReadRequest]:
    """A plain read of ``entry`` of ``ledger``, for ``BookKeeper.request`` and
    ``BookieConnection.request`` (which supply the request id)."""
    return lambda rid: ReadRequest(rid, ledger, entry)


async def replicas(
    bk: BookKeeper, lid: int, md: LedgerMetadata, entry: int, password: bytes
) -> list[str]:
    """The bookies of ``entry``'s write set that hold a copy whose digest verifies."""
    digest = Digest(md.digest_type, password)
    ensemble = md.ensemble_for(entry)
    holders = []
    for idx in md.quorum.write_set(entry):
        b = ensemble[idx]
        try:
            resp = await bk.request(b, read_request(lid, entry))
        except BookieUnavailableError:
            continue
        if isinstance(resp, ReadResponse) and resp.status is Status.OK:
            try:
                digest.verify(resp.body, lid, entry)
            except DigestMismatchError:
                continue
            holders.append(b)
    return holders


async def holds_any(bk: BookKeeper, bookie: str, lid: int, entries: int) -> bool:
    """``bookie`` answers a read of one of entries 0 .. ``entries`` - 1 of ``lid``."""
    for e in range(entries):
        resp = await bk.request(bookie, read_request(lid, e))
        if resp.status is Status.OK:
            return True
    return False


async def assert_fully_replicated(
    bk: BookKeeper, ledgers: Ledgers, live: set[str], password: bytes
) -> None:
    """Each ledger is closed after its last entry, names only ``live`` bookies, never one
    bookie twice in a segment; every entry has Wq copies that verify, and reads back."""
    for lid, data in ledgers.items():
        md, _ = await asyncio.to_thread(bk.meta.read_ledger, lid)
        assert md.is_closed
        assert md.last_entry == len(data) - 1
        assert md.bookies() <= live, f"ledger {lid} still names {md.bookies() - live}"
        for seg in md.segments:  # one bookie never holds two replicas of a segment
            assert len(set(seg.ensemble)) == len(seg.ensemble), (lid, seg)
        for e in range(len(data)):
            holders = await replicas(bk, lid, md, e, password)
            assert len(set(holders)) == md.write_quorum, (lid, e, holders)
        r = await bk.open_ledger(lid, password, recovery=False)
        assert await r.read(0, len(data) - 1) == data


async def assert_bookie_holds(
    bookie_id: str, ledger: int, payload: list[bytes], password: bytes
) -> None:
    """The bookie itself, asked over a connection of its own (no client, no metadata),
    serves entries 0 .. len(payload) - 1 of ``ledger`` with these bodies, digest checked."""
    conn = BookieConnection(bookie_id)
    digest = Digest(DigestType.CRC32C, password)
    try:
        for e, want in enumerate(payload):
            resp = await conn.request(read_request(ledger, e))
            assert isinstance(resp, ReadResponse)
            assert resp.status is Status.OK, e
            assert digest.verify(resp.body, ledger, e).data == want
    finally:
        await conn.close()


# ------------------------------------------------------------------ faults and repair


async def corrupt_replica(
    bk: BookKeeper, lid: int, entry: int, password: bytes
) -> tuple[LedgerMetadata, str]:
    """Overwrite ``entry`` on the first bookie of its write set with a body whose digest
    fails, as a flipped bit on disk would leave it (a bookie does not check digests).
    Returns the ledger's metadata and that bookie."""
    md, _ = await asyncio.to_thread(bk.meta.read_ledger, lid)
    bookie = md.ensemble_for(entry)[md.quorum.write_set(entry)[0]]
    good = await bk.request(bookie, read_request(lid, entry))
    assert isinstance(good, ReadResponse)
    bad_body = good.body[:-1] + bytes([good.body[-1] ^ 0xFF])
    resp = await bk.request(
        bookie,
        lambda rid: AddRequest(rid, lid, entry, master_key(password), bad_body, recovery=True),
    )
    assert resp.status is Status.OK
    return md, bookie


def repaired_off(
    store: ZkMetadataStore, urm: UnderreplicationManager, bookie: str, ledgers: Iterable[int]
) -> Callable[[], bool]:
    """A condition: repair is done, no task is left and no ledger of ``ledgers`` names
    ``bookie``."""
    ids = list(ledgers)

    def done() -> bool:
        return not urm.tasks() and all(
            bookie not in store.read_ledger(lid)[0].bookies() for lid in ids
        )

    return done


def replica_moved(
    bk: BookKeeper,
    store: ZkMetadataStore,
    urm: UnderreplicationManager,
    *,
    lid: int,
    bookie: str,
    entry: int,
    password: bytes,
) -> Callable[[], Awaitable[bool]]:
    """A condition: the replica of ``entry`` on ``bookie`` moved to a new bookie (as
    BookKeeper's worker moves a replica that misses entries), every replica verifies,
    no task is left."""

    def settled() -> LedgerMetadata | None:
        md = store.read_ledger(lid)[0]
        return None if urm.tasks() or bookie in md.ensemble_for(entry) else md

    async def moved() -> bool:
        md = await asyncio.to_thread(settled)
        if md is None:
            return False
        return len(await replicas(bk, lid, md, entry, password)) == md.write_quorum

    return moved
