"""Refinement: the executable spec held against a real implementation, step by step.

The one place, with ``tests/``, that imports both ``spec`` and ``impl`` (an
import-linter contract keeps it so); only the ``bkref`` CLI imports it.

- :mod:`bkref.refine.driver`: what an implementation provides (the ``Driver``
  protocol: build the system, perform a spec step, report the abstract state).
- :mod:`bkref.refine.observe`: how two abstract states are compared (the parts of a
  state no guard reads are projected out).
- :mod:`bkref.refine.machine`: the Hypothesis ``RuleBasedStateMachine`` driven by
  ``bkref.spec.protocol.next_states``, the same for every implementation.
- :mod:`bkref.refine.spec_driver`: the spec as its own implementation (a self-test,
  and the smallest example of a driver).
- :mod:`bkref.refine.bkref_driver`: bkref's own bookie, writer and recovery client on
  real storage files and a real ZooKeeper, the first adapter; its bookies are
  :mod:`bkref.refine.bkref_bookie`'s, its AutoRecovery :mod:`bkref.refine.bkref_autorecovery`'s.
- :mod:`bkref.refine.cli`: ``bkref refine``.
"""
