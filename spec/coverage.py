"""Spec coverage: which actions and which branches of the action functions the configs reach.

TLC reports how often each action and expression was evaluated, so that a spec's
author sees what no config ever exercised. This is bkref's counterpart, measured
by exhaustive checks of the named configs:

- per action, counted from the labels of ``next_states``: the distinct states it
  is enabled in and the transitions it fires;
- per branch: every ``return`` statement of an action function. A ``return
  None`` is a guard that refuses the step (``guard``); any other return is a
  path to a successor state (``path``). The checker explores with a copy of
  ``spec/protocol.py`` in which each of these returns records itself first (one
  dict store: no tracer), so measuring costs a few per cent.

A branch that no config reaches must say why next to it, as a proof sketch a
reviewer can check: a comment ``# unreachable: <why>`` on the return's line or on
the comment lines just above it. ``bkref spec coverage`` lists every action and
branch with the configs that reach it and exits 1 when a branch is unreached
without a reason; ``make spec-check`` runs it over every named config.

Granularity: a return statement, not an expression; the two arms of a
conditional expression inside one return are one branch.
"""

from __future__ import annotations

import ast
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from spec import protocol
from spec.checker import check
from spec.config import Config
from spec.protocol import ACTIONS, State, Step

SOURCE = Path(protocol.__file__)
REASON = "# unreachable:"
_REACHED = "_COVERAGE_REACHED"  # the dict the instrumented returns store into


@dataclass(frozen=True)
class Branch:
    """One return statement of an action function."""

    action: str
    line: int
    kind: str  # "guard": returns None (the step is refused); "path": returns a state
    text: str  # the statement's first source line, stripped
    reason: str | None  # why no config reaches it, as recorded next to it


def _returns(fn: ast.FunctionDef) -> Iterable[ast.Return]:
    """The return statements of ``fn`` itself (not of functions nested in it)."""
    todo: list[ast.AST] = list(fn.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        if isinstance(node, ast.Return):
            yield node
        todo.extend(ast.iter_child_nodes(node))


def _reason(lines: list[str], line: int) -> str | None:
    """The ``# unreachable:`` reason on the line or in the comment block above it."""
    here = lines[line - 1]
    if REASON in here:
        return here.split(REASON, 1)[1].strip()
    block: list[str] = []
    k = line - 2
    while k >= 0 and lines[k].strip().startswith("#"):
        block.insert(0, lines[k].strip().lstrip("#").strip())
        k -= 1
    text = " ".join(block)
    marker = REASON.lstrip("# ").strip()
    return text.split(marker, 1)[1].strip() if marker in text else None


def _action_defs(tree: ast.Module) -> list[ast.FunctionDef]:
    names = {fn.__name__ for fn in ACTIONS}
    return [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]


def branches() -> list[Branch]:
    """Every return statement of every action function, in source order."""
    text = SOURCE.read_text()
    lines = text.splitlines()
    out = []
    for fn in _action_defs(ast.parse(text)):
        for r in sorted(_returns(fn), key=lambda r: r.lineno):
            none = r.value is None or (isinstance(r.value, ast.Constant) and r.value.value is None)
            out.append(
                Branch(
                    fn.name,
                    r.lineno,
                    "guard" if none else "path",
                    lines[r.lineno - 1].strip(),
                    _reason(lines, r.lineno),
                )
            )
    return out


class _Instrument(ast.NodeTransformer):
    """Put ``_COVERAGE_REACHED[line] = 1`` before each return of the action functions."""

    def __init__(self) -> None:
        self.targets: set[int] = set()

    def visit_Return(self, node: ast.Return) -> Any:  # noqa: ANN401 - ast's own signature
        if node.lineno not in self.targets:
            return node
        store = ast.Assign(
            targets=[
                ast.Subscript(
                    value=ast.Name(id=_REACHED, ctx=ast.Load()),
                    slice=ast.Constant(node.lineno),
                    ctx=ast.Store(),
                )
            ],
            value=ast.Constant(1),
        )
        return [ast.copy_location(store, node), node]


def instrumented() -> tuple[dict[str, Any], dict[int, int]]:
    """A fresh copy of ``spec.protocol`` whose action returns record themselves: its
    namespace, and the dict (return line -> 1) they fill."""
    tree = ast.parse(SOURCE.read_text())
    instrument = _Instrument()
    for fn in _action_defs(tree):
        instrument.targets.update(r.lineno for r in _returns(fn))
    tree = ast.fix_missing_locations(instrument.visit(tree))
    reached: dict[int, int] = {}
    namespace: dict[str, Any] = {"__name__": "spec._protocol_coverage", _REACHED: reached}
    exec(compile(tree, str(SOURCE), "exec"), namespace)  # noqa: S102 - our own source
    return namespace, reached


@dataclass
class ConfigCoverage:
    """What one config's exhaustive check reached."""

    config: str
    distinct: int = 0
    complete: bool = False
    seconds: float = 0.0
    enabled: Counter[str] = field(default_factory=Counter)  # distinct states enabled in
    fired: Counter[str] = field(default_factory=Counter)  # transitions taken
    reached: frozenset[int] = frozenset()  # lines of the branches reached


def measure(cfg: Config, *, max_states: int | None = None) -> ConfigCoverage:
    """Check ``cfg`` exhaustively with the instrumented spec and count what it reaches."""
    namespace, reached = instrumented()
    steps = namespace["next_states"]
    cov = ConfigCoverage(cfg.name)

    def expand(c: Config, s: State) -> list[Step]:
        out: list[Step] = steps(c, s)
        names = [label[0] for label, _t in out]
        cov.fired.update(names)
        cov.enabled.update(set(names))
        return out

    started = time.monotonic()
    r = check(cfg, max_states=max_states, expand=expand)
    if r.violation is not None:
        raise ValueError(f"config {cfg.name} violates {r.violation}: coverage of a wrong spec")
    cov.distinct, cov.complete = r.distinct, r.complete
    cov.seconds = time.monotonic() - started
    cov.reached = frozenset(reached)
    return cov


@dataclass
class Report:
    """Coverage of every action and branch over a set of configs."""

    configs: list[ConfigCoverage]
    branches: list[Branch]

    def reached_by(self, b: Branch) -> list[str]:
        return [c.config for c in self.configs if b.line in c.reached]

    def unexplained(self) -> list[Branch]:
        """Branches no config reaches and no recorded reason explains."""
        return [b for b in self.branches if not self.reached_by(b) and b.reason is None]

    def to_json(self) -> dict[str, Any]:
        return {
            "configs": [
                {
                    "config": c.config,
                    "distinct": c.distinct,
                    "complete": c.complete,
                    "seconds": round(c.seconds, 1),
                }
                for c in self.configs
            ],
            "actions": {
                fn.__name__: {
                    c.config: {"enabled": c.enabled[fn.__name__], "fired": c.fired[fn.__name__]}
                    for c in self.configs
                }
                for fn in ACTIONS
            },
            "branches": [
                {
                    "action": b.action,
                    "line": b.line,
                    "kind": b.kind,
                    "text": b.text,
                    "reached_by": self.reached_by(b),
                    "unreachable_because": b.reason,
                }
                for b in self.branches
            ],
            "unexplained": len(self.unexplained()),
        }

    def write_text(self, out: TextIO) -> None:
        names = [c.config for c in self.configs]
        out.write("actions: distinct states enabled in, per config\n")
        width = max(len(fn.__name__) for fn in ACTIONS)
        out.write(f"  {'':{width}}  " + "  ".join(f"{n:>10}" for n in names) + "\n")
        for fn in ACTIONS:
            counts = [c.enabled[fn.__name__] for c in self.configs]
            mark = " " if any(counts) else "!"
            cells = "  ".join(f"{n:>10,}" for n in counts)
            out.write(f"{mark} {fn.__name__:{width}}  {cells}\n")
        reached = sum(1 for b in self.branches if self.reached_by(b))
        out.write(f"branches: {reached} of {len(self.branches)} reached\n")
        for b in self.branches:
            if self.reached_by(b):
                continue
            why = f"unreachable: {b.reason}" if b.reason else "UNREACHED, no reason recorded"
            out.write(f"  {b.action} line {b.line} ({b.kind}) `{b.text}`: {why}\n")


def report(
    configs: Iterable[Config],
    *,
    max_states: int | None = None,
    progress: TextIO | None = None,
) -> Report:
    measured = []
    for cfg in configs:
        cov = measure(cfg, max_states=max_states)
        if progress is not None:
            print(
                f"  {cfg.name}: {cov.distinct:,} distinct states, {len(cov.reached)} branches, "
                f"{cov.seconds:.1f} s",
                file=progress,
                flush=True,
            )
        measured.append(cov)
    return Report(measured, branches())
