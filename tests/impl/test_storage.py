"""Bookie storage on real files: journal durability, replay, LastLogMark, GC and compaction."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from bkref.impl.core.bookie import JournalAdd, JournalFence, JournalMasterKey, JournalRecord
from bkref.impl.core.digest import Digest, DigestType, master_key
from bkref.impl.storage.bookie_storage import BookieStorage, StorageConfig
from bkref.impl.storage.journal import journal_ids, journal_path

KEY = master_key(b"pw")
DIGEST = Digest(DigestType.CRC32C, b"pw")


def _body(ledger: int, entry: int, size: int = 100) -> bytes:
    return DIGEST.sign(ledger, entry, entry - 1, (entry + 1) * size, bytes([entry % 251]) * size)


def _persist(s: BookieStorage, records: list[JournalRecord]) -> None:
    """Persist and wait for the journal's fsync, as the bookie does before replying."""
    done = threading.Event()
    errors: list[BaseException | None] = []

    def cb(err: BaseException | None) -> None:
        errors.append(err)
        done.set()

    s.persist(tuple(records), cb)
    assert done.wait(10)
    assert errors == [None]


def _open(tmp: Path, **kw: int | float | bool) -> BookieStorage:
    return BookieStorage(tmp / "journal", tmp / "ledgers", StorageConfig(**kw))  # type: ignore[arg-type]


def test_acknowledged_adds_survive_a_crash_by_journal_replay(tmp_path: Path) -> None:
    s = _open(tmp_path)
    _persist(s, [JournalMasterKey(1, KEY)])
    for e in range(50):
        _persist(s, [JournalAdd(1, e, _body(1, e))])
    _persist(s, [JournalFence(1)])
    s.abandon()  # no checkpoint, entry-log buffer lost
    s2 = _open(tmp_path)
    assert s2.replay.records == 52
    for e in range(50):
        assert s2.read_entry(1, e) == _body(1, e)
    info = s2.ledger_infos()[1]
    assert info.fenced
    assert info.master_key == KEY
    assert info.lac == 48
    s2.close()


def test_checkpoint_persists_the_last_log_mark_and_deletes_older_journals(
    tmp_path: Path,
) -> None:
    s = _open(tmp_path, journal_max_size=4096)
    _persist(s, [JournalMasterKey(1, KEY)])
    for e in range(200):
        _persist(s, [JournalAdd(1, e, _body(1, e))])
    assert len(journal_ids(tmp_path / "journal")) > 3
    mark = s.checkpoint()
    assert journal_ids(tmp_path / "journal")[0] == mark.journal_id
    s.abandon()
    s2 = _open(tmp_path)
    assert s2.replay.records == 0  # everything was before the mark, in entry logs and index
    assert all(s2.read_entry(1, e) == _body(1, e) for e in range(200))
    s2.close()


def test_truncated_journal_tail_is_tolerated_with_a_clear_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    s = _open(tmp_path)
    _persist(s, [JournalMasterKey(1, KEY), JournalAdd(1, 0, _body(1, 0))])
    jid = journal_ids(tmp_path / "journal")[-1]
    s.abandon()
    with journal_path(tmp_path / "journal", jid).open("ab") as f:
        f.write(b"\x00\x00\x01\x00garbage")  # a torn record: declares 256 bytes
    with caplog.at_level(logging.WARNING):
        s2 = _open(tmp_path)
    assert s2.read_entry(1, 0) == _body(1, 0)
    assert len(s2.replay.truncated) == 1
    assert "never acknowledged" in caplog.text
    assert "record declares" in caplog.text
    s2.close()


def test_gc_and_compaction_reclaim_space_and_live_ledgers_still_read(tmp_path: Path) -> None:
    s = _open(tmp_path, entry_log_size_limit=64 * 1024)
    _persist(s, [JournalMasterKey(1, KEY), JournalMasterKey(2, KEY), JournalMasterKey(3, KEY)])
    for e in range(300):  # interleaved: ledger 2 is 10% of the bytes, ledger 3 has its own log
        _persist(s, [JournalAdd(1, e, _body(1, e, 900))])
        if e % 9 == 0:
            _persist(s, [JournalAdd(2, e, _body(2, e))])
    for e in range(100):
        _persist(s, [JournalAdd(3, e, _body(3, e, 900))])
    s.checkpoint()
    before = s.entry_log_bytes()
    candidates = s.ledger_ids()
    # Ledger 1 is deleted: logs with only ledger 1 go, mixed logs are below 0.2 and compact.
    report = s.garbage_collect({2, 3}, candidates, compaction_threshold=0.2)
    assert report.deleted_ledgers == [1]
    assert report.compacted_logs
    assert s.entry_log_bytes() < before / 2
    assert s.read_entry(1, 0) is None
    for e in range(0, 300, 9):
        assert s.read_entry(2, e) == _body(2, e)
    s.abandon()
    s2 = _open(tmp_path)
    assert all(s2.read_entry(3, e) == _body(3, e, 900) for e in range(100))
    assert all(s2.read_entry(2, e) == _body(2, e) for e in range(0, 300, 9))
    s2.close()


def test_gc_never_deletes_a_ledger_created_after_the_listing(tmp_path: Path) -> None:
    s = _open(tmp_path)
    candidates = s.ledger_ids()  # taken before the metadata listing
    _persist(s, [JournalMasterKey(9, KEY), JournalAdd(9, 0, _body(9, 0))])
    report = s.garbage_collect(set(), candidates)
    assert report.deleted_ledgers == []
    assert s.read_entry(9, 0) == _body(9, 0)
    s.close()
