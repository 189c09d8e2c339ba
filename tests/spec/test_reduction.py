"""The dead-request reduction is sound: same verdicts and shortest depths as the unreduced model."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bkref.spec.checker import check
from bkref.spec.configs import CONFIGS, mutant_config
from bkref.spec.protocol import (
    bookie_handles_add,
    bookie_handles_fencing_lac_read,
    bookie_handles_recovery_read,
    dead_request,
    initial_state,
    next_states,
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


def test_delivering_a_dead_request_changes_nothing_but_the_messages() -> None:
    cfg = replace(CONFIGS["a-short"], reduce_dead_requests=False)
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
