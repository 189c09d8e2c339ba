"""Spec coverage: which actions and which branches of the action functions the configs reach.

TLC reports how often each action and expression was evaluated, so that a spec's
author sees what no config ever exercised. This is bkref's counterpart, measured
by exhaustive checks of the named configs:

- per action, counted from the labels of ``next_states``: the distinct states it
  is enabled in and the transitions it fires;
- per branch: every ``return`` statement of an action function. A ``return
  None`` is a guard that refuses the step (``guard``); any other return is a
  path to a successor state (``path``). The checker explores with a copy of
  ``bkref/spec/protocol.py`` in which each of these returns records itself first (one
  dict store: no tracer), so measuring costs a few per cent.

A branch that no config reaches must say why next to it, as a proof sketch a
reviewer can check: a comment ``# unreachable: <why>`` on the return's line or on
the comment lines just above it. ``bkref spec coverage`` lists every action and
branch with the configs that reach it and exits 1 when a branch is unreached
without a reason; ``make spec-check`` runs it over every named config.

Granularity: a return statement, not an expression; the two arms of a
conditional expression inside one return are one branch.

Races. The writer, the recovery client, a replication worker and the auditor
each write a ledger's metadata or its under-replication task. Two of them
race on a ledger when one writes either while the other holds a read of it
that its own next write depends on (``holds``): the writer, OPEN, at the
metadata version it last wrote; the recovery client, between its IN_RECOVERY
CAS and its close, at the version it wrote; a worker, under the ledger's lock,
at the task version it read or the metadata version of the copy it is to
swap in. The auditor holds nothing: its audit reads the metadata and writes
the tasks in one step, and each mark is one conditional write of the task
znode. Every pair of the four must be reached by some config.

Bounds. Each fault a config allows comes with a budget (``State.budget``: losses,
crashes, give-ups, ...), as TLC's configs bound their constants. A budget that no
config ever spends to 0 bounds nothing: the spec could stop spending it and no
check would notice (a recovery that gives up without counting it). Every kind of
budget that some config sets must be spent to 0 in some state of some config.
"""

from __future__ import annotations

import ast
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TextIO, cast

from bkref.spec.build import PACKAGE_DIR
from bkref.spec.checker import check
from bkref.spec.config import Config
from bkref.spec.protocol import (
    ACTIONS,
    BUDGETS,
    IN_RECOVERY,
    OPEN,
    RC_FENCING,
    RC_WRITING,
    W_CLOSED,
    W_OPEN,
    Label,
    Recovery,
    State,
    Step,
)

# The source, not ``protocol.__file__``: that is an extension module under a compiled build.
SOURCE = PACKAGE_DIR / "protocol.py"
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
    """A fresh copy of ``bkref.spec.protocol`` whose action returns record themselves: its
    namespace, and the dict (return line -> 1) they fill."""
    tree = ast.parse(SOURCE.read_text())
    instrument = _Instrument()
    for fn in _action_defs(tree):
        instrument.targets.update(r.lineno for r in _returns(fn))
    tree = ast.fix_missing_locations(instrument.visit(tree))
    reached: dict[int, int] = {}
    namespace: dict[str, Any] = {"__name__": "bkref.spec._protocol_coverage", _REACHED: reached}
    exec(compile(tree, str(SOURCE), "exec"), namespace)  # noqa: S102 - our own source
    return namespace, reached


# The actors that write a ledger's metadata or task, by the prefix of their actions' names.
ACTORS = ("writer", "recovery_client", "worker", "auditor")
RACES: tuple[tuple[str, str], ...] = tuple(
    (a, b) for i, a in enumerate(ACTORS) for b in ACTORS[i + 1 :]
)


def actor(action: str) -> str | None:
    for a in ACTORS:
        if action.startswith(a + "_"):
            return a
    return None


def holds(cfg: Config, s: State, who: str, ledger: int) -> bool:
    """``who`` has read ``ledger``'s metadata or task, at its current version, for a write
    of its own still to come (see the module docstring)."""
    if who == "writer":
        return (
            cfg.writer
            and ledger == cfg.writer_ledger
            and s.w_status == W_OPEN
            and s.meta_status[ledger] == OPEN
            and s.w_version == s.meta_version[ledger]
        )
    if who == "recovery_client":
        return ledger == cfg.writer_ledger and any(
            RC_FENCING <= r.phase <= RC_WRITING and r.version == s.meta_version[ledger]
            for r in map(Recovery._make, s.rc)
        )
    if who == "worker":
        for _b, locked, tv, pending in s.wk:
            if locked != ledger:
                continue
            if tv == s.meta_task[ledger][0]:
                return True
            if pending is not None and pending[0] >= 0 and pending[2] == s.meta_version[ledger]:
                return True
        return False
    return False  # the auditor: see the module docstring


def races(cfg: Config, s: State, action: str, t: State) -> Iterable[tuple[str, str]]:
    """(writer, holder) for each actor whose held read of a ledger the step ``s -> t``
    makes stale by writing that ledger's metadata or task."""
    who = actor(action)
    if who is None:
        return
    for ledger in range(cfg.ledgers):
        if (
            s.meta_version[ledger] == t.meta_version[ledger]
            and s.meta_task[ledger] == t.meta_task[ledger]
        ):
            continue
        for other in ACTORS:
            if other != who and holds(cfg, s, other, ledger):
                yield who, other


def _latest_metadata_writer(cfg: Config, s: State, ledger: int) -> str | None:
    """Whose CAS wrote ``ledger``'s metadata at its current version (the writer's ledger)."""
    v = s.meta_version[ledger]
    if ledger != cfg.writer_ledger:
        return None
    if s.w_status in (W_OPEN, W_CLOSED) and s.w_version == v:
        return "writer"
    if any(r.phase >= RC_FENCING and r.version == v for r in map(Recovery._make, s.rc)):
        return "recovery_client"
    return None


def effects(cfg: Config, s: State, label: Label, t: State) -> Iterable[tuple[str, str]]:
    """(winner, loser) for a step ``s -> t`` in which the loser of a race writes, and what
    it writes differs from what its own stale read alone would give: the race changed data.

    - the writer's ensemble change keeps the earlier segments a worker swapped since its
      read (its view of them differs from the store's), or, the ledger no longer OPEN,
      the writer's change or close gives way to a recovery (it withdraws);
    - a recovery's close keeps the earlier segments a worker swapped since it began;
    - a worker's swap lands on newer metadata than its copy read, keeping the writer's
      or a recovery's change (whoever wrote the current version);
    - a worker's versioned task delete fails: the auditor marked the task since its read;
    - a writer's, recovery's or worker's CAS names a bookie that was down before it
      landed: the auditor's last audit read older metadata and missed it (``au_missed``).
    """
    name, args = label
    who = actor(name)
    if who is None or (not cfg.writer and who in ("writer", "recovery_client")):
        return
    wl = cfg.writer_ledger
    if name in ("writer_completes_ensemble_change", "writer_closes_ledger"):
        if s.meta_status[wl] != OPEN:
            yield "recovery_client", "writer"
        elif name == "writer_completes_ensemble_change":
            n = len(s.w_segments)
            if s.meta_segments[wl][: n - 1] != s.w_segments[: n - 1]:
                yield "worker", "writer"
    elif name == "recovery_client_closes_ledger":
        r = Recovery._make(s.rc[cast(int, args[0])])
        if s.meta_status[wl] == IN_RECOVERY and (
            s.meta_segments[wl][: r.base] != r.segments[: r.base]
        ):
            yield "worker", "recovery_client"
    elif name == "worker_updates_segment_ensemble":
        _b, ledger, _tv, pending = s.wk[cast(int, args[0])]
        if pending is not None and t.meta_version[ledger] != s.meta_version[ledger]:
            winner = _latest_metadata_writer(cfg, s, ledger)
            if pending[2] != s.meta_version[ledger] and winner is not None:
                yield winner, "worker"
    elif name == "worker_deletes_task":
        _b, ledger, tv, _p = s.wk[cast(int, args[0])]
        if s.meta_task[ledger][0] != tv:
            yield "auditor", "worker"
    if t.au_missed & ~s.au_missed and who != "auditor":
        yield who, "auditor"


class ViolationError(Exception):
    """A config's check found an invariant violated: coverage of a wrong spec means nothing."""

    def __init__(self, message: str, violation: str = "") -> None:
        super().__init__(message)
        self.violation = violation  # the invariant's name


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
    races: Counter[tuple[str, str]] = field(default_factory=Counter)  # (writer, holder) steps
    effects: Counter[tuple[str, str]] = field(default_factory=Counter)  # (winner, loser) steps
    bounded: frozenset[str] = frozenset()  # budgets (protocol.BUDGETS) the config sets above 0
    spent: frozenset[str] = frozenset()  # those of them some reachable state has at 0


def measure(cfg: Config, *, max_states: int | None = None) -> ConfigCoverage:
    """Check ``cfg`` exhaustively with the instrumented spec and count what it reaches."""
    namespace, reached = instrumented()
    steps = namespace["next_states"]
    cov = ConfigCoverage(cfg.name)
    initial = namespace["initial_state"](cfg).budget
    spent: set[int] = set()

    def expand(c: Config, s: State) -> list[Step]:
        out: list[Step] = steps(c, s)
        names = [label[0] for label, _t in out]
        cov.fired.update(names)
        cov.enabled.update(set(names))
        for label, t in out:
            cov.races.update(races(c, s, label[0], t))
            cov.effects.update(effects(c, s, label, t))
            if t.budget != s.budget:  # rare: a fault's step
                spent.update(i for i, v in enumerate(t.budget) if v == 0 and initial[i])
        return out

    started = time.monotonic()
    r = check(cfg, max_states=max_states, expand=expand)
    if r.violation is not None:
        raise ViolationError(
            f"config {cfg.name} violates {r.violation}: see its trace with "
            f"`bkref spec check --config {cfg.name}`",
            str(r.violation),
        )
    cov.distinct, cov.complete = r.distinct, r.complete
    cov.seconds = time.monotonic() - started
    cov.reached = frozenset(reached)
    cov.bounded = frozenset(BUDGETS[i] for i, v in enumerate(initial) if v)
    cov.spent = frozenset(BUDGETS[i] for i in spent)
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

    def raced_by(self, pair: tuple[str, str]) -> dict[str, int]:
        """Per config, the steps in which one actor of ``pair`` made the other's read stale."""
        return self._per_config(pair, lambda c: c.races)

    def _per_config(
        self, pair: tuple[str, str], counts: Callable[[ConfigCoverage], Counter[tuple[str, str]]]
    ) -> dict[str, int]:
        """Per config with any, the steps ``counts`` holds for ``pair`` in either direction."""
        a, b = pair
        out = {}
        for c in self.configs:
            n = counts(c)[(a, b)] + counts(c)[(b, a)]
            if n:
                out[c.config] = n
        return out

    def unraced(self) -> list[tuple[str, str]]:
        """Pairs of metadata writers that no config has racing on one ledger."""
        return [p for p in RACES if not self.raced_by(p)]

    def effect_by(self, pair: tuple[str, str]) -> dict[str, int]:
        """Per config, the steps in which the race of ``pair`` changed what the loser wrote."""
        return self._per_config(pair, lambda c: c.effects)

    def without_effect(self) -> list[tuple[str, str]]:
        """Pairs of metadata writers whose race changes data in no config."""
        return [p for p in RACES if not self.effect_by(p)]

    def spent_by(self, budget: str) -> list[str]:
        """The configs in which some reachable state has spent ``budget`` to 0."""
        return [c.config for c in self.configs if budget in c.spent]

    def unspent(self) -> list[str]:
        """Budgets some config sets that no config spends to 0: bounds that bound nothing."""
        bounded = {b for c in self.configs for b in c.bounded}
        return [b for b in BUDGETS if b in bounded and not self.spent_by(b)]

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
            "races": [
                {
                    "actors": list(p),
                    "reached_by": self.raced_by(p),
                    "directions": {
                        f"{x} writes while {y} holds": [
                            c.config for c in self.configs if c.races[(x, y)]
                        ]
                        for x, y in (p, p[::-1])
                    },
                    "with_effect_in": self.effect_by(p),
                    "effect_directions": {
                        f"{y} keeps what {x} wrote": [
                            c.config for c in self.configs if c.effects[(x, y)]
                        ]
                        for x, y in (p, p[::-1])
                    },
                }
                for p in RACES
            ],
            "bounds": {
                b: {
                    "set_by": [c.config for c in self.configs if b in c.bounded],
                    "spent_by": self.spent_by(b),
                }
                for b in BUDGETS
            },
            "unexplained": len(self.unexplained()),
            "unraced": len(self.unraced()),
            "without_effect": len(self.without_effect()),
            "unspent": len(self.unspent()),
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
        out.write("races: pairs of metadata writers on one ledger, steps per config\n")
        for p in RACES:
            by = self.raced_by(p)
            cells = ", ".join(f"{n} {k:,}" for n, k in by.items()) or "UNREACHED"
            out.write(f"  {p[0]} / {p[1]}: {cells}\n")
        out.write("races with an effect: the loser's write differs from its own view\n")
        for p in RACES:
            by = self.effect_by(p)
            cells = ", ".join(f"{n} {k:,}" for n, k in by.items()) or "NO EFFECT"
            out.write(f"  {p[0]} / {p[1]}: {cells}\n")
        out.write("bounds: configs that spend each budget to 0\n")
        for budget in BUDGETS:
            if any(budget in c.bounded for c in self.configs):
                spent = ", ".join(self.spent_by(budget)) or "NEVER SPENT"
                out.write(f"  {budget}: {spent}\n")


def write_markdown(r: Report, out: TextIO) -> None:
    """The coverage page for reviewers (``docs/coverage.md``, written by ``make spec-check``)."""
    w = out.write
    w("# Spec coverage\n\n")
    w(
        "Generated by `make spec-check` (`bkref spec coverage --markdown docs/coverage.md`): "
        "every named config checked exhaustively with a copy of `bkref/spec/protocol.py` whose "
        "action returns record themselves (see `bkref/spec/coverage.py`). Do not edit.\n\n"
    )
    w("## Configs\n\n| config | distinct states | seconds |\n|---|---:|---:|\n")
    for c in r.configs:
        done = "" if c.complete else " (stopped)"
        w(f"| `{c.config}` | {c.distinct:,}{done} | {c.seconds:.1f} |\n")
    w("\n## Actions\n\nPer action, the configs in which some state enables it, and the ")
    w("distinct states it is enabled in over all of them.\n\n")
    w("| action | configs | states enabled in |\n|---|---:|---:|\n")
    for fn in ACTIONS:
        name = fn.__name__
        n = sum(1 for c in r.configs if c.enabled[name])
        w(f"| `{name}` | {n} | {sum(c.enabled[name] for c in r.configs):,} |\n")
    reached = sum(1 for b in r.branches if r.reached_by(b))
    w(f"\n## Branches\n\n{reached} of {len(r.branches)} return statements reached; ")
    w("each other one says why no config can reach it.\n\n")
    w("| action | kind | return | reached by, or why unreachable |\n|---|---|---|---|\n")
    for b in r.branches:
        by = r.reached_by(b)
        if by:
            cell = ", ".join(f"`{n}`" for n in by)
        else:
            cell = f"unreachable: {b.reason}" if b.reason else "**UNREACHED, no reason**"
        text = b.text.replace("|", "\\|")
        w(f"| `{b.action}` | {b.kind} | `{text}` | {cell} |\n")
    w("\n## Races\n\nTwo metadata writers race on a ledger when one writes its metadata ")
    w("or task while the other holds a read of it that its next write depends on. Steps ")
    w("in which that happens, per config; and the steps in which the race had an effect: ")
    w("the loser's write differs from what its own stale read alone would give (see ")
    w("`effects` in `bkref/spec/coverage.py`). A race without an effect cannot catch a ")
    w("merge bug.\n\n| actors | raced in: configs (steps) | with an effect in |\n")
    w("|---|---|---|\n")
    for p in RACES:
        raced = r.raced_by(p)
        cell = ", ".join(f"`{n}` ({k:,})" for n, k in raced.items()) or "**UNREACHED**"
        eff = r.effect_by(p)
        cell2 = ", ".join(f"`{n}` ({k:,})" for n, k in eff.items()) or "**NO EFFECT**"
        w(f"| {p[0]} / {p[1]} | {cell} | {cell2} |\n")
    w("\n## Bounds\n\nEach fault's budget, the configs that set it and those in which ")
    w("some reachable state has spent it to 0. A budget never spent bounds nothing.\n\n")
    w("| budget | set by | spent to 0 in |\n|---|---|---|\n")
    for budget in BUDGETS:
        set_by = [c.config for c in r.configs if budget in c.bounded]
        if set_by:
            spent = ", ".join(f"`{n}`" for n in r.spent_by(budget)) or "**NEVER SPENT**"
            n = len(set_by)
            w(f"| `{budget}` | {n} config{'' if n == 1 else 's'} | {spent} |\n")


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
