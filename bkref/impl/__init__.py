"""bkref.impl: the real system (bookies, client, ZooKeeper metadata, AutoRecovery).

Dependency direction: impl imports neither spec nor the checkers; it is an
independent version of the protocol that the tests hold against the spec.
"""
