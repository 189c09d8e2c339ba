"""History files: the format of :mod:`bkref.linearizability.history` as JSON Lines and Parquet.

Both are read and written as streams, and every reader validates as it goes
(:class:`bkref.linearizability.history.Validator`) unless told not to. Every error
is a :class:`~linearizability.history.HistoryError` naming the file and the
line (or Parquet row).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from bkref.linearizability.history import (
    FIELDS,
    FORMAT_NAME,
    FORMAT_VERSION,
    JSON,
    NEMESIS,
    HistoryError,
    Op,
    Validator,
    op_from_json,
)

if TYPE_CHECKING:
    import pyarrow as pa

_loads: Callable[[str | bytes], Any]
try:  # orjson parses a line about 3x faster; million-op histories are read line by line
    from orjson import loads as _orjson_loads

    _loads = _orjson_loads
except ImportError:  # pragma: no cover - orjson is a dependency; the standard parser still works
    _loads = json.loads


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
