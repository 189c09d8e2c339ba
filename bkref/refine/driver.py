"""What an implementation provides to be held against the spec: a ``Driver``.

The refinement machine (:mod:`bkref.refine.machine`) owns the spec state; a driver
owns the implementation. At each step the machine picks one enabled spec step
(an action name and its arguments, a ``bkref.spec.protocol.Label``) and asks the
driver to perform the same step on the implementation; then it asks the
driver for the implementation's *abstract state* (a ``bkref.spec.protocol.State``)
and compares it with the spec's successor.

A driver

- builds the system in the config's initial state (:meth:`Driver.start`);
- performs one spec step (:meth:`Driver.perform`). The implementation may do
  more in the same call than the spec step says (a recovery client that starts
  reading in the call that completed its fencing): it reports those further
  spec steps as ``followups``, which the machine applies after checking that
  the spec enables each. An actor that makes its own decisions (a replication
  worker: which ledger, copy or give up) takes the step asked as its turn and
  reports what it ``decided`` instead, checked the same way, so that a wrong
  decision the spec never offers is still caught. A step the implementation has
  no way to take now is ``refused`` with the reason (counted and reported,
  never a silent pass);
- reports its abstract state (:meth:`Driver.abstract`): the spec's variables
  computed from the implementation's real state (bookie indices and ledger
  indices as the spec numbers them; the projection in :mod:`bkref.refine.observe`
  removes what no guard reads);
- releases what it holds (:meth:`Driver.stop`), after every example.

An implementation under test that takes a step the spec does not allow shows
up as a state that differs from every spec successor, or as a follow-up the
spec does not enable: both are counterexamples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from bkref.spec.config import Config
from bkref.spec.protocol import Label, State


@dataclass(frozen=True)
class Performed:
    """What the implementation did for one spec step."""

    followups: tuple[Label, ...] = ()  # further spec steps it took in the same call
    refused: str = ""  # non-empty: it could not take the step, and why
    # An actor that decides for itself (a replication worker) was given its turn: the
    # spec steps it chose to take instead of the one asked, () if its turn changed
    # nothing the spec sees (a stutter). None: it took exactly the step asked.
    decided: tuple[Label, ...] | None = None


class ImplementationError(RuntimeError):
    """The implementation did something no spec step describes (an action, an error)."""


class Driver(Protocol):
    """One implementation of the protocol, as the refinement machine drives it."""

    name: str

    def unsupported(self, cfg: Config) -> list[str]:
        """Why this driver cannot run ``cfg`` (empty: it can)."""
        ...

    def start(self, cfg: Config) -> None:
        """Build the system in ``bkref.spec.protocol.initial_state(cfg)``."""
        ...

    def perform(self, label: Label) -> Performed:
        """Take the spec step ``label`` on the implementation."""
        ...

    def abstract(self) -> State:
        """The implementation's state as a spec ``State``."""
        ...

    def stop(self) -> None:
        """Release processes, files and sessions of this example."""
        ...
