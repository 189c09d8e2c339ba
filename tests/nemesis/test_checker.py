"""The campaign's durability checker on histories known good and known bad."""

from __future__ import annotations

from pathlib import Path

from bkref.linearizability.testing import HistoryBuilder
from bkref.nemesis.checker import check_durability, check_replication, reason_kind


def _good() -> HistoryBuilder:
    h = HistoryBuilder()
    for e in range(3):
        h.op(1, "add", 7, {"entry": e, "data": f"d{e}"}, {"entry": e, "data": f"d{e}"})
    h.op(2, "recover", 7, None, {"last_entry": 2})
    for e in range(3):
        h.op(3, "read", 7, {"entry": e}, {"entry": e, "found": True, "data": f"d{e}"})
    return h


def test_every_acknowledged_entry_read_back_is_valid() -> None:
    result = check_durability(_good().ops)
    assert result["valid"]
    assert result["acknowledged"] == 3
    assert result["final_reads"] == 3


def test_acknowledged_entry_beyond_the_close_point_is_a_lost_write() -> None:
    h = HistoryBuilder()
    for e in range(3):
        h.op(1, "add", 7, {"entry": e, "data": f"d{e}"}, {"entry": e, "data": f"d{e}"})
    h.op(2, "recover", 7, None, {"last_entry": 1})
    for e in range(2):
        h.op(3, "read", 7, {"entry": e}, {"entry": e, "found": True, "data": f"d{e}"})
    result = check_durability(h.ops)
    assert not result["valid"]
    [anomaly] = result["anomalies"]
    assert anomaly["kind"] == "lost-write"
    assert "closed the ledger at 1" in anomaly["message"]
    assert anomaly["ops"] == [4, 6]  # the add of entry 2 and the recovery


def test_an_entry_whose_final_read_failed_is_unknown_not_lost() -> None:
    # A failed read is no answer: the history cannot say whether entry 0 survived.
    h = HistoryBuilder()
    h.op(1, "add", 7, {"entry": 0, "data": "a"}, {"entry": 0, "data": "a"})
    h.op(2, "recover", 7, None, {"last_entry": 0})
    h.op(3, "read", 7, {"entry": 0}, {"error": "unreachable"}, typ="fail")
    result = check_durability(h.ops)
    assert result["anomalies"] == []
    assert result["unknown"] == {"recovered but not read back": 1}


def test_acknowledged_entry_a_final_read_did_not_find_is_a_lost_write() -> None:
    h = HistoryBuilder()
    h.op(1, "add", 7, {"entry": 0, "data": "a"}, {"entry": 0, "data": "a"})
    h.op(2, "recover", 7, None, {"last_entry": 0})
    h.op(3, "read", 7, {"entry": 0}, {"entry": 0, "found": False})
    result = check_durability(h.ops)
    assert [a["kind"] for a in result["anomalies"]] == ["lost-write"]


def test_other_data_at_an_acknowledged_entry_is_divergent() -> None:
    h = HistoryBuilder()
    h.op(1, "add", 7, {"entry": 0, "data": "a"}, {"entry": 0, "data": "a"})
    h.op(2, "recover", 7, None, {"last_entry": 0})
    h.op(3, "read", 7, {"entry": 0}, {"entry": 0, "found": True, "data": "b"})
    assert [a["kind"] for a in check_durability(h.ops)["anomalies"]] == ["divergent-read"]


def test_reads_before_the_last_recovery_are_not_final() -> None:
    h = HistoryBuilder()
    h.op(1, "add", 7, {"entry": 0, "data": "a"}, {"entry": 0, "data": "a"})
    h.op(3, "read", 7, {"entry": 0}, {"entry": 0, "found": True, "data": "a"})
    h.op(2, "recover", 7, None, {"last_entry": 0})
    result = check_durability(h.ops)
    assert result["anomalies"] == []  # the read before the recovery does not judge it
    assert result["unknown"] == {"recovered but not read back": 1}
    h.op(4, "read", 7, {"entry": 0}, {"entry": 0, "found": True, "data": "a"})
    result = check_durability(h.ops)
    assert (result["valid"], result["unknown_ledgers"]) == (True, 0)


def _converged(**extra: object) -> dict[str, object]:
    """A converged cluster's record: one closed ledger, Wq = Aq = 2, on a and b."""
    row = {
        "ledger": 1,
        "state": "CLOSED",
        "last_entry": 0,
        "ensemble_size": 2,
        "write_quorum": 2,
        "ack_quorum": 2,
        "segments": [{"first_entry": 0, "ensemble": ["a", "b"]}],
    }
    return {"converged": True, "seconds": 1.0, "ledgers": [row], **extra}


def test_a_replica_the_full_check_found_missing_after_convergence_is_an_anomaly(
    tmp_path: Path,
) -> None:
    (tmp_path / "dumps").mkdir()
    entries = [{"bookie": b, "ledger": 1, "entry": 0, "digest": "d"} for b in ("a", "b")]
    clean = check_replication(_converged(missing_after_convergence=[]), entries, tmp_path)
    assert clean["valid"], clean
    # The dumps are whole again (the repair moved the replica back), yet with Wq = Aq a
    # replica missing once the cluster converged was lost by the protocol or a repair.
    lost = _converged(missing_after_convergence=[{"ledger": 1, "bookies": ["b"]}])
    found = check_replication(lost, entries, tmp_path)
    assert not found["valid"]
    assert [a["kind"] for a in found["anomalies"]] == ["under-replicated"]
    assert found["anomalies"][0]["message"] == (
        "ledger 1 (Wq = Aq): after the cluster converged the full replica check found "
        "replicas missing on b"
    )


def test_a_cluster_that_did_not_converge_is_an_anomaly_first(tmp_path: Path) -> None:
    (tmp_path / "dumps").mkdir()
    entries = [{"bookie": b, "ledger": 1, "entry": 0, "digest": "d"} for b in ("a", "b")]
    stuck = _converged(converged=False, seconds=120.0, tasks_left=1, missing_after_convergence=[])
    found = check_replication(stuck, entries, tmp_path)
    assert not found["valid"]
    first = found["anomalies"][0]
    assert (first["kind"], first["tasks_left"]) == ("not-repaired-after-heal", 1)
    assert first["message"] == "the cluster did not converge within 120.0 s"


def test_unknown_ledgers_are_counted_by_why_not_by_which_node() -> None:
    """The run's summary groups unknown ledgers by their reason's kind: the same gap on
    two ledgers (other nodes, bookies, numbers) is one line; two gaps are two."""
    a = (
        "autorecovery-127.0.0.1:3181-0 #5 auditor_marks_ledgers_of_lost_bookies(replicas="
        "{'127.0.0.1:3185': 'LOST'}, rewrite=True) marked 127.0.0.1:3185 lost, and it went on"
    )
    b = a.replace("3181-0 #5", "3182-1 #270").replace("3185", "3183")
    budget = "the time budget (10 s) ran out after 65063 configurations; deepest refusal"
    assert reason_kind(a) == reason_kind(b) == "<step> marked <bookie> lost, and it went on"
    assert reason_kind(budget) == "the time budget (N s) ran out after N configurations"
