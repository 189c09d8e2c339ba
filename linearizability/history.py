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
- durability (:mod:`linearizability.durability`): the campaign's ending, per
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
Lines; both are read and written as streams.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Literal, NamedTuple, Self, TypeAlias

if TYPE_CHECKING:
    import pyarrow as pa

_loads: Callable[[str | bytes], Any]
try:  # orjson parses a line about 3x faster; million-op histories are read line by line
    from orjson import loads as _orjson_loads

    _loads = _orjson_loads
except ImportError:  # pragma: no cover - orjson is a dependency; the standard parser still works
    _loads = json.loads

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


# ---------------------------------------------------------------- JSON Lines


def _check_header(obj: Mapping[str, JSON], line: int, source: str) -> None:
    if obj.get("format") != FORMAT_NAME:
        raise HistoryError(f"header names format {obj.get('format')!r}", line=line, source=source)
    version = obj.get("version")
    if version != FORMAT_VERSION:
        raise HistoryError(
            f"history format version {version!r} is not the version this bkref reads "
            f"({FORMAT_VERSION}); convert the file or use a matching bkref",
            line=line,
            source=source,
        )


def _not_utf8(n: int, source: str, detail: str = "") -> HistoryError:
    return HistoryError(
        f"not UTF-8 text{detail}; expected JSON Lines: one JSON object per line",
        line=n,
        source=source,
    )


def _parse_slow(raw: str | bytes, n: int, source: str) -> object:
    """A line orjson refused: blank (None), not UTF-8, or the standard parser
    decides and words the error (it also takes NaN and integers beyond 64 bits)."""
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            byte = e.object[e.start : e.start + 1].hex()
            raise _not_utf8(n, source, f" (byte 0x{byte} at byte {e.start + 1})") from None
    text = raw.strip()
    if not text:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise HistoryError(
            f"not valid JSON: {e.msg} at column {e.colno}", line=n, source=source
        ) from None


def iter_jsonl(
    stream: Iterable[str | bytes], *, source: str = "history", check: bool = True
) -> Iterator[Op]:
    """Read ops from a stream of JSON Lines, text or bytes (UTF-8); validates
    unless ``check`` is false. Every error is a :class:`HistoryError` naming
    ``source`` and the line."""
    validate_op = Validator(source).check if check else None
    loads = _loads
    n = 0
    try:
        for n, raw in enumerate(stream, start=1):
            try:
                obj = loads(raw)  # JSON allows the surrounding whitespace and newline
            except ValueError:
                obj = _parse_slow(raw, n, source)
                if obj is None:
                    continue
            if n == 1 and isinstance(obj, Mapping) and "format" in obj:
                _check_header(obj, n, source)
                continue
            op = op_from_json(obj, line=n, source=source)
            yield validate_op(op, n) if validate_op is not None else op
    except UnicodeDecodeError:  # a text stream's decoder met bytes that are not UTF-8
        raise _not_utf8(n + 1, source, " (at or after this line)") from None


def read_jsonl(path: str | Path, *, check: bool = True) -> Iterator[Op]:
    """Stream the ops of a JSON Lines file (UTF-8).

    Read as bytes: orjson takes them as they are (and checks the UTF-8), so a
    byte that is not UTF-8 is reported on its own line, not where a text
    decoder's buffer happened to end."""
    try:
        stream = open(path, "rb")  # noqa: SIM115 - closed below, after the generator ends
    except OSError as e:
        raise HistoryError(f"cannot read: {e.strerror or e}", source=str(path)) from None
    with stream:
        yield from iter_jsonl(stream, source=str(path), check=check)


def dumps_op(op: Op) -> str:
    return json.dumps(op.to_json(), separators=(",", ":"), allow_nan=False)


class JsonlWriter:
    """Write ops as JSON Lines, with the format header; flushes each line."""

    def __init__(self, path: str | Path, *, header: bool = True) -> None:
        self._file = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
        if header:
            self._file.write(json.dumps({"format": FORMAT_NAME, "version": FORMAT_VERSION}) + "\n")

    def write(self, op: Op) -> None:
        self._file.write(dumps_op(op) + "\n")

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def write_jsonl(ops: Iterable[Op], path: str | Path) -> int:
    """Write ``ops`` to ``path``; returns how many were written."""
    n = 0
    with JsonlWriter(path) as w:
        for op in ops:
            w.write(op)
            n += 1
    return n


# ---------------------------------------------------------------- Parquet


def parquet_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            pa.field("index", pa.int64(), nullable=False),
            pa.field("time", pa.int64(), nullable=False),
            pa.field("process", pa.int64()),  # null: the nemesis
            pa.field("type", pa.string(), nullable=False),
            pa.field("f", pa.string(), nullable=False),
            pa.field("ledger", pa.int64()),
            pa.field("value", pa.string()),  # JSON text; null for JSON null
        ],
        metadata={"format": FORMAT_NAME, "version": str(FORMAT_VERSION)},
    )


def write_parquet(ops: Iterable[Op], path: str | Path, *, batch_size: int = 65_536) -> int:
    """Write ``ops`` to one Parquet file in row groups of ``batch_size``; returns the count."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = parquet_schema()
    n = 0
    with pq.ParquetWriter(str(path), schema, compression="zstd") as writer:
        cols: dict[str, list[Any]] = {name: [] for name in FIELDS}

        def flush() -> None:
            if cols["index"]:
                writer.write_table(pa.table(cols, schema=schema))
                for c in cols.values():
                    c.clear()

        for op in ops:
            cols["index"].append(op.index)
            cols["time"].append(op.time)
            cols["process"].append(None if op.is_nemesis else op.process)
            cols["type"].append(op.type)
            cols["f"].append(op.f)
            cols["ledger"].append(op.ledger)
            cols["value"].append(
                None if op.value is None else json.dumps(op.value, separators=(",", ":"))
            )
            n += 1
            if len(cols["index"]) >= batch_size:
                flush()
        flush()
    return n


def _parquet_files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.parquet") if p.is_file())
        if not files:
            raise HistoryError("no .parquet files in this directory", source=str(path))
        return files
    if not path.exists():
        raise HistoryError("no such file or directory", source=str(path))
    return [path]


def _arrow_error(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _parquet_batches(file: Path, columns: list[str]) -> Iterator[Any]:
    """The record batches of one Parquet file; a file that is not Parquet, or
    breaks off, is a :class:`HistoryError` naming it."""
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(str(file))
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
        raise HistoryError(
            f"not a readable Parquet file ({_arrow_error(e)})", source=str(file)
        ) from None
    meta = pf.schema_arrow.metadata or {}
    version = meta.get(b"version")
    if version is not None and version != str(FORMAT_VERSION).encode():
        raise HistoryError(
            f"history format version {version.decode(errors='replace')} is not {FORMAT_VERSION}",
            source=str(file),
        )
    missing = [c for c in columns if c not in pf.schema_arrow.names]
    if missing:
        raise HistoryError(f"missing column(s) {missing}", source=str(file))
    batches = pf.iter_batches(columns=columns)
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except (OSError, ValueError) as e:
            raise HistoryError(
                f"cannot read this Parquet file ({_arrow_error(e)})", source=str(file)
            ) from None
        yield batch


def _value(text: object, row: int, source: str) -> JSON:
    if text is None:
        return None
    if not isinstance(text, str):
        raise HistoryError(
            f"value must be JSON text (a string column), got {text!r}", line=row, source=source
        )
    try:
        return json.loads(text)
    except ValueError as e:
        raise HistoryError(f"value is not valid JSON: {e}", line=row, source=source) from None


def read_parquet(path: str | Path, *, check: bool = True) -> Iterator[Op]:
    """Stream the ops of a Parquet file, or of a directory of them in name order."""
    files = _parquet_files(Path(path))
    validator = Validator(str(path)) if check else None
    row = 0
    for file in files:
        file_row = 0  # errors in one file's rows name the file and the row in it
        for batch in _parquet_batches(file, list(FIELDS)):
            cols = batch.to_pydict()
            for i in range(batch.num_rows):
                row += 1
                file_row += 1
                process = cols["process"][i]
                obj = {
                    "index": cols["index"][i],
                    "time": cols["time"][i],
                    "process": NEMESIS if process is None else process,
                    "type": cols["type"][i],
                    "f": cols["f"][i],
                    "ledger": cols["ledger"][i],
                    "value": _value(cols["value"][i], file_row, str(file)),
                }
                op = op_from_json(obj, line=file_row, source=str(file))
                yield validator.check(op, row) if validator is not None else op


def read_history(path: str | Path, *, check: bool = True) -> Iterator[Op]:
    """Stream a history from JSON Lines or Parquet (a file or a directory), by its name."""
    p = Path(path)
    if p.is_dir() or p.suffix == ".parquet":
        return read_parquet(p, check=check)
    return read_jsonl(p, check=check)


def write_history(ops: Iterable[Op], path: str | Path) -> int:
    """Write JSON Lines or Parquet, chosen by the file's suffix (``.parquet``)."""
    if Path(path).suffix == ".parquet":
        return write_parquet(ops, path)
    return write_jsonl(ops, path)


def nonempty(ops: Iterable[Op], source: str, *, hint: str = "") -> Iterator[Op]:
    """Yield ``ops``; raise :class:`HistoryError` at the end if there was none.

    An empty history proves nothing: a pipeline that lost its history must
    not pass as valid. ``hint`` is appended to the message (say how to accept
    an empty history where that is intended)."""
    empty = True
    for op in ops:
        empty = False
        yield op
    if empty:
        raise HistoryError(
            "no operations: expected a history of at least one operation "
            f"(the file is empty, or has only the header line){hint}",
            source=source,
        )


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


class Recorder:
    """Assigns ``index`` and ``time`` to ops as they happen; safe across threads.

    Campaign clients call :meth:`invoke` and then :meth:`complete`; every op is
    written at once, so a crash of the runner leaves a valid prefix on disk.
    """

    def __init__(self, writer: JsonlWriter) -> None:
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
