"""Storage through an injected Disk: plants as arguments, and power loss with CrashDisk."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import Phase, event, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from bkref.impl.core.bookie import JournalAdd, JournalFence, JournalMasterKey, JournalRecord
from bkref.impl.core.planted import UnknownPlantError
from bkref.impl.storage.bookie_storage import BookieStorage, StorageConfig
from bkref.impl.storage.crashdisk import CrashDisk, CrashReport, PowerLossError
from bkref.impl.storage.disk import Disk, OsDisk
from tests.impl.test_storage import DIGEST, KEY, _body, _persist

if TYPE_CHECKING:
    from _typeshed import FileDescriptorLike


class CountingDisk(OsDisk):
    """OsDisk that counts journal syncs, to see whether an add waited for one."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def fdatasync(self, fd: FileDescriptorLike, /) -> None:
        self.calls["fdatasync"] += 1
        os.fdatasync(fd)


def _adds_with(tmp: Path, plants: frozenset[str]) -> int:
    disk = CountingDisk()
    s = BookieStorage(tmp / "journal", tmp / "ledgers", StorageConfig(), disk=disk, plants=plants)
    _persist(s, [JournalMasterKey(1, KEY)])
    for e in range(5):
        _persist(s, [JournalAdd(1, e, _body(1, e))])
    s.close()
    return disk.calls["fdatasync"]


def test_plants_argument_switches_the_journal_sync_off_in_process(tmp_path: Path) -> None:
    assert _adds_with(tmp_path / "a", frozenset()) == 6
    assert _adds_with(tmp_path / "b", frozenset({"ack-before-fsync"})) == 0
    # Another plant leaves the journal's syncs alone.
    assert _adds_with(tmp_path / "c", frozenset({"bookie-forgets-lac-on-replay"})) == 6


def test_without_plants_argument_nothing_is_planted(tmp_path: Path) -> None:
    disk = CountingDisk()
    s = BookieStorage(tmp_path / "journal", tmp_path / "ledgers", StorageConfig(), disk=disk)
    _persist(s, [JournalMasterKey(1, KEY)])
    _persist(s, [JournalAdd(1, 0, _body(1, 0))])
    s.close()
    assert disk.calls["fdatasync"] == 2


def test_an_unknown_plant_name_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(UnknownPlantError, match="ack-before-fsnyc"):
        BookieStorage(tmp_path / "j", tmp_path / "l", plants=frozenset({"ack-before-fsnyc"}))


# ---------------------------------------------------------------- CrashDisk on its own


def _append(disk: CrashDisk, path: Path, data: bytes, *, sync: bool) -> None:
    fd = disk.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    disk.write(fd, data)
    if sync:
        disk.fsync(fd)
    disk.close(fd)


def _rewrite(disk: CrashDisk, path: Path, data: bytes, *, sync: bool) -> None:
    fd = disk.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    disk.write(fd, data)
    if sync:
        disk.fsync(fd)
    disk.close(fd)


def test_crash_keeps_a_file_up_to_its_last_fsync(tmp_path: Path) -> None:
    disk = CrashDisk()
    f = tmp_path / "log"
    _append(disk, f, b"durable", sync=True)
    disk.fsync_dir(tmp_path)
    _append(disk, f, b"+lost", sync=False)
    assert f.read_bytes() == b"durable+lost"  # a running process sees everything
    assert disk.durable_size(f) == 7
    report = disk.crash()
    assert f.read_bytes() == b"durable"
    assert report.truncated == {f: 5}


def test_crash_removes_a_file_whose_directory_was_not_synced(tmp_path: Path) -> None:
    disk = CrashDisk()
    f = tmp_path / "new"
    _append(disk, f, b"synced data, unsynced name", sync=True)
    assert disk.durable_size(f) is None
    assert disk.crash().removed == [f]
    assert not f.exists()


def test_a_rename_not_made_durable_is_undone_and_the_old_content_comes_back(
    tmp_path: Path,
) -> None:
    disk = CrashDisk()
    final, tmp = tmp_path / "mark", tmp_path / "mark.tmp"
    _rewrite(disk, final, b"old", sync=True)
    disk.fsync_dir(tmp_path)
    _rewrite(disk, tmp, b"new", sync=True)
    disk.replace(tmp, final)
    assert final.read_bytes() == b"new"
    report = disk.crash()
    assert final.read_bytes() == b"old"
    assert not tmp.exists()
    assert report.restored == [final]
    # Once the directory is synced, the rename stays.
    _rewrite(disk, tmp, b"new", sync=True)
    disk.replace(tmp, final)
    disk.fsync_dir(tmp_path)
    assert not disk.crash().lost_anything
    assert final.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mark"]


def test_an_overwrite_or_truncation_not_synced_is_undone(tmp_path: Path) -> None:
    disk = CrashDisk()
    f = tmp_path / "f"
    _rewrite(disk, f, b"0123456789", sync=True)
    disk.fsync_dir(tmp_path)
    _rewrite(disk, f, b"ab", sync=False)  # O_TRUNC, then a short write
    disk.crash()
    assert f.read_bytes() == b"0123456789"
    fd = disk.open(f, os.O_RDWR, 0)
    disk.pwrite(fd, b"XY", 3)  # in place, below the durable length
    disk.pwrite(fd, b"tail", 10)
    disk.close(fd)
    disk.crash()
    assert f.read_bytes() == b"0123456789"


def test_an_unlink_not_made_durable_is_undone(tmp_path: Path) -> None:
    disk = CrashDisk()
    f = tmp_path / "f"
    _append(disk, f, b"abc", sync=True)
    disk.fsync_dir(tmp_path)
    _append(disk, f, b"def", sync=False)
    disk.unlink(f)
    assert disk.crash().restored == [f]
    assert f.read_bytes() == b"abc"
    disk.unlink(f)
    disk.fsync_dir(tmp_path)
    disk.crash()
    assert not f.exists()


def test_files_present_before_the_disk_touched_them_count_as_durable(tmp_path: Path) -> None:
    (tmp_path / "cookie").write_bytes(b"written by someone else")
    disk = CrashDisk()
    _append(disk, tmp_path / "cookie", b"!", sync=False)
    disk.crash()
    assert (tmp_path / "cookie").read_bytes() == b"written by someone else"


def test_keep_models_a_torn_tail_between_durable_and_written(tmp_path: Path) -> None:
    disk = CrashDisk(real_sync=False)
    f = tmp_path / "log"
    _append(disk, f, b"0123", sync=True)
    disk.fsync_dir(tmp_path)
    _append(disk, f, b"4567", sync=False)
    seen: list[tuple[Path, int, int]] = []

    def keep(path: Path, durable: int, size: int) -> int:
        seen.append((path, durable, size))
        return 6

    disk.crash(keep)
    assert seen == [(f, 4, 8)]
    assert f.read_bytes() == b"012345"


def test_power_off_fails_every_later_change_and_crash_wants_files_closed(
    tmp_path: Path,
) -> None:
    disk = CrashDisk()
    fd = disk.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT, 0o644)
    disk.power_off_after(1)
    assert disk.write(fd, b"x") == 1
    assert not disk.powered
    with pytest.raises(PowerLossError):
        disk.fsync(fd)
    with pytest.raises(PowerLossError):
        disk.fsync_dir(tmp_path)
    with pytest.raises(RuntimeError, match="still open"):
        disk.crash()
    disk.close(fd)  # closing never needs power
    with pytest.raises(OSError, match="not open"):
        disk.close(fd)
    assert disk.crash().removed == [tmp_path / "f"]
    assert disk.powered


# ---------------------------------------------------------------- storage on a CrashDisk

PLANT = frozenset({"ack-before-fsync"})
FAST = StorageConfig(journal_max_group_wait_ms=0.0)
SMALL_LOGS = StorageConfig(journal_max_group_wait_ms=0.0, entry_log_size_limit=1024)


def _storage(
    tmp: Path, disk: Disk, plants: frozenset[str] = frozenset(), config: StorageConfig = FAST
) -> BookieStorage:
    return BookieStorage(tmp / "journal", tmp / "ledgers", config, disk=disk, plants=plants)


def _power_loss(s: BookieStorage, disk: CrashDisk) -> CrashReport:
    s.abandon()  # the process dies: no checkpoint, buffered entry-log bytes gone
    return disk.crash()  # and the machine with it: un-fsynced bytes gone


def test_an_acknowledged_add_survives_a_kill_and_a_power_loss(tmp_path: Path) -> None:
    for how in ("kill", "power loss"):
        disk = CrashDisk()
        s = _storage(tmp_path / how, disk)
        _persist(s, [JournalMasterKey(1, KEY), JournalAdd(1, 0, _body(1, 0))])
        _persist(s, [JournalAdd(1, 1, _body(1, 1))])
        if how == "kill":
            s.abandon()
        else:
            assert not _power_loss(s, disk).truncated  # the journal was fsynced before the ack
        s2 = _storage(tmp_path / how, disk)
        assert s2.replay.records == 3
        assert [s2.read_entry(1, e) for e in (0, 1)] == [_body(1, 0), _body(1, 1)]
        s2.close()


def test_ack_before_fsync_loses_an_acknowledged_add_on_power_loss_only(tmp_path: Path) -> None:
    # Killed, the planted bookie keeps the entry (the page cache survives): why CrashDisk exists.
    disk = CrashDisk()
    s = _storage(tmp_path / "kill", disk, PLANT)
    _persist(s, [JournalMasterKey(1, KEY), JournalAdd(1, 0, _body(1, 0))])  # acknowledged
    s.abandon()
    s2 = _storage(tmp_path / "kill", disk)
    assert s2.read_entry(1, 0) == _body(1, 0)
    s2.close()
    # Power lost, the acknowledged add is gone, and with it the ledger's master key.
    disk = CrashDisk()
    s = _storage(tmp_path / "power", disk, PLANT)
    _persist(s, [JournalMasterKey(1, KEY), JournalAdd(1, 0, _body(1, 0))])  # acknowledged
    report = _power_loss(s, disk)
    assert [p.name for p in report.truncated] == ["journal-00000000.txn"]
    s2 = _storage(tmp_path / "power", disk)
    assert s2.replay.records == 0
    assert s2.read_entry(1, 0) is None
    assert s2.ledger_infos() == {}
    s2.close()


@pytest.mark.parametrize("plants", [frozenset(), PLANT], ids=["correct", "ack-before-fsync"])
def test_fences_and_master_keys_survive_power_loss_unless_planted(
    tmp_path: Path, plants: frozenset[str]
) -> None:
    disk = CrashDisk()
    s = _storage(tmp_path, disk, plants)
    _persist(s, [JournalMasterKey(1, KEY)])
    s.checkpoint()  # ledger 1 and its key are now in the index, durable either way
    _persist(s, [JournalFence(1)])
    _persist(s, [JournalMasterKey(2, KEY)])
    _persist(s, [JournalFence(2)])
    _power_loss(s, disk)
    s2 = _storage(tmp_path, disk)
    infos = s2.ledger_infos()
    s2.close()
    if plants:
        assert set(infos) == {1}
        assert not infos[1].fenced
    else:
        assert set(infos) == {1, 2}
        assert infos[1].fenced
        assert infos[2].fenced
        assert infos[2].master_key == KEY
    assert infos[1].master_key == KEY


def test_the_planted_journal_is_durable_after_a_checkpoint(tmp_path: Path) -> None:
    disk = CrashDisk()
    s = _storage(tmp_path, disk, PLANT)
    _persist(s, [JournalMasterKey(1, KEY), JournalAdd(1, 0, _body(1, 0))])
    s.checkpoint()  # entry log and index fsynced: the bug only loses what came after
    _persist(s, [JournalAdd(1, 1, _body(1, 1))])
    _power_loss(s, disk)
    s2 = _storage(tmp_path, disk)
    assert s2.read_entry(1, 0) == _body(1, 0)
    assert s2.read_entry(1, 1) is None
    s2.close()


def test_a_journal_torn_by_power_loss_is_replayed_up_to_the_tear(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    disk = CrashDisk()
    s = _storage(tmp_path, disk, PLANT)  # the plant leaves the journal tail unsynced
    _persist(s, [JournalMasterKey(1, KEY)])
    for e in range(10):
        _persist(s, [JournalAdd(1, e, _body(1, e))])
    s.abandon()
    disk.crash(keep=lambda _path, _durable, size: size - 7)  # the last record cut short
    with caplog.at_level(logging.WARNING):
        s2 = _storage(tmp_path, disk)
    assert [s2.read_entry(1, e) for e in range(10)] == [_body(1, e) for e in range(9)] + [None]
    assert len(s2.replay.truncated) == 1
    assert "never acknowledged" in caplog.text
    s2.close()


def _populate(
    tmp: Path, disk: CrashDisk, *, settle: bool = False
) -> tuple[BookieStorage, dict[tuple[int, int], bytes]]:
    """Ledger 1 alone in the first entry logs, a checkpoint (index files and a mark exist),
    then ledgers 1 and 2 interleaved and a fence; ``settle``: and a last checkpoint."""
    s = _storage(tmp, disk, config=SMALL_LOGS)
    acked: dict[tuple[int, int], bytes] = {}

    def add(lg: int, e: int) -> None:
        _persist(s, [JournalAdd(lg, e, _body(lg, e))])
        acked[(lg, e)] = _body(lg, e)

    _persist(s, [JournalMasterKey(1, KEY), JournalMasterKey(2, KEY)])
    for e in range(8):
        add(1, e)
    s.checkpoint()
    for e in range(8):
        add(1, 8 + e)
        add(2, e)
    _persist(s, [JournalFence(2)])
    if settle:
        s.checkpoint()
    return s, acked


def _changes(action: Callable[[BookieStorage], object], tmp: Path, *, settle: bool = False) -> int:
    """How many disk changes ``action`` makes on populated storage (the crash points)."""
    disk = CrashDisk(real_sync=False)
    s, _ = _populate(tmp, disk, settle=settle)
    before = disk.changes
    action(s)
    n = disk.changes - before
    s.close()
    return n


def test_power_loss_at_any_step_of_a_checkpoint_keeps_every_acknowledged_record(
    tmp_path: Path,
) -> None:
    steps = _changes(BookieStorage.checkpoint, tmp_path / "count")
    assert steps >= 15  # entry log, two index files (write, sync, rename), the mark, dir syncs
    for k in range(steps + 1):
        disk = CrashDisk(real_sync=False)
        s, acked = _populate(tmp_path / str(k), disk)
        disk.power_off_after(k)
        if k < steps:
            with pytest.raises(PowerLossError):
                s.checkpoint()
        else:
            s.checkpoint()
        _power_loss(s, disk)
        s2 = _storage(tmp_path / str(k), disk)
        assert {key: s2.read_entry(*key) for key in acked} == acked, f"crash at step {k}"
        assert s2.ledger_infos()[2].fenced
        s2.close()


@pytest.mark.parametrize("threshold", [0.0, 0.9], ids=["delete", "delete-and-compact"])
def test_power_loss_at_any_step_of_gc_keeps_live_ledgers_and_deletion_is_all_or_nothing(
    tmp_path: Path, threshold: float
) -> None:
    def _gc(s: BookieStorage) -> object:
        return s.garbage_collect({2}, {1, 2}, compaction_threshold=threshold)

    # Settled first: nothing is dirty, so GC's own checkpoint writes no index file.
    steps = _changes(_gc, tmp_path / "count", settle=True)
    for k in range(steps + 1):
        disk = CrashDisk(real_sync=False)
        s, acked = _populate(tmp_path / str(k), disk, settle=True)
        disk.power_off_after(k)
        done = k >= steps
        if done:
            _gc(s)
        else:
            with pytest.raises(PowerLossError):
                _gc(s)
        _power_loss(s, disk)
        s2 = _storage(tmp_path / str(k), disk)
        live = {key: body for key, body in acked.items() if key[0] == 2}
        assert {key: s2.read_entry(*key) for key in live} == live, f"crash at step {k}"
        if done or 1 not in s2.ledger_ids():
            assert 1 not in s2.ledger_ids(), f"a deleted ledger came back (crash at step {k})"
        else:  # GC cut short: ledger 1 may stay, but then whole
            gone = {key: body for key, body in acked.items() if key[0] == 1}
            assert {key: s2.read_entry(*key) for key in gone} == gone, f"crash at step {k}"
        s2.close()


# ---------------------------------------------------------------- the property


def _try_persist(s: BookieStorage, records: list[JournalRecord]) -> bool:
    """Persist and wait: True if the callback fired without error (the add was acknowledged)."""
    done = threading.Event()
    errors: list[BaseException | None] = []

    def cb(err: BaseException | None) -> None:
        errors.append(err)
        done.set()

    try:
        s.persist(tuple(records), cb)
    except PowerLossError:
        return False
    assert done.wait(10)
    return errors == [None]


class PowerLossMachine(RuleBasedStateMachine):
    """Whatever persist acknowledged survives any sequence of adds, fences, checkpoints, GC,
    power cut at any step, torn tails and restarts (correct code, CrashDisk).

    The model only holds what was acknowledged; unacknowledged records may survive or not.
    """

    plants: frozenset[str] = frozenset()

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="bkref-crashdisk-"))
        self.disk = CrashDisk()
        self.storage = self._open()
        self.acked: dict[tuple[int, int], bytes] = {}
        self.ledgers: set[int] = set()  # master key acknowledged, not deleted since
        self.fenced: set[int] = set()
        self.deleted: set[int] = set()  # ledgers a completed GC deleted
        self.next_entry: dict[int, int] = {}
        self.armed = False  # power_off_after set and not yet crashed

    def _open(self) -> BookieStorage:
        return _storage(self.dir, self.disk, self.plants, config=STATEFUL)

    @rule(ledger=st.integers(1, 3), size=st.integers(0, 1500))
    def add(self, ledger: int, size: int) -> None:
        records: list[JournalRecord] = []
        if ledger not in self.ledgers:
            records.append(JournalMasterKey(ledger, KEY))
            self.deleted.discard(ledger)  # re-created, acknowledged or not
        e = self.next_entry.get(ledger, 0)
        self.next_entry[ledger] = e + 1
        body = DIGEST.sign(ledger, e, e - 1, size, bytes([e % 256]) * size)
        records.append(JournalAdd(ledger, e, body))
        if _try_persist(self.storage, records):
            self.ledgers.add(ledger)
            self.acked[(ledger, e)] = body
        else:
            event("add not acknowledged")

    @precondition(lambda self: self.ledgers)
    @rule(data=st.data())
    def fence(self, data: st.DataObject) -> None:
        ledger = data.draw(st.sampled_from(sorted(self.ledgers)))
        if _try_persist(self.storage, [JournalFence(ledger)]):
            self.fenced.add(ledger)

    @rule()
    def checkpoint(self) -> None:
        try:
            self.storage.checkpoint()
        except PowerLossError:
            event("checkpoint cut short")

    @precondition(lambda self: self.ledgers)
    @rule(data=st.data(), threshold=st.sampled_from([0.0, 0.8]))
    def delete_and_gc(self, data: st.DataObject, threshold: float) -> None:
        doomed = data.draw(st.sampled_from(sorted(self.ledgers)))
        candidates = self.storage.ledger_ids()
        self.ledgers.discard(doomed)
        self.fenced.discard(doomed)
        self.acked = {k: v for k, v in self.acked.items() if k[0] != doomed}
        try:
            report = self.storage.garbage_collect(set(self.ledgers), candidates, threshold)
        except PowerLossError:
            event("GC cut short")  # the ledger deleted or not: both are fine
            return
        self.deleted |= set(report.deleted_ledgers)

    @precondition(lambda self: not self.armed)
    @rule(changes=st.integers(0, 40))
    def power_off_soon(self, changes: int) -> None:
        note(f"power goes off after {changes} more changes")
        self.disk.power_off_after(changes)
        self.armed = True

    @rule(data=st.data())
    def power_loss_and_restart(self, data: st.DataObject) -> None:
        def keep(path: Path, durable: int, size: int) -> int:
            return data.draw(st.integers(durable, size), label=f"bytes kept of {path.name}")

        self.storage.abandon()
        report = self.disk.crash(keep if data.draw(st.booleans(), label="torn tails") else None)
        note(f"power loss: {report}")
        event(f"power loss lost data: {report.lost_anything}")
        self.armed = False
        self.storage = self._open()

    @precondition(lambda self: not self.armed)
    @rule()
    def clean_restart(self) -> None:
        self.storage.close()
        self.storage = self._open()

    @invariant()
    def acknowledged_records_are_there(self) -> None:
        for (ledger, e), body in self.acked.items():
            assert self.storage.read_entry(ledger, e) == body, f"acknowledged {ledger}:{e} lost"
        infos = self.storage.ledger_infos()
        assert self.ledgers <= set(infos), f"acknowledged ledgers {self.ledgers - set(infos)} lost"
        assert not self.deleted & set(infos), "a ledger GC deleted came back"
        for lg in self.ledgers:
            assert infos[lg].master_key == KEY
            assert infos[lg].fenced or lg not in self.fenced, f"acknowledged fence {lg} lost"

    def teardown(self) -> None:
        self.storage.abandon()
        self.disk.crash()
        shutil.rmtree(self.dir, ignore_errors=True)


STATEFUL = StorageConfig(
    journal_max_size=8 * 1024, entry_log_size_limit=8 * 1024, journal_max_group_wait_ms=0.0
)
PowerLossMachine.TestCase.settings = settings(
    max_examples=30, stateful_step_count=30, deadline=None
)
TestPowerLoss = PowerLossMachine.TestCase


class PlantedPowerLossMachine(PowerLossMachine):
    plants = PLANT


def test_the_property_catches_ack_before_fsync() -> None:
    # The same machine must fail with the plant, or its passing says nothing.
    with pytest.raises(AssertionError, match=r"acknowledged .* lost"):
        run_state_machine_as_test(
            PlantedPowerLossMachine,
            settings=settings(
                max_examples=200,
                stateful_step_count=30,
                deadline=None,
                database=None,
                phases=[Phase.generate],
            ),
        )
