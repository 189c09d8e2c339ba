"""The refinement machine: Hypothesis picks spec steps, an implementation takes them.

One example is one run from ``bkref.spec.protocol.initial_state(cfg)``. At each step
the machine lists ``bkref.spec.protocol.next_states`` of its spec state, lets
Hypothesis choose one enabled step, and has the driver take the same step on
the implementation (:mod:`bkref.refine.driver`). Then

- every follow-up the driver reports must be enabled in the spec, and is
  applied to the spec state too;
- every invariant of ``bkref.spec.invariants.INVARIANTS`` (but the config's
  ``skip_invariants``) must hold on the implementation's abstract state;
- the implementation's abstract state must equal the spec's, compared through
  :func:`bkref.refine.observe.project`.

Any failure raises :class:`RefinementError`, which Hypothesis shrinks to a
short list of spec steps. A refused step leaves both sides where they were.
Liveness goals are not checked here (safety only).
"""

from __future__ import annotations

import time
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from hypothesis import HealthCheck, Phase, Verbosity, note, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.errors import Flaky, HypothesisDeprecationWarning
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test

from bkref.refine.driver import Driver, ImplementationError
from bkref.refine.observe import differences, project
from bkref.spec.config import Config
from bkref.spec.invariants import INVARIANTS
from bkref.spec.protocol import (
    Label,
    State,
    format_label,
    initial_state,
    next_states,
    worker_copies_fragment,
)
from bkref.spec.trace import describe


@dataclass
class RunStats:
    """What a run of the machine did, for the CLI's report and the benchmark."""

    examples: int = 0  # runs of the machine, shrinking included
    first_failure: int = 0  # the run that first found a counterexample (0: none)
    steps: int = 0  # spec steps taken (follow-ups included)
    followups: int = 0
    actions: Counter[str] = field(default_factory=Counter)  # spec steps taken, per action
    enabled: set[str] = field(default_factory=set)  # actions the spec ever offered
    refused: Counter[str] = field(default_factory=Counter)
    refused_why: dict[str, str] = field(default_factory=dict)
    states: set[State] = field(default_factory=set)  # distinct projected abstract states
    passed_over: int = 0  # replay(): chosen steps the spec did not enable at their turn
    # Called with the stats at the start of each example (the CLI prints progress).
    on_example: Callable[[RunStats], None] | None = None
    # Seconds per part: "setup" (building and removing a system per example),
    # "implementation" (its steps), "abstraction", "comparison", "spec".
    seconds: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))


class RefinementError(AssertionError):
    """A counterexample: the implementation and the spec disagree after ``trace``.

    ``chosen``: the steps the machine chose, in order, refused ones included (``trace``
    adds the follow-ups the implementation took and leaves out refusals); :func:`replay`
    takes them again."""

    def __init__(
        self,
        cfg: Config,
        trace: list[Label],
        what: str,
        *,
        spec: State,
        impl: State | None,
        invariant: str = "",
        chosen: list[Label] | None = None,
    ) -> None:
        self.cfg, self.trace, self.what = cfg, list(trace), what
        self.spec, self.impl, self.invariant = spec, impl, invariant
        self.chosen = list(chosen or [])
        super().__init__(self.report())

    def report(self) -> str:
        lines = [f"refinement failed on config {self.cfg.name}: {self.what}", "", "spec steps:"]
        lines += [f"  {i + 1:3d}. {format_label(lb)}" for i, lb in enumerate(self.trace)]
        if self.impl is None:
            return "\n".join(lines)
        diff = differences(self.cfg, self.spec, self.impl)
        if diff:
            lines += ["", "differences (projected; spec | implementation):"]
            w = max(len(k) for k, _, _ in diff)
            lines += [f"  {k.ljust(w)}  {a} | {b}" for k, a, b in diff]
        a, b = describe(project(self.cfg, self.spec)), describe(project(self.cfg, self.impl))
        keys = list(dict.fromkeys([*a, *b]))
        w = max(len(k) for k in keys)
        wa = max(len(a.get(k, "-")) for k in keys)
        lines += ["", f"  {'variable'.ljust(w)}  {'spec'.ljust(wa)}  implementation"]
        for k in keys:
            mark = "  " if a.get(k) == b.get(k) else "≠ "
            lines.append(f"{mark}{k.ljust(w)}  {a.get(k, '-').ljust(wa)}  {b.get(k, '-')}")
        return "\n".join(lines)


class Machine(RuleBasedStateMachine):
    """What :func:`make_machine`'s class offers besides Hypothesis's rule."""

    def enabled(self) -> list[Label]:
        raise NotImplementedError

    def take(self, label: Label) -> None:
        raise NotImplementedError


def make_machine(cfg: Config, new_driver: Callable[[], Driver], stats: RunStats) -> type[Machine]:
    """A ``RuleBasedStateMachine`` class that holds ``new_driver()`` against the spec."""
    invariants = [i for i in INVARIANTS if i.__name__ not in cfg.skip_invariants]

    class RefinementMachine(Machine):
        def __init__(self) -> None:
            super().__init__()
            stats.examples += 1
            if stats.on_example is not None:
                stats.on_example(stats)
            self.trace: list[Label] = []
            self.chosen: list[Label] = []  # the machine's choices, for replay()
            self.swarm_off: dict[str, bool] = {}  # actions this example never takes
            # Steps the implementation refused in the current spec state: not drawn again
            # until a step changes the state (a refusal changes nothing on either side).
            self.refused_here: set[Label] = set()
            self.spec = initial_state(cfg)
            t0 = time.perf_counter()
            self.driver = new_driver()
            self.driver.start(cfg)
            stats.seconds["setup"] += time.perf_counter() - t0
            self._check("the initial states differ")

        def _fail(self, what: str, impl: State | None, invariant: str = "") -> None:
            if not stats.first_failure:
                stats.first_failure = stats.examples
            raise RefinementError(
                cfg,
                self.trace,
                what,
                spec=self.spec,
                impl=impl,
                invariant=invariant,
                chosen=self.chosen,
            )

        def _check(self, what: str) -> None:
            t0 = time.perf_counter()
            try:
                impl = self.driver.abstract()
            except ImplementationError as e:
                self._fail(f"the implementation's state has no spec counterpart: {e}", None)
            t1 = time.perf_counter()
            stats.seconds["abstraction"] += t1 - t0
            # The ghost au_missed has no implementation counterpart (observe.project, point
            # 7): the invariants read the spec's, whose history is the same steps.
            judged = impl._replace(au_missed=self.spec.au_missed)
            for inv in invariants:
                if not inv(cfg, judged):
                    self._fail(f"invariant {inv.__name__} is violated", impl, inv.__name__)
            pi = project(cfg, impl)
            if pi != project(cfg, self.spec):
                self._fail(what, impl)
            stats.states.add(pi)
            stats.seconds["comparison"] += time.perf_counter() - t1

        def _advance(self, label: Label) -> bool:
            """Move the spec state along ``label``; False if the spec does not enable it."""
            nxt = next((t for lb, t in next_states(cfg, self.spec) if lb == label), None)
            nxt = nxt or _chosen(cfg, self.spec, label)
            if nxt is None:
                return False
            self.spec = nxt
            self.trace.append(label)
            stats.steps += 1
            stats.actions[label[0]] += 1
            return True

        def _advance_or_fail(self, label: Label, how: str) -> None:
            """A step the implementation took on its own: the spec must enable it."""
            if not self._advance(label):
                self.trace.append(label)
                self._fail(
                    f"the implementation {how} {format_label(label)}, "
                    "which the spec does not enable here",
                    self.driver.abstract(),
                )

        def enabled(self) -> list[Label]:
            """The steps the machine may choose now."""
            t0 = time.perf_counter()
            labels = [lb for lb, _ in next_states(cfg, self.spec) if lb not in self.refused_here]
            stats.seconds["spec"] += time.perf_counter() - t0
            return labels

        @rule(data=st.data())
        def step(self, data: st.DataObject) -> None:
            labels = self.enabled()
            if not labels:
                return  # a final state: nothing more happens (a stutter)
            # Action first, then its arguments: a uniform draw over labels would favour
            # actions with many argument choices (a crash of any of five bookies) and
            # rarely reach deep states (a second entry, then a crash).
            by_action: dict[str, list[Label]] = {}
            for lb in labels:
                by_action.setdefault(lb[0], []).append(lb)
            stats.enabled.update(by_action)
            # Swarm testing (Groce et al., ISSTA 2012): each example switches some actions
            # off for its whole length, so that some examples never close the ledger early
            # and go deep (a second entry, then a crash of a bookie that holds it). Each
            # flag is drawn when its action is first enabled and shrinks to "on"; when
            # every enabled action is off, all of them are on for this step.
            for a in by_action:
                if a not in self.swarm_off:
                    self.swarm_off[a] = data.draw(st.booleans(), label=f"swarm: {a} off")
            on = sorted(a for a in by_action if not self.swarm_off[a]) or sorted(by_action)
            action = data.draw(st.sampled_from(on), label="spec action")
            label = data.draw(st.sampled_from(by_action[action]), label="spec step")
            note(format_label(label))
            self.take(label)

        def take(self, label: Label) -> None:
            """The implementation takes the chosen step ``label``; the spec follows it."""
            self.chosen.append(label)
            t1 = time.perf_counter()
            try:
                done = self.driver.perform(label)
            except ImplementationError as e:
                self.trace.append(label)
                self._fail(f"the implementation could not take {format_label(label)}: {e}", None)
            stats.seconds["implementation"] += time.perf_counter() - t1
            if done.refused:
                stats.refused[label[0]] += 1
                stats.refused_why.setdefault(label[0], done.refused)
                self.refused_here.add(label)
                return
            self.refused_here.clear()
            if done.decided is None:
                self._advance(label)
            else:
                for f in done.decided:
                    self._advance_or_fail(f, "decided")
            for f in done.followups:
                stats.followups += 1
                self._advance_or_fail(f, "also took")
            after = format_label(self.trace[-1]) if self.trace else "the first step"
            stutter = done.decided == () and not done.followups
            self._check(
                f"the implementation's {label[0]} turn changed the state but took no spec step"
                if stutter
                else f"the states differ after {after}"
            )

        def teardown(self) -> None:
            t0 = time.perf_counter()
            self.driver.stop()
            stats.seconds["setup"] += time.perf_counter() - t0

    RefinementMachine.__name__ = f"Refine_{cfg.name.replace('-', '_')}"
    return RefinementMachine


def _chosen(cfg: Config, s: State, label: Label) -> State | None:
    """A step the model checker takes only for its first choice (a reduction), with the
    choice the implementation made: a worker's copy names the fragment's bookie, where
    ``next_states`` offers the segment's first (``worker_copies_fragment``'s docstring).
    The step must be enabled for its first choice, and for this one."""
    name, args = label
    if name != "worker_copies_fragment" or len(args) != 3:
        return None
    if not any(lb == (name, args[:2]) for lb, _t in next_states(cfg, s)):
        return None
    w, idx, lost = (int(str(a)) for a in args)
    return worker_copies_fragment(cfg, s, w, idx, lost)


def run(
    cfg: Config,
    new_driver: Callable[[], Driver],
    *,
    examples: int,
    seed: int,
    steps: int = 60,
    stats: RunStats | None = None,
    shrink: bool = True,
) -> tuple[RunStats, RefinementError | None]:
    """Run the machine for ``examples`` examples; the counterexample, if any: shrunk,
    unless ``shrink`` is off (shrinking replays it hundreds of times: a test that only
    asks whether a bug is caught saves nine tenths of its time without it)."""
    stats = stats if stats is not None else RunStats()
    machine = hypothesis_seed(seed)(make_machine(cfg, new_driver, stats))
    config = settings(
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        database=None,
        report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
        # No "explain" phase: after shrinking it would re-run the counterexample many
        # times to say which steps could vary (minutes with real storage), and the
        # report already shows both states side by side.
        phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target]
        + ([Phase.shrink] if shrink else []),
    )
    try:
        with warnings.catch_warnings():
            # Hypothesis warns when the global `random` changed during a draw, taking it
            # for a strategy's own use. Here it is kazoo's connection thread, which draws a
            # jitter from `random` at every turn of its select loop
            # (kazoo/protocol/connection.py, `_connect_attempt`) while the machine draws:
            # under load often enough to fail a verify run, and nothing of the machine's.
            warnings.filterwarnings(
                "ignore",
                message="Do not use the `random` module inside strategies",
                category=HypothesisDeprecationWarning,
            )
            run_state_machine_as_test(machine, settings=config)
    except RefinementError as ce:
        return stats, ce
    except Flaky as e:  # the implementation did not behave the same on a replay
        raise ImplementationError(f"a counterexample did not reproduce on replay: {e}") from e
    return stats, None


def replay(
    cfg: Config,
    new_driver: Callable[[], Driver],
    chosen: list[Label],
    *,
    stats: RunStats | None = None,
) -> RefinementError | None:
    """Take a counterexample's chosen steps (:attr:`RefinementError.chosen`) again, on
    a new system and outside Hypothesis: each in turn where the spec enables it, one it
    does not enable there (the implementation decided otherwise this time) passed over.
    The counterexample this one example finds, if any: a planted bug's steps, replayed
    without the plant, show that the plant made the difference, in one example where the
    same seed's whole run would take every example before it again."""
    stats = stats if stats is not None else RunStats()
    try:
        machine = make_machine(cfg, new_driver, stats)()
    except RefinementError as ce:
        return ce
    try:
        for label in chosen:
            if label in machine.enabled():
                machine.take(label)
            else:
                stats.passed_over += 1
    except RefinementError as ce:
        return ce
    finally:
        machine.teardown()
    return None
