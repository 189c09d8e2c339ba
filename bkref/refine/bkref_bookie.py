"""One bookie of the refinement driver (:mod:`bkref.refine.bkref_driver`): bkref's
``BookieCore`` over ``BookieStorage`` on real files, started (the cookie check, then the
journal's replay), crashed, wiped and restarted as the bookie process would be. The
driver hands it the requests its cores send; :meth:`Bookie.serve` answers each as the
bookie server does.
"""

from __future__ import annotations

import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path

from bkref.impl.bookie.cookie import CookieMismatchError, verify_or_create
from bkref.impl.core.bookie import BookieCore, JournalRecord
from bkref.impl.core.digest import peek_header
from bkref.impl.core.frames import Request, Response
from bkref.impl.meta.store import ZkMetadataStore
from bkref.impl.storage.bookie_storage import BookieStorage, StorageConfig
from bkref.impl.storage.crashdisk import CrashDisk
from bkref.refine.driver import ImplementationError
from bkref.spec import protocol as sp

# Group commit off: each add is journaled and fsynced on its own, at once.
STORAGE = StorageConfig(journal_max_group_wait_ms=0.0, journal_flush_when_queue_empty=True)
PERSIST_TIMEOUT = 30.0


@dataclass
class Bookie:
    """One bookie: its real storage and core while up, its directory always.

    Its files go through a ``CrashDisk``: real files and real fsyncs, plus a record
    of what was fsynced, so that a crash loses exactly what a power loss would.
    """

    name: str
    directory: Path
    plants: frozenset[str] = frozenset()
    disk: CrashDisk = field(default_factory=CrashDisk)
    up: int = sp.UP
    storage: BookieStorage | None = None
    core: BookieCore | None = None
    # What survived the last crash, read back from disk: ledger -> (entries, fenced, LAC).
    on_disk: dict[int, tuple[frozenset[int], bool, int]] = field(default_factory=dict)
    # And each surviving entry's signed LAC (the spec's b_signed): (ledger, entry) -> LAC.
    signed_on_disk: dict[tuple[int, int], int] = field(default_factory=dict)

    def _storage(self) -> BookieStorage:
        return BookieStorage(
            self.directory / "journal",
            self.directory / "ledgers",
            STORAGE,
            disk=self.disk,
            plants=self.plants,
        )

    def open(self, store: ZkMetadataStore) -> bool:
        """Start as the bookie process does: the cookie check, then storage replay.
        False when the cookie check refuses (a wiped disk): the bookie stays out."""
        dirs = self.directory / "journal", self.directory / "ledgers"
        try:
            verify_or_create(store, self.name, str(dirs[0]), [str(dirs[1])])
        except CookieMismatchError:
            self.up, self.on_disk, self.signed_on_disk = sp.REFUSED, {}, {}
            return False
        self.storage = self._storage()
        self.core = BookieCore(self.storage.ledger_infos())
        self.up = sp.UP
        return True

    def wipe(self) -> None:
        """The disk is replaced by an empty one (the bookie is down)."""
        assert self.storage is None
        shutil.rmtree(self.directory)
        self.disk, self.on_disk, self.signed_on_disk = CrashDisk(), {}, {}

    def persist(self, records: tuple[JournalRecord, ...]) -> None:
        """Journal ``records`` and wait until they are durable (the reply waits for it)."""
        if not records:
            return
        assert self.storage is not None
        done = threading.Event()
        errors: list[BaseException] = []

        def durable(err: BaseException | None) -> None:
            if err is not None:
                errors.append(err)
            done.set()

        self.storage.persist(records, durable)
        if not done.wait(PERSIST_TIMEOUT):
            raise ImplementationError(f"bookie {self.name}: journal did not sync in time")
        if errors:
            raise ImplementationError(f"bookie {self.name}: journal write failed: {errors[0]}")
        assert self.core is not None
        self.core.on_durable(records)

    def serve(self, request: Request) -> Response:
        """Answer ``request`` as the bookie server does: decide, make the decision's
        records durable, look the entry up if it is a read, reply."""
        if self.core is None or self.storage is None:
            raise ImplementationError(f"bookie {self.name} is down: it cannot serve {request}")
        d = self.core.handle(request)
        self.persist(d.records)
        if d.read is not None:
            return self.core.read_result(
                d.read, self.storage.read_entry(d.read.ledger_id, d.read.entry_id)
            )
        assert d.reply is not None
        return d.reply

    def crash(self) -> None:
        """Lose power: nothing is checkpointed and what was not fsynced is gone; then
        read back what the disk kept, for the abstraction while the bookie is down."""
        assert self.storage is not None
        self.storage.abandon()
        self.disk.crash()
        self.storage, self.core = None, None
        survivor = self._storage()
        try:
            self.on_disk = {
                lid: (frozenset(ix.entries), ix.fenced, ix.lac)
                for lid, ix in survivor.index.ledgers.items()
            }
            self.signed_on_disk = {
                (lid, e): signed_lac(survivor, lid, e)
                for lid, ix in survivor.index.ledgers.items()
                for e in ix.entries
            }
        finally:
            survivor.close()
        self.up = sp.DOWN


def signed_lac(storage: BookieStorage, ledger_id: int, entry_id: int) -> int:
    """The LAC a stored entry is signed with (its header's), as the spec's ``b_signed``."""
    body = storage.read_entry(ledger_id, entry_id)
    if body is None:
        raise ImplementationError(f"ledger {ledger_id} entry {entry_id} is indexed but unreadable")
    return peek_header(body).lac
