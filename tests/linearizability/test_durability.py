"""The durability check on histories known good and known bad."""

from __future__ import annotations

import pytest

from bkref.linearizability.durability import (
    NEVER_RECOVERED,
    NOT_READ_BACK,
    READ_IN_PART,
    check_durability,
    describe,
)
from bkref.linearizability.gen_cli import generate
from bkref.linearizability.history import validate
from bkref.linearizability.testing import HistoryBuilder


def _kinds(h: HistoryBuilder) -> list[str]:
    return [a["kind"] for a in check_durability(h.ops)["anomalies"]]


def test_every_acknowledged_entry_read_back_is_valid() -> None:
    h = HistoryBuilder()
    for e in range(3):
        h.add(1, e, f"d{e}")
    h.op(2, "recover", 7, None, {"last_entry": 2})
    for e in range(3):
        h.read(3, e, f"d{e}")
    result = check_durability(h.ops)
    assert result == {
        "valid": True,
        "acknowledged": 3,
        "final_reads": 3,
        "ledgers": 1,
        "counts": {},
        "anomalies": [],
        "unknown_ledgers": 0,
        "unknown": {},
        "unknown_examples": [],
    }
    assert describe(result) == (
        "durability: valid, every acknowledged entry read back "
        "(3 acknowledged entries in 1 ledgers, 3 found by final reads)"
    )


@pytest.mark.parametrize("seed", range(5))
def test_generated_campaign_histories_are_durable(seed: int) -> None:
    ops = list(validate(generate(3000, 6, seed=seed)))
    result = check_durability(ops)
    assert result["valid"], result["anomalies"][:3]
    assert result["acknowledged"] > 0
    assert result["unknown_ledgers"] == 0  # every ledger recovered and read back


def test_acknowledged_entry_beyond_the_recovered_last_entry_is_a_lost_write() -> None:
    h = HistoryBuilder()
    for e in range(3):
        h.add(1, e, f"d{e}")
    h.op(2, "recover", 7, None, {"last_entry": 1})
    h.read(3, 0, "d0")
    h.read(3, 1, "d1")
    [anomaly] = check_durability(h.ops)["anomalies"]
    assert anomaly["kind"] == "lost-write"
    assert anomaly["ops"] == [4, 6]
    assert "closed the ledger at 1" in anomaly["message"]


def test_a_ledger_never_recovered_is_unknown_not_a_lost_write() -> None:
    h = HistoryBuilder()
    h.add(1, 0, "a")
    h.add(1, 1, "b")
    h.read(3, 0, "a")  # no recovery: not a final read
    result = check_durability(h.ops)
    assert result["valid"]
    assert result["anomalies"] == []
    assert result["unknown"] == {NEVER_RECOVERED: 1}
    assert result["unknown_examples"] == [
        {"ledger": 7, "reason": NEVER_RECOVERED, "acknowledged": 2, "unread": 2}
    ]
    assert describe(result).startswith("durability: no anomaly in what the history decides")
    assert "unknown for 1 of 1 ledgers (never recovered: 1)" in describe(result)


def test_a_ledger_recovered_but_not_read_back_is_unknown() -> None:
    h = HistoryBuilder()
    h.add(1, 0, "a")
    h.read(3, 0, "a")  # before the recovery: not a final read
    h.op(2, "recover", 7, None, {"last_entry": 0})
    h.op(4, "read", 7, {"entry": 0}, {"error": "timeout"}, typ="fail")  # not an answer
    result = check_durability(h.ops)
    assert result["valid"]
    assert result["unknown"] == {NOT_READ_BACK: 1}


def test_a_ledger_read_back_in_part_is_unknown_and_what_was_read_is_still_judged() -> None:
    h = HistoryBuilder()
    for e in range(3):
        h.add(1, e, f"d{e}")
    h.op(2, "recover", 7, None, {"last_entry": 2})
    h.read(3, 0, "d0")
    h.read(3, 1, "other")  # decided: read back with other data
    result = check_durability(h.ops)
    assert result["unknown_examples"] == [
        {"ledger": 7, "reason": READ_IN_PART, "acknowledged": 3, "unread": 1}
    ]
    assert [a["kind"] for a in result["anomalies"]] == ["divergent-read"]
    assert not result["valid"]


def test_an_entry_acked_beyond_the_close_point_is_lost_without_any_final_read() -> None:
    h = HistoryBuilder()
    h.add(1, 0, "a")
    h.add(1, 1, "b")
    h.op(2, "recover", 7, None, {"last_entry": 0})
    result = check_durability(h.ops)
    assert [(a["kind"], a["ops"]) for a in result["anomalies"]] == [("lost-write", [2, 4])]
    assert result["unknown"] == {NOT_READ_BACK: 1}  # entry 0 is still undecided


def test_duplicate_acks_are_decided_without_a_recovery() -> None:
    h = HistoryBuilder()
    h.add(1, 0, "a")
    h.add(5, 0, "b")
    result = check_durability(h.ops)
    assert result["counts"] == {"duplicate": 1}
    assert result["unknown"] == {NEVER_RECOVERED: 1}


def test_only_ledgers_with_acknowledged_entries_are_counted() -> None:
    h = HistoryBuilder()
    h.op(1, "add", 8, {"entry": 0, "data": "x"}, None, typ="info")  # never acknowledged
    h.op(2, "recover", 9, None, {"last_entry": -1})
    result = check_durability(h.ops)
    assert (result["ledgers"], result["unknown_ledgers"], result["valid"]) == (0, 0, True)


def test_acknowledged_entry_a_final_read_did_not_find_is_a_lost_write() -> None:
    h = HistoryBuilder()
    h.add(1, 0, "a")
    h.read(3, 0, "a")  # before the recovery: not a final read
    h.op(2, "recover", 7, None, {"last_entry": 0})
    h.read(4, 0, None)  # "no such entry" is not finding it
    result = check_durability(h.ops)
    assert [a["kind"] for a in result["anomalies"]] == ["lost-write"]
    assert "a final read found no such entry" in result["anomalies"][0]["message"]
    assert result["unknown_ledgers"] == 0


def test_final_read_with_other_data_is_divergent() -> None:
    h = HistoryBuilder()
    h.add(1, 0, "a")
    h.op(2, "recover", 7, None, {"last_entry": 0})
    h.read(3, 0, "b")
    [anomaly] = check_durability(h.ops)["anomalies"]
    assert (anomaly["kind"], anomaly["ops"]) == ("divergent-read", [0, 4])


def test_final_read_beyond_the_recovered_last_entry_is_a_read_of_a_truncated_entry() -> None:
    h = HistoryBuilder()
    h.add(1, 0, "a")
    h.op(2, "recover", 7, None, {"last_entry": 0})
    h.read(3, 0, "a")
    h.read(4, 1, "x")
    [anomaly] = check_durability(h.ops)["anomalies"]
    assert (anomaly["kind"], anomaly["ops"]) == ("read-of-truncated-entry", [6, 2])


def test_two_acknowledged_adds_of_one_entry_are_a_duplicate() -> None:
    h = HistoryBuilder()
    h.add(1, 0, "a")
    h.add(5, 0, "b")
    h.op(2, "recover", 7, None, {"last_entry": 0})
    h.read(3, 0, "b")
    [anomaly] = check_durability(h.ops)["anomalies"]
    assert (anomaly["kind"], anomaly["ops"]) == ("duplicate", [0, 2])


def test_two_final_reads_of_one_entry_with_different_data_are_divergent() -> None:
    h = HistoryBuilder()
    h.add(1, 0, "a")
    h.op(2, "recover", 7, None, {"last_entry": 0})
    h.read(3, 0, "b")
    h.read(4, 0, "a")  # the last read agrees with the ack, the one before did not
    [anomaly] = check_durability(h.ops)["anomalies"]
    assert (anomaly["kind"], anomaly["ops"]) == ("divergent-read", [4, 6])
    assert "as 'b' and as 'a'" in anomaly["message"]


def test_only_the_last_recovery_decides_and_failed_adds_do_not_count() -> None:
    h = HistoryBuilder()
    h.add(1, 0, "a")
    h.op(2, "recover", 7, None, {"last_entry": 0})
    h.read(3, 0, "a")
    h.op(6, "add", 7, {"entry": 1, "data": "x"}, {"error": "fenced"}, typ="fail")
    h.op(4, "recover", 7, None, {"last_entry": 0})  # the last recovery: earlier reads are not final
    assert check_durability(h.ops)["unknown"] == {NOT_READ_BACK: 1}
    h.read(5, 0, None)
    assert _kinds(h) == ["lost-write"]
    h.read(5, 0, "a")
    assert _kinds(h) == []


def test_planted_duplicate_in_a_generated_history_is_found() -> None:
    ops = list(validate(generate(2000, 4, seed=3, anomaly="duplicate")))
    result = check_durability(ops)
    assert result["counts"] == {"duplicate": 1}
