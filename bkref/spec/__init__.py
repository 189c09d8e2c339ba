"""bkref.spec: the executable specification of the BookKeeper ledger protocol.

Dependency direction: spec is pure and stdlib-only; it imports no other package
of bkref, and every other package may read it.
"""
