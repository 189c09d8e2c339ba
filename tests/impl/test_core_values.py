"""What the sans-I/O cores hand out are values: frames, actions, journal records, metadata,
fragments and tasks cannot change after they are made.

The same object travels to several readers: a core's action is performed by its shell,
recorded by the trace and compared by the refinement machine; a decoded frame is both
answered and logged. Were one mutable, a reader could change what another already
recorded, and the record would lie. Hashable, they can be kept in sets and dict keys.
"""

from __future__ import annotations

import dataclasses
import inspect
from types import ModuleType

import pytest

from bkref.impl.core import (
    actions,
    audit,
    bookie,
    digest,
    frames,
    metadata,
    quorum,
    repair,
    repair_run,
    replication,
    worker_actions,
)

# Modules whose every dataclass is a message or an action.
ALL_VALUES = (actions, frames, worker_actions)
# And the values of modules that also hold a core's mutable state or its config.
NAMED = (
    audit.JoinElection,
    audit.ReadDelay,
    audit.ReadLedgers,
    audit.CheckLedgers,
    audit.Mark,
    audit.Probe,
    audit.AuditView,
    audit.AuditorConfig,
    bookie.JournalAdd,
    bookie.JournalMasterKey,
    bookie.JournalFence,
    bookie.BookieDecision,
    digest.Entry,
    digest.EntryHeader,
    metadata.Segment,
    metadata.LedgerMetadata,
    quorum.Quorum,
    repair.Fragment,
    repair.Task,
    repair.Scheduling,
    repair_run.ReadOpenLac,
    repair_run.Copy,
    repair_run.CasReplica,
    replication.WorkerConfig,
)


def _dataclasses(module: ModuleType) -> list[type]:
    return [
        c
        for _, c in inspect.getmembers(module, inspect.isclass)
        if c.__module__ == module.__name__ and dataclasses.is_dataclass(c)
    ]


VALUES = sorted(
    {c for m in ALL_VALUES for c in _dataclasses(m)} | set(NAMED), key=lambda c: c.__qualname__
)


def test_the_value_modules_hold_values() -> None:
    assert len(VALUES) > len(NAMED) + 20, [c.__name__ for c in VALUES]


@pytest.mark.parametrize(
    "cls", VALUES, ids=lambda c: f"{c.__module__.rsplit('.', 1)[-1]}.{c.__name__}"
)
def test_a_core_value_cannot_be_changed_and_can_be_hashed(cls: type) -> None:
    value: object = object.__new__(cls)  # no field set: the test needs no valid arguments
    for f in dataclasses.fields(cls):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, f.name, None)
    assert cls.__hash__ is not None, f"{cls.__name__} is unhashable"
