"""Storage against a model: whatever was acknowledged survives crashes, restarts and GC.

Rules add entries, fence, checkpoint, roll the journal, crash (journal writes done,
entry-log buffer lost, no checkpoint), restart, and garbage-collect deleted
ledgers with compaction; the model is the dict of acknowledged entries.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from pathlib import Path

from hypothesis import note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from bkref.impl.core.bookie import JournalAdd, JournalFence, JournalMasterKey, JournalRecord
from bkref.impl.core.digest import Digest, DigestType, master_key
from bkref.impl.storage.bookie_storage import BookieStorage, StorageConfig

KEY = master_key(b"pw")
DIGEST = Digest(DigestType.CRC32C, b"pw")
CONFIG = StorageConfig(
    journal_max_size=8 * 1024, entry_log_size_limit=16 * 1024, journal_max_group_wait_ms=0.5
)


def _persist(s: BookieStorage, records: list[JournalRecord]) -> None:
    done = threading.Event()
    s.persist(tuple(records), lambda err: done.set())
    assert done.wait(10)


class StorageMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="bkref-storage-"))
        self.storage = self._open()
        self.entries: dict[tuple[int, int], bytes] = {}
        self.ledgers: set[int] = set()
        self.fenced: set[int] = set()
        self.next_entry: dict[int, int] = {}

    def _open(self) -> BookieStorage:
        return BookieStorage(self.dir / "journal", self.dir / "ledgers", CONFIG)

    @rule(ledger=st.integers(1, 4), size=st.integers(0, 3000))
    def add(self, ledger: int, size: int) -> None:
        records: list[JournalRecord] = []
        if ledger not in self.ledgers:
            records.append(JournalMasterKey(ledger, KEY))
            self.ledgers.add(ledger)
        e = self.next_entry.get(ledger, 0)
        self.next_entry[ledger] = e + 1
        body = DIGEST.sign(ledger, e, e - 1, size, bytes([e % 256]) * size)
        records.append(JournalAdd(ledger, e, body))
        _persist(self.storage, records)
        self.entries[(ledger, e)] = body

    @precondition(lambda self: self.ledgers)
    @rule(data=st.data())
    def fence(self, data: st.DataObject) -> None:
        ledger = data.draw(st.sampled_from(sorted(self.ledgers)))
        _persist(self.storage, [JournalFence(ledger)])
        self.fenced.add(ledger)

    @rule()
    def checkpoint(self) -> None:
        self.storage.checkpoint()

    @rule()
    def crash_and_restart(self) -> None:
        note("crash")
        self.storage.abandon()
        self.storage = self._open()

    @rule()
    def clean_restart(self) -> None:
        self.storage.close()
        self.storage = self._open()

    @precondition(lambda self: self.ledgers)
    @rule(data=st.data(), threshold=st.sampled_from([0.0, 0.2, 0.8, 1.0]))
    def delete_and_gc(self, data: st.DataObject, threshold: float) -> None:
        doomed = data.draw(st.sampled_from(sorted(self.ledgers)))
        note(f"delete ledger {doomed}, compaction threshold {threshold}")
        candidates = self.storage.ledger_ids()
        self.ledgers.discard(doomed)
        self.fenced.discard(doomed)
        self.entries = {k: v for k, v in self.entries.items() if k[0] != doomed}
        self.storage.garbage_collect(set(self.ledgers), candidates, threshold)

    @invariant()
    def acknowledged_entries_read_back(self) -> None:
        for (ledger, e), body in self.entries.items():
            assert self.storage.read_entry(ledger, e) == body, (ledger, e)

    @invariant()
    def fence_and_keys_persist(self) -> None:
        infos = self.storage.ledger_infos()
        assert set(infos) == self.ledgers
        for lg, info in infos.items():
            assert info.fenced == (lg in self.fenced)
            assert info.master_key == KEY

    def teardown(self) -> None:
        self.storage.close()
        shutil.rmtree(self.dir, ignore_errors=True)


StorageMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
TestStorage = StorageMachine.TestCase
