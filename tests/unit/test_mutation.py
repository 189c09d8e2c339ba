"""`make mutation`'s machinery (tests/mutation), small but real: cosmic-ray's mutants of
a spec module, run on copies of the tree, judged by the spec's own checker."""

from __future__ import annotations

import ast
import json
import os
import random
import shlex
import subprocess
import sys
from collections.abc import Callable
from importlib import import_module
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import tests.mutation.session as session_module
from tests.mutation.__main__ import again_jobs, set_timeout
from tests.mutation.sampling import annotation_spans, draw, in_annotation
from tests.mutation.score import (
    Score,
    mutant_key,
    outcome,
    wilson,
)
from tests.mutation.selection import ALL, changed_lines, measure, runs, statements
from tests.mutation.session import (
    ROOT,
    Session,
    Target,
    copy_tree,
)

# The smallest configs of spec-check that use the quorum arithmetic, and a hand-written
# mutant's config (m-4651: acks of a replaced bookie), so the smoke run takes seconds.
ONLY = "a-short,m-4651,live-check"
PROTOCOL = "bkref/spec/protocol.py"
MEASURE = f"{PROTOCOL},bkref/spec/quorum.py"

SOURCE = """\
LIMIT = 3


class Box:
    size = 2

    @staticmethod
    def fits(n: int, cap: int = LIMIT) -> bool:
        if n > cap:
            return False
        total = (n +
                 1)
        return total <= cap
"""


def test_two_mutants_of_one_operator_on_one_line_have_two_keys() -> None:
    def result(after: str) -> dict[str, object]:
        diff = f"--- a/m.py\n+++ b/m.py\n@@ -9 +9 @@\n-        if n > cap:\n+{after}\n"
        where = {"module": "m.py", "definition": "fits", "line": 9}
        return where | {"operator": "core/NumberReplacer", "diff": diff}

    one, other = (mutant_key(result(a), SOURCE) for a in ("if n > 1:", "if n > -1:"))
    assert one != other
    assert one.endswith("if n > cap: => if n > 1:")


def test_a_mutant_keeps_its_key_when_lines_above_it_move() -> None:
    # A stored run's line numbers point elsewhere once the file is edited above them:
    # the key takes the line as the mutant's diff shows it (a verdict then still applies).
    diff = "--- a/m.py\n+++ b/m.py\n@@ -9 +9 @@\n-        if n > cap:\n+        if n > 1:\n"
    r = {"module": "m.py", "definition": "fits", "line": 9, "operator": "o", "diff": diff}
    moved = "# an edit\n# above it\n" + SOURCE
    assert mutant_key(r, moved) == mutant_key(r, SOURCE)
    assert mutant_key(r, SOURCE).endswith("if n > cap: => if n > 1:")


def test_a_change_maps_to_its_innermost_statement_or_to_every_config() -> None:
    assert changed_lines(SOURCE, SOURCE.replace("n > cap", "n >= cap")) == {9}
    assert statements(SOURCE, {9}) == {9}  # the if's test
    assert statements(SOURCE, {10}) == {10}
    # A statement over several lines is seen on any of them (below).
    assert statements(SOURCE, {12}) == {11, 12}
    assert statements(SOURCE, {10, 13}) == {10, 13}
    # Executed at import, by every config: a constant, a class attribute, a default.
    assert statements(SOURCE, {1}) is ALL
    assert statements(SOURCE, {5}) is ALL
    assert statements(SOURCE, {8}) is ALL
    assert statements(SOURCE, {7}) is ALL  # a decorator


SPREAD = """\
def repair(pending: int, swapping: bool) -> bool:
    if (
        pending != 1
        and not swapping
    ):
        return False
    return True
"""


def test_a_run_that_took_a_condition_spread_over_lines_sees_a_change_to_it(
    tmp_path: Path,
) -> None:
    # coverage.py records the lines an `if (` runs bytecode on: the operands it
    # evaluated, never the `if (` itself. A run that evaluated line 4 (c-lock's, on the
    # spec sample's mutant of such an operand) must see a change to it; when only the
    # `if (` line counted, that mutant ran no config at all.
    (tmp_path / "spread.py").write_text(SPREAD)
    sys.path.insert(0, str(tmp_path))
    try:
        module = import_module("spread")
        _, took = measure(tmp_path, ["spread.py"], lambda: module.repair(2, False))
        _, skipped = measure(tmp_path, ["spread.py"], lambda: module.repair(1, False))
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("spread", None)
    assert {3, 4, 6} <= set(took["spread.py"])
    assert 2 not in set(took["spread.py"]) | set(skipped["spread.py"])  # Python 3.11's lines
    stmts = statements(SPREAD, changed_lines(SPREAD, SPREAD.replace("not swapping", "swapping")))
    assert stmts == {2, 3, 4, 5}
    assert runs(took, {}, "spread.py", stmts)
    assert runs(skipped, {}, "spread.py", stmts)  # it evaluated line 3 of the statement
    # A change to the body only is seen only by a run that took the body.
    assert runs(took, {}, "spread.py", statements(SPREAD, {6}))
    assert not runs(skipped, {}, "spread.py", statements(SPREAD, {6}))
    # A compound statement on one line is that line; a header that ends on its body's
    # line holds that line too, so a run that stopped at its first operand sees it.
    assert statements("def f(x):\n    if x: return 1\n", {2}) == {2}
    assert statements("def f(a, b):\n    if (a\n            and b): return 1\n", {3}) == {2, 3}


ANNOTATED = """\
from __future__ import annotations
LIMIT: int | None = 3
def f(a: int | None, b=1 | 2) -> dict[str, int] | None:
    x: list[int] = [a | b]
    return None
"""


def test_a_mutant_in_an_annotation_is_found_and_one_in_code_is_not() -> None:
    spans = annotation_spans(ANNOTATED)
    # The `|` of each annotation: module-level, argument, return, local.
    for pos in [(2, 11), (3, 13), (3, 48), (4, 7)]:
        assert in_annotation(pos, spans), pos
    # The `|` of a default and of an expression are code, evaluated at run time.
    assert not in_annotation((3, 25), spans)
    assert not in_annotation((4, 22), spans)
    assert ANNOTATED.splitlines()[2][25] == ANNOTATED.splitlines()[3][22] == "|"


def test_the_sample_leaves_out_annotations_and_keeps_the_seed_s_other_draws(
    tmp_path: Path,
) -> None:
    (tmp_path / "m.py").write_text(ANNOTATED)
    annotated = [(2, 11), (3, 13), (3, 48)]
    code = [(3, 25), (4, 22)] + [(5, c) for c in range(4, 10)]
    items = [
        SimpleNamespace(
            job_id=f"j{n}", mutations=[SimpleNamespace(module_path="m.py", start_pos=pos)]
        )
        for n, pos in enumerate(annotated + code)
    ]
    for seed in range(20):
        chosen, n_annotated = draw(items, 5, seed, tmp_path)
        assert n_annotated == 3
        assert len(chosen) == len({i.job_id for i in chosen}) == 5
        assert not any(i.mutations[0].start_pos in annotated for i in chosen)
        # The plain draw of the same seed, less its annotations, is kept.
        first = random.Random(seed).sample(items, 5)
        assert {i.job_id for i in first if i.mutations[0].start_pos in code} <= {
            i.job_id for i in chosen
        }


def test_a_target_s_digest_names_its_own_test_scripts_only() -> None:
    spec, core = Target.load("spec"), Target.load("core")
    assert [p.name for p in spec.scripts()] == ["selection.py", "spec_kill.py"]
    assert [p.name for p in core.scripts()] == ["core_kill.py", "selection.py"]


def test_the_wilson_interval_has_its_textbook_values() -> None:
    lo, hi = wilson(5, 10)
    assert (round(lo, 4), round(hi, 4)) == (0.2366, 0.7634)
    assert wilson(10, 10)[1] == 1.0
    assert round(wilson(10, 10)[0], 4) == 0.7225
    assert wilson(0, 0) == (0.0, 1.0)


def _kill(
    tree: Path, baseline: Path, env: dict[str, str] | None = None, codes: tuple[int, ...] = (0, 1)
) -> tuple[int, dict[str, object]]:
    done = subprocess.run(
        [sys.executable, "-m", "tests.mutation.spec_kill", str(baseline)],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env=None if env is None else {**os.environ, **env},
    )
    assert done.returncode in codes, done.stderr
    return done.returncode, json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_the_spec_kill_passes_the_spec_and_kills_a_broken_quorum(tmp_path: Path) -> None:
    from cosmic_ray.mutating import mutate_code
    from cosmic_ray.plugins import get_operator

    tree = tmp_path / "tree"
    copy_tree(tree)
    baseline = tmp_path / "baseline.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.mutation.spec_kill",
            "--only",
            ONLY,
            "--measure",
            MEASURE,
            "--baseline",
            str(baseline),
        ],
        cwd=tree,
        check=True,
        capture_output=True,
        timeout=600,
    )
    base = json.loads(baseline.read_text())
    assert set(base["configs"]) == set(ONLY.split(","))
    assert set(base["mutants"]) == {"acks-from-replaced-bookie-count"}  # m-4651's
    # The copy, unmutated: every verdict as the baseline's.
    status, verdict = _kill(tree, baseline)
    assert (status, verdict["verdict"], verdict["changed"]) == (0, "survived", {})
    # `count >= Wq - Aq + 1` made `count < ...`: a recovery takes too few answers for
    # coverage and closes the ledger before an acknowledged entry (a-short).
    quorum = tree / "bkref" / "spec" / "quorum.py"
    source = quorum.read_text()
    op = get_operator("core/ReplaceComparisonOperator_GtE_Lt")()
    mutated = mutate_code(source, op, 0)
    assert mutated is not None
    assert mutated != source
    quorum.write_text(mutated)
    status, verdict = _kill(tree, baseline)
    assert status == 1, verdict
    assert verdict["verdict"] == "killed"
    assert verdict["by"] == "a-short violates NoDivergenceBetweenClientAndMetaData"
    quorum.write_text(source)
    protocol = tree / PROTOCOL
    text = protocol.read_text()
    # A mutant that changes only how a trace names a step breaks no invariant: the trace
    # a hand-written mutant's example documents shows it.
    names = 'W_NAMES = ("NONE", "OPEN", "CLOSED", "WITHDRAWN")'
    assert text.count(names) == 1
    protocol.write_text(text.replace(names, names.replace('"OPEN"', '"OPENED"')))
    status, verdict = _kill(tree, baseline)
    assert status == 1, verdict
    assert verdict["by"] == "hand-written mutant acks-from-replaced-bookie-count: its trace differs"
    # Selection: a statement no measured config executes is never run, one a-short
    # executes is. Each is made to raise, which kills the mutant wherever it runs.
    runs = {c: set(v["lines"][PROTOCOL]) for c, v in base["configs"].items()}
    runs |= {m: set(v["lines"][PROTOCOL]) for m, v in base["mutants"].items()}
    runs["import"] = set(base["import"][PROTOCOL])
    assert runs["import"], "importing the spec runs some of its functions' bodies"
    unrun = _simple_statement(text, lambda n: all(n not in r for r in runs.values()))
    protocol.write_text(_raise_at(text, unrun))
    status, verdict = _kill(tree, baseline)
    assert (status, verdict["verdict"], verdict["ran"]) == (0, "survived", []), verdict
    run_by_a_short = _simple_statement(text, lambda n: n in runs["a-short"])
    protocol.write_text(_raise_at(text, run_by_a_short))
    status, verdict = _kill(tree, baseline)
    assert status == 1, verdict
    assert str(verdict["by"]).startswith("crashed: RuntimeError: planted"), verdict
    # A recovery that counts its write-backs' acks only when it is neither reading nor
    # writing never closes: a-short grows past three times its states, but not past the
    # floor, so it is searched whole and its liveness goal fails.
    acks = "    if r.phase not in (RC_READING, RC_WRITING):\n        return s\n    if not last_"
    assert text.count(acks) == 1
    protocol.write_text(text.replace(acks, acks.replace("if r.phase", "if not r.phase")))
    status, verdict = _kill(tree, baseline)
    assert status == 1, verdict
    assert verdict["by"] == "a-short: liveness <>ledger-closed fails", verdict
    # A guard that refuses more breaks no invariant and no liveness goal: the auditor
    # never loses its session. spec-check's coverage fails on the branch no config
    # reaches any more (live-check reached it).
    guard = "if node < 0 or s.budget[B_ELECT] == 0:"
    assert text.count(guard) == 1
    protocol.write_text(text.replace(guard, "if node < 0 or s.budget[B_ELECT] >= 0:"))
    status, verdict = _kill(tree, baseline)
    assert status == 1, verdict
    assert verdict["by"] == (
        "spec-check's coverage: no config reaches the branch auditor_loses_session#1 now"
    ), verdict


@pytest.mark.slow
def test_the_spec_s_own_tests_kill_what_its_configs_do_not_see(tmp_path: Path) -> None:
    """Verdict 4: a statement of the spec that a test file of its suite executes and no
    measured config does. Planted to raise, the configs pass and the test fails."""
    tree = tmp_path / "tree"
    copy_tree(tree)
    baseline = tmp_path / "baseline.json"
    suite = "tests/spec/test_protocol.py"
    argv = ["--measure", PROTOCOL, "--suite", suite, "--refine", "", "--baseline", str(baseline)]
    subprocess.run(
        [sys.executable, "-m", "tests.mutation.spec_kill", "--only", "a-short", *argv],
        cwd=tree,
        check=True,
        capture_output=True,
        timeout=600,
    )
    base = json.loads(baseline.read_text())
    assert set(base["suite"]) == {suite}
    assert base["refine"] == {}
    by_config = set(base["configs"]["a-short"]["lines"][PROTOCOL]) | set(base["import"][PROTOCOL])
    by_test = set(base["suite"][suite]["lines"][PROTOCOL])
    text = (tree / PROTOCOL).read_text()
    line = _simple_statement(text, lambda n: n in by_test and n not in by_config)
    (tree / PROTOCOL).write_text(_raise_at(text, line))
    status, verdict = _kill(tree, baseline)
    assert status == 1, verdict
    assert str(verdict["by"]).startswith(f"spec tests: FAILED {suite}::"), verdict
    # The same statement made slow: the test passes pytest-timeout's limit (made 2 s
    # here), which says nothing of the mutant's behaviour. Not a kill: a timeout (exit 2).
    (tree / PROTOCOL).write_text(_raise_at(text, line, "__import__('time').sleep(60)"))
    status, verdict = _kill(tree, baseline, {"PYTEST_ADDOPTS": "--timeout=2"}, codes=(2,))
    assert verdict["verdict"] == "timeout", verdict
    assert str(verdict["by"]).endswith(": past pytest-timeout"), verdict


def test_a_budget_no_config_spends_any_more_kills_the_mutant() -> None:
    """A mutant that stops spending a budget (a recovery gives up without counting it)
    merges states and breaks no invariant; spec-check's bounds fail on it."""
    from tests.mutation.spec_kill import _unreached

    def reach(bounds: list[str]) -> dict[str, list[str]]:
        return {"branches": [], "races": [], "effects": [], "bounds": bounds}

    base = {"configs": {"a-give-up": {"reach": reach(["give_ups", "losses"])}}}
    assert _unreached(base, {"a-give-up": reach(["give_ups", "losses"])}) is None
    assert _unreached(base, {"a-give-up": reach(["losses"])}) == (
        "no config spends its budget of give_ups to 0 now"
    )


def _core_kill(tree: Path, *argv: str) -> tuple[int, dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "tests.mutation.core_kill", *argv],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode in (0, 1), done.stdout[-2000:] + done.stderr[-2000:]
    verdict: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return done.returncode, verdict


@pytest.mark.slow
def test_the_core_kill_selects_by_its_baseline_and_kills_a_broken_quorum(tmp_path: Path) -> None:
    from cosmic_ray.mutating import mutate_code
    from cosmic_ray.plugins import get_operator

    tree = tmp_path / "tree"
    copy_tree(tree)
    # Two of the core's test files: measuring all 17 under coverage.py was 60 of this
    # test's 88 CPU s; `make mutation` measures them all.
    tests = "tests/impl/test_writer_recovery.py,tests/impl/test_reads.py"
    short = ("--configs", "a-short", "--examples", "3", "--tests", tests)
    baseline = tmp_path / "baseline.json"
    # Measuring runs the core test files and the refinement config on the unmutated
    # core (each must pass) under coverage.py.
    subprocess.run(
        [sys.executable, "-m", "tests.mutation.core_kill", "--baseline", str(baseline), *short],
        cwd=tree,
        check=True,
        capture_output=True,
        timeout=900,
    )
    base = json.loads(baseline.read_text())
    assert set(base["configs"]) == {"a-short"}
    assert set(base["tests"]) == set(tests.split(","))
    writer = "bkref/impl/core/writer.py"
    assert base["configs"]["a-short"]["lines"][writer], "the refinement machine writes"
    # The client's ack quorum test made `<`: the core's own tests fail first.
    quorum = tree / "bkref" / "impl" / "core" / "quorum.py"
    source = quorum.read_text()
    mutated = mutate_code(source, get_operator("core/ReplaceComparisonOperator_GtE_Lt")(), 3)
    assert mutated is not None
    assert "return len(ws.intersection(acked)) < self.ack_quorum" in mutated
    quorum.write_text(mutated)
    status, verdict = _core_kill(tree, str(baseline), *short)
    assert status == 1, verdict
    assert verdict["verdict"] == "killed"
    assert str(verdict["by"]).startswith("core tests: FAILED"), verdict
    quorum.write_text(source)
    # A module-level alias `A | B` made `A * B` raises as the core is imported: pytest
    # cannot load its conftest (exit 4), and every test fails with it.
    reads = tree / "bkref" / "impl" / "core" / "reads.py"
    text = reads.read_text()
    alias = "EntryReadAction = SendRead | ReadCompleted"
    assert alias in text
    reads.write_text(text.replace(alias, alias.replace("|", "*")))
    status, verdict = _core_kill(tree, str(baseline), *short)
    assert status == 1, verdict
    assert str(verdict["by"]).startswith("core tests: the core does not import"), verdict
    reads.write_text(text)
    # A statement of the writer that a-short executes, rewritten to the same effect
    # (`x = (...)`): the selected test files and the machine run, and it survives.
    stages = [*base["tests"].values(), *base["configs"].values()]
    text = (tree / writer).read_text()
    run = set(base["configs"]["a-short"]["lines"][writer])
    (tree / writer).write_text(_parenthesised(text, run))
    status, verdict = _core_kill(tree, str(baseline), *short)
    assert (status, verdict["verdict"]) == (0, "survived"), verdict
    assert "a-short" in verdict["ran"]
    # A statement no test file and no config executes is run by none of them.
    unrun = _simple_statement(
        text,
        lambda n: (
            all(n not in st["lines"][writer] for st in stages) and n not in base["import"][writer]
        ),
    )
    (tree / writer).write_text(_raise_at(text, unrun))
    status, verdict = _core_kill(tree, str(baseline), *short)
    assert (status, verdict["verdict"], verdict["ran"]) == (0, "survived", []), verdict


def _parenthesised(source: str, lines: set[int]) -> str:
    """``source`` with the value of its first one-line assignment on one of ``lines``
    in parentheses: the same program, a changed line."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign) and node.lineno in lines:
            v = node.value
            if v.lineno == v.end_lineno == node.lineno and v.end_col_offset is not None:
                text = source.splitlines(keepends=True)
                ln = text[v.lineno - 1]
                a, b = v.col_offset, v.end_col_offset
                text[v.lineno - 1] = f"{ln[:a]}({ln[a:b]}){ln[b:]}"
                return "".join(text)
    raise AssertionError("no such assignment")


def _simple_statement(source: str, want: Callable[[int], bool]) -> int:
    """The line of the first one-line assignment or expression in a function body of
    ``source`` for which ``want`` holds."""
    for fn in ast.walk(ast.parse(source)):
        if isinstance(fn, ast.FunctionDef):
            for st in fn.body:
                one_line = st.lineno == st.end_lineno
                if isinstance(st, ast.Assign | ast.Expr) and one_line and want(st.lineno):
                    return st.lineno
    raise AssertionError("no such statement")


def _raise_at(source: str, line: int, statement: str = "") -> str:
    """The source with the statement at ``line`` replaced: by a raise, or ``statement``."""
    lines = source.splitlines(keepends=True)
    indent = lines[line - 1][: len(lines[line - 1]) - len(lines[line - 1].lstrip())]
    planted = statement or f"raise RuntimeError('planted at line {line}')"
    lines[line - 1] = f"{indent}{planted}\n"
    return "".join(lines)


@pytest.mark.slow
def test_a_sampled_session_runs_on_copies_and_is_scored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        "[tool.bkref.mutation.smoke]\n"
        'modules = ["bkref/spec/quorum.py"]\n'
        f'baseline-command = "{{python}} -m tests.mutation.spec_kill --only {ONLY} '
        f'--measure {MEASURE} --baseline {{work}}/baseline.json"\n'
        'test-command = "{python} -m tests.mutation.spec_kill {work}/baseline.json"\n'
        "timeout = 300\n"
        'exclude-operators = ["core/ReplaceComparisonOperator_.*_(Is|IsNot)$"]\n'
    )
    target = Target.load("smoke", pyproject)
    session = Session(target, tmp_path / "work")
    session.create(sample=3, seed=7, workers=2, log=lambda _m: None)
    assert session.meta()["sampled"] == 3
    assert len(session.shards()) == 2
    assert session.matches(3, 7, 2)
    assert not session.matches(3, 8, 2)
    command = target.baseline_command.format(python=sys.executable, work=session.work)
    subprocess.run(shlex.split(command), cwd=session.shards()[0], check=True, timeout=600)
    assert session.run(budget=600, log=lambda _m: None)
    results = session.results()
    assert len(results) == 3
    assert {outcome(r) for r in results} <= {"killed", "survived"}
    assert all(r["module"] == "bkref/spec/quorum.py" and r["diff"] for r in results)
    # The checkout was never touched: cosmic-ray mutated the copies only.
    assert (
        subprocess.run(
            ["git", "diff", "--quiet", "--", "bkref/spec/quorum.py"], cwd=ROOT, check=False
        ).returncode
        == 0
    )
    source = (ROOT / "bkref/spec/quorum.py").read_text()
    keys = {r["job"]: mutant_key(r, source) for r in results}
    score = Score("smoke", results, keys, {})
    assert score.judged == 3
    assert 0.0 <= score.interval[0] <= score.score <= score.interval[1] <= 1.0
    # What ran is kept with its baseline: a session of the same sources on a new machine
    # (a new work folder) takes the baseline instead of measuring it; other sources do not.
    monkeypatch.setattr(session_module, "STORED", tmp_path / "stored")
    session.store()
    measured = json.loads((session.work / "baseline.json").read_text())
    elsewhere = Session(target, tmp_path / "elsewhere")
    elsewhere.create(sample=3, seed=7, workers=2, log=lambda _m: None)
    assert json.loads((elsewhere.work / "baseline.json").read_text()) == measured
    kept = json.loads(session.stored_baseline.read_text())
    session.stored_baseline.write_text(json.dumps({**kept, "digest": "other sources"}))
    other = Session(target, tmp_path / "other")
    other.create(sample=3, seed=7, workers=2, log=lambda _m: None)
    assert not (other.work / "baseline.json").exists()
    # `--again`: a job runs again (with today's tests and a new baseline); the rest stand.
    again = results[0]["job"]
    session.again({again}, log=lambda _m: None)
    assert session.pending() == 1
    assert {r["job"] for r in session.results()} == set(keys) - {again}
    assert not (session.work / "baseline.json").exists()
    assert session.meta()["again"][0]["jobs"] == 1


def test_a_spent_budget_stops_every_test_and_returns_when_they_are_gone(tmp_path: Path) -> None:
    # cosmic-ray starts each test in a session of its own: stopping the exec alone would
    # leave the test running after run() returned.
    marker = f"bkref-mutation-stop-{tmp_path.name}"
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        "[tool.bkref.mutation.stuck]\n"
        'modules = ["bkref/spec/quorum.py"]\n'
        f"test-command = \"{{python}} -c 'import time; time.sleep(300)' {marker}\"\n"
        "timeout = 600\n"
    )
    session = Session(Target.load("stuck", pyproject), tmp_path / "work")
    session.create(sample=2, seed=1, workers=2, log=lambda _m: None)
    assert session.run(budget=8, log=lambda _m: None) is False
    left = [
        p.parent.name for p in Path("/proc").glob("[0-9]*/cmdline") if marker.encode() in _read(p)
    ]
    assert left == [], f"tests still running after run() returned: {left}"
    # Each copy holds its unmutated source again at the next run's start.
    assert session.pending() == 2


@pytest.mark.slow
def test_a_timeout_runs_again_with_a_longer_timeout(tmp_path: Path) -> None:
    # A test that takes 3 s under a timeout of 1 s: cosmic-ray stops each and records a
    # timeout, which nothing judged. `--again` takes it up with the errors and survivors
    # without a credited verdict; `--timeout` gives it the time it needs, and it survives.
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        "[tool.bkref.mutation.slow]\n"
        'modules = ["bkref/spec/quorum.py"]\n'
        "test-command = \"{python} -c 'import time; time.sleep(3)'\"\n"
        "timeout = 1\n"
    )
    session = Session(Target.load("slow", pyproject), tmp_path / "work")
    session.create(sample=2, seed=7, workers=1, log=lambda _m: None)
    assert session.run(budget=300, log=lambda _m: None)
    first = session.results()
    assert [outcome(r) for r in first] == ["timeout", "timeout"]
    jobs = again_jobs(Score("slow", first, {r["job"]: r["job"] for r in first}, {}))
    assert jobs == {r["job"] for r in first}
    session.again(jobs, log=lambda _m: None)
    set_timeout(session, 60)
    assert session.run(budget=300, log=lambda _m: None)
    assert [outcome(r) for r in session.results()] == ["survived", "survived"]


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""
