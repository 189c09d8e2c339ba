"""The writer and recovery state machines, driven over in-memory bookies in drawn orders."""

from __future__ import annotations

from hypothesis import given, note, settings
from hypothesis import strategies as st

from bkref.impl.core.actions import (
    AddCompleted,
    CloseCompleted,
    NeedReplacement,
    RecoveryCompleted,
    SendAdd,
    SendRead,
    WriteMetadata,
)
from bkref.impl.core.digest import Digest, DigestType, password_hash, peek_header
from bkref.impl.core.frames import (
    Status,
)
from bkref.impl.core.metadata import LedgerMetadata, LedgerState, Segment
from bkref.impl.core.recovery import LedgerRecovery
from bkref.impl.core.sim import MetaStore, SimCluster
from bkref.impl.core.writer import LedgerWriter, WriterState
from tests.impl.client_sim import (
    LEDGER,
    PW,
    Driver,
    run_all,
    setup_cluster,
    start_recovery,
    write_entries,
)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 30), st.data())
def test_completions_are_in_entry_order_whatever_the_ack_order(n: int, data: st.DataObject) -> None:
    cluster, store, digest = setup_cluster(3, 2, 2, 3)
    w = LedgerWriter(LEDGER, store.metadata, store.version, digest)
    drv = Driver(cluster, store, w, "w")
    for i in range(n):
        assert w.add(b"x%d" % i) == i
    drv.pump()
    run_all(cluster, {"w": drv}, data)
    assert [c.entry_id for c in drv.completed] == list(range(n))
    assert all(c.status is Status.OK for c in drv.completed)
    assert w.lac == n - 1


@settings(max_examples=150, deadline=None)
@given(st.integers(2, 20), st.data())
def test_ensemble_change_holds_acks_until_the_metadata_cas_lands(
    n: int, data: st.DataObject
) -> None:
    cluster, store, digest = setup_cluster(3, 3, 2, 4)
    w = LedgerWriter(LEDGER, store.metadata, store.version, digest)
    drv = Driver(cluster, store, w, "w")
    for i in range(n):
        w.add(b"y%d" % i)
    drv.pump()
    run_all(cluster, {"w": drv}, data, limit=data.draw(st.integers(0, 3 * n)))
    victim = data.draw(st.sampled_from(["b0", "b1", "b2"]))
    cluster.bookies[victim].alive = False
    note(f"killed {victim}")
    run_all(cluster, {"w": drv}, data)
    assert [c.entry_id for c in drv.completed] == list(range(n))
    # Every confirmed entry is on Aq bookies of its write set in the metadata as stored.
    meta = store.metadata
    for e in range(n):
        ens = meta.ensemble_for(e)
        holders = [
            ens[i]
            for i in meta.quorum.write_set(e)
            if (LEDGER, e) in cluster.bookies[ens[i]].entries and cluster.bookies[ens[i]].alive
        ]
        assert len(holders) >= 2, (e, meta)
    assert w.pending == 0


def test_no_completion_while_the_ensemble_change_is_outstanding() -> None:
    _cluster, store, digest = setup_cluster(3, 3, 2, 4)
    w = LedgerWriter(LEDGER, store.metadata, store.version, digest)
    w.add(b"a")
    sends = [a for a in w.take_actions() if isinstance(a, SendAdd)]
    w.on_add_response(sends[0].bookie, 0, Status.IO_ERROR)
    (need,) = w.take_actions()
    assert isinstance(need, NeedReplacement)
    w.replace(need.failed, "b3")
    (cas,) = w.take_actions()
    assert isinstance(cas, WriteMetadata)
    # Aq acks arrive while the CAS is outstanding: BOOKKEEPER-1591 says hold them.
    w.on_add_response(sends[1].bookie, 0, Status.OK)
    w.on_add_response(sends[2].bookie, 0, Status.OK)
    assert w.take_actions() == []
    assert store.cas(cas)
    w.on_metadata_written(store.version)
    out = w.take_actions()
    assert AddCompleted(0, Status.OK) in out
    # Confirmed by the held acks when the CAS landed: not re-sent to the replacement
    # (the spec resends only entries above the LAC).
    assert [a.bookie for a in out if isinstance(a, SendAdd)] == []


def test_entries_still_pending_when_the_change_lands_go_to_the_replacement() -> None:
    _cluster, store, digest = setup_cluster(3, 3, 2, 4)
    w = LedgerWriter(LEDGER, store.metadata, store.version, digest)
    w.add(b"a")
    sends = [a for a in w.take_actions() if isinstance(a, SendAdd)]
    w.on_add_response(sends[0].bookie, 0, Status.IO_ERROR)
    (need,) = w.take_actions()
    assert isinstance(need, NeedReplacement)
    w.replace(need.failed, "b3")
    (cas,) = w.take_actions()
    assert isinstance(cas, WriteMetadata)
    w.on_add_response(sends[1].bookie, 0, Status.OK)  # one ack: Aq = 2 not reached
    assert store.cas(cas)
    w.on_metadata_written(store.version)
    out = w.take_actions()
    assert [a.bookie for a in out if isinstance(a, SendAdd)] == ["b3"]
    assert not [a for a in out if isinstance(a, AddCompleted)]


def test_a_bookie_that_never_answers_is_replaced_after_the_add_timeout() -> None:
    cluster, store, digest = setup_cluster(3, 3, 3, 4)
    w = LedgerWriter(LEDGER, store.metadata, store.version, digest, add_timeout_ticks=5)
    drv = Driver(cluster, store, w, "w")
    w.add(b"t0")
    w.add(b"t1")
    drv.pump()
    silent = "b1"  # swallows its requests; the others answer
    cluster.inflight = [d for d in cluster.inflight if d.action.bookie != silent]
    run_all(cluster, {"w": drv}, None)
    for _ in range(4):
        w.tick()
        drv.pump()
    assert drv.completed == []  # Aq = 3 needs b1, and 4 ticks are not yet the timeout
    assert silent in store.metadata.last_segment.ensemble
    w.tick()
    drv.pump()
    run_all(cluster, {"w": drv}, None)
    assert silent not in store.metadata.last_segment.ensemble
    assert [c.entry_id for c in drv.completed] == [0, 1]


def test_close_with_adds_in_flight_fails_them_and_closes_at_the_lac() -> None:
    # BookKeeper's close fails pending adds and closes at the LAC (the spec's
    # writer_closes_ledger): an unacknowledged entry is not part of the ledger.
    _cluster, store, digest = setup_cluster(3, 2, 2, 3)
    w = LedgerWriter(LEDGER, store.metadata, store.version, digest)
    w.add(b"a")
    w.take_actions()
    w.close()
    actions = w.take_actions()
    failed = [a for a in actions if isinstance(a, AddCompleted)]
    assert [(a.entry_id, a.status) for a in failed] == [(0, Status.IO_ERROR)]
    (cas,) = [a for a in actions if isinstance(a, WriteMetadata)]
    assert cas.metadata.is_closed
    assert cas.metadata.last_entry == -1
    w.on_add_response(store.metadata.last_segment.ensemble[0], 0, Status.OK)
    assert w.lac == -1  # a late ack changes nothing
    assert not w.take_actions()


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 12),
    st.sampled_from([(3, 3, 2), (3, 2, 2), (4, 3, 2), (3, 3, 3)]),
    st.booleans(),
    st.data(),
)
def test_recovery_keeps_every_acknowledged_entry_and_fences_the_old_writer(
    n: int, eqa: tuple[int, int, int], kill_one: bool, data: st.DataObject
) -> None:
    e, wq, aq = eqa
    cluster, store, digest = setup_cluster(e, wq, aq, e)
    w = LedgerWriter(LEDGER, store.metadata, store.version, digest)
    wd = Driver(cluster, store, w, "w")
    for i in range(n):
        w.add(b"z%d" % i)
    wd.pump()
    run_all(cluster, {"w": wd}, data, limit=data.draw(st.integers(0, n * wq)))
    acked = [c.entry_id for c in wd.completed if c.status is Status.OK]
    note(f"acked before the writer stopped: {acked}")
    if kill_one and wq > aq:
        cluster.bookies[data.draw(st.sampled_from(sorted(cluster.bookies)))].alive = False
    r = LedgerRecovery(LEDGER, store.metadata, store.version, digest)
    rd = Driver(cluster, store, r, "r")
    r.start()
    rd.pump()
    # The old writer's requests still in flight interleave with recovery's.
    run_all(cluster, {"w": wd, "r": rd}, data)
    acked = [c.entry_id for c in wd.completed if c.status is Status.OK]
    (done,) = rd.finished
    assert isinstance(done, RecoveryCompleted)
    assert done.ok, done.message
    assert store.metadata.state is LedgerState.CLOSED
    last = store.metadata.last_entry
    assert all(a <= last for a in acked), (acked, last)
    # Every entry up to the last one is on Aq live bookies of its write set, digest intact.
    for entry in range(last + 1):
        ens = store.metadata.ensemble_for(entry)
        good = 0
        for idx in store.metadata.quorum.write_set(entry):
            b = cluster.bookies[ens[idx]]
            body = b.entries.get((LEDGER, entry))
            if b.alive and body is not None:
                assert digest.verify(body, LEDGER, entry).data == b"z%d" % entry
                good += 1
        assert good >= 1
    # The old writer's next add fails as fenced.
    if w.state is WriterState.OPEN:
        nxt = w.add(b"late")
        wd.pump()
        run_all(cluster, {"w": wd, "r": rd}, None)
        late = [c for c in wd.completed if c.entry_id == nxt]
        assert late
        assert late[0].status is not Status.OK


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 8), st.data())
def test_recovery_replaces_a_dead_write_back_bookie_by_an_ensemble_change(
    n: int, data: st.DataObject
) -> None:
    """With Wq = Aq a dead bookie blocks every write-back: recovery must change the ensemble."""
    cluster, store, digest = setup_cluster(3, 3, 3, 4)
    w = LedgerWriter(LEDGER, store.metadata, store.version, digest)
    wd = Driver(cluster, store, w, "w")
    for i in range(n):
        w.add(b"q%d" % i)
    wd.pump()
    run_all(cluster, {"w": wd}, data)
    assert len(wd.completed) == n
    dead = data.draw(st.sampled_from(["b0", "b1", "b2"]))
    cluster.bookies[dead].alive = False
    r = LedgerRecovery(LEDGER, store.metadata, store.version, digest)
    rd = Driver(cluster, store, r, "r")
    r.start()
    rd.pump()
    run_all(cluster, {"w": wd, "r": rd}, data)
    (done,) = rd.finished
    assert isinstance(done, RecoveryCompleted)
    assert done.ok, done.message
    md = store.metadata
    assert md.state is LedgerState.CLOSED
    assert md.last_entry == n - 1
    assert dead not in md.last_segment.ensemble
    # Every entry of the new segment is on all three bookies of its ensemble.
    for entry in range(md.last_segment.first_entry, n):
        for b in md.ensemble_for(entry):
            assert (LEDGER, entry) in cluster.bookies[b].entries


def _two_segments() -> tuple[LedgerMetadata, Digest]:
    md = LedgerMetadata(
        3,
        2,
        2,
        (Segment(0, ("b0", "b1", "b2")), Segment(5, ("b0", "b1", "b3"))),
        DigestType.CRC32C,
        password_hash(PW),
        last_entry=-1,
    )
    return md, Digest(DigestType.CRC32C, PW)


def test_close_retries_when_a_replication_worker_rewrote_an_earlier_segment() -> None:
    md, digest = _two_segments()
    w = LedgerWriter(LEDGER, md, 3, digest)
    w.close()
    (first,) = w.take_actions()
    assert isinstance(first, WriteMetadata)
    # Meanwhile a worker replaced b2 by b4 in segment 0 (version 3 -> 4).
    repaired = LedgerMetadata(
        3, 2, 2, (Segment(0, ("b0", "b1", "b4")), md.segments[1]), md.digest_type, md.password_hash
    )
    w.on_metadata_conflict(repaired, 4)
    (retry,) = w.take_actions()
    assert isinstance(retry, WriteMetadata)
    assert retry.expected_version == 4
    assert retry.metadata.is_closed
    assert retry.metadata.segments[0].ensemble == ("b0", "b1", "b4")  # the worker's change kept
    w.on_metadata_written(5)
    (done,) = w.take_actions()
    assert isinstance(done, CloseCompleted)
    assert done.ok
    assert w.state is WriterState.CLOSED


def test_close_still_fails_when_another_client_changed_the_last_segment_or_state() -> None:
    md, digest = _two_segments()
    for current, said in (
        # not this writer's last segment
        (md.with_segment(5, ("b0", "b4", "b3")), "changed its open segment (ensemble now"),
        (
            LedgerMetadata(
                3,
                2,
                2,
                md.segments,
                md.digest_type,
                md.password_hash,
                state=LedgerState.IN_RECOVERY,
            ),
            "was IN_RECOVERY by another client",
        ),
    ):
        w = LedgerWriter(LEDGER, md, 3, digest)
        w.close()
        w.take_actions()
        w.on_metadata_conflict(current, 4)
        (done,) = w.take_actions()
        assert isinstance(done, CloseCompleted)
        assert not done.ok
        assert w.state is WriterState.FENCED
        assert said in done.message


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 12), st.data())
def test_a_recovery_that_dies_after_replacing_a_bookie_loses_nothing_for_the_next(
    n: int, data: st.DataObject
) -> None:
    """Found by a power-loss campaign: a recovery replaced a dead write-back bookie, wrote
    the new segment to the metadata, and died before its write-backs were done. The next
    recovery read those entries from the replacement, got "no such entry" (with Wq = Aq
    one negative suffices) and closed the ledger before acknowledged entries."""
    cluster, store, digest = setup_cluster(3, 3, 3, 4)
    w = LedgerWriter(LEDGER, store.metadata, store.version, digest)
    wd = Driver(cluster, store, w, "w")
    for i in range(n):
        w.add(b"p%d" % i)
    wd.pump()
    run_all(cluster, {"w": wd}, data)
    assert len(wd.completed) == n
    cluster.bookies[data.draw(st.sampled_from(["b0", "b1", "b2"]))].alive = False
    r1 = LedgerRecovery(LEDGER, store.metadata, store.version, digest)
    d1 = Driver(cluster, store, r1, "r1")
    r1.start()
    d1.pump()
    drivers = {"w": wd, "r1": d1}
    while cluster.inflight and "b3" not in r1.ensemble:  # until b3 replaced the dead one
        run_all(cluster, drivers, data, limit=1)
    assert "b3" in r1.ensemble
    # r1 dies here, its write-backs to the replacement partly done (or not at all).
    cluster.inflight[:] = [d for d in cluster.inflight if d.client != "r1"]
    r2 = LedgerRecovery(LEDGER, store.metadata, store.version, digest)
    d2 = Driver(cluster, store, r2, "r2")
    r2.start()
    d2.pump()
    run_all(cluster, {**drivers, "r2": d2}, data)
    (done,) = d2.finished
    assert isinstance(done, RecoveryCompleted)
    assert done.ok, done.message
    assert store.metadata.last_entry == n - 1


def _recovery_after_two_unconfirmed_adds(
    n_bookies: int, confirmed: list[bytes], unconfirmed: tuple[bytes, bytes]
) -> tuple[SimCluster, MetaStore, Driver, LedgerRecovery, Driver]:
    """E=Wq=3, Aq=2: ``confirmed`` added one by one, then both ``unconfirmed`` reach b0 and
    b1 only and their answers are lost; a recovery has started (cluster, store, writer's
    driver, recovery, its driver)."""
    cluster, store, digest = setup_cluster(3, 3, 2, n_bookies)
    w = LedgerWriter(LEDGER, store.metadata, store.version, digest)
    wd = Driver(cluster, store, w, "w")
    for body in confirmed:
        w.add(body)
        wd.pump()
        run_all(cluster, {"w": wd}, None)
    for body in unconfirmed:
        w.add(body)
    wd.pump()
    for d in cluster.inflight:
        if d.action.bookie != "b2":
            cluster.deliver(d)
    cluster.inflight.clear()
    r = LedgerRecovery(LEDGER, store.metadata, store.version, digest)
    rd = Driver(cluster, store, r, "r")
    r.start()
    rd.pump()
    return cluster, store, wd, r, rd


def test_recovery_reads_lc_for_the_length_and_writes_back_with_lc() -> None:
    """LC is read (for its header's length) but never written back; entries after it are,
    piggybacking LC, never recovery's own LAC (docs/findings/two-recoveries.md); the
    close's length is the ledger's exact length."""
    # The two unconfirmed adds piggyback LAC 2.
    cluster, store, wd, _r, rd = _recovery_after_two_unconfirmed_adds(
        3, [b"a" * 3, b"b" * 5, b"c" * 7], (b"d" * 11, b"e" * 13)
    )
    reads: list[int] = []
    writebacks: list[tuple[int, int]] = []  # (entry, piggybacked LAC)
    while cluster.inflight:
        d = cluster.inflight.pop(0)
        if isinstance(d.action, SendRead):
            reads.append(d.action.entry_id)
        elif isinstance(d.action, SendAdd) and d.client == "r":
            writebacks.append((d.action.entry_id, peek_header(d.action.body).lac))
        (wd if d.client == "w" else rd).deliver(d)
    (done,) = rd.finished
    assert isinstance(done, RecoveryCompleted)
    assert done.ok, done.message
    assert min(reads) == 2, "reading starts at LC = 2, the highest LAC the bookies saw"
    assert {e for e, _ in writebacks} == {3, 4}, "LC itself is not written back"
    # Entry 4 was found after entry 3's write-back reached Aq: recovery's own LAC was 3
    # then; BookKeeper's write-back would carry it, bkref's carries LC.
    assert dict(writebacks) == {3: 2, 4: 2}, "write-backs carry LC"
    md = store.metadata
    assert (md.last_entry, md.length) == (4, 3 + 5 + 7 + 11 + 13)


def test_a_write_back_resent_to_a_replacement_carries_the_lac_it_was_first_signed_with() -> None:
    """A resend is the same signed body (BookKeeper re-sends a pending add's buffer): a LAC
    signed in later could pass the last entry that a concurrent recovery closes at."""
    # The two unconfirmed adds piggyback LAC 0; b3 is the spare.
    cluster, store, wd, r, rd = _recovery_after_two_unconfirmed_adds(4, [b"a"], (b"b", b"c"))
    sent: list[tuple[str, int, int]] = []  # (bookie, entry, piggybacked LAC) of write-backs
    failed = False
    while cluster.inflight:
        # Reads first: entry 2 is found (and written back) before entry 1's write-back is
        # acknowledged, so it is signed with LAC 0.
        adds = [i for i, d in enumerate(cluster.inflight) if isinstance(d.action, SendAdd)]
        rest = [i for i in range(len(cluster.inflight)) if i not in adds]
        d = cluster.inflight.pop((rest or adds)[0])
        if isinstance(d.action, SendAdd) and d.client == "r":
            sent.append((d.action.bookie, d.action.entry_id, peek_header(d.action.body).lac))
            # Entry 2's write set is b2, b0, b1 (striping): its first write-back fails once
            # entry 1's reached Aq (recovery's LAC is 1 then).
            if (d.action.bookie, d.action.entry_id) == ("b2", 2) and not failed:
                failed = True  # b2's connection drops: recovery replaces it by b3
                assert r.lac == 1
                r.on_add_response("b2", 2, Status.IO_ERROR)
                rd.pump()
                continue
        (wd if d.client == "w" else rd).deliver(d)
    (done,) = rd.finished
    assert done.ok, done.message
    assert failed
    first = {e: lac for b, e, lac in sent if b != "b3"}
    assert first == {1: 0, 2: 0}, "both found before any write-back was acknowledged"
    assert ("b3", 2, 0) in sent, "the resend to b3 carries entry 2's first LAC, not 1"
    assert store.metadata.last_entry == 2


def test_a_recovery_close_keeps_a_worker_swap_of_an_earlier_segment() -> None:
    """Found by `bkref refine --config c-merge`: a replication worker swapped a lost bookie
    of the closed first segment while recovery was closing; recovery failed ("metadata
    changed under recovery") where BookKeeper's closeRecovered re-reads and closes on the
    new version with the worker's segment kept (BOOKKEEPER-584)."""
    cluster, _store, digest = setup_cluster(2, 2, 2, 5)
    two = LedgerMetadata(
        2,
        2,
        2,
        (Segment(0, ("b0", "b1")), Segment(1, ("b0", "b2"))),
        DigestType.CRC32C,
        password_hash(PW),
    )
    store = MetaStore(two, 1)
    write_entries(cluster, store, digest, 2)
    r = LedgerRecovery(LEDGER, store.metadata, store.version, digest)
    rd = Driver(cluster, store, r, "r")
    rd.deferred = []
    r.start()
    rd.pump()
    (mark,) = [a for _d, a in rd.deferred]
    rd.deferred.clear()
    rd.land(mark)
    run_all(cluster, {"r": rd}, None)
    (close,) = [a for _d, a in rd.deferred]
    assert close.metadata.is_closed
    # The worker's CAS lands first: b3 replaces b1 in segment 0.
    swapped = LedgerMetadata(
        2,
        2,
        2,
        (Segment(0, ("b0", "b3")), store.metadata.segments[1]),
        DigestType.CRC32C,
        password_hash(PW),
        state=LedgerState.IN_RECOVERY,
    )
    assert store.cas(WriteMetadata(swapped, store.version, "worker swap"))
    rd.deferred = None
    rd.land(close)
    (done,) = rd.finished
    assert isinstance(done, RecoveryCompleted)
    assert done.ok, done.message
    md = store.metadata
    assert md.state is LedgerState.CLOSED
    assert md.last_entry == 1
    assert md.segments == (Segment(0, ("b0", "b3")), Segment(1, ("b0", "b2")))


def test_an_add_after_the_writer_stopped_fails_with_the_reason_it_stopped() -> None:
    """Once fenced, every later add fails as FENCED (a recovery took the ledger over, as
    BookKeeper's BKLedgerFencedException says); once failed otherwise (here no spare
    bookie to replace a failed one), as IO_ERROR, with the writer's error message."""
    for fenced in (True, False):
        _cluster, store, digest = setup_cluster(3, 3, 3, 3)
        w = LedgerWriter(LEDGER, store.metadata, store.version, digest)
        w.add(b"a")
        send = next(a for a in w.take_actions() if isinstance(a, SendAdd))
        w.on_add_response(send.bookie, 0, Status.FENCED if fenced else Status.IO_ERROR)
        if not fenced:
            (need,) = w.take_actions()
            assert isinstance(need, NeedReplacement)
            w.no_replacement(need.failed, "no spare bookie")
        expected = Status.FENCED if fenced else Status.IO_ERROR
        assert w.state is (WriterState.FENCED if fenced else WriterState.FAILED)
        assert w.take_actions() == [AddCompleted(0, expected, w.error)]
        assert w.add(b"late") == 1
        assert w.take_actions() == [AddCompleted(1, expected, w.error)]


def test_recovery_replaces_a_write_back_bookie_from_its_own_lac_plus_one() -> None:
    """The new segment of a write-back bookie's replacement starts after recovery's own LAC:
    LC and the entries before it, and a write-back already at Aq, stay on the segment whose
    bookies hold them (the replacement never receives them)."""
    # E=Wq=3, Aq=2, LC = 2; entries 3 and 4 reached b0 and b1 only; b3 is the spare.
    cluster, store, wd, _r, rd = _recovery_after_two_unconfirmed_adds(
        4, [b"a", b"b", b"c"], (b"d", b"e")
    )
    cluster.bookies["b2"].alive = False  # every write-back to it fails
    run_all(cluster, {"w": wd, "r": rd}, None)  # in the order sent
    (done,) = rd.finished
    assert done.ok, done.message
    md = store.metadata
    assert (md.last_entry, md.length) == (4, 5)
    # Entry 3's write-back reached Aq on b0 and b1 before b2's error came back: recovery's
    # LAC was 3, so the replacement's segment starts at 4.
    assert md.segments == (Segment(0, ("b0", "b1", "b2")), Segment(4, ("b0", "b1", "b3")))
    for entry in range(3):  # up to LC: on every bookie its segment names
        for b in md.ensemble_for(entry):
            assert (LEDGER, entry) in cluster.bookies[b].entries, (entry, b)


def test_recovery_replacing_two_write_back_bookies_adds_one_segment() -> None:
    """Two replacements from the same entry make one new segment, as BookKeeper's ensembles
    (a map keyed by first entry) hold one ensemble per first entry."""
    cluster, store, digest = setup_cluster(3, 3, 3, 5)
    write_entries(cluster, store, digest, 3, one_at_a_time=True)  # entry 2 piggybacks LAC 1
    cluster.bookies["b0"].alive = cluster.bookies["b1"].alive = False
    _, rd = start_recovery(cluster, store, digest)
    # b2 alone covers every write set (Wq - Aq + 1 = 1): LC = 1; entry 2 is written back,
    # and its write-backs to b0 and b1 fail: b3, then b4, replace them from entry 2.
    run_all(cluster, {"r": rd}, None)
    (done,) = rd.finished
    assert done.ok, done.message
    md = store.metadata
    assert md.last_entry == 2
    assert md.segments == (Segment(0, ("b0", "b1", "b2")), Segment(2, ("b3", "b4", "b2")))
    assert all((LEDGER, 2) in cluster.bookies[b].entries for b in ("b2", "b3", "b4"))
