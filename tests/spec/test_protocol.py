"""Single actions of the protocol spec: guards and effects."""

from __future__ import annotations

from dataclasses import replace

from bkref.spec.config import Config
from bkref.spec.configs import NAMED
from bkref.spec.invariants import (
    INVARIANTS,
    AllClosedLedgersRepairedWhenQuiescent,
    NoLostMetadataUpdate,
)
from bkref.spec.protocol import (
    ADD,
    CLOSED,
    DOWN,
    IN_RECOVERY,
    OPEN,
    RC_CLOSED,
    RC_WRITING,
    REFUSED,
    UNREGISTERED,
    UP,
    W_WITHDRAWN,
    State,
    auditor_loses_session,
    auditor_node,
    auditor_runs_periodic_bookie_check,
    bookie_crashes,
    bookie_handles_add,
    bookie_restarts_with_wiped_disk,
    format_label,
    initial_state,
    network_duplicates_message,
    network_loses_message,
    next_states,
    node_wins_auditor_election,
    reader_opens_ledger,
    reader_reads_entry,
    reader_receives_lac,
    recovery_client_closes_ledger,
    recovery_client_starts_recovery,
    recovery_of,
    writer_changes_ensemble,
    writer_closes_ledger,
    writer_completes_ensemble_change,
    writer_creates_ledger,
    writer_sends_add,
)

CFG = Config(name="t", description="test", entries=2, losses=1, crashes=1, wipes=1)


def _step(s: State | None) -> State:
    assert s is not None
    return s


def _created() -> State:
    return _step(writer_creates_ledger(CFG, initial_state(CFG), (0, 1, 2)))


def _deliver(s: State, b: int, entry: int = 0, rec: int = 0) -> State:
    m = next(m for m in s.msgs if m[0] == ADD and m[1] == b and m[2] == entry and m[4] == rec)
    return _step(bookie_handles_add(CFG, s, m, 0))


def test_writer_confirms_at_ack_quorum() -> None:
    s = _step(writer_sends_add(CFG, _created()))
    s = _deliver(s, 0)
    assert s.w_lac == -1
    s = _deliver(s, 1)
    assert s.w_lac == 0


def test_a_fenced_bookie_rejects_the_writer_and_the_writer_withdraws() -> None:
    s = _step(writer_sends_add(CFG, _created()))
    s = _step(recovery_client_starts_recovery(CFG, s, 0))
    assert s.meta_status[0] == IN_RECOVERY
    fence = next(m for m in s.msgs if m[0] != ADD and m[1] == 0)
    s = _step(next(t for (name, args), t in next_states(CFG, s) if args == (fence, 0)))
    assert s.b_ledgers[0][0][2] == 1
    s = _deliver(s, 0)
    assert s.b_ledgers[0][0][0] == 0  # not stored
    assert s.w_status == W_WITHDRAWN


def test_a_fenced_bookie_accepts_recovery_adds() -> None:
    s = _created()
    synced, unsynced, _f, lac = s.b_ledgers[0][0]
    s = s._replace(
        b_ledgers=(((synced, unsynced, 1, lac),), *s.b_ledgers[1:]),
        msgs=((ADD, 0, 0, -1, 1),),
    )
    s = _step(bookie_handles_add(CFG, s, (ADD, 0, 0, -1, 1), 0))
    assert s.b_ledgers[0][0][0] & 1


def test_acks_are_held_until_the_ensemble_change_lands() -> None:
    s = _step(writer_sends_add(CFG, _created()))
    s = _step(network_loses_message(CFG, s, (ADD, 2, 0, -1, 0)))
    s = _deliver(s, 0)
    s = _step(writer_changes_ensemble(CFG, s, 2, 3))
    assert s.w_change is not None
    assert s.meta_segments[0] == ((0, (0, 1, 2)),)  # metadata unchanged until the CAS
    # No resend to b3 before the CAS lands (BookKeeper re-sends after it; BOOKKEEPER-1591).
    assert not [t for (name, _a), t in next_states(CFG, s) if name == "writer_resends_add"]
    s = _deliver(s, 1)
    assert s.w_lac == -1  # b0 and b1 acked, but the CAS is in flight
    s = _step(writer_completes_ensemble_change(CFG, s))
    assert s.meta_segments[0] == ((0, (0, 1, 3)),)
    assert s.w_lac == 0


def _resend_ready() -> tuple[Config, State]:
    """e0 confirmed, e1 (sent before e0's confirmation) lost on its way to b2, b2 replaced
    by b3: the writer may resend e1 to b3."""
    cfg = replace(CFG, pipeline=2)
    s = _step(writer_creates_ledger(cfg, initial_state(cfg), (0, 1, 2)))
    s = _step(writer_sends_add(cfg, _step(writer_sends_add(cfg, s))))
    assert {m[3] for m in s.msgs} == {-1}  # e1 went out before e0 was confirmed
    s = _step(network_loses_message(cfg, s, (ADD, 2, 1, -1, 0)))
    for m in [(ADD, 0, 0, -1, 0), (ADD, 1, 0, -1, 0), (ADD, 0, 1, -1, 0)]:
        s = _step(bookie_handles_add(cfg, s, m, 0))
    assert s.w_lac == 0
    s = _step(writer_completes_ensemble_change(cfg, _step(writer_changes_ensemble(cfg, s, 2, 3))))
    return cfg, s


def test_a_resend_carries_the_lac_of_the_entrys_first_send() -> None:
    """The entry is signed once: with two adds in flight its resend after an ensemble
    change carries the LAC it was first sent with, not the writer's current one."""
    cfg, s = _resend_ready()
    resend = [t for (name, args), t in next_states(cfg, s) if name == "writer_resends_add"]
    assert len(resend) == 1
    assert (ADD, 3, 1, -1, 0) in resend[0].msgs  # not (ADD, 3, 1, 0, 0)


def test_the_mutant_1591_confirms_before_the_cas() -> None:
    cfg = CFG.with_mutant("acks-before-ensemble-change-lands")
    s = _step(
        writer_sends_add(cfg, _step(writer_creates_ledger(cfg, initial_state(cfg), (0, 1, 2))))
    )
    s = _step(network_loses_message(cfg, s, (ADD, 2, 0, -1, 0)))
    s = _step(bookie_handles_add(cfg, s, (ADD, 0, 0, -1, 0), 0))
    s = _step(writer_changes_ensemble(cfg, s, 2, 3))
    s = _step(next(t for (name, _a), t in next_states(cfg, s) if name == "writer_resends_add"))
    s = _step(bookie_handles_add(cfg, s, (ADD, 3, 0, -1, 0), 0))
    assert s.w_lac == 0
    assert s.w_change is not None


def test_writer_close_fails_once_recovery_began() -> None:
    s = _step(recovery_client_starts_recovery(CFG, _created(), 0))
    s = _step(writer_closes_ledger(CFG, s))
    assert s.w_status == W_WITHDRAWN
    assert s.meta_status[0] == IN_RECOVERY


def test_writer_close_sets_the_last_entry_to_its_lac() -> None:
    s = _step(writer_sends_add(CFG, _created()))
    s = _deliver(_deliver(s, 0), 1)
    s = _step(writer_closes_ledger(CFG, s))
    assert s.meta_status[0] == CLOSED
    assert s.meta_last[0] == 0


def test_a_wiped_bookie_is_refused_by_its_cookie_unless_the_mutant_is_on() -> None:
    s = _step(bookie_crashes(CFG, _created(), 0))
    assert _step(bookie_restarts_with_wiped_disk(CFG, s, 0)).b_up[0] == REFUSED
    cfg = CFG.with_mutant("wiped-bookie-rejoins")
    assert _step(bookie_restarts_with_wiped_disk(cfg, s, 0)).b_up[0] == UP


def test_any_auditor_may_lose_its_session_not_only_the_first() -> None:
    # Node 0 leads first; after its session loss node 1 may win the election, and then
    # lose its own session as well: BookKeeper's auditor election has no favourite.
    cfg = Config(name="t", description="", autorecovery=True, workers=2, elections=2)
    s = initial_state(cfg)
    assert auditor_node(s) == 0
    s = _step(auditor_loses_session(cfg, s))
    assert auditor_node(s) == -1
    s = _step(node_wins_auditor_election(cfg, s, 1))
    assert auditor_node(s) == 1
    t = _step(auditor_loses_session(cfg, s))
    assert auditor_node(t) == -1
    assert t.au_leads[1] == 0
    assert t.meta_auditor == (s.meta_auditor[0], -1)
    assert auditor_loses_session(cfg, _step(node_wins_auditor_election(cfg, t, 0))) is None


def test_the_initial_state_is_open_only_when_configured() -> None:
    assert initial_state(CFG).meta_status == (0,)
    cfg = replace(CFG, writer_ledger_created=True)
    assert initial_state(cfg).meta_status == (OPEN,)


def test_the_writer_starts_with_its_own_ledger_s_segments_beside_closed_ledgers() -> None:
    for two in (False, True):
        cfg = replace(CFG, writer_ledger_created=True, two_segments=two, closed_ledgers=1)
        s = initial_state(cfg)
        wl = cfg.writer_ledger
        assert wl == 1
        assert s.w_segments == s.meta_segments[wl]
        assert len(s.w_segments) == (2 if two else 1)
        assert s.meta_segments[0] == ((0, (0, 1, 2)),)  # the closed ledger's


def test_two_segments_start_with_e0_confirmed_and_e1_next_to_the_new_ensemble() -> None:
    # The initial state the configs with two_segments describe: e0 confirmed on b0..b2
    # (carrying LAC -1), then b2 replaced by b3 from e1 on, e1 not yet sent.
    cfg = replace(CFG, writer_ledger_created=True, two_segments=True)
    s = initial_state(cfg)
    wl = cfg.writer_ledger
    assert s.w_segments == s.meta_segments[wl] == ((0, (0, 1, 2)), (1, (0, 1, 3)))
    assert (s.w_lac, s.w_next) == (0, 1)
    assert s.w_acks == (0b0111, 0)  # e0 acknowledged by b0..b2; one slot per entry
    assert len(s.w_sent) == len(s.w_piggy) == cfg.entries
    assert not s.msgs
    for b in (0, 1, 2):
        assert s.b_ledgers[b][wl] == (0b1, 0, 0, -1)
    t = _step(writer_sends_add(cfg, s))  # the writer's next add is e1, to b0, b1 and b3
    assert sorted(m[1] for m in t.msgs if m[:1] == (ADD,) and m[2] == 1) == [0, 1, 3]
    assert t.w_piggy[1] == 0  # carrying LAC 0


def _replay(cfg: Config, labels: list[str]) -> State:
    """The state after the steps named (as ``format_label`` spells them) from Init."""
    s = initial_state(cfg)
    for want in labels:
        steps = {format_label(label): t for label, t in next_states(cfg, s)}
        assert want in steps, f"{want} not enabled; enabled: {sorted(steps)}"
        s = steps[want]
    return s


def test_the_periodic_bookie_check_marks_a_bookie_that_went_down_before_its_cas() -> None:
    # Found while widening configs for coverage: the writer's new bookie crashes after the
    # writer chose it and before its ensemble change lands. The audit of that crash reads
    # the old metadata, so nothing marks the ledger; only BookKeeper's periodic bookie
    # check does. Before the ghost ``au_missed``, the invariant deemed repair quiescent here.
    cfg = replace(
        Config(name="t", description="", autorecovery=True, workers=2),
        writer_ledger_created=True,
        entries=1,
        recovery_client=False,
        crashes=2,
    )
    s = _replay(
        cfg,
        [
            "writer_sends_add",
            "bookie_crashes(0)",
            "writer_changes_ensemble(0, 3)",
            "bookie_restarts(0)",
            "bookie_crashes(3)",
            "auditor_marks_ledgers_of_lost_bookies",
            "writer_completes_ensemble_change",
            "writer_closes_ledger",
        ],
    )
    assert s.meta_status[0] == CLOSED
    assert 3 in s.meta_segments[0][-1][1]
    assert s.b_up[3] == DOWN
    assert s.meta_task[0] == (0, 0)
    assert s.au_missed == 1
    assert not s.au_stale
    assert AllClosedLedgersRepairedWhenQuiescent(cfg, s)  # not quiescent: a check is due
    assert not AllClosedLedgersRepairedWhenQuiescent(cfg, s._replace(au_missed=0))
    t = auditor_runs_periodic_bookie_check(cfg, s)
    assert t is not None
    assert t.meta_task[0][1] == 1 << 3
    assert t.au_missed == 0
    assert auditor_runs_periodic_bookie_check(cfg, t) is None
    # The auditor runs it, whichever node that is; with no auditor, nobody does.
    epoch = s.meta_auditor[0]
    assert auditor_node(s) == 0
    assert auditor_runs_periodic_bookie_check(cfg, s._replace(meta_auditor=(epoch, -1))) is None
    node1 = s._replace(meta_auditor=(epoch, 1), au_leads=(0, epoch))
    assert auditor_node(node1) == 1
    by_node1 = auditor_runs_periodic_bookie_check(cfg, node1)
    assert by_node1 is not None
    assert by_node1.meta_task == t.meta_task


# Two recovery clients over a writer's one entry, which reaches b0 alone: client 0 will
# find e0 on b0, client 1 will find it on neither b1 nor b2 and close the ledger at -1.
TWO_RECOVERIES = replace(Config(name="t", description="", entries=1, losses=1), recovery_clients=2)
BOTH_START = [
    "writer_creates_ledger((0, 1, 2))",
    "writer_sends_add",
    "recovery_client_starts_recovery(0)",
    "recovery_client_starts_recovery(1)",
    "bookie_handles_add(add e0 to b0 from writer (lac -1), 0)",
]
CLIENT_1_FINDS_NO_E0 = [
    f"bookie_handles_recovery_read(recovery read e0 to b{b} (fencing) by recovery client 1, 0)"
    for b in (1, 2)
]


def test_two_recoveries_a_resend_keeps_its_first_lac_the_loser_adopts_the_close() -> None:
    # Found with two recovery clients: client 1 closes the ledger at -1 (two negatives for
    # e0) while client 0, which found e0 on b0, writes it back. Client 0 re-sent e0 to its
    # replacement b3 signed with its LAC by then (0, e0 at Aq): b3's LAC passed the last
    # entry (NoDirtyReads). BookKeeper re-sends a pending add's first buffer, LAC -1; so
    # does the spec now, and so does bkref's LedgerRecovery.
    cfg = TWO_RECOVERIES
    s = _replay(
        cfg,
        [
            *BOTH_START,
            "bookie_handles_fencing_lac_read(fencing LAC read to b0, 0)",
            "bookie_handles_fencing_lac_read(fencing LAC read to b0 by recovery client 1, 0)",
            "bookie_handles_fencing_lac_read(fencing LAC read to b1, 0)",
            "recovery_client_completes_fencing(0)",
            "bookie_handles_fencing_lac_read(fencing LAC read to b1 by recovery client 1, 0)",
            "recovery_client_completes_fencing(1)",
            "bookie_handles_recovery_read(recovery read e0 to b0 (fencing), 0)",
            "bookie_handles_add(add e0 to b0 from recovery client (lac -1), 0)",
            "network_loses_message(add e0 to b1 from recovery client (lac -1))",
            "recovery_client_changes_ensemble(0, 1, 3)",
            *CLIENT_1_FINDS_NO_E0,
            "recovery_client_closes_ledger(1)",
            "bookie_handles_add(add e0 to b2 from recovery client (lac -1), 0)",
            "recovery_client_resends_add(0, 0, 3)",
            "bookie_handles_add(add e0 to b3 from recovery client (lac -1), 0)",
        ],
    )
    assert s.meta_status[0] == CLOSED
    assert s.meta_last[0] == -1
    assert recovery_of(s, 0).lac == 0  # e0 reached Aq in client 0's write-back
    assert s.b_ledgers[3][0][3] == -1  # but b3 holds the LAC e0 was first sent with
    assert all(inv(cfg, s) for inv in INVARIANTS)
    # Client 0 ends its ledger at e0; its close finds it closed at another last entry: it
    # writes nothing and reports the stored close, as BookKeeper's closeRecovered does.
    for b in (0, 2):
        label = f"bookie_handles_recovery_read(recovery read e1 to b{b} (fencing), 0)"
        s = next(t for lb, t in next_states(cfg, s) if format_label(lb) == label)
    assert recovery_of(s, 0).last == 0
    t = _step(recovery_client_closes_ledger(cfg, s, 0))
    assert recovery_of(t, 0).phase == RC_CLOSED
    assert recovery_of(t, 0).last == -1
    assert t.meta_version == s.meta_version
    assert t.meta_last == s.meta_last


def test_a_recovery_still_writing_back_keeps_its_adds_once_another_closed_the_ledger() -> None:
    # drop_dead_requests drops every request once the writer is done, the ledger CLOSED
    # and no recovery client still at work; one writing back is at work: its adds land.
    cfg = TWO_RECOVERIES
    late = "bookie_handles_add(add e0 to b2 from recovery client (lac -1), 0)"
    s = _replay(
        cfg,
        [
            *BOTH_START,
            *(
                f"bookie_handles_fencing_lac_read(fencing LAC read to b{b}{by}, 0)"
                for b in (0, 1)
                for by in ("", " by recovery client 1")
            ),
            "recovery_client_completes_fencing(0)",
            "recovery_client_completes_fencing(1)",
            "bookie_handles_add(add e0 to b1 from writer (lac -1), 0)",  # refused: fenced
            "bookie_handles_recovery_read(recovery read e0 to b0 (fencing), 0)",
            *CLIENT_1_FINDS_NO_E0,
            "recovery_client_closes_ledger(1)",
            *(
                f"bookie_handles_recovery_read(recovery read e1 to b{b} (fencing), 0)"
                for b in (0, 2)
            ),
        ],
    )
    assert s.meta_status[0] == CLOSED
    assert s.w_status == W_WITHDRAWN  # so that no open writer keeps the requests
    assert recovery_of(s, 0).phase == RC_WRITING
    assert (ADD, 2, 0, -1, 1) in s.msgs
    assert late in {format_label(lb) for lb, _t in next_states(cfg, s)}


def test_a_close_or_a_worker_swap_undone_is_a_lost_metadata_update() -> None:
    cfg = NAMED["c-merge"]
    s = initial_state(cfg)
    assert NoLostMetadataUpdate(cfg, s)
    closed = writer_closes_ledger(cfg, s)
    assert closed is not None
    assert NoLostMetadataUpdate(cfg, closed)
    wl = cfg.writer_ledger
    reopened = closed._replace(meta_status=(*closed.meta_status[:wl], OPEN))
    assert not NoLostMetadataUpdate(cfg, reopened)
    moved = closed._replace(meta_last=(*closed.meta_last[:wl], closed.meta_last[wl] - 1))
    assert not NoLostMetadataUpdate(cfg, moved)
    # A worker swapped b0 out of segment 0 for b3: b0 back there is the lost update;
    # b0 filled back in by a later swap (replaced marked -1) is not.
    segs = s.meta_segments[wl]
    swapped = s._replace(
        meta_segments=(((0, (3, *segs[0][1][1:])), segs[1]),),
        meta_rereplicated=(((0, 3, 0),),),
    )
    assert NoLostMetadataUpdate(cfg, swapped)
    undone = swapped._replace(meta_segments=(segs,))
    assert not NoLostMetadataUpdate(cfg, undone)
    assert NoLostMetadataUpdate(cfg, undone._replace(meta_rereplicated=(((0, 3, -1),),)))


def _read_setup() -> tuple[Config, State]:
    """e0 stored on b0 and b1 (confirmed), e1 on b2 alone, carrying LAC 0: b2 knows LAC 0
    but lacks e0. A reader opened the ledger, its LAC read in flight."""
    cfg = replace(CFG, readers=1)
    s = _step(writer_creates_ledger(cfg, initial_state(cfg), (0, 1, 2)))
    s = _step(writer_sends_add(cfg, s))
    for b in (0, 1):
        s = _step(bookie_handles_add(cfg, s, (ADD, b, 0, -1, 0), 0))
    assert s.w_lac == 0
    s = _step(writer_sends_add(cfg, s))
    s = _step(bookie_handles_add(cfg, s, (ADD, 2, 1, 0, 0), 0))
    assert s.b_ledgers[2][0][0] == 0b10  # e1 alone
    assert s.b_ledgers[2][0][3] == 0
    return cfg, _step(reader_opens_ledger(cfg, s, 0))


def test_a_reader_learns_the_lac_from_any_live_bookie_of_the_ledger_only() -> None:
    cfg, s = _read_setup()
    for b in (0, 1, 2):
        assert _step(reader_receives_lac(cfg, s, 0, b)).rd[0][2] == 0  # the read completes
    assert _step(reader_receives_lac(cfg, s, 0, 2)).rd[0][1] == 0  # b2's LAC
    assert reader_receives_lac(cfg, s, 0, 3) is None  # b3 is no bookie of the ledger
    assert reader_receives_lac(cfg, _step(bookie_crashes(cfg, s, 1)), 0, 1) is None


def test_a_reader_reads_an_entry_only_from_a_bookie_that_stores_it() -> None:
    cfg, s = _read_setup()
    assert reader_reads_entry(cfg, s, 0, 0, 0) is None  # the handle's LAC is still -1
    s = _step(reader_receives_lac(cfg, s, 0, 2))
    assert _step(reader_reads_entry(cfg, s, 0, 0, 0)).rd[0][3] == 0b1  # e0 returned
    # b2 stores e1 and knows LAC 0, but not e0: it cannot serve it.
    assert reader_reads_entry(cfg, s, 0, 0, 2) is None
    assert reader_reads_entry(cfg, s, 0, 1, 2) is None  # e1 is past the handle's LAC


def test_a_reader_reads_any_entry_up_to_its_lac_not_only_the_last() -> None:
    # LedgerHandle.readEntries takes any range up to the handle's LAC: an entry below it
    # is as readable as the LAC's own.
    cfg = replace(CFG, readers=1, entries=3)
    s = _step(writer_creates_ledger(cfg, initial_state(cfg), (0, 1, 2)))
    for e in (0, 1):
        s = _step(writer_sends_add(cfg, s))
        for b in (0, 1):
            s = _step(bookie_handles_add(cfg, s, (ADD, b, e, e - 1, 0), 0))
    assert s.w_lac == 1
    s = _step(writer_sends_add(cfg, s))
    s = _step(bookie_handles_add(cfg, s, (ADD, 0, 2, 1, 0), 0))  # e2 carries LAC 1 to b0
    s = _step(reader_receives_lac(cfg, _step(reader_opens_ledger(cfg, s, 0)), 0, 0))
    assert s.rd[0][1] == 1
    for e in (0, 1):
        assert _step(reader_reads_entry(cfg, s, 0, e, 1)).rd[0][3] == 1 << e


def test_each_distinct_message_is_offered_once_and_a_duplicate_holds_none_back() -> None:
    # The network delivers in any order: a duplicated add is offered once, whatever its
    # copies, and the adds to the other bookies, sorted after it, are offered too.
    cfg = replace(CFG, duplicates=1)
    s = _step(
        writer_sends_add(cfg, _step(writer_creates_ledger(cfg, initial_state(cfg), (0, 1, 2))))
    )
    to_b0 = next(m for m in s.msgs if m[1] == 0)
    s = _step(network_duplicates_message(cfg, s, to_b0))
    assert s.msgs.count(to_b0) == 2
    delivered = [
        args[0]
        for (name, args), _t in next_states(cfg, s)
        if name == "bookie_handles_add" and args[1] == 0
    ]
    assert delivered == sorted(set(s.msgs))
    assert len(delivered) == 3  # to b0, b1 and b2


def test_a_new_ledger_s_ensembles_name_only_registered_live_bookies() -> None:
    # BookKeeper places a new ledger on the bookies registered as available: not one its
    # cookie refused (a wiped disk), nor one whose ZooKeeper session expired.
    s = initial_state(CFG)
    assert (CFG.bookies, CFG.ensemble) == (4, 3)

    def ensembles(*up: int) -> list[object]:
        t = s._replace(b_up=up)
        return [
            args[0] for (name, args), _t in next_states(CFG, t) if name == "writer_creates_ledger"
        ]

    assert ensembles(UP, UP, UP, UP) == [(0, 1, 2), (0, 1, 3), (0, 2, 3), (1, 2, 3)]
    assert ensembles(UP, UP, UP, REFUSED) == [(0, 1, 2)]
    assert ensembles(UP, UP, UNREGISTERED, UP) == [(0, 1, 3)]
    assert ensembles(UP, DOWN, REFUSED, UNREGISTERED) == []
