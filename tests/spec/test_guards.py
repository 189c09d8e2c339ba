"""Guards the model checker never tests: next_states offers each of these actions only
where it may be taken, but the trace check (``bkref.tracecheck``) and the refinement
machine (``bkref.refine``) call actions by name, with the arguments a real run logged, so
each guard must refuse the rest on its own."""

from __future__ import annotations

from dataclasses import replace

from bkref.spec.protocol import (
    ADD,
    FENCE,
    RC_CLOSED,
    RC_FENCING,
    RC_IDLE,
    RC_WRITING,
    REFUSED,
    UNREGISTERED,
    UP,
    W_CLOSED,
    W_WITHDRAWN,
    bookie_crashes,
    bookie_handles_fencing_lac_read,
    bookie_loses_session,
    bookie_restarts,
    bookie_restarts_with_wiped_disk,
    initial_state,
    network_duplicates_message,
    network_loses_message,
    recovery_client_resends_add,
    recovery_client_retries_request,
    recovery_client_starts_recovery,
    recovery_of,
    with_recovery,
    writer_changes_ensemble,
    writer_closes_ledger,
    writer_creates_ledger,
    writer_resends_add,
    writer_sends_add,
)
from tests.spec.test_protocol import (
    BOTH_START,
    CFG,
    TWO_RECOVERIES,
    _created,
    _replay,
    _resend_ready,
    _step,
)


def test_only_a_down_bookie_restarts_a_refused_one_stays_out() -> None:
    # next_states offers a restart only for a DOWN bookie; the trace check calls the
    # action for any bookie its trace restarts, so the guard itself must refuse the rest.
    s = _step(bookie_crashes(CFG, _created(), 0))
    assert _step(bookie_restarts(CFG, s, 0)).b_up[0] == UP
    refused = _step(bookie_restarts_with_wiped_disk(CFG, s, 0))
    assert refused.b_up[0] == REFUSED
    assert bookie_restarts(CFG, refused, 0) is None  # its cookie is still refused
    assert bookie_restarts(CFG, s, 1) is None  # bookie 1 is up
    assert bookie_restarts(replace(CFG, restarts=False), s, 0) is None


def test_a_recovery_resends_an_entry_only_to_a_bookie_that_joined_its_write_set() -> None:
    # next_states offers a resend only to write-set bookies the entry was not sent to; the
    # trace check calls the action for the resends its trace logs.
    cfg = TWO_RECOVERIES
    lost = [
        *BOTH_START,
        "bookie_handles_fencing_lac_read(fencing LAC read to b0, 0)",
        "bookie_handles_fencing_lac_read(fencing LAC read to b1, 0)",
        "recovery_client_completes_fencing(0)",
        "bookie_handles_recovery_read(recovery read e0 to b0 (fencing), 0)",
        "network_loses_message(add e0 to b1 from recovery client (lac -1))",
    ]
    before = _replay(cfg, lost)
    assert recovery_client_resends_add(cfg, before, 0, 0, 3) is None  # b3 not in it yet
    s = _replay(cfg, [*lost, "recovery_client_changes_ensemble(0, 1, 3)"])
    assert recovery_of(s, 0).segments[-1][1] == (0, 3, 2)  # b3 replaced b1
    assert recovery_of(s, 0).sent[0] == 0b0111  # e0 went to b0, b1 and b2
    resent = _step(recovery_client_resends_add(cfg, s, 0, 0, 3))
    assert recovery_of(resent, 0).sent[0] == 0b1111
    for b in (0, 1, 2):  # sent already (b1 left the write set besides)
        assert recovery_client_resends_add(cfg, s, 0, 0, b) is None
    assert recovery_client_resends_add(cfg, resent, 0, 0, 3) is None  # sent already


def test_only_a_registered_bookie_loses_its_session_and_only_while_losses_are_left() -> None:
    # The trace check calls this action for the bookies its trace expires; next_states
    # offers it only for a registered one, so the guard itself must refuse the rest.
    cfg = replace(CFG, session_losses=1)
    s = _step(writer_creates_ledger(cfg, initial_state(cfg), (0, 1, 2)))
    t = _step(bookie_loses_session(cfg, s, 0))
    assert t.b_up[0] == UNREGISTERED
    assert bookie_loses_session(cfg, t, 0) is None  # no session left to lose
    assert bookie_loses_session(cfg, t, 1) is None  # the one loss is spent
    down = _step(bookie_crashes(cfg, s, 1))
    assert bookie_loses_session(cfg, down, 1) is None  # a crashed bookie has no session


def test_only_an_add_is_lost_and_only_while_losses_are_left() -> None:
    # A lost fencing or recovery read is a delayed one (the recovery client retries):
    # next_states offers only adds, and the action itself refuses the rest.
    s = _step(writer_sends_add(CFG, _created()))
    s = _step(recovery_client_starts_recovery(CFG, s, 0))
    fence = next(m for m in s.msgs if m[0] != ADD)
    assert network_loses_message(CFG, s, fence) is None
    t = _step(network_loses_message(CFG, s, (ADD, 2, 0, -1, 0)))
    assert (ADD, 2, 0, -1, 0) not in t.msgs
    assert network_loses_message(CFG, t, (ADD, 1, 0, -1, 0)) is None  # the one loss is spent


def test_a_message_is_duplicated_only_while_duplicates_are_left() -> None:
    # The refinement machine calls this action for each duplicate its network injects;
    # next_states offers it only while the budget lasts, so the guard must refuse the rest.
    cfg = replace(CFG, duplicates=1)
    s = _step(writer_creates_ledger(cfg, initial_state(cfg), (0, 1, 2)))
    s = _step(writer_sends_add(cfg, s))
    add = s.msgs[0]
    t = _step(network_duplicates_message(cfg, s, add))
    assert t.msgs.count(add) == 2
    assert network_duplicates_message(cfg, t, add) is None  # the one duplicate is spent
    none_left = _step(writer_sends_add(CFG, _created()))  # a config with none to spend
    assert network_duplicates_message(CFG, none_left, add) is None


def test_only_an_open_writer_resends_and_only_entries_still_pending() -> None:
    # next_states offers a resend only for w_lac < e < w_next while the writer is OPEN;
    # the trace check calls the action for the resends its trace logs.
    cfg, s = _resend_ready()
    assert _step(writer_resends_add(cfg, s, 1, 3)).w_sent[1] & 1 << 3
    assert writer_resends_add(cfg, s._replace(w_status=W_WITHDRAWN), 1, 3) is None
    assert writer_resends_add(cfg, s._replace(w_lac=1), 1, 3) is None  # e1 confirmed


def test_only_an_open_writer_with_no_change_in_flight_closes() -> None:
    # next_states offers a close only then; the trace check calls the action for the
    # close its trace logs, so the guard must refuse a writer that has no ledger yet (its
    # close would otherwise withdraw it), one done, and one whose change is in flight.
    assert writer_closes_ledger(CFG, initial_state(CFG)) is None  # NONE: no ledger yet
    closed = _step(writer_closes_ledger(CFG, _created()))
    assert closed.w_status == W_CLOSED
    assert writer_closes_ledger(CFG, closed) is None
    assert writer_closes_ledger(CFG, _created()._replace(w_status=W_WITHDRAWN)) is None
    s = _step(writer_sends_add(CFG, _created()))
    s = _step(network_loses_message(CFG, s, (ADD, 2, 0, -1, 0)))
    s = _step(writer_changes_ensemble(CFG, s, 2, 3))
    assert s.w_change is not None
    assert writer_closes_ledger(CFG, s) is None


def test_only_a_fencing_or_reading_recovery_retries_a_request() -> None:
    # next_states offers a retry only to a client FENCING or READING; the refinement
    # machine applies the step by name, so the guard must refuse the other phases.
    s = _created()
    assert recovery_of(s, 0).phase == RC_IDLE
    assert recovery_client_retries_request(CFG, s, 0, 0) is None  # nothing to retry yet
    fencing = _step(recovery_client_starts_recovery(CFG, s, 0))
    assert recovery_of(fencing, 0).phase == RC_FENCING
    assert recovery_client_retries_request(CFG, fencing, 0, 0) is None  # its fence is in flight
    # A crash drops the requests to b0; once it is back, the fence goes again.
    lost = _step(bookie_restarts(CFG, _step(bookie_crashes(CFG, fencing, 0)), 0))
    assert not any(m[0] == FENCE and m[1] == 0 for m in lost.msgs)
    assert (FENCE, 0, -1, 0, 0) in _step(recovery_client_retries_request(CFG, lost, 0, 0)).msgs
    for phase in (RC_WRITING, RC_CLOSED):
        r = recovery_of(lost, 0)._replace(phase=phase)
        past = lost._replace(rc=with_recovery(lost, 0, r))
        assert recovery_client_retries_request(CFG, past, 0, 0) is None


def test_a_recovery_retries_a_fence_only_to_a_bookie_of_the_ensemble_yet_to_answer() -> None:
    # next_states offers a fence's retry only to a live bookie of the last ensemble whose
    # fence has not been answered; the refinement machine applies the step by name.
    fencing = _step(recovery_client_starts_recovery(CFG, _created(), 0))
    fence_b1 = next(m for m in fencing.msgs if m[0] == FENCE and m[1] == 1)
    answered = _step(bookie_handles_fencing_lac_read(CFG, fencing, fence_b1, 0))
    assert recovery_of(answered, 0).fenced == 0b0010
    assert not any(m[0] == FENCE and m[1] == 1 for m in answered.msgs)
    assert recovery_client_retries_request(CFG, answered, 0, 1) is None  # b1 has answered
    assert answered.b_up[3] == UP
    assert recovery_client_retries_request(CFG, answered, 0, 3) is None  # b3: not in it
