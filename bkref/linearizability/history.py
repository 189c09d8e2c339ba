"""The bkref history format: one operation per line, in Jepsen's vocabulary.

A history records what clients asked for and what they were told, in real-time
order. Other implementations record histories in this format to have bkref
check them, so the format is documented here and versioned.

JSON Lines (``.jsonl``), one object per line::

    {"index": 0, "time": 12000, "process": 3, "type": "invoke", "f": "add",
     "ledger": 7, "value": {"entry": 0, "data": "a"}}

- ``index``: strictly increasing; line order is real-time order.
- ``time``: nanoseconds from one monotonic clock (for latency and display; the
  checkers order operations by ``index``).
- ``process``: a non-negative int (a logical client thread) or ``"nemesis"``.
  Each process runs one operation at a time. A process whose operation
  completed as ``info`` has crashed and its id is never used again.
- ``type``: ``invoke``, then one of ``ok`` (it happened), ``fail`` (it certainly
  did not happen) or ``info`` (unknown: it may take effect at any time after
  its invocation, or never). An invocation without a completion is unknown too.
  One exception, from the protocol: an add that fails as fenced
  (``{"error": "fenced"}``) is unknown to the checkers, because the bookies
  that took it before the fence may hand it to recovery, which keeps it.
- ``f``: the operation (``create``, ``add``, ``read``, ``read_lac``, ``close``,
  ``recover``, ...; for nemesis operations the fault: ``kill``, ``partition``).
- ``ledger``: the ledger id, or null (a ``create`` learns its id on completion).
- ``value``: any JSON value. For ledger operations (invocation -> completion):

  - ``create``: ``{"ensemble": E, "write_quorum": Wq, "ack_quorum": Aq}`` -> the
    same, with ``ledger`` set on the completion;
  - ``add``: ``{"entry": id, "data": str}`` -> the same. The client assigns the
    entry id when the add is invoked, as BookKeeper's client does, so an add
    that never completes still names its entry;
  - ``read``: ``{"entry": id}`` -> ``{"entry": id, "found": true, "data": str}``
    or ``{"entry": id, "found": false}`` (no such entry: an observation);
  - ``read_lac``: null -> ``{"lac": id}`` (-1 for none);
  - ``close`` (by the writer) and ``recover`` (open with recovery, by another
    client): null -> ``{"last_entry": id}``;
  - a fenced writer's add completes as ``fail`` with ``{"error": "fenced"}``.

What a history must contain for each check to decide (``bkref check``,
``bkref spark-check`` and the campaign apply the same rules and words):

- linearizability (the ledger checker, the generic search): any history; no
  particular ending is needed.
- durability (:mod:`bkref.linearizability.durability`): the campaign's ending, per
  ledger: an ok ``recover``, then an ok ``read`` (invoked after that recovery
  completed) of every acknowledged entry up to the recovered last entry. A
  ledger without it is counted as "durability unknown" with the reason (never
  recovered; recovered but not read back; read back only in part), never as
  an anomaly, and leaves the verdict valid (exit 0). What the history decides
  without that ending is still decided: an entry acknowledged beyond the
  recovery's last entry is a ``lost-write``, two acknowledged adds of one entry
  a ``duplicate``.

An optional first line ``{"format": "bkref-history", "version": 1}`` names the
format; files without it are read as version 1. Nemesis operations are in the
same history and are not paired.

Parquet files (or a directory of them) have the same columns: ``index``,
``time``, ``process`` (int64; null means the nemesis), ``type``, ``f``,
``ledger`` (nullable int64) and ``value`` (JSON text), and carry the format name
and version in the schema metadata. Parquet is for histories too large for JSON
Lines; both are read and written as streams, by :mod:`bkref.linearizability.history_files`.

This module holds the format's records (:class:`Op`, :class:`Operation`), the
checks of one line and of the rules across lines (:func:`op_from_json`,
:class:`Validator`), pairing and the :class:`Recorder` of a live history.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final, Literal, NamedTuple, Protocol, TypeAlias

FORMAT_NAME: Final = "bkref-history"
FORMAT_VERSION: Final = 1
NEMESIS: Final = "nemesis"
OP_TYPES: Final = ("invoke", "ok", "fail", "info")
FIELDS: Final = ("index", "time", "process", "type", "f", "ledger", "value")
_FIELD_SET: Final = frozenset(FIELDS)
_TYPE_SET: Final = frozenset(OP_TYPES)

OpType: TypeAlias = Literal["invoke", "ok", "fail", "info"]
Process: TypeAlias = int | str
JSON: TypeAlias = Any  # any value json.loads can return


class HistoryError(ValueError):
    """The history is malformed; the message names the line and what is wrong."""

    def __init__(self, message: str, *, line: int | None = None, source: str | None = None) -> None:
        self.reason = message
        self.line = line
        self.source = source
        where = source or "history"
        if line is not None:
            where += f" line {line}"
        super().__init__(f"{where}: {message}")


class Op(NamedTuple):
    """One line of a history: an invocation or a completion.

    A NamedTuple rather than a frozen dataclass: histories have millions of
    ops, and tuple construction is several times cheaper.
    """

    index: int  # type: ignore[assignment]  # the format's name; shadows tuple.index, unused here
    time: int
    process: Process
    type: OpType
    f: str
    ledger: int | None = None
    value: JSON = None

    @property
    def is_nemesis(self) -> bool:
        return self.process == NEMESIS

    def to_json(self) -> dict[str, JSON]:
        return {
            "index": self.index,
            "time": self.time,
            "process": self.process,
            "type": self.type,
            "f": self.f,
            "ledger": self.ledger,
            "value": self.value,
        }


_tuple_new: Final = tuple.__new__


def op_from_json(obj: object, *, line: int | None = None, source: str | None = None) -> Op:
    """Build an :class:`Op` from a decoded JSON object, checking every field."""
    if type(obj) is dict and _FIELD_SET.issuperset(obj):
        # Fast path for the well-formed case (millions of lines); anything it
        # does not accept goes through the checks below, which word the error.
        index, t, process = obj.get("index"), obj.get("time"), obj.get("process")
        typ, f, ledger = obj.get("type"), obj.get("f"), obj.get("ledger")
        if (
            type(index) is int
            and index >= 0
            and type(t) is int
            and t >= 0
            and ((type(process) is int and process >= 0) or process == NEMESIS)
            and type(typ) is str
            and typ in _TYPE_SET
            and type(f) is str
            and f
            and (ledger is None or type(ledger) is int)
        ):
            # tuple.__new__ skips the NamedTuple's Python-level __new__: a third cheaper
            return _tuple_new(Op, (index, t, process, typ, f, ledger, obj.get("value")))

    def bad(message: str) -> HistoryError:
        return HistoryError(message, line=line, source=source)

    if not isinstance(obj, Mapping):
        raise bad(f"expected a JSON object, got {type(obj).__name__}")
    if not obj.keys() <= _FIELD_SET:
        unknown = sorted(set(obj) - _FIELD_SET)
        raise bad(f"unknown field(s) {unknown}; the fields are {list(FIELDS)}")
    try:
        index, t, process, typ, f = obj["index"], obj["time"], obj["process"], obj["type"], obj["f"]
    except KeyError:
        missing = [k for k in ("index", "time", "process", "type", "f") if k not in obj]
        raise bad(f"missing field(s) {missing}") from None
    ledger = obj.get("ledger")
    # type(x) is int: bool is a subclass of int and must not pass.
    if type(index) is not int or index < 0:
        raise bad(f"index must be a non-negative integer, got {index!r}")
    if type(t) is not int or t < 0:
        raise bad(f"time must be a non-negative integer (nanoseconds), got {t!r}")
    if not ((type(process) is int and process >= 0) or process == NEMESIS):
        raise bad(f"process must be a non-negative integer or {NEMESIS!r}, got {process!r}")
    if typ not in OP_TYPES:  # a tuple: an unhashable value compares, a set would raise
        raise bad(f"unknown type {typ!r}; the types are {', '.join(OP_TYPES)}")
    if type(f) is not str or not f:
        raise bad(f"f must be a non-empty string, got {f!r}")
    if ledger is not None and type(ledger) is not int:
        raise bad(f"ledger must be an integer or null, got {ledger!r}")
    return Op(index, t, process, typ, f, ledger, obj.get("value"))


class Validator:
    """Checks the rules that span lines, one op at a time (streaming).

    - ``index`` strictly increases;
    - a process has at most one open invocation;
    - a completion has an open invocation on its process, with the same ``f``
      and the same ledger (or the invocation had none: ``create``);
    - a process whose operation completed as ``info`` is not used again.
    """

    def __init__(self, source: str | None = None) -> None:
        self.source = source
        self.last_index = -1
        self.open: dict[Process, tuple[Op, int | None]] = {}
        self.crashed: dict[Process, int | None] = {}

    def _error(self, line: int | None, message: str) -> HistoryError:
        return HistoryError(message, line=line, source=self.source)

    def check(self, op: Op, line: int | None = None) -> Op:
        if op.index <= self.last_index:
            raise self._error(
                line,
                f"non-monotonic index: {op.index} after {self.last_index} "
                "(indices must strictly increase in line order)",
            )
        self.last_index = op.index
        p = op.process
        if p == NEMESIS:
            return op
        if op.type == "invoke":
            if p in self.open:
                prev, prev_line = self.open[p]
                raise self._error(
                    line,
                    f"two open invocations on process {p}: {op.f!r} invoked while "
                    f"{prev.f!r} (index {prev.index}, line {prev_line}) has not completed; "
                    "a process runs one operation at a time",
                )
            if p in self.crashed:
                raise self._error(
                    line,
                    f"process {p} is reused after its operation completed as info "
                    f"(line {self.crashed[p]}); a crashed process needs a new id",
                )
            self.open[p] = (op, line)
            return op
        if p not in self.open:
            raise self._error(
                line, f"completion without invocation: {op.type} {op.f!r} on process {p}"
            )
        inv, _ = self.open.pop(p)
        if inv.f != op.f:
            raise self._error(
                line, f"completion {op.f!r} does not match the invocation {inv.f!r} of process {p}"
            )
        if inv.ledger is not None and op.ledger != inv.ledger:
            raise self._error(
                line,
                f"completion names ledger {op.ledger} but process {p} invoked "
                f"{inv.f!r} on ledger {inv.ledger}",
            )
        if op.type == "info":
            self.crashed[p] = line
        return op


def validate(ops: Iterable[Op], source: str | None = None) -> Iterator[Op]:
    """Yield ``ops`` unchanged, raising :class:`HistoryError` at the first bad one."""
    v = Validator(source)
    for n, op in enumerate(ops, start=1):
        yield v.check(op, n)


# ---------------------------------------------------------------- pairing


class Operation(NamedTuple):
    """An invocation with its completion (None when it never completed)."""

    invoke: Op
    complete: Op | None

    @property
    def process(self) -> Process:
        return self.invoke.process

    @property
    def f(self) -> str:
        return self.invoke.f

    @property
    def ledger(self) -> int | None:
        return self.complete.ledger if self.complete is not None else self.invoke.ledger

    @property
    def status(self) -> Literal["ok", "fail", "info"]:
        """``info`` also for an invocation that never completed: the outcome is unknown."""
        if self.complete is None or self.complete.type == "info":
            return "info"
        return "ok" if self.complete.type == "ok" else "fail"

    @property
    def call(self) -> int:
        """The invocation's index: operations are ordered by index, not time."""
        return self.invoke.index

    @property
    def ret(self) -> float:
        """The completion's index, or infinity if the outcome is unknown."""
        if self.complete is None or self.complete.type == "info":
            return math.inf
        return self.complete.index

    @property
    def input(self) -> JSON:
        return self.invoke.value

    @property
    def output(self) -> JSON:
        return None if self.complete is None else self.complete.value


def pair(ops: Iterable[Op]) -> list[Operation]:
    """Pair client invocations with their completions, in invocation order.

    Nemesis operations are dropped; validate the history first (the reader
    does), because pairing trusts one open invocation per process.
    """
    pending: dict[Process, int] = {}
    out: list[Operation] = []
    for op in ops:
        if op.is_nemesis:
            continue
        if op.type == "invoke":
            pending[op.process] = len(out)
            out.append(Operation(op, None))
        else:
            i = pending.pop(op.process)
            out[i] = Operation(out[i].invoke, op)
    return out


# ---------------------------------------------------------------- recording


class OpWriter(Protocol):
    """Where a :class:`Recorder` writes (``history_files.JsonlWriter``)."""

    def write(self, op: Op) -> None: ...


class Recorder:
    """Assigns ``index`` and ``time`` to ops as they happen; safe across threads.

    Campaign clients call :meth:`invoke` and then :meth:`complete`; every op is
    written at once, so a crash of the runner leaves a valid prefix on disk.
    """

    def __init__(self, writer: OpWriter) -> None:
        self._writer = writer
        self._lock = threading.Lock()
        self._next = 0
        self._t0 = time.monotonic_ns()

    def record(self, process: Process, typ: OpType, f: str, ledger: int | None, value: JSON) -> Op:
        with self._lock:
            op = Op(self._next, time.monotonic_ns() - self._t0, process, typ, f, ledger, value)
            self._next += 1
            self._writer.write(op)
            return op

    def elapsed_ns(self) -> int:
        """Nanoseconds since the history's time origin (the ``time`` of an op recorded now)."""
        return time.monotonic_ns() - self._t0

    def invoke(self, process: Process, f: str, ledger: int | None, value: JSON = None) -> Op:
        return self.record(process, "invoke", f, ledger, value)

    def complete(
        self, invocation: Op, typ: OpType, value: JSON = None, ledger: int | None = None
    ) -> Op:
        if typ == "invoke":
            raise ValueError("a completion is ok, fail or info, not invoke")
        led = invocation.ledger if ledger is None else ledger
        return self.record(invocation.process, typ, invocation.f, led, value)
