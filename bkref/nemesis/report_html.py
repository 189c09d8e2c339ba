"""The pieces of HTML every part of the campaign report uses: a verdict, a table, and a
field read by its dotted path from a run's or a check's result."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence


def verdict(valid: bool | None) -> str:
    if valid is None:
        return '<span class="error">could not run</span>'
    return '<span class="valid">valid</span>' if valid else '<span class="invalid">INVALID</span>'


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], raw: int = 0) -> str:
    """Cells escaped, except those of the first ``raw`` columns (HTML already)."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>"
        + "".join(f"<td>{c if i < raw else html.escape(str(c))}</td>" for i, c in enumerate(row))
        + "</tr>"
        for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def dig(result: Mapping[str, object] | None, path: str) -> object:
    """``result``'s field at ``path`` (``counts.explained`` reads into a mapping); None
    when any step of the path is missing."""
    value: object = result
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value
