"""Time is injected: the shells' decisions follow the Clock they are given.

With a :class:`ManualClock`, real time passing changes nothing; stepping the clock
does. The shells run here over in-memory doubles of ZooKeeper and the bookies (no
processes): the worker's grace period, the client's wait for a ZooKeeper
connection, the auditor's lost-bookie delay and the age stamped on a new task.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from kazoo.exceptions import NoNodeError

from bkref.impl.autorecovery.auditor import Auditor
from bkref.impl.autorecovery.worker import ReplicationWorker
from bkref.impl.client.client import BookKeeper
from bkref.impl.client.errors import BKError, ZooKeeperError
from bkref.impl.client.zkcalls import ZkCalls
from bkref.impl.clock import SYSTEM_CLOCK, Clock, ManualClock, SystemClock
from bkref.impl.core.audit import AuditorConfig, ReadDelay, ReadLedgers
from bkref.impl.core.digest import DigestType, password_hash
from bkref.impl.core.metadata import LedgerMetadata, Segment
from bkref.impl.core.repair import Reason, Task
from bkref.impl.core.replication import WorkerConfig
from bkref.impl.meta.store import BookieInfo, ZkMetadataStore
from bkref.impl.meta.underreplication import UnderreplicationManager

LEDGER = 5
LOST = "lost:3181"
LIVE = ("b0:3181", "b1:3181", "b2:3181")


def test_manual_clock_moves_only_when_stepped_and_never_back() -> None:
    clock = ManualClock(monotonic_ms=10, wall_ms=5_000)
    assert isinstance(clock, Clock)
    assert (clock.monotonic_ms(), clock.wall_ms()) == (10, 5_000)
    assert clock.step(90) == 100
    assert clock.step_seconds(0.25) == 350
    assert (clock.monotonic_ms(), clock.wall_ms()) == (350, 5_340)
    clock.set_wall(1_000)  # the wall clock may jump back; monotonic time does not
    assert (clock.monotonic_ms(), clock.wall_ms()) == (350, 1_000)
    with pytest.raises(ValueError, match="cannot go back"):
        clock.step(-1)


def test_a_manual_clock_step_of_zero_is_allowed_and_changes_nothing() -> None:
    """No time passing is not going back: step(0) (or a sub-millisecond step_seconds,
    which rounds to 0) leaves both readings as they were."""
    clock = ManualClock(monotonic_ms=10, wall_ms=5_000)
    assert clock.step(0) == 10
    assert clock.step_seconds(0.0004) == 10
    assert (clock.monotonic_ms(), clock.wall_ms()) == (10, 5_000)


def test_system_clock_reads_the_system_time() -> None:
    assert isinstance(SYSTEM_CLOCK, SystemClock)
    assert isinstance(SYSTEM_CLOCK, Clock)
    a = SYSTEM_CLOCK.monotonic_ms()
    assert SYSTEM_CLOCK.monotonic_ms() >= a
    assert SYSTEM_CLOCK.wall_ms() > 1_600_000_000_000  # after September 2020


# ---------------------------------------------------------------- the worker's grace period


class _Meta:
    """The metadata store, as the worker reads it."""

    def __init__(self, md: LedgerMetadata) -> None:
        self.md = md

    def bookies(self) -> list[BookieInfo]:
        return [BookieInfo(b, b, False) for b in LIVE]

    def read_ledger(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        assert ledger_id == LEDGER
        return self.md, 3

    def writable_bookies(self) -> dict[str, str]:
        return {b: b for b in LIVE}


@dataclass
class _Client:
    """The BookKeeper client, as the worker uses it: a recovery open is recorded, then
    refused (what follows the fence is not this test's business)."""

    meta: _Meta
    opened: list[int] = field(default_factory=list)

    async def open_ledger(self, ledger_id: int, password: bytes, *, recovery: bool) -> None:
        assert recovery
        self.opened.append(ledger_id)
        raise BKError("the test stops the attempt at the fence")


@dataclass
class _Tasks:
    """The under-replication task list and locks, in memory."""

    task: Task
    failures: list[int] = field(default_factory=list)

    def release_leaked(self) -> int:
        return 0

    def tasks(self) -> list[tuple[Task, int]]:
        return [(self.task, 1)]

    def try_lock(self, ledger_id: int, owner: str) -> bool:
        return True

    def get(self, ledger_id: int) -> tuple[Task, int]:
        return self.task, 1

    def unlock(self, ledger_id: int) -> None:
        pass

    def record_failure(self, ledger_id: int, version: int) -> None:
        self.failures.append(ledger_id)


def _open_ledger_on_a_lost_bookie() -> LedgerMetadata:
    return LedgerMetadata(
        3,
        2,
        2,
        (Segment(0, (LIVE[0], LIVE[1], LOST)),),
        DigestType.CRC32C,
        password_hash(b"pw"),
        password=b"pw",
    )


def test_the_open_ledger_grace_period_elapses_only_when_the_clock_is_stepped() -> None:
    grace_ms = 30_000
    clock = ManualClock()
    client = _Client(_Meta(_open_ledger_on_a_lost_bookie()))
    tasks = _Tasks(Task(LEDGER, {LOST: Reason.LOST}, 0, clock.wall_ms()))
    worker = ReplicationWorker(
        cast(BookKeeper, client),
        cast(UnderreplicationManager, tasks),
        "worker-1",
        None,
        WorkerConfig(grace_period_ms=grace_ms),
        clock=clock,
    )

    async def rounds() -> None:
        await worker.run_once()  # first look: the grace period starts
        assert worker._deferred[LEDGER] == "open or in recovery: grace period started"
        for _ in range(3):  # real time passes, the clock does not
            await asyncio.sleep(0.01)
            await worker.run_once()
            assert worker._deferred[LEDGER] == "open or in recovery: in its grace period"
        assert client.opened == []
        clock.step(grace_ms - 1)
        await worker.run_once()
        assert client.opened == []  # one millisecond short
        clock.step(1)
        await worker.run_once()
        assert client.opened == [LEDGER]  # fenced by a recovery open
        assert tasks.failures == [LEDGER]  # (the fake refused it: a failure, backed off)

    asyncio.run(rounds())


# ---------------------------------------------------------------- the client's ZooKeeper wait


class _DisconnectedZk:
    connected = False


def test_a_metadata_call_waits_for_zookeeper_until_the_clock_passes_its_deadline() -> None:
    clock = ManualClock()
    calls = ZkCalls("zk.invalid:2181", call_timeout=30.0, clock=clock)
    calls._store = ZkMetadataStore(cast(Any, _DisconnectedZk()), clock=clock)
    ran: list[str] = []

    async def go() -> None:
        call = asyncio.ensure_future(calls.call("list ledgers", lambda: ran.append("sent")))
        await asyncio.sleep(0.3)  # several polls of the connection, in real time
        assert not call.done()
        clock.step(29_999)
        await asyncio.sleep(0.2)
        assert not call.done()
        clock.step(1)
        with pytest.raises(ZooKeeperError, match=r"no connection to ZooKeeper at zk\.invalid:2181"):
            await asyncio.wait_for(call, 5)
        assert ran == []  # nothing was sent

    asyncio.run(go())


# ---------------------------------------------------------------- the auditor's delay


def test_the_lost_bookie_delay_runs_on_the_auditors_clock() -> None:
    clock = ManualClock(monotonic_ms=5_000_000)
    auditor = Auditor(
        cast(BookKeeper, object()),
        cast(UnderreplicationManager, object()),
        "node-1",
        AuditorConfig(lost_bookie_recovery_delay=60),
        clock=clock,
    )
    core = auditor.core
    assert core.now_ms == 5_000_000  # the core starts at the clock's time
    core.on_votes(1, 1, auditor._now_ms())  # elected
    core.on_registered(set(LIVE) | {LOST}, auditor._now_ms())
    core.tick(auditor._now_ms())
    assert any(isinstance(a, ReadLedgers) for a in core.take_actions())  # the new auditor's
    core.on_ledgers(None)
    core.on_registered(set(LIVE), auditor._now_ms())  # LOST went away
    assert [type(a) for a in core.take_actions()] == [ReadDelay]
    core.on_delay(60)
    clock.step_seconds(59.999)
    core.tick(auditor._now_ms())
    assert core.take_actions() == []
    clock.step(1)
    core.tick(auditor._now_ms())
    assert [type(a) for a in core.take_actions()] == [ReadLedgers]


# ---------------------------------------------------------------- a task's age


class _EmptyZk:
    def __init__(self) -> None:
        self.created: dict[str, bytes] = {}

    def get(self, path: str) -> tuple[bytes, object]:
        raise NoNodeError(path)

    def create(self, path: str, data: bytes, makepath: bool = False) -> str:
        self.created[path] = data
        return path


def test_a_new_task_is_stamped_with_the_wall_clock_it_was_given() -> None:
    clock = ManualClock(wall_ms=1_234_567)
    urm = UnderreplicationManager(cast(Any, _EmptyZk()), clock=clock)
    task = urm.mark(LEDGER, {LOST: Reason.LOST}, 1)
    assert task.ctime_ms == 1_234_567
