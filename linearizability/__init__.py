"""bkref.linearizability: the history format and the checkers that judge histories.

Dependency direction: linearizability may import spec (its models are the
spec's sequential model) and nothing else of bkref.
"""
