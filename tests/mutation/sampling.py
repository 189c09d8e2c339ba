"""How a target's sample is drawn: uniformly with a seed, from the mutants the operator
filter kept, none of them in an annotation.

cosmic-ray also mutates the ``|`` of ``-> State | None``; under ``from __future__ import
annotations`` no annotation is evaluated, so such a mutant is equivalent by construction
(and mypy rejects it). Those drawn are replaced by draws from the rest (``draw``), so the
sample stays uniform over the mutants that can change a behaviour, and a seed's sample
keeps every other mutant it had before this filter.
"""

from __future__ import annotations

import ast
import random
from pathlib import Path
from typing import Any

# How the sample is drawn (``draw``); a session drawn another way is not resumed.
DRAW = "annotations replaced"

Span = tuple[tuple[int, int], tuple[int, int]]


def annotation_spans(source: str) -> list[Span]:
    """Where ``source``'s annotations are, as (line, column) pairs (lines from 1, as
    cosmic-ray counts them): arguments', returns' and annotated assignments'."""
    found: list[ast.expr | None] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found.append(node.returns)
        elif isinstance(node, ast.arg | ast.AnnAssign):
            found.append(node.annotation)
    spans: list[Span] = [
        ((a.lineno, a.col_offset), (a.end_lineno, a.end_col_offset))
        for a in found
        if a is not None and a.end_lineno is not None and a.end_col_offset is not None
    ]
    return spans


def in_annotation(start: tuple[int, int], spans: list[Span]) -> bool:
    return any(lo <= tuple(start) < hi for lo, hi in spans)


def draw(kept: list[Any], sample: int, seed: int, tree: Path) -> tuple[list[Any], int]:
    """``sample`` of ``kept`` drawn uniformly with ``seed``, none in an annotation: the
    seed's draw over every kept mutant, less those in annotations, topped up from the
    rest (a uniform subset of a uniform draw, topped up uniformly, is a uniform draw).
    Returns the sample and how many mutants of ``kept`` are in annotations."""
    spans = {
        m: annotation_spans((tree / m).read_text())
        for m in {str(i.mutations[0].module_path) for i in kept}
    }

    def annotated(i: Any) -> bool:
        m = i.mutations[0]
        return in_annotation(m.start_pos, spans[str(m.module_path)])

    rng = random.Random(seed)
    first = rng.sample(kept, min(sample, len(kept)))
    chosen = [i for i in first if not annotated(i)]
    drawn = {i.job_id for i in first}
    rest = [i for i in kept if i.job_id not in drawn and not annotated(i)]
    chosen += rng.sample(rest, min(sample - len(chosen), len(rest)))
    return chosen, sum(map(annotated, kept))
