"""Survivors' verdicts held to what they claim (tests/mutation/verdicts.toml), and how a
mutant's outcome is counted: a verdict's kill is run, not taken on trust."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.mutation.score import (
    Score,
    diff_lines,
    load_verdicts,
    mark_syntax_errors,
    mutant_key,
    outcome,
)
from tests.mutation.session import ROOT

PROTOCOL = "bkref/spec/protocol.py"


def _definition_at(source: str) -> dict[int, str]:
    """The innermost function or class each line of ``source`` is in (1-based; none: module
    level), as cosmic-ray names a mutant's definition (a decorator is outside its class)."""
    spans = sorted(
        (node.lineno, node.end_lineno or node.lineno, node.name)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    )
    # Sorted by start, an inner definition comes after the one around it and overwrites it.
    return {line: name for lo, hi, name in spans for line in range(lo, hi + 1)}


def _mutated(source: str, diff: str, near: int, definition: str) -> str:
    """``source`` with a one-line mutant's diff applied to the matching line in the
    function it was found in (``definition``, "None" at module level; two functions may
    share a line, a signature), nearest ``near``: its line when it ran, since the file may
    have changed around it."""
    old, new = diff_lines(diff)
    assert len(old) == len(new) == 1, f"not a one-line mutant:\n{diff}"
    lines = source.splitlines(keepends=True)
    at = [i for i, ln in enumerate(lines) if ln.rstrip("\n") == old[0]]
    assert at, f"the mutated line is no longer in the source: {old[0].strip()}"
    where = _definition_at(source)
    inside = [i for i in at if where.get(i + 1, "None") == definition]
    assert inside, f"the mutated line is no longer in {definition}: {old[0].strip()}"
    i = min(inside, key=lambda i: abs(i + 1 - near))
    lines[i] = new[0] + "\n"
    return "".join(lines)


EARLIER = "tests/data/mutation/spec-earlier-survivors.json"


def _judged(kind: str) -> list[tuple[dict[str, Any], dict[str, str]]]:
    """The stored spec results judged ``kind``, with their verdicts: the stored run's,
    and those of earlier runs whose survivors a config or a test added since kills (kept
    in tests/data/mutation when a new run replaced their results)."""
    results = [
        r
        for path in ("tests/mutation/results/spec.json", EARLIER)
        for r in json.loads((ROOT / path).read_text())["results"]
    ]
    source = (ROOT / PROTOCOL).read_text()
    verdicts = load_verdicts()
    return [
        (r, verdicts[k])
        for r in results
        if (k := mutant_key(r, source)) in verdicts and verdicts[k]["verdict"] == kind
    ]


def _mutated_tree(tmp_path: Path, r: dict[str, Any], *parts: str) -> Path:
    """A copy of ``parts`` of the checkout whose spec holds the mutant ``r``, applied to
    today's spec."""
    tree = tmp_path / f"line-{r['line']}"  # one mutant a test case, so one tree a tmp_path
    (tree / "tests").mkdir(parents=True)  # a file of tests/ may come before the folder
    for part in parts:
        if (ROOT / part).is_dir():
            shutil.copytree(ROOT / part, tree / part, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / part, tree / part)
    source = (ROOT / PROTOCOL).read_text()
    mutated = _mutated(source, str(r["diff"]), r["line"], str(r["definition"]))
    (tree / PROTOCOL).write_text(mutated)
    return tree


def _run_in(tree: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree), "BKREF_SPEC": "pure"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def _where(r: dict[str, Any]) -> str:
    return "module" if r["definition"] == "None" else str(r["definition"])


def _cases(kind: str) -> list[Any]:
    """One test case per verdict of ``kind``: each has its own time limit, and a wrong
    verdict fails alone, named by its mutant's function, line and operator."""
    return [
        pytest.param(r, v, id=f"{_where(r)}-line-{r['line']}-{str(r['operator']).split('/')[-1]}")
        for r, v in _judged(kind)
    ]


def test_each_kind_of_later_kill_has_verdicts_to_check() -> None:
    # Without one, the two tests below would check nothing.
    assert _cases("killed-by-config"), "no survivor judged killed-by-config"
    assert _cases("killed-by-test"), "no survivor judged killed-by-test"


@pytest.mark.slow
@pytest.mark.parametrize(("r", "v"), _cases("killed-by-config"))
def test_a_survivor_judged_killed_by_a_later_config_is_killed_by_it(
    tmp_path: Path, r: dict[str, Any], v: dict[str, str]
) -> None:
    # The verdict is checked, not taken on trust: the mutant's diff applied to today's
    # spec, the config it names must fail (exit 1: a violation or a failed liveness goal).
    tree = _mutated_tree(tmp_path, r, "bkref")
    cmd = ["-m", "bkref.impl.cli.main", "spec", "check", "--quiet", "--config", v["config"]]
    run = _run_in(tree, *cmd)
    why = f"{v['config']} did not kill the mutant of line {r['line']}: {run.stdout}"
    assert run.returncode == 1, why


@pytest.mark.slow
@pytest.mark.parametrize(("r", "v"), _cases("killed-by-test"))
def test_a_survivor_judged_killed_by_a_later_test_is_killed_by_it(
    tmp_path: Path, r: dict[str, Any], v: dict[str, str]
) -> None:
    # The same for a test: run on the mutated spec, the test the verdict names must fail
    # (pytest's exit 1: a test failed, not 4 or 5, a test id that names nothing).
    # The test's own folder of tests/ (and tests/'s package files), not all of tests/.
    folder = str(Path(v["test"].split("::")[0]).parent)
    parts = ("bkref", "tests/__init__.py", "tests/conftest.py", folder, "pyproject.toml")
    tree = _mutated_tree(tmp_path, r, *parts)
    run = _run_in(tree, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", v["test"])
    why = f"{v['test']} did not kill the mutant of line {r['line']}: {run.stdout[-2000:]}"
    assert run.returncode == 1, why
    assert "1 failed" in run.stdout, why  # the named test, not a collection error


def test_a_verdicts_file_refuses_a_bad_table_with_its_key(tmp_path: Path) -> None:
    # Two tables of one key: the later would win in silence (a first sample's
    # "equivalent" stood beside a later "killed-by-test" of the same mutant). A kill
    # without what kills it cannot be run.
    key = "bkref/spec/protocol.py:f:core/Op:a == b => a != b"
    table = f'[[mutant]]\nkey = "{key}"\nverdict = "equivalent"\nreason = "why"\n'
    bad = {
        "judged twice": table + table,
        "a test (a pytest node id)": table.replace('"equivalent"', '"killed-by-test"'),
        "a config, with killed-by-config only": table.replace('"equivalent"', '"killed-by-config"'),
        "needs a verdict": table.replace('"equivalent"', '"dead"'),
    }
    for why, text in bad.items():
        path = tmp_path / "verdicts.toml"
        path.write_text(text)
        with pytest.raises(SystemExit, match=f"{re.escape(key)}.*{re.escape(why)}"):
            load_verdicts(path)
    path.write_text(table)
    assert load_verdicts(path)[key]["verdict"] == "equivalent"


def test_an_equivalent_verdict_judges_every_line_its_key_names() -> None:
    """A key names a line by its text in its function, so two equal lines share one
    verdict. A kill is run on each mutant it is matched with (the tests above); an
    equivalence is not run, so its reason must judge every such line, and says how many
    with ``occurrences``. A new equal line fails this until someone judges it too, and so
    does a count that is no longer today's. The spec's keys and the core's alike (a
    decorator line is module level: one key stands for every class of the module it
    decorates so)."""
    wrong = []
    for key, v in load_verdicts().items():
        module, definition, _operator, rest = key.split(":", 3)
        if v["verdict"] != "equivalent" or not (ROOT / module).is_file():
            continue
        source = (ROOT / module).read_text()
        where = _definition_at(source)
        text = rest.split(" => ", 1)[0]
        named = [
            i + 1
            for i, ln in enumerate(source.splitlines())
            if ln.strip() == text and where.get(i + 1, "None") == definition
        ]
        # A count given must be today's, or it judges lines now gone; without one, a key
        # may name one line, or none (its line since edited away).
        given = int(v.get("occurrences", 0))
        if (given and len(named) != given) or (not given and len(named) > 1):
            where_named = f"{module} {definition} lines {named}"
            wrong.append(f"{where_named}: occurrences = {v.get('occurrences', 1)}")
    assert not wrong, wrong


def test_a_mutant_that_is_not_python_is_incompetent() -> None:
    """cosmic-ray's parso-based `*` -> `-` also hits a keyword-only marker (`*,` becomes
    `-,`): such a mutant's tests cannot even load (pytest exit 4), and it is counted
    apart from kills and survivors, while a real product mutated stays as it ran."""
    from cosmic_ray.mutating import mutate_code
    from cosmic_ray.plugins import get_operator

    module, operator = "bkref/impl/core/frames.py", "core/ReplaceBinaryOperator_Mul_Sub"
    source = (ROOT / module).read_text()
    op = get_operator(operator)()
    count = 0
    while mutate_code(source, op, count) is not None:
        count += 1
    out = '{"verdict": "error", "by": "pytest exit 4: "}\n'
    results = [
        {"module": module, "operator": operator, "occurrence": n, "output": out}
        | {"test": "killed", "worker": "normal"}
        for n in range(count)
    ]
    mark_syntax_errors(results, {module: source})
    kinds = {outcome(r) for r in results}
    assert kinds == {"incompetent", "error"}, kinds
    for r in results:
        code = mutate_code(source, op, r["occurrence"])
        assert code is not None
        marker = re.search(r"\n +-,\n", code) is not None  # a `*,` line, at any indent
        assert (outcome(r) == "incompetent") == marker


def test_a_timeout_counts_apart_from_the_kills_however_it_came() -> None:
    """cosmic-ray's own timeout, and a spec test past pytest-timeout's limit (the kill
    script's exit 2, which cosmic-ray records as a kill), are timeouts: nothing said the
    mutant was wrong. A test that failed is a kill."""
    ran = {"test": "killed", "worker": "normal"}
    past = '{"verdict": "timeout", "by": "spec tests: FAILED t.py::x: past pytest-timeout"}\n'
    failed = '{"verdict": "killed", "by": "spec tests: FAILED t.py::x - AssertionError"}\n'
    assert outcome(ran | {"output": "timeout"}) == "timeout"
    assert outcome(ran | {"output": "x: 1 states\n" + past}) == "timeout"
    assert outcome(ran | {"output": failed}) == "killed"


def test_a_timeout_counts_against_the_score_until_a_verdict_judges_it() -> None:
    """A timeout is no kill, and is not left out either (that would assume the slow
    mutants are killed as often as the rest): it counts as a survivor does, credited
    only once a verdict judges it."""
    ran = {"test": "killed", "worker": "normal", "module": PROTOCOL}
    killed = '{"verdict": "killed", "by": "a-short violates TypeOK"}\n'
    results = [ran | {"job": "k", "output": killed}, ran | {"job": "t", "output": "timeout"}]
    keys = {"k": "key-k", "t": "key-t"}
    unjudged = Score("spec", results, keys, {})
    assert [r["job"] for r in unjudged.survivors] == ["t"]
    assert (unjudged.credited, unjudged.judged) == (1, 2)
    equivalent = {"key-t": {"verdict": "equivalent", "reason": "why"}}
    assert Score("spec", results, keys, equivalent).score == 1.0
    finding = {"key-t": {"verdict": "finding", "reason": "why"}}
    assert Score("spec", results, keys, finding).score == 0.5


def test_a_documented_trace_is_compared_without_the_count_of_states_searched() -> None:
    """Verdict 3 of the spec's kill: a reduction that merges fewer states changes how many
    states the search took to find a hand-written mutant, not its trace."""
    from tests.mutation.spec_kill import _trace_of

    text = (ROOT / "bkref/spec/examples/ack-before-fsync.txt").read_text()
    assert "found after 590 distinct states" in text
    more = text.replace("found after 590 distinct", "found after 1,590 distinct")
    assert _trace_of(more) == _trace_of(text)
    assert _trace_of(text.replace("6 steps", "7 steps")) != _trace_of(text)
    assert _trace_of(text.replace("OPEN -> CLOSED", "OPENED -> CLOSED")) != _trace_of(text)
