"""Test selection for spec mutants: run a mutant only on the configs that execute it.

A config whose check never executes the mutated statement in the unmutated spec
runs exactly the same code with the mutant in place, so its verdict cannot change:
skipping it is sound, as PIT's and Google's mutation testing skip tests that do not
cover the mutated line. The baseline records, per config (and per hand-written
mutant's config), the lines of each measured module its check executed, with
coverage.py's tracer, and the module's unmutated source. The kill script diffs the
mutated module against that source and keeps the configs whose lines meet the
statements the mutant changed.

What is always run on every config: a change outside any function body (a module
constant, a class attribute, a ``def`` line with its defaults and decorators), and a
statement the import executed (a function the module calls as it is built): both
run before any check; and a change to a module that no baseline measured (nothing
says which configs execute it). An error here can only run too much or turn a kill
into a survivor, never make a survivor look killed.
"""

from __future__ import annotations

import ast
import difflib
import importlib
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
ALL = None  # the selection of a change every config may see
BODIES = ("body", "handlers", "orelse", "finalbody")  # a compound statement's, in order


def tree() -> Path:
    """The tree this process imports bkref from (a session's copy, not the checkout)."""
    import bkref

    return Path(bkref.__file__).resolve().parents[1]


def measure(
    root: Path, modules: Iterable[str], run: Callable[[], T]
) -> tuple[T, dict[str, list[int]]]:
    """``run()``'s result and, per module (a path under ``root``), the lines that
    executed during it."""
    import coverage

    files = {m: str((root / m).resolve()) for m in modules}
    cov = coverage.Coverage(data_file=None, include=list(files.values()), config_file=False)
    cov.start()
    try:
        result = run()
    finally:
        cov.stop()
    data = cov.get_data()
    return result, {m: sorted(data.lines(f) or ()) for m, f in files.items()}


def measure_import(root: Path, modules: Iterable[str]) -> dict[str, list[int]]:
    """The lines of ``modules`` that importing them executes (module code, and the
    function bodies a module calls while it is built). Each must not be imported yet."""
    names = [m.removesuffix(".py").replace("/", ".") for m in modules]
    early = [n for n in names if n in sys.modules]
    if early:
        raise RuntimeError(f"already imported, so its import cannot be measured: {early}")

    def load() -> None:
        for n in names:
            importlib.import_module(n)

    return measure(root, modules, load)[1]


def changed_lines(before: str, after: str) -> set[int]:
    """The lines of ``before`` (1-based) that ``after`` replaces, deletes, or inserts
    text next to."""
    a, b = before.splitlines(), after.splitlines()
    out: set[int] = set()
    for tag, i1, i2, _j1, _j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag != "equal":
            out.update(range(i1 + 1, max(i2, i1 + 1) + 1))
    return out


def statements(source: str, lines: set[int]) -> set[int] | None:
    """Every line of the innermost statement holding each of ``lines`` (a compound
    statement's header, up to its body), and of each enclosing header that holds it
    too; ``ALL`` when one of them is outside every function body (executed at import,
    by every config).

    A statement executed when coverage.py recorded any of these lines. It records the
    lines its bytecode sits on, not the statement's first line: the ``if (`` of a
    condition spread over lines has none, and a run that took the ``if`` records only
    the lines of the operands it evaluated. A header that ends on its body's line
    (``and b): return 1``) holds that line as well as the body does."""
    tree = ast.parse(source)
    out: set[int] = set()
    for line in lines:
        found = _innermost(tree, line)
        if found is None:
            return ALL
        out |= found
    return out


def _bodies(st: ast.stmt) -> list[tuple[int, list[Any]]]:
    """Each body nested in ``st``, with the line it starts on (a case's, its pattern's).
    A ``handlers`` body holds except clauses, visited as statements."""
    out = [(b[0].lineno, b) for f in BODIES if (b := getattr(st, f, None))]
    out += [(c.pattern.lineno, c.body) for c in getattr(st, "cases", [])]
    return out


def _header(st: ast.stmt, nested: list[int]) -> tuple[int, int]:
    """The first and last lines of ``st`` less its bodies, which start on the lines
    ``nested``: a simple statement's every line; a compound one's header, from its
    keyword to the end of its own expressions or the line before its first body,
    whichever is later."""
    if not nested:
        return st.lineno, st.end_lineno or st.lineno
    own: list[int] = [
        end
        for child in ast.iter_child_nodes(st)
        if not isinstance(child, ast.stmt | ast.excepthandler | ast.match_case)
        for n in ast.walk(child)
        if (end := getattr(n, "end_lineno", None))
    ]
    return st.lineno, max([st.lineno, min(nested) - 1, *own])


def _innermost(tree: ast.Module, line: int) -> set[int] | None:
    """The lines (:func:`_header`) of the innermost statement inside a function body
    that spans ``line``, and of each enclosing statement whose header spans it."""
    found: set[int] = set()

    def visit(body: list[ast.stmt], in_function: bool) -> bool:
        for st in body:
            end = st.end_lineno or st.lineno
            first = min([st.lineno, *(d.lineno for d in getattr(st, "decorator_list", []))])
            if not first <= line <= end:
                continue
            if isinstance(st, ast.FunctionDef | ast.AsyncFunctionDef):
                # The header (decorators, defaults) runs at import; the body when called.
                body_start = st.body[0].lineno if st.body else end + 1
                if line < body_start:
                    return False
                return visit(st.body, True)
            if isinstance(st, ast.ClassDef):
                return visit(st.body, in_function)
            if not in_function:
                return False
            bodies = _bodies(st)
            head, tail = _header(st, [start for start, _b in bodies])
            in_body = [visit(b, True) for _start, b in bodies]  # each: a body may share a line
            if head <= line <= tail or not any(in_body):
                found.update(range(head, tail + 1))
            return True
        return False

    return found if visit(tree.body, False) else None


def selected(baseline: dict[str, Any], root: Path) -> tuple[str, set[int] | None, str]:
    """The measured module the mutant in the tree at ``root`` changed, the statements
    it changed (``ALL``: run every config), and a word on why."""
    for module, source in baseline.get("sources", {}).items():
        now = (root / module).read_text()
        if now == source:
            continue
        stmts = statements(source, changed_lines(source, now))
        if stmts is ALL:
            return module, ALL, f"{module}: a change executed at import"
        return module, stmts, f"{module}: lines {sorted(stmts)}"
    return "", ALL, "no measured module changed"


def runs(
    lines: dict[str, list[int]],
    at_import: dict[str, list[int]],
    module: str,
    stmts: set[int] | None,
) -> bool:
    """Whether a config that executed ``lines`` (per module), after the import that
    executed ``at_import``, can see the change."""
    if stmts is ALL:
        return True
    return bool(stmts & (set(lines.get(module, ())) | set(at_import.get(module, ()))))
