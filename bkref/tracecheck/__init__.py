"""Trace validation: a real run's protocol steps replayed through the executable spec.

Bookies, clients and recoveries started with a tracer (``bkref.impl.trace``) log each
protocol step they take under the spec's action name. ``bkref trace check DIR`` reads a
run's trace files (:mod:`bkref.tracecheck.load`), projects them on each ledger
(:mod:`bkref.tracecheck.project`) and searches for a behaviour of the spec that explains
them (:mod:`bkref.tracecheck.search`), each event taken as a spec step
(:mod:`bkref.tracecheck.replay`). The design and what is left out:
docs/notes/trace-validation.md and docs/trace.md.

This package imports the spec and reads JSON lines; it never imports the
implementation (the trace format is its only contract with it).
"""
