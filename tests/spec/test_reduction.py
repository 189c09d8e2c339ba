"""The dead-request reduction is sound: same verdicts and shortest depths as the unreduced model."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bkref.spec.checker import check
from bkref.spec.configs import CONFIGS, NAMED, mutant_config
from bkref.spec.protocol import (
    FENCE,
    ORPHAN,
    RC_FENCING,
    RC_READING,
    READ,
    W_WITHDRAWN,
    bookie_handles_add,
    bookie_handles_fencing_lac_read,
    bookie_handles_recovery_read,
    dead_request,
    drop_dead_requests,
    initial_state,
    next_states,
    recovery_client_starts_recovery,
    recovery_of,
    send,
    set_ledger_on,
    with_recovery,
    writer_creates_ledger,
)

HANDLERS = (bookie_handles_add, bookie_handles_fencing_lac_read, bookie_handles_recovery_read)
FAST_MUTANTS = [
    "recovery-reads-without-fence",
    "negative-read-without-coverage",
    "ack-before-fsync",
    "recovery-from-lac-minus-one",
    "fence-lost-on-restart",  # a fence lost by a crash, which drops every request to it
]


@pytest.mark.parametrize("mutant", FAST_MUTANTS)
def test_reduced_and_unreduced_search_find_the_mutant_at_the_same_depth(mutant: str) -> None:
    cfg = mutant_config(mutant)
    reduced = check(cfg)
    full = check(replace(cfg, reduce_dead_requests=False))
    assert reduced.violation == full.violation is not None
    assert reduced.depth == full.depth
    assert reduced.distinct <= full.distinct


def test_reduced_search_of_the_correct_spec_passes_as_the_unreduced_one() -> None:
    cfg = CONFIGS["a-short"]
    reduced = check(cfg)
    full = check(replace(cfg, reduce_dead_requests=False))
    assert reduced.violation is full.violation is None
    assert reduced.complete
    assert full.complete
    assert full.distinct > 3 * reduced.distinct


# m-581: two adds in flight (pipeline 2), so a dead add of the second entry is judged by
# the bookie's bit for entry 1, which a config of one entry never reads.
@pytest.mark.parametrize("config", ["a-short", "m-581"])
def test_delivering_a_dead_request_changes_nothing_but_the_messages(config: str) -> None:
    cfg = replace(NAMED[config], reduce_dead_requests=False)
    frontier = [initial_state(cfg)]
    seen = 0
    for _ in range(14):
        nxt = []
        for s in frontier:
            for m in set(s.msgs):
                if dead_request(cfg, s, m):
                    seen += 1
                    t = HANDLERS[m[0]](cfg, s, m, 0)
                    assert t is not None
                    i = s.msgs.index(m)
                    assert t == s._replace(msgs=s.msgs[:i] + s.msgs[i + 1 :])
            nxt += [t for _l, t in next_states(cfg, s)]
        frontier = list(dict.fromkeys(nxt))[:300]
    assert seen > 0


def test_an_orphan_request_is_dead_only_when_it_can_fence_nothing() -> None:
    # An orphan (a request of a recovery that gave up) is answered to no one: only the fence
    # its delivery may bring matters. No config reaches this branch with the reduction on.
    cfg = CONFIGS["a-short"]
    wl = cfg.writer_ledger
    fence, read, fencing_read = (
        (FENCE, 0, -1, 0, ORPHAN),
        (READ, 0, 0, 0, ORPHAN),
        (READ, 0, 0, 1, ORPHAN),
    )
    s = initial_state(cfg)
    assert s.b_ledgers[0][wl][2] == 0  # b0 has not fenced the ledger
    for m in (fence, fencing_read):
        assert not dead_request(cfg, s, m)
        delivered = HANDLERS[m[0]](cfg, s._replace(msgs=(m,)), m, 0)
        assert delivered is not None
        assert delivered.b_ledgers[0][wl][2] == 1  # its delivery fences b0
    assert dead_request(cfg, s, read)
    synced, unsynced, _f, lac = s.b_ledgers[0][wl]
    fenced = s._replace(b_ledgers=set_ledger_on(s, 0, wl, (synced, unsynced, 1, lac)))
    assert all(dead_request(cfg, fenced, m) for m in (fence, read, fencing_read))


def test_once_the_writer_is_done_only_a_client_still_fencing_keeps_its_fences() -> None:
    # The writer sends and hears nothing more, so a fence matters only to the recovery
    # client that counts its answer: the reduction keeps the fences of a client still
    # FENCING and drops the others, an orphan's or those of a client reading on, though
    # their bookies have not fenced yet (no request of theirs is dead).
    cfg = CONFIGS["a-short"]
    created = writer_creates_ledger(cfg, initial_state(cfg), (0, 1, 2))
    assert created is not None
    fencing = recovery_client_starts_recovery(cfg, created, 0)
    assert fencing is not None
    assert recovery_of(fencing, 0).phase == RC_FENCING
    orphan = (FENCE, 2, -1, 0, ORPHAN)
    done = fencing._replace(w_status=W_WITHDRAWN, msgs=send(fencing.msgs, orphan))
    own = [m for m in done.msgs if m[0] == FENCE and m[4] == 0]
    assert [m[1] for m in own] == [0, 1, 2]
    assert not any(dead_request(cfg, done, m) for m in (*own, orphan))
    assert drop_dead_requests(cfg, done).msgs == tuple(own)  # the orphan's goes
    # b0 and b1 fenced and answered, which covers the ensemble: the client reads on while
    # its fence to b2 is still in flight.
    wl = cfg.writer_ledger
    ledgers = done
    for b in (0, 1):
        synced, unsynced, _fenced, lac = ledgers.b_ledgers[b][wl]
        ledgers = ledgers._replace(
            b_ledgers=set_ledger_on(ledgers, b, wl, (synced, unsynced, 1, lac))
        )
    r = recovery_of(done, 0)._replace(phase=RC_READING, fenced=0b011)
    reading = ledgers._replace(rc=with_recovery(done, 0, r), msgs=(own[2], orphan))
    assert not any(dead_request(cfg, reading, m) for m in reading.msgs)
    assert drop_dead_requests(cfg, reading).msgs == ()
