"""Storage through an injected Disk: plants as arguments, and power loss with CrashDisk."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from impl.core.bookie import JournalAdd, JournalMasterKey
from impl.core.planted import ENV, UnknownPlantError
from impl.storage.bookie_storage import BookieStorage, StorageConfig
from impl.storage.disk import OsDisk
from tests.impl.test_storage import KEY, _body, _persist

if TYPE_CHECKING:
    from _typeshed import FileDescriptorLike


class CountingDisk(OsDisk):
    """OsDisk that counts journal syncs, to see whether an add waited for one."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def fdatasync(self, fd: FileDescriptorLike, /) -> None:
        self.calls["fdatasync"] += 1
        os.fdatasync(fd)


def _adds_with(tmp: Path, plants: frozenset[str] | None) -> int:
    disk = CountingDisk()
    s = BookieStorage(tmp / "journal", tmp / "ledgers", StorageConfig(), disk=disk, plants=plants)
    _persist(s, [JournalMasterKey(1, KEY)])
    for e in range(5):
        _persist(s, [JournalAdd(1, e, _body(1, e))])
    s.close()
    return disk.calls["fdatasync"]


def test_plants_argument_switches_the_journal_sync_off_in_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert _adds_with(tmp_path / "a", frozenset()) == 6
    assert _adds_with(tmp_path / "b", frozenset({"ack-before-fsync"})) == 0
    # The argument wins over the environment, both ways.
    monkeypatch.setenv(ENV, "ack-before-fsync")
    assert _adds_with(tmp_path / "c", frozenset()) == 6


def test_without_plants_argument_the_environment_decides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV, "ack-before-fsync")
    assert _adds_with(tmp_path / "a", None) == 0
    monkeypatch.delenv(ENV)
    assert _adds_with(tmp_path / "b", None) == 6


def test_an_unknown_plant_name_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(UnknownPlantError, match="ack-before-fsnyc"):
        BookieStorage(tmp_path / "j", tmp_path / "l", plants=frozenset({"ack-before-fsnyc"}))
