"""Refinement: the executable spec held against a real implementation, step by step.

The one place, with ``tests/``, that imports both ``spec`` and ``impl`` (an
import-linter contract keeps it so); only the ``bkref`` CLI imports it.

- :mod:`refine.driver`: what an implementation provides (the ``Driver``
  protocol: build the system, perform a spec step, report the abstract state).
- :mod:`refine.observe`: how two abstract states are compared (the parts of a
  state no guard reads are projected out).
- :mod:`refine.machine`: the Hypothesis ``RuleBasedStateMachine`` driven by
  ``spec.protocol.next_states``, the same for every implementation.
- :mod:`refine.spec_driver`: the spec as its own implementation (a self-test,
  and the smallest example of a driver).
- :mod:`refine.bkref_driver`: bkref's own bookie, writer and recovery client on
  real storage files and a real ZooKeeper, the first adapter; its bookies are
  :mod:`refine.bkref_bookie`'s, its AutoRecovery :mod:`refine.bkref_autorecovery`'s.
- :mod:`refine.cli`: ``bkref refine``.
"""
