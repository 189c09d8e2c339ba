"""bkref bookie --dump on a damaged disk: an unreadable record is a finding, not a crash."""

from __future__ import annotations

import struct
from pathlib import Path

from impl.bookie.config import BookieConfig
from impl.bookie.dump import UNREADABLE, stored_entries
from impl.core.bookie import JournalAdd, JournalMasterKey
from impl.core.checksum import crc32c
from impl.storage.bookie_storage import BookieStorage
from impl.storage.entrylog import log_path
from tests.impl.test_storage import KEY, _body, _persist


def test_a_corrupt_record_length_marks_one_entry_unreadable_and_the_dump_goes_on(
    tmp_path: Path,
) -> None:
    config = BookieConfig(
        journalDirectory=str(tmp_path / "journal"),
        ledgerDirectories=[str(tmp_path / "ledgers")],
    )
    s = BookieStorage(Path(config.journalDirectory), Path(config.ledgerDirectories[0]))
    _persist(s, [JournalMasterKey(1, KEY), JournalMasterKey(2, KEY)])
    for e in range(10):
        _persist(s, [JournalAdd(1, e, _body(1, e)), JournalAdd(2, e, _body(2, e))])
    s.checkpoint()  # entries now live in the entry log, not only in the journal
    log_id, offset = s.index.ledgers[1].entries[4]
    s.close()

    # Flip the record's length to one far past the end of the file, as a disk fault
    # that hits the header would: reading the body then comes up short.
    with log_path(Path(config.ledgerDirectories[0]), log_id).open("r+b") as f:
        f.seek(offset)
        f.write(struct.pack(">I", 0x7FFFFFF0))

    rows = list(stored_entries(config))
    by_key = {(r["ledger"], r["entry"]): r for r in rows}
    assert sorted(by_key) == [(lg, e) for lg in (1, 2) for e in range(10)]
    bad = by_key[(1, 4)]
    assert bad["digest"] == UNREADABLE
    assert "cut short" in bad["error"]
    for (lg, e), r in by_key.items():
        if (lg, e) != (1, 4):
            assert r["digest"] == f"{crc32c(_body(lg, e)):08x}", (lg, e)
            assert "error" not in r
