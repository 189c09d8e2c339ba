"""The model checker: the correct spec passes short configs; symmetry is sound; walks."""

from __future__ import annotations

import random

import pytest

from bkref.spec.checker import check, walk
from bkref.spec.config import Config
from bkref.spec.configs import CONFIGS, mutant_config
from bkref.spec.protocol import W_OPEN, Label, State, initial_state, next_states
from bkref.spec.symmetry import canonical, rename
from bkref.spec.visited import collision_probability, fingerprint

SHORT = ["a-short", "b-short", "c-short"]


@pytest.mark.parametrize("name", SHORT)
def test_short_configs_pass_every_invariant_exhaustively(name: str) -> None:
    r = check(CONFIGS[name])
    assert r.violation is None
    assert r.complete
    assert r.distinct > 1_000  # the run really explored something


def test_canonical_form_is_the_same_for_every_renaming_of_bookies() -> None:
    cfg = CONFIGS["a-short"]
    rng = random.Random(7)
    seen = [initial_state(cfg)]
    frontier = list(seen)
    for _ in range(12):  # a few BFS layers of concrete states
        frontier = [t for s in frontier for _l, t in next_states(cfg, s)]
        rng.shuffle(frontier)
        frontier = frontier[:40]
        seen += frontier
    for s in seen:
        perm = list(range(cfg.bookies))
        rng.shuffle(perm)
        assert canonical(rename(s, tuple(perm))) == canonical(s)


def test_symmetry_shrinks_the_state_space_without_changing_the_verdict() -> None:
    cfg = CONFIGS["a-short"]
    with_sym = check(cfg)
    without = check(cfg, symmetry=False)
    assert without.violation is None
    assert without.distinct > 2 * with_sym.distinct


def test_a_shortest_trace_is_replayable_from_the_initial_state() -> None:
    r = check(mutant_config("negative-read-without-coverage"))
    assert r.violation == "NoDivergenceBetweenClientAndMetaData"
    cfg = r.config
    for before, after in zip(r.trace, r.trace[1:], strict=False):
        assert after.state in {t for _l, t in next_states(cfg, before.state)}
    # shortest: no violation at any earlier depth
    assert check(cfg, max_states=None).depth == r.depth


def test_random_walks_are_reproducible_and_find_a_mutant() -> None:
    cfg = mutant_config("negative-read-without-coverage")
    first = walk(cfg, 20_000, seed=3)
    again = walk(cfg, 20_000, seed=3)
    assert first.violation == "NoDivergenceBetweenClientAndMetaData"
    assert [s.action for s in first.trace] == [s.action for s in again.trace]


def test_random_walks_of_the_correct_spec_go_deep_without_violation() -> None:
    w = walk(CONFIGS["a"], 5_000, seed=1)
    assert w.violation is None
    assert w.steps == 5_000
    assert w.max_depth > 15


def test_walks_count_the_distinct_states_they_saw_as_the_bfs_counts_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import bkref.spec.checker

    cfg = CONFIGS["b-short"]
    bfs = check(cfg, keep_graph=True)
    assert bfs.graph is not None
    everything = {fingerprint(s) for s in bfs.graph.states}  # canonical, as the BFS keeps them
    # A walk asks for the successors of every state it is in, the last one included.
    visited: list[State] = []

    def recording(c: Config, s: State) -> list[tuple[Label, State]]:
        visited.append(s)
        return next_states(c, s)

    monkeypatch.setattr(bkref.spec.checker, "next_states", recording)
    w = walk(cfg, 3_000, seed=2)
    walked = {fingerprint(canonical(s)) for s in visited}
    assert w.violation is None
    assert w.distinct == len(walked)
    assert walked <= everything  # every state a walk saw is one the BFS counts
    assert 1 < w.distinct <= min(bfs.distinct, w.steps + 1)


def test_config_b_reaches_a_striped_ensemble_change_in_the_metadata() -> None:
    cfg = CONFIGS["b"]
    rng = random.Random(1)
    landed = False
    for _ in range(3000):
        s = initial_state(cfg)
        for _step in range(60):
            succ = list(next_states(cfg, s))
            if not succ:
                break
            (name, _args), s = rng.choice(succ)
            if name == "writer_completes_ensemble_change" and s.w_status == W_OPEN:
                landed = s.meta_segments[0] == s.w_segments  # the CAS landed
        if landed:
            break
    assert landed


def test_the_levels_count_the_new_states_at_each_bfs_depth() -> None:
    # Against the graph: a state's depth is its parent's plus one (Init at depth 0).
    r = check(CONFIGS["c"], keep_graph=True)
    assert r.graph is not None
    depth: list[int] = []
    for p in r.graph.parent:
        depth.append(0 if p < 0 else depth[p] + 1)
    assert r.levels == [depth.count(d) for d in range(max(depth) + 1)]
    assert len(r.levels) == r.depth + 1
    assert sum(r.levels) == r.distinct
    # A search stopped early keeps the levels it began, the last one partial.
    short = check(CONFIGS["c"], max_states=1_000)
    assert short.levels[:-1] == r.levels[: len(short.levels) - 1]
    assert 0 < short.levels[-1] <= r.levels[len(short.levels) - 1]
    assert sum(short.levels) == short.distinct


def test_workers_give_the_same_result_as_one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    import bkref.spec.checker

    monkeypatch.setattr(bkref.spec.checker, "PARALLEL_MIN_LAYER", 1)  # fork even for tiny layers
    # Config c: 14,548 states in 30 layers, each forked (c-short's 121,379 made the same
    # claims at 8 times the CPU).
    for cfg in (CONFIGS["c"], mutant_config("recovery-reads-without-fence")):
        one = check(cfg, keep_graph=True)
        two = check(cfg, keep_graph=True, workers=2)
        assert (two.distinct, two.explored, two.depth) == (one.distinct, one.explored, one.depth)
        assert two.levels == one.levels
        assert two.violation == one.violation
        assert two.trace == one.trace
        assert one.graph is not None
        assert two.graph is not None
        assert two.graph.states == one.graph.states
        assert two.graph.edges == one.graph.edges


def test_fingerprints_and_layers_on_disk_give_the_same_result(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import bkref.spec.checker

    monkeypatch.setattr(bkref.spec.checker, "PARALLEL_MIN_LAYER", 1)
    monkeypatch.setattr(bkref.spec.checker, "LAYER_BATCH", 300)  # several pools per layer
    # Config c: 14,548 states in 30 layers, several pools each (c-short's 121,379 took 114 s
    # of a loaded run for the same claims).
    for cfg in (CONFIGS["c"], mutant_config("delete-task-without-version-check")):
        whole = check(cfg)
        for workers in (1, 2):
            fp = check(cfg, fingerprints=True, workers=workers)
            assert (fp.distinct, fp.explored, fp.depth) == (
                whole.distinct,
                whole.explored,
                whole.depth,
            )
            assert fp.violation == whole.violation
            assert fp.levels == whole.levels
            assert fp.trace == whole.trace
            assert fp.fingerprints
            assert 0 < fp.collision_probability < 1e-9
    assert whole.collision_probability == 0.0


def test_fingerprints_tell_minus_one_from_minus_two() -> None:
    # CPython's hash(-1) == hash(-2): a fingerprint built on hash(state) would merge these.
    s = initial_state(CONFIGS["a"])
    assert hash(s._replace(w_lac=-1)) == hash(s._replace(w_lac=-2))
    assert fingerprint(s._replace(w_lac=-1)) != fingerprint(s._replace(w_lac=-2))


def test_the_collision_estimate_is_the_birthday_bound() -> None:
    assert collision_probability(1) == 0.0
    assert collision_probability(2**32) == pytest.approx(0.5, rel=1e-6)
    assert collision_probability(2**40) == 1.0
    with pytest.raises(ValueError, match="keep_graph"):
        check(CONFIGS["c-short"], fingerprints=True, keep_graph=True)
