"""Test helpers for checkers of bkref histories, here and in other projects.

:class:`HistoryBuilder` writes a history by hand, one operation (an invocation
and its completion, one after the other) at a time; for histories drawn at
random see :mod:`bkref.linearizability.generate` and :mod:`bkref.linearizability.plant`.
"""

from __future__ import annotations

from bkref.linearizability.history import JSON, Op, OpType


class HistoryBuilder:
    """A history built operation by operation: :attr:`ops`, indices and times
    counting up from 0, each operation completed before the next is invoked.

    >>> h = HistoryBuilder()
    >>> h.add(1, 0, "a")
    >>> h.op(2, "recover", 7, None, {"last_entry": 0})
    >>> h.read(3, 0, "a")
    >>> [(op.index, op.type, op.f) for op in h.ops[:2]]
    [(0, 'invoke', 'add'), (1, 'ok', 'add')]
    """

    def __init__(self) -> None:
        self.ops: list[Op] = []

    def op(  # noqa: PLR0917 - reads like a history line
        self, p: int, f: str, ledger: int, inv: JSON, out: JSON, typ: OpType = "ok"
    ) -> None:
        """Process ``p`` invokes ``f`` on ``ledger`` with ``inv``; it completes as
        ``typ`` with ``out``."""
        i = len(self.ops)
        self.ops.append(Op(i, i, p, "invoke", f, ledger, inv))
        self.ops.append(Op(i + 1, i + 1, p, typ, f, ledger, out))

    def add(self, p: int, e: int, data: str, ledger: int = 7) -> None:
        """An acknowledged add of entry ``e``."""
        self.op(p, "add", ledger, {"entry": e, "data": data}, {"entry": e, "data": data})

    def read(self, p: int, e: int, data: str | None, ledger: int = 7) -> None:
        """A read of entry ``e`` that found ``data`` (None: "no such entry")."""
        out = {"entry": e, "found": data is not None, **({"data": data} if data else {})}
        self.op(p, "read", ledger, {"entry": e}, out)
