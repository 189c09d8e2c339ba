"""The replication worker's actions: what :class:`bkref.impl.core.replication.WorkerCore`
asks its shell (``bkref/impl/autorecovery/worker.py``) or a test harness to do, each
answered by one of the core's events."""

from __future__ import annotations

from dataclasses import dataclass

from bkref.impl.core.audit import Probe
from bkref.impl.core.repair_run import CasReplica, Copy, ReadOpenLac


@dataclass(frozen=True, slots=True)
class TryLock:
    """Take the ledger's lock (an ephemeral znode), then re-read its task; answer with
    :meth:`WorkerCore.on_lock`."""

    ledger_id: int


@dataclass(frozen=True, slots=True)
class ReadLedger:
    """Read the ledger's metadata, and the registered (``live``) and the writable
    (``candidates``) bookies if asked; answer with :meth:`WorkerCore.on_ledger`."""

    ledger_id: int
    live: bool = False
    candidates: bool = False


@dataclass(frozen=True, slots=True)
class StartRecovery:
    """Open the ledger with recovery (fence and close it); answer with
    :meth:`WorkerCore.on_recovered`. ``bookies``: the bad ones of its open segment."""

    ledger_id: int
    password: bytes
    bookies: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Verified:
    """No segment names a lost or leaving bookie any more (nothing for the shell to do)."""

    ledger_id: int


@dataclass(frozen=True, slots=True)
class CompleteTask:
    """Delete the task if still at ``version``; answer with :meth:`WorkerCore.on_completed`.
    ``repaired``: after :class:`Verified` (else the ledger is gone)."""

    ledger_id: int
    version: int
    repaired: bool


@dataclass(frozen=True, slots=True)
class RecordFailure:
    """Count a failed attempt in the task (best effort; a concurrent mark wins)."""

    ledger_id: int
    version: int
    why: str


@dataclass(frozen=True, slots=True)
class Defer:
    """Leave the ledger for a later round; not a failure."""

    ledger_id: int
    why: str


@dataclass(frozen=True, slots=True)
class Unlock:
    """Release the ledger's lock; answer with :meth:`WorkerCore.on_unlocked`."""

    ledger_id: int


WorkerAction = (
    TryLock
    | ReadLedger
    | StartRecovery
    | Probe
    | ReadOpenLac
    | Copy
    | CasReplica
    | Verified
    | CompleteTask
    | RecordFailure
    | Defer
    | Unlock
)
