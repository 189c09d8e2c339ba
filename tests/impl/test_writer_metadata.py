"""The writer's metadata writes, event by event: the ensemble change it proposes, a CAS
that meets another client's write, a write whose outcome is unknown, and the add timeout.

Each test drives one :class:`LedgerWriter` by hand (no bookies: the test answers its
sends), so the state each event meets is exact. The in-memory ``MetaStore`` plays
ZooKeeper's versioned CAS.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from bkref.impl.core.actions import (
    Action,
    AddCompleted,
    CloseCompleted,
    NeedReplacement,
    SendAdd,
    WriteMetadata,
)
from bkref.impl.core.frames import Status
from bkref.impl.core.metadata import LedgerMetadata, LedgerState, Segment
from bkref.impl.core.sim import MetaStore
from bkref.impl.core.writer import PLANT_UNDO_SWAP, LedgerWriter, WriterState
from tests.impl.client_sim import LEDGER, setup_cluster

FIRST = ("b0", "b1", "b2")


def _writer(
    *, add_timeout_ticks: int | None = None, plants: frozenset[str] = frozenset()
) -> tuple[LedgerWriter, MetaStore]:
    """A writer of a new ledger (E = Wq = 3, Aq = 2 on b0, b1, b2) with entries 0-2
    confirmed by every bookie: its LAC is 2."""
    _cluster, store, digest = setup_cluster(3, 3, 2, 6)
    w = LedgerWriter(
        LEDGER,
        store.metadata,
        store.version,
        digest,
        add_timeout_ticks=add_timeout_ticks,
        plants=plants,
    )
    for i in range(3):
        w.add(b"e%d" % i)
        for a in w.take_actions():
            if isinstance(a, SendAdd):
                w.on_add_response(a.bookie, a.entry_id, Status.OK)
    assert w.lac == 2
    w.take_actions()
    return w, store


def _one(actions: list[Action]) -> Action:
    assert len(actions) == 1, actions
    return actions[0]


def _change(w: LedgerWriter, failed: str, new: str) -> WriteMetadata:
    """Entry 3 added; ``failed`` refuses it; the shell picks ``new``: the proposal."""
    if w.next_entry == 3:
        w.add(b"e3")
        w.take_actions()
    w.on_add_response(failed, 3, Status.IO_ERROR)
    assert _one(w.take_actions()) == NeedReplacement(failed, w.ensemble)
    w.replace(failed, new)
    cas = _one(w.take_actions())
    assert isinstance(cas, WriteMetadata)
    return cas


def _proposed(w: LedgerWriter) -> LedgerMetadata | None:
    return w.proposed  # read through a call: mypy would keep an earlier narrowing


def _land(w: LedgerWriter, store: MetaStore, cas: WriteMetadata) -> None:
    assert store.cas(cas)
    w.on_metadata_written(store.version)


def test_an_ensemble_change_proposes_a_segment_from_lac_plus_one_and_shows_it_until_it_lands() -> (
    None
):
    w, store = _writer()
    assert _proposed(w) is None
    cas = _change(w, "b0", "b3")
    assert cas.metadata.segments == (Segment(0, FIRST), Segment(3, ("b3", "b1", "b2")))
    assert cas.expected_version == store.version
    assert cas.reason == "ensemble change: b0 -> b3 from entry 3"  # what the shell logs
    assert _proposed(w) == cas.metadata  # observers (the refinement machine) see the CAS
    _land(w, store, cas)
    assert _proposed(w) is None
    assert w.state is WriterState.OPEN
    assert [a.bookie for a in w.take_actions() if isinstance(a, SendAdd)] == ["b3"]


def test_a_bookie_failing_during_a_change_gets_its_own_change_once_the_first_lands() -> None:
    w, store = _writer()
    w.add(b"e3")
    w.take_actions()
    w.on_add_response("b0", 3, Status.IO_ERROR)
    assert _one(w.take_actions()) == NeedReplacement("b0", FIRST)
    w.on_add_response("b1", 3, Status.IO_ERROR)  # a second failure while the first waits
    assert w.take_actions() == []
    w.replace("b0", "b3")  # the first in failure order
    cas = _one(w.take_actions())
    assert isinstance(cas, WriteMetadata)
    _land(w, store, cas)
    assert _one(w.take_actions()) == NeedReplacement("b1", ("b3", "b1", "b2"))
    with pytest.raises(Exception, match="unexpected replacement of b2"):
        w.replace("b2", "b4")  # only the bookie the writer asked about


def _retry_after_a_swap(w: LedgerWriter, store: MetaStore) -> WriteMetadata:
    """b0 replaced by b3 from entry 3; then a worker swaps b4 into segment 0 while the
    writer replaces b1 by b5: the writer's CAS fails, and it retries at the new version."""
    _land(w, store, _change(w, "b0", "b3"))
    w.take_actions()
    swapped = replace(
        store.metadata, segments=(Segment(0, ("b4", "b1", "b2")), *store.metadata.segments[1:])
    )
    assert store.cas(WriteMetadata(swapped, store.version, "a worker's swap"))
    assert not store.cas(_change(w, "b1", "b5"))
    w.on_metadata_conflict(store.metadata, store.version)
    retry = _one(w.take_actions())
    assert isinstance(retry, WriteMetadata)
    assert retry.expected_version == store.version
    return retry


def test_a_change_retried_on_a_worker_swap_keeps_the_swap_and_its_own_segment() -> None:
    # BOOKKEEPER-667: the retry writes the stored earlier segments, not the writer's view.
    w, store = _writer()
    retry = _retry_after_a_swap(w, store)
    assert retry.metadata.segments == (
        Segment(0, ("b4", "b1", "b2")),
        Segment(3, ("b3", "b5", "b2")),
    )
    _land(w, store, retry)
    assert w.state is WriterState.OPEN
    assert store.metadata.segments[0].ensemble == ("b4", "b1", "b2")


def test_the_planted_undo_swap_retries_with_the_writers_own_earlier_segments() -> None:
    w, store = _writer(plants=frozenset({PLANT_UNDO_SWAP}))
    retry = _retry_after_a_swap(w, store)
    assert retry.metadata.segments[0] == Segment(0, FIRST)  # the worker's swap undone


def test_a_change_that_meets_a_recovery_fails_every_pending_add_as_fenced() -> None:
    w, store = _writer()
    cas = _change(w, "b0", "b3")
    marked = replace(store.metadata, state=LedgerState.IN_RECOVERY)
    assert store.cas(WriteMetadata(marked, store.version, "a recovery's mark"))
    assert not store.cas(cas)
    w.on_metadata_conflict(store.metadata, store.version)
    (done,) = w.take_actions()
    assert isinstance(done, AddCompleted)
    assert (done.entry_id, done.status) == (3, Status.FENCED)
    assert w.state is WriterState.FENCED
    assert w.add(b"late") == 4
    assert _one(w.take_actions()) == AddCompleted(4, Status.FENCED, w.error)


def test_a_change_whose_write_outcome_is_unknown_fails_the_adds_not_a_close() -> None:
    w, _store = _writer()
    _change(w, "b0", "b3")
    w.on_metadata_failed("ZooKeeper connection lost")
    assert w.take_actions() == [AddCompleted(3, Status.IO_ERROR, "ZooKeeper connection lost")]
    assert w.state is WriterState.FAILED


def test_a_close_whose_write_outcome_is_unknown_fails_the_close() -> None:
    w, _store = _writer()
    w.close()
    assert isinstance(_one(w.take_actions()), WriteMetadata)
    w.on_metadata_failed("ZooKeeper connection lost")
    assert w.take_actions() == [CloseCompleted(False, 2, w.length, "ZooKeeper connection lost")]
    assert w.state is WriterState.FAILED


def test_an_add_times_out_add_timeout_ticks_after_its_own_send() -> None:
    w, _store = _writer(add_timeout_ticks=3)
    for _ in range(5):  # time passes before the add: its clock starts at its send
        w.tick()
    w.add(b"e3")
    assert len(w.take_actions()) == 3  # sent to b0, b1, b2; none answers
    for _ in range(2):
        w.tick()
        assert w.take_actions() == []
    w.tick()
    assert w.take_actions() == [NeedReplacement("b0", FIRST)]


def test_the_in_memory_store_takes_a_cas_only_at_its_version() -> None:
    _cluster, store, _digest = setup_cluster(3, 3, 2, 3)
    md = store.metadata
    assert store.version == 0  # a new ledger's first version, as ZooKeeper's create gives
    assert not store.cas(WriteMetadata(md, 1, "ahead of the store"))
    assert store.cas(WriteMetadata(md, 0, "at its version"))
    assert store.version == 1
    assert not store.cas(WriteMetadata(md, 0, "behind the store"))


def test_acks_from_the_replaced_bookie_no_longer_count_once_the_change_lands() -> None:
    # b0 acknowledged entries 3 and 4, then failed on 5 and was replaced by b3 from entry
    # 3. b0 is no longer in those entries' ensemble, so a read would never look there:
    # its acks are dropped and the three entries go to b3 (BookKeeper's
    # LedgerHandle.ensembleChangeLoop -> PendingAddOp.unsetSuccessAndSendWriteRequest).
    w, store = _writer()
    for i in (3, 4, 5):
        w.add(b"e%d" % i)
    w.take_actions()
    w.on_add_response("b0", 3, Status.OK)
    w.on_add_response("b0", 4, Status.OK)
    w.on_add_response("b0", 5, Status.IO_ERROR)
    assert _one(w.take_actions()) == NeedReplacement("b0", FIRST)
    w.replace("b0", "b3")
    cas = _one(w.take_actions())
    assert isinstance(cas, WriteMetadata)
    assert cas.metadata.last_segment == Segment(3, ("b3", "b1", "b2"))
    _land(w, store, cas)
    sent = [(a.bookie, a.entry_id) for a in w.take_actions() if isinstance(a, SendAdd)]
    assert sorted(sent) == [("b3", 3), ("b3", 4), ("b3", 5)]
    w.on_add_response("b1", 3, Status.OK)  # one ack of the new ensemble is short of Aq
    assert w.lac == 2
    w.on_add_response("b3", 3, Status.OK)
    assert w.lac == 3


def test_a_close_that_meets_a_close_short_of_the_writers_lac_fails() -> None:
    # Another client closed the ledger at entry 1 while this writer had confirmed 2: the
    # close must not report success on metadata that drops a confirmed entry.
    w, store = _writer()
    w.close()
    cas = _one(w.take_actions())
    assert isinstance(cas, WriteMetadata)
    short = store.metadata.closed(1, 4)
    assert store.cas(WriteMetadata(short, store.version, "another client's close"))
    assert not store.cas(cas)
    w.on_metadata_conflict(store.metadata, store.version)
    (done,) = w.take_actions()
    assert done == CloseCompleted(False, 2, w.length, w.error)
    assert w.state is WriterState.FENCED
    assert "CLOSED by another client (last entry 1); this writer confirmed up to 2" in w.error
