"""The refinement machine itself, driven by the spec as its own implementation.

No servers: ``SpecDriver`` takes each step with the spec's action functions.
The correct spec must refine itself on every config; a spec with a mutant
switched on is an implementation with that bug, and must be caught.
"""

from __future__ import annotations

import random
import re
import threading
from dataclasses import replace
from fnmatch import fnmatch
from pathlib import Path

import pytest

from bkref.refine.driver import Performed
from bkref.refine.machine import RunStats, replay, run
from bkref.refine.observe import differences, project
from bkref.refine.spec_driver import SpecDriver
from bkref.spec.config import Config
from bkref.spec.configs import CONFIGS, MUTANT_CONFIGS
from bkref.spec.invariants import INVARIANTS
from bkref.spec.protocol import ACTIONS, Label, State, initial_state, next_states


@pytest.mark.parametrize(
    "name", ["a-short", "a", "b-short", "c-short", "c-workers", "a-recoveries"]
)
def test_the_spec_refines_itself(name: str) -> None:
    stats, found = run(CONFIGS[name], SpecDriver, examples=40, seed=1)
    assert found is None, found.report() if found else ""
    assert stats.steps > 0
    assert stats.states
    assert not stats.refused


def test_another_thread_using_the_global_random_does_not_fail_the_run() -> None:
    # kazoo's connection thread draws from `random` at every turn of its loop; Hypothesis
    # takes a change of the global state during a draw for the strategy's own, and the
    # suite turns its warning into an error. The machine's run must not.
    stop = threading.Event()

    def stir() -> None:
        while not stop.is_set():
            random.randint(1, 40)

    stirrer = threading.Thread(target=stir, daemon=True)
    stirrer.start()
    try:
        stats, found = run(CONFIGS["a-short"], SpecDriver, examples=20, seed=1)
    finally:
        stop.set()
        stirrer.join()
    assert found is None, found.report() if found else ""
    assert stats.examples >= 20


@pytest.mark.slow
@pytest.mark.parametrize(
    "mutant",
    [
        "recovery-reads-without-fence",
        "negative-read-without-coverage",
        "ack-before-fsync",
        "acks-before-ensemble-change-lands",
    ],
)
def test_a_mutant_is_caught_as_an_implementation_with_that_bug(mutant: str) -> None:
    stats, found = run(
        MUTANT_CONFIGS[mutant], lambda: SpecDriver(frozenset({mutant})), examples=2000, seed=0
    )
    assert found is not None, f"{mutant} not caught in {stats.examples} examples"
    assert stats.first_failure <= 2000
    assert found.trace, "a counterexample names the spec steps that lead to it"
    assert "spec steps:" in found.report()


class _ExtraStep(SpecDriver):
    """Reports a follow-up the spec never takes after creating the ledger."""

    def perform(self, label: Label) -> Performed:
        done = super().perform(label)
        if label[0] == "writer_creates_ledger":
            return Performed(followups=(("writer_closes_ledger", ()), ("writer_closes_ledger", ())))
        return done


def test_a_followup_the_spec_does_not_enable_is_a_counterexample() -> None:
    _stats, found = run(CONFIGS["a-short"], _ExtraStep, examples=50, seed=0)
    assert found is not None
    assert "does not enable" in found.what


def test_replay_takes_a_counterexample_s_steps_again_and_passes_over_disabled_ones() -> None:
    # The mutant is in the driver only: the spec it is held to is the correct one.
    cfg, mutant = MUTANT_CONFIGS["recovery-reads-without-fence"], "recovery-reads-without-fence"
    _stats, found = run(cfg, lambda: SpecDriver(frozenset({mutant})), examples=2000, seed=0)
    assert found is not None
    again = replay(cfg, lambda: SpecDriver(frozenset({mutant})), found.chosen)
    assert again is not None
    assert again.trace == found.trace
    stats = RunStats()
    assert replay(cfg, SpecDriver, found.chosen, stats=stats) is None
    assert stats.passed_over == 0
    assert stats.steps >= len(found.chosen) > 0
    # A step the spec does not enable at its turn (no ledger to close yet) is passed
    # over, not taken; the others are taken as before.
    stats = RunStats()
    closes_first = [("writer_closes_ledger", ()), *found.chosen]
    assert replay(cfg, SpecDriver, closes_first, stats=stats) is None
    assert stats.passed_over == 1


class _Forgetful(SpecDriver):
    """Forgets the writer's LAC: a difference no invariant may notice at once."""

    def abstract(self) -> State:
        s = super().abstract()
        return s._replace(w_lac=-1) if s.w_lac >= 0 else s


def test_a_difference_in_one_variable_is_named_in_the_report() -> None:
    _stats, found = run(CONFIGS["a-short"], _Forgetful, examples=200, seed=0)
    assert found is not None
    assert found.impl is not None
    named = [k for k, _a, _b in differences(found.cfg, found.spec, found.impl)]
    # The LAC, and what the projection keeps because of it (acks of entries above it).
    assert "writer.lac" in named
    assert all(k.startswith("writer.") for k in named)
    assert "writer.lac" in found.report()


def _walk_states(cfg: Config, rng: random.Random, walks: int, depth: int) -> list[State]:
    out = []
    for _ in range(walks):
        s = initial_state(cfg)
        for _ in range(depth):
            steps = next_states(cfg, s)
            if not steps:
                break
            s = rng.choice(steps)[1]
            out.append(s)
    return out


@pytest.mark.parametrize(
    "cfg",
    [
        CONFIGS["a"],
        CONFIGS["c"],
        *(replace(c, mutants=frozenset({m})) for m, c in MUTANT_CONFIGS.items()),
    ],
    ids=lambda c: c.name + ("+" + ",".join(sorted(c.mutants)) if c.mutants else ""),
)
def test_the_projection_keeps_every_invariant_verdict(cfg: Config) -> None:
    # project() removes only what no guard or invariant reads: each invariant says the
    # same of a state and of its projection, on states where some are violated too. The
    # ghost au_missed is the exception (observe.py, point 7): the machine judges the
    # implementation's state with the spec's, as here.
    for s in _walk_states(cfg, random.Random(7), walks=40, depth=30):
        p = project(cfg, s)
        for inv in INVARIANTS:
            assert inv(cfg, s) == inv(cfg, p._replace(au_missed=s.au_missed)), inv.__name__
        assert project(cfg, p) == p


def test_the_docs_map_every_spec_action_to_a_bkref_step() -> None:
    """docs/refine.md's table names each action of ``bkref.spec.protocol.ACTIONS`` (a family of
    actions by its ``*`` row), so that a new action cannot go unmapped."""
    text = (Path(__file__).parents[2] / "docs" / "refine.md").read_text()
    table = text.split("### Spec action → bkref step", 1)[1].split("\n###", 1)[0]
    rows = re.findall(r"^\| `([a-z_*]+)", table, re.MULTILINE)
    rows += re.findall(r"^\| `[a-z_]+` / `([a-z_]+)`", table, re.MULTILINE)
    for action in ACTIONS:
        name = action.__name__
        assert any(fnmatch(name, row) for row in rows), f"{name} is not in docs/refine.md"
