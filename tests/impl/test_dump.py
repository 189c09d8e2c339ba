"""bkref bookie --dump on a damaged disk: an unreadable record is a finding, not a crash."""

from __future__ import annotations

import struct
from pathlib import Path

from bkref.impl.bookie.config import BookieConfig
from bkref.impl.bookie.dump import UNREADABLE, stored_entries
from bkref.impl.core.bookie import JournalAdd, JournalMasterKey
from bkref.impl.core.checksum import crc32c
from bkref.impl.core.digest import Digest, DigestType, content_fingerprint
from bkref.impl.storage.bookie_storage import BookieStorage
from bkref.impl.storage.entrylog import log_path
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
            assert r["digest"] == content_fingerprint(_body(lg, e)), (lg, e)
            assert "error" not in r


def test_replicas_that_differ_only_in_their_piggybacked_lac_match_and_a_flip_does_not() -> None:
    # The writer's copy and a recovery's write-back of one entry: same data, own LACs.
    d = Digest(DigestType.CRC32C, b"pw")
    writer = d.sign(7, 3, 1, 120, b"payload")
    writeback = d.sign(7, 3, 2, 120, b"payload")
    assert writer != writeback
    assert content_fingerprint(writer) == content_fingerprint(writeback)
    assert content_fingerprint(d.sign(7, 3, 1, 120, b"payloaD")) != content_fingerprint(writer)
    assert content_fingerprint(d.sign(7, 4, 1, 120, b"payload")) != content_fingerprint(writer)
    for i in range(len(writer)):  # a flipped byte anywhere, the LAC field included
        flipped = writer[:i] + bytes([writer[i] ^ 0x10]) + writer[i + 1 :]
        assert content_fingerprint(flipped) != content_fingerprint(writer), i
    # HMAC copies cannot be split without the password: compared byte for byte.
    h = Digest(DigestType.HMAC, b"pw")
    assert (
        content_fingerprint(h.sign(7, 3, 1, 120, b"x"))
        == f"{crc32c(h.sign(7, 3, 1, 120, b'x')):08x}"
    )
