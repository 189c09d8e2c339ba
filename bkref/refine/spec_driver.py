"""The spec as its own implementation: the smallest driver, and the machine's self-test.

``SpecDriver`` keeps a spec state and takes each step with the spec's own
action functions. With the correct spec it must never disagree with the
machine; with a mutant switched on (``mutants=``) it is an implementation with
that bug, which the machine must catch. Another implementation's adapter has
the same shape: ``start`` builds, ``perform`` acts, ``abstract`` observes.
"""

from __future__ import annotations

from dataclasses import replace

from bkref.refine.driver import Performed
from bkref.spec.config import Config
from bkref.spec.protocol import Label, State, initial_state, next_states


class SpecDriver:
    name = "spec"

    def __init__(self, mutants: frozenset[str] = frozenset()) -> None:
        self.mutants = mutants
        self.cfg: Config | None = None
        self.state: State | None = None

    def unsupported(self, cfg: Config) -> list[str]:
        return []

    def start(self, cfg: Config) -> None:
        self.cfg = replace(cfg, mutants=cfg.mutants | self.mutants)
        self.state = initial_state(self.cfg)

    def perform(self, label: Label) -> Performed:
        assert self.cfg is not None
        assert self.state is not None
        for lb, nxt in next_states(self.cfg, self.state):
            if lb == label:
                self.state = nxt
                return Performed()
        return Performed(refused="not enabled in this version of the spec")

    def abstract(self) -> State:
        assert self.state is not None
        return self.state

    def stop(self) -> None:
        self.state = None
