"""Disk corruption helpers on real files: what they change, and that the seed decides it."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from bkref.nemesis.disk import NothingToCorruptError, flip_bytes, truncate_tail, wipe


def test_flip_changes_exactly_the_named_bytes_of_one_entry_log(tmp_path: Path) -> None:
    original = bytes(range(256)) * 4
    (tmp_path / "00000000.log").write_bytes(original)
    said = flip_bytes(tmp_path, random.Random(5), count=3)
    after = (tmp_path / "00000000.log").read_bytes()
    changed = [i for i, (a, b) in enumerate(zip(original, after, strict=True)) if a != b]
    assert 1 <= len(changed) <= 3  # two picks may hit one offset (flipped back)
    assert all(after[i] == original[i] ^ 0xFF for i in changed)
    assert "00000000.log" in said
    assert str(changed[0]) in said


def test_truncate_cuts_the_newest_journal_by_at_most_a_quarter(tmp_path: Path) -> None:
    (tmp_path / "journal-00000000.txn").write_bytes(b"a" * 1000)
    (tmp_path / "journal-00000001.txn").write_bytes(b"b" * 4000)
    said = truncate_tail(tmp_path, random.Random(2))
    assert (tmp_path / "journal-00000000.txn").stat().st_size == 1000
    size = (tmp_path / "journal-00000001.txn").stat().st_size
    assert 3000 <= size < 4000
    assert f"cut {4000 - size} of 4000 bytes" in said


def test_the_seed_decides_the_corruption(tmp_path: Path) -> None:
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "00000000.log").write_bytes(bytes(4096))
    assert flip_bytes(tmp_path / "a", random.Random(9)) == flip_bytes(
        tmp_path / "b", random.Random(9)
    ).replace("/b/", "/a/")


def test_wipe_empties_the_directories_and_keeps_them(tmp_path: Path) -> None:
    (tmp_path / "journal" / "current").mkdir(parents=True)
    (tmp_path / "journal" / "current" / "VERSION").write_text("cookie")
    (tmp_path / "ledgers").mkdir()
    (tmp_path / "ledgers" / "00000000.log").write_bytes(b"x")
    said = wipe([tmp_path / "journal", tmp_path / "ledgers", tmp_path / "missing"])
    assert list((tmp_path / "journal").iterdir()) == []
    assert list((tmp_path / "ledgers").iterdir()) == []
    assert "2 entries removed" in said


def test_nothing_to_corrupt_is_said(tmp_path: Path) -> None:
    with pytest.raises(NothingToCorruptError, match="no entry log"):
        flip_bytes(tmp_path, random.Random(1))
    with pytest.raises(NothingToCorruptError, match="no journal"):
        truncate_tail(tmp_path, random.Random(1))
