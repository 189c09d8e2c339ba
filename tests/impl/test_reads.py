"""The client's readers (bkref/impl/core/reads.py): what a read's answers prove, without I/O.

An entry read asks its write set one replica at a time; a LAC read asks the last
ensemble at once. Each test feeds answers and checks the actions that come out.
"""

from __future__ import annotations

from dataclasses import FrozenInstanceError

import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from bkref.impl.core.actions import (
    LocalProtocolError,
    ReadCompleted,
    ReadLacCompleted,
    SendRead,
    SendReadLac,
)
from bkref.impl.core.digest import Digest, DigestType, password_hash
from bkref.impl.core.frames import Status
from bkref.impl.core.metadata import LedgerMetadata, LedgerState, Segment
from bkref.impl.core.reads import EntryReader, LacReader, read_order

PW = b"pw"
LEDGER = 9
DIGEST = Digest(DigestType.CRC32C, PW)


def _md(e: int, wq: int, aq: int, *, segments: tuple[Segment, ...] | None = None) -> LedgerMetadata:
    return LedgerMetadata(
        e,
        wq,
        aq,
        segments or (Segment(0, tuple(f"b{i}" for i in range(e))),),
        DigestType.CRC32C,
        password_hash(PW),
    )


def _body(entry: int, data: bytes = b"data") -> bytes:
    return DIGEST.sign(LEDGER, entry, entry - 1, 100 + entry, data)


def _reader(md: LedgerMetadata, entry: int) -> EntryReader:
    r = EntryReader(LEDGER, md, entry, DIGEST)
    r.start()
    return r


def _sent(r: EntryReader) -> str:
    """The one bookie the reader asks next."""
    actions = r.take_actions()
    assert len(actions) == 1, actions
    a = actions[0]
    assert isinstance(a, SendRead)
    assert (a.ledger_id, a.entry_id, a.fence) == (LEDGER, r.entry_id, False)
    return a.bookie


def _completed(r: EntryReader) -> ReadCompleted:
    actions = r.take_actions()
    assert len(actions) == 1, actions
    done = actions[0]
    assert isinstance(done, ReadCompleted)
    assert r.result == done
    return done


# ---------------------------------------------------------------- entry reads


def test_a_verified_copy_from_the_first_replica_is_the_answer_and_no_one_else_is_asked() -> None:
    md = _md(3, 2, 2)
    r = _reader(md, 4)
    first = _sent(r)
    assert first == read_order(md, 4)[0]
    r.on_read_response(first, Status.OK, _body(4, b"four"))
    done = _completed(r)
    assert (done.status, done.data, done.digest_mismatches) == (Status.OK, b"four", ())
    assert r.asking is None


def test_a_reader_asks_no_replica_before_it_starts_and_then_the_first_in_read_order() -> None:
    md = _md(3, 2, 2)
    r = EntryReader(LEDGER, md, 4, DIGEST)
    assert r.asking is None
    r.start()
    assert r.asking == _sent(r) == read_order(md, 4)[0]


def test_a_corrupt_copy_counts_as_an_error_and_the_next_replica_serves() -> None:
    md = _md(3, 3, 2)
    r = _reader(md, 0)
    first = _sent(r)
    bad = bytearray(_body(0))
    bad[-1] ^= 0x01
    r.on_read_response(first, Status.OK, bytes(bad))
    second = _sent(r)
    assert second != first
    r.on_read_response(second, Status.OK, _body(0, b"zero"))
    done = _completed(r)
    assert (done.status, done.data) == (Status.OK, b"zero")
    assert [b for b, _why in done.digest_mismatches] == [first]


def test_negatives_from_every_replica_prove_the_entry_absent() -> None:
    md = _md(3, 2, 2)
    r = _reader(md, 5)
    for _ in range(2):
        r.on_read_response(_sent(r), Status.NO_SUCH_ENTRY)
    done = _completed(r)
    assert done.status is Status.NO_SUCH_ENTRY
    assert "every replica of its write set" in done.message


def test_negatives_from_all_but_an_unreachable_replica_leave_the_entry_unknown() -> None:
    # Wq 3, Aq 2: two negatives would prove absence by coverage, but the third replica may
    # be the one holder left after a disk lost fsynced data: unknown, not absent.
    md = _md(3, 3, 2)
    r = _reader(md, 1)
    r.on_read_response(_sent(r), Status.NO_SUCH_ENTRY)
    r.on_bookie_unavailable(_sent(r), "connection refused")
    r.on_read_response(_sent(r), Status.NO_SUCH_LEDGER)
    done = _completed(r)
    assert done.status is Status.IO_ERROR
    assert "only 2 of the 3 replicas" in done.message
    assert "connection refused" in done.message


def test_one_negative_among_failures_leaves_the_entry_unknown() -> None:
    md = _md(3, 3, 2)
    r = _reader(md, 1)
    r.on_read_response(_sent(r), Status.NO_SUCH_ENTRY)
    r.on_bookie_unavailable(_sent(r), "no response in 10.0 s")
    r.on_read_response(_sent(r), Status.IO_ERROR)
    done = _completed(r)
    assert done.status is Status.IO_ERROR
    assert "only 1 of the 3 replicas" in done.message
    assert "retry once the bookies are reachable" in done.message


def test_a_verified_copy_wins_over_negatives_that_would_prove_absence() -> None:
    md = _md(3, 3, 2)
    r = _reader(md, 2)
    r.on_read_response(_sent(r), Status.NO_SUCH_ENTRY)
    r.on_read_response(_sent(r), Status.NO_SUCH_ENTRY)
    r.on_read_response(_sent(r), Status.OK, _body(2, b"two"))
    done = _completed(r)
    assert (done.status, done.data) == (Status.OK, b"two")


def test_no_replica_reachable_is_an_io_error_naming_each_failure() -> None:
    md = _md(2, 2, 1)
    r = _reader(md, 0)
    asked = []
    for _ in range(2):
        b = _sent(r)
        asked.append(b)
        r.on_bookie_unavailable(b, f"{b} is down")
    done = _completed(r)
    assert done.status is Status.IO_ERROR
    assert all(f"{b} is down" in done.message for b in asked)


def test_the_replicas_of_the_entrys_own_segment_are_asked() -> None:
    md = _md(2, 2, 2, segments=(Segment(0, ("b0", "b1")), Segment(10, ("b0", "b2"))))
    r = _reader(md, 11)
    first = _sent(r)
    r.on_read_response(first, Status.NO_SUCH_ENTRY)
    second = _sent(r)
    assert {first, second} == {"b0", "b2"}


def test_an_answer_the_reader_did_not_ask_for_is_a_local_error() -> None:
    md = _md(3, 2, 2)
    r = _reader(md, 0)
    first = _sent(r)
    other = next(b for b in md.last_segment.ensemble if b != first)
    with pytest.raises(LocalProtocolError, match=f"from {other}, which it did not ask"):
        r.on_read_response(other, Status.OK, _body(0))
    r.on_read_response(first, Status.OK, _body(0))
    _completed(r)
    with pytest.raises(LocalProtocolError, match="done"):
        r.on_bookie_unavailable(first, "late")
    with pytest.raises(LocalProtocolError, match="started twice"):
        r.start()


def test_a_reads_completion_is_an_immutable_value() -> None:
    """The completion handed out is the reader's ``result`` too: neither can be changed
    under the other, and like every action it is a hashable value (a shell may keep
    completions in a set or key a dict by them)."""
    r = _reader(_md(3, 2, 2), 4)
    r.on_read_response(_sent(r), Status.OK, _body(4, b"four"))
    done = _completed(r)
    assert done is r.result
    with pytest.raises(FrozenInstanceError):
        done.data = b"other"  # type: ignore[misc]
    assert r.result.data == b"four"
    assert {done, ReadCompleted(4, Status.OK, b"four")} == {done}


ANSWERS = st.sampled_from(["valid", "corrupt", "absent", "error", "unavailable"])


@given(
    sizes=st.tuples(st.integers(1, 5), st.integers(1, 5), st.integers(1, 5)).filter(
        lambda s: s[0] >= s[1] >= s[2]
    ),
    entry=st.integers(0, 20),
    answers=st.lists(ANSWERS, min_size=5, max_size=5),
)
def test_an_entry_read_is_found_absent_or_unknown_as_its_answers_say(
    sizes: tuple[int, int, int], entry: int, answers: list[str]
) -> None:
    e, wq, aq = sizes
    md = _md(e, wq, aq)
    r = _reader(md, entry)
    asked: list[str] = []
    while r.result is None:
        b = _sent(r)
        kind = answers[len(asked)]
        asked.append(b)
        note(f"{b}: {kind}")
        if kind == "valid":
            r.on_read_response(b, Status.OK, _body(entry))
        elif kind == "corrupt":
            r.on_read_response(b, Status.OK, _body(entry + 1))  # another entry's copy
        elif kind == "absent":
            r.on_read_response(b, Status.NO_SUCH_ENTRY)
        elif kind == "error":
            r.on_read_response(b, Status.IO_ERROR)
        else:
            r.on_bookie_unavailable(b, "down")
    done = _completed(r)
    given_answers = answers[: len(asked)]
    # Oracle: a verified copy stops the read; otherwise all Wq replicas were asked, and
    # only negatives from every one of them make the entry absent.
    if "valid" in given_answers:
        assert done.status is Status.OK
        assert given_answers.index("valid") == len(asked) - 1
    else:
        assert len(asked) == wq
        absent = given_answers.count("absent") == wq
        assert done.status is (Status.NO_SUCH_ENTRY if absent else Status.IO_ERROR)
    assert len(done.digest_mismatches) == given_answers.count("corrupt")
    assert asked == read_order(md, entry)[: len(asked)]


# ---------------------------------------------------------------- LAC reads


def _lac_reader(md: LedgerMetadata) -> LacReader:
    r = LacReader(LEDGER, md)
    r.start()
    actions = r.take_actions()
    sends = [a for a in actions if isinstance(a, SendReadLac) and not a.fence]
    assert sends == actions  # one unfenced LAC read per bookie, nothing else
    assert [a.bookie for a in sends] == list(md.last_segment.ensemble)
    return r


def _lac_completed(r: LacReader) -> ReadLacCompleted:
    actions = r.take_actions()
    assert len(actions) == 1, actions
    done = actions[0]
    assert isinstance(done, ReadLacCompleted)
    return done


def test_lac_is_the_highest_reported_once_the_answers_cover_every_write_set() -> None:
    md = _md(3, 2, 2)  # write sets {0,1} {1,2} {2,0}: one answer of each is coverage
    r = _lac_reader(md)
    r.on_read_lac_response("b0", Status.OK, 7)
    r.on_read_lac_response("b1", Status.OK, 9)
    assert r.covered
    assert r.take_actions() == []  # covered, but b2 may report a higher LAC: wait for it
    r.on_bookie_unavailable("b2", "down")
    assert _lac_completed(r) == ReadLacCompleted(True, 9)


def test_lac_answers_that_miss_a_write_set_are_not_enough() -> None:
    md = _md(3, 2, 2)
    r = _lac_reader(md)
    r.on_read_lac_response("b0", Status.OK, 7)  # b0 is in {0,1} and {2,0}, not in {1,2}
    r.on_bookie_unavailable("b1", "down")
    r.on_read_lac_response("b2", Status.IO_ERROR, -1)
    assert not r.covered
    done = _lac_completed(r)
    assert not done.ok
    assert "too few bookies answered the LAC read (1 of 3" in done.message
    assert "b1: down" in done.message
    assert "retry once more bookies are reachable" in done.message


def test_lac_coverage_needs_wq_minus_aq_plus_one_answers_of_each_write_set() -> None:
    md = _md(3, 3, 2)  # one write set {0,1,2}: two answers cover it
    r = _lac_reader(md)
    r.on_read_lac_response("b0", Status.NO_SUCH_LEDGER, -1)
    r.on_bookie_unavailable("b1", "down")
    r.on_read_lac_response("b2", Status.OK, 3)
    assert _lac_completed(r) == ReadLacCompleted(True, 3)


def test_lac_is_never_below_the_entry_before_the_last_segment() -> None:
    md = _md(2, 2, 2, segments=(Segment(0, ("b0", "b1")), Segment(20, ("b0", "b2"))))
    r = _lac_reader(md)
    r.on_read_lac_response("b0", Status.NO_SUCH_LEDGER, -1)
    r.on_read_lac_response("b2", Status.OK, -1)
    assert _lac_completed(r) == ReadLacCompleted(True, 19)


def test_a_closed_ledgers_lac_is_its_last_entry() -> None:
    md = _md(2, 2, 2).closed(41, 1000)
    assert md.state is LedgerState.CLOSED
    r = _lac_reader(md)
    r.on_read_lac_response("b0", Status.OK, 40)
    r.on_read_lac_response("b1", Status.OK, 40)
    assert _lac_completed(r) == ReadLacCompleted(True, 41)


def test_a_lac_answer_twice_or_from_outside_the_ensemble_is_a_local_error() -> None:
    md = _md(2, 2, 2)
    r = LacReader(LEDGER, md)
    with pytest.raises(LocalProtocolError):
        r.on_read_lac_response("b0", Status.OK, 1)  # not started
    r.start()
    r.on_read_lac_response("b0", Status.OK, 1)
    with pytest.raises(LocalProtocolError, match="answered already"):
        r.on_read_lac_response("b0", Status.OK, 2)
    with pytest.raises(LocalProtocolError, match="b9"):
        r.on_bookie_unavailable("b9", "down")
