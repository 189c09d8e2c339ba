"""How the auditor logs a mark (bkref/impl/autorecovery/auditor.py ``_mark``): after its
ZooKeeper write, in the thread that wrote it; and, when the write failed on the
connection (it may have landed: the answer is what was lost), with its outcome unknown.

A stand-in for the under-replication manager plays ZooKeeper's answer; the real path
runs in every traced campaign (the trace check reads these lines)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import cast

import pytest
from kazoo.exceptions import ConnectionLoss, NoAuthError

from bkref.impl.autorecovery.auditor import _mark
from bkref.impl.core.audit import Mark
from bkref.impl.core.repair import Reason
from bkref.impl.meta.underreplication import UnderreplicationManager
from bkref.impl.trace import Tracer

ACTION = "auditor_marks_ledgers_of_lost_bookies"


class _Answers:
    """``mark`` answers as ZooKeeper did: nothing (written), or the exception given."""

    def __init__(self, error: Exception | None) -> None:
        self.error = error
        self.marks: list[int] = []

    def mark(self, ledger_id: int, *_args: object, **_kw: object) -> None:
        self.marks.append(ledger_id)
        if self.error is not None:
            raise self.error


def _run(tmp_path: Path, error: Exception | None) -> list[dict[str, object]]:
    tracer = Tracer(tmp_path, "autorecovery-x")
    urm = cast(UnderreplicationManager, _Answers(error))
    mark = Mark(78, {"127.0.0.1:3185": Reason.LOST}, 1, rewrite=True)
    try:
        asyncio.run(_mark(urm, mark, tracer, ACTION, viewed=42))
    finally:
        tracer.close()
    return [json.loads(x) for x in tracer.path.read_text().splitlines()]


def test_a_written_mark_is_logged_with_when_its_audit_read_the_bookies(tmp_path: Path) -> None:
    (line,) = _run(tmp_path, None)
    assert line["action"] == ACTION
    assert (line["ledger"], line["replicas"], line["decided"]) == (
        78,
        {"127.0.0.1:3185": "LOST"},
        42,
    )
    assert "outcome" not in line


def test_a_mark_whose_answer_was_lost_is_logged_with_its_outcome_unknown(tmp_path: Path) -> None:
    with pytest.raises(ConnectionLoss):
        _run(tmp_path, ConnectionLoss())
    (line,) = [
        json.loads(x) for x in (tmp_path / "trace-autorecovery-x.jsonl").read_text().splitlines()
    ]
    assert (line["ledger"], line["outcome"]) == (78, "unknown")


def test_a_mark_zookeeper_refused_is_not_logged(tmp_path: Path) -> None:
    with pytest.raises(NoAuthError):
        _run(tmp_path, NoAuthError())
    assert (tmp_path / "trace-autorecovery-x.jsonl").read_text() == ""
