"""Porcupine's test suite: every peer history gets its expected verdict."""

from __future__ import annotations

import csv
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bkref.linearizability import wgl
from bkref.linearizability.history import HistoryError, Op, pair
from bkref.linearizability.peer import read_edn_kv, read_jepsen_log, sniff

PEER = Path(__file__).resolve().parents[1] / "data" / "peer-histories"


def _verdicts() -> list[tuple[str, bool]]:
    with open(PEER / "verdicts.tsv", encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t"))
    assert rows[0] == ["file", "linearizable"]
    return [(name, flag == "true") for name, flag in rows[1:]]


VERDICTS = _verdicts()


def test_the_suite_is_all_there() -> None:
    assert len(VERDICTS) == 108
    assert sum(ok for _, ok in VERDICTS) == 26
    assert all((PEER / name).is_file() for name, _ in VERDICTS)


@pytest.mark.parametrize(("name", "linearizable"), VERDICTS, ids=[n for n, _ in VERDICTS])
def test_peer_history_gets_its_verdict(name: str, linearizable: bool) -> None:
    path = PEER / name
    if name.startswith("jepsen/"):
        assert sniff(path) == "jepsen-log"
        ops, model = pair(read_jepsen_log(path)), "cas-register"
    else:
        assert sniff(path) == "edn"
        ops, model = pair(read_edn_kv(path)), "kv"
    result = wgl.check(model, ops, budget=120, jobs=1)
    assert result.verdict == ("valid" if linearizable else "invalid")
    if not linearizable:
        bad = result.invalid[0]
        assert bad.blocked is not None, (
            "an invalid key names the operation that could not be placed"
        )


def test_parallel_workers_reach_the_same_verdicts() -> None:
    for name in ("kv/c50-ok.txt", "kv/c50-bad.txt"):
        ops = pair(read_edn_kv(PEER / name))
        result = wgl.check("kv", ops, budget=120, jobs=2, parallel_min_ops=0)
        assert result.verdict == ("valid" if name.endswith("ok.txt") else "invalid")


@pytest.mark.parametrize(
    ("reader", "good"),
    [
        (read_jepsen_log, b"INFO  jepsen.util - 1 :invoke :read nil\n"),
        (read_edn_kv, b'{:process 1, :type :invoke, :f :get, :key "a", :value nil}\n'),
    ],
)
def test_a_line_that_is_not_utf8_or_a_missing_file_is_a_history_error(
    tmp_path: Path, reader: Callable[[Path], Iterator[Op]], good: bytes
) -> None:
    path = tmp_path / "h.log"
    path.write_bytes(good + b"\xff\xfe\n")
    where = re.escape(str(path))
    with pytest.raises(HistoryError, match=rf"^{where} line 2: not UTF-8 text \(byte 0xff"):
        list(reader(path))
    with pytest.raises(HistoryError, match=r"(?i)no such file"):
        list(reader(tmp_path / "none.log"))
