"""Mutation testing of the spec and the core (`make mutation`, docs/mutation.md)."""

import os

# Mutants are of the source, and the baseline measures its lines under coverage.py: never a
# compiled build of the spec (bkref/spec/build.py), even where a current one exists.
os.environ["BKREF_SPEC"] = "pure"
