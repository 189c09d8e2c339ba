"""Columnar histories: whole ledgers drawn as arrays, for histories of 10^8 lines.

The simulation of :mod:`bkref.linearizability.generate` draws one event at a time
(about 40k lines/s): 10^8 lines would take most of an hour.
:func:`columnar_history` draws each ledger's operations as whole arrays
instead: times first, then what each operation observed at a point between
its invocation and completion, so the history is linearizable by construction
as before. It writes Arrow tables in the Parquet layout of
:func:`bkref.linearizability.history_files.parquet_schema` (the value column's JSON
is formatted by array arithmetic, not json.dumps). ``bkref gen-history`` draws
its histories here unless told to simulate.
"""

from __future__ import annotations

import collections
import concurrent.futures
import itertools
import json
import multiprocessing
import os
import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np
from numpy.typing import NDArray

from bkref.linearizability.generate import CREATE_VALUE
from bkref.linearizability.history import JSON, Op
from bkref.linearizability.history_files import parquet_schema, write_history
from bkref.linearizability.plant import plant

if TYPE_CHECKING:
    import pyarrow as pa

TYPES: Final = ("invoke", "ok", "fail", "info")
FS: Final = ("create", "add", "read", "read_lac", "recover")
INVOKE, OK, FAIL, INFO = range(4)
CREATE_F, ADD_F, READ_F, LAC_F, RECOVER_F = range(5)
# value kinds (a template each; LITERAL: JSON text carried as is)
V_NULL, V_CREATE, V_ADD, V_FENCED, V_READ, V_FOUND, V_MISS, V_LAC, V_LAST, V_LITERAL = range(10)
_READERS: Final = 3
_CRASH: Final = 0.05
_LAC_READS: Final = 0.3
_EARLY_END: Final = 0.05  # ledgers whose recovery starts before all adds are sent


@dataclass
class LedgerColumns:
    """One ledger's lines in real-time order, as arrays (``t``: time in [0, 1))."""

    t: NDArray[Any]
    process: NDArray[Any]
    type: NDArray[Any]  # index into TYPES
    f: NDArray[Any]  # index into FS
    ledger: NDArray[Any]  # -1: null (a create's invocation)
    kind: NDArray[Any]  # value template, V_*
    a: NDArray[Any]  # the entry, LAC or last entry the value names
    r: NDArray[Any]  # the random part of an entry's data, "<ledger>.<entry>.<r>"
    literal: NDArray[Any]  # on V_LITERAL rows: index into ``texts``
    texts: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.t)

    def sorted(self) -> LedgerColumns:
        order = np.argsort(self.t, kind="stable")
        names = ("t", "process", "type", "f", "ledger", "kind", "a", "r", "literal")
        columns: dict[str, Any] = {n: getattr(self, n)[order] for n in names}
        return LedgerColumns(**columns, texts=self.texts)

    def ops(self) -> list[Op]:
        """As Ops (index = position), for planting and tests."""
        out = []
        for i in range(len(self)):
            k = int(self.kind[i])
            led = int(self.ledger[i])
            value = _value(k, led, int(self.a[i]), int(self.r[i]))
            if k == V_LITERAL:
                value = json.loads(self.texts[int(self.literal[i])])
            out.append(
                Op(
                    i,
                    1000 * i,
                    int(self.process[i]),
                    TYPES[self.type[i]],
                    FS[self.f[i]],
                    None if led < 0 else led,
                    value,
                )
            )
        return out


def _value(kind: int, ledger: int, a: int, r: int) -> JSON:
    data = f"{ledger}.{a}.{r}"
    values: dict[int, JSON] = {
        V_NULL: None,
        V_CREATE: dict(CREATE_VALUE),
        V_ADD: {"entry": a, "data": data},
        V_FENCED: {"error": "fenced"},
        V_READ: {"entry": a},
        V_FOUND: {"entry": a, "found": True, "data": data},
        V_MISS: {"entry": a, "found": False},
        V_LAC: {"lac": a},
        V_LAST: {"last_entry": a},
        V_LITERAL: None,
    }
    return values[kind]


def columnar_ledger(
    seed: Sequence[int], ledger: int, adds: int, reads: int, first_process: int
) -> LedgerColumns:
    """A campaign-shaped ledger (as ``gen_cli.campaign_ledger`` makes): a create,
    a pipelined writer (a process per add; 5% crash as info; adds that land
    after the fence fail as fenced), three readers of entries and the LAC (a
    crashed reader's process is retired), a recovery that completes, then final
    reads of entries 0..last by a fresh process. ``seed`` fixes it entirely."""
    rng = np.random.default_rng([*seed, ledger])
    # --- the writer: invocation, effect (in entry order) and completion times
    created = 1.0 + rng.exponential(1.0)
    sent = created + np.cumsum(rng.exponential(1.0, adds))
    effect = np.maximum.accumulate(sent + rng.exponential(2.0, adds))
    done = effect + rng.exponential(2.0, adds) + 1e-6
    if adds > 1 and rng.random() < _EARLY_END:
        cut = int(rng.integers(1, adds))
        sent, effect, done = sent[:cut], effect[:cut], done[:cut]
    n_sent = len(sent)
    rec_call = (sent[-1] if n_sent else created) + rng.exponential(1.0)
    rec_effect = rec_call + rng.exponential(1.0)
    applied = int(np.searchsorted(effect, rec_effect))  # effect is non-decreasing
    rec_done = rec_effect + rng.exponential(1.0)
    fenced = np.arange(n_sent) >= applied
    done[fenced] = np.maximum(sent[fenced], rec_effect) + rng.exponential(1.0, n_sent - applied)
    add_crash = ~fenced & (rng.random(n_sent) < _CRASH)
    data_r = rng.integers(0, 999, n_sent)
    add_proc = first_process + 1 + np.arange(n_sent)

    # --- the readers: each a sequence of operations spread over the ledger's life
    reader_of = rng.integers(0, _READERS, reads)
    order = np.argsort(reader_of, kind="stable")
    reader_of = reader_of[order]
    span = rec_done - created
    # (+ a little: an operation and the next of its process never share a time)
    scale = span / max(1.0, 2.0 * reads / _READERS)
    steps = rng.exponential(scale, 2 * reads).reshape(reads, 2) + 1e-6 * scale
    # boundaries: cumulative per reader (gap then duration)
    flat = steps.reshape(-1)
    cum = np.cumsum(flat).reshape(reads, 2)
    first_of = np.searchsorted(reader_of, np.arange(_READERS))
    base = np.zeros(reads)
    if reads:
        starts = np.concatenate(([0.0], cum[:-1, 1]))
        base = starts[first_of[reader_of]]
    r_call = created + cum[:, 0] - base
    r_done = created + cum[:, 1] - base
    r_at = r_call + rng.random(reads) * (r_done - r_call)
    is_lac = rng.random(reads) < _LAC_READS
    invoked = np.searchsorted(sent, r_call, side="right")  # adds sent by the call
    entry = np.minimum((rng.random(reads) * (invoked + 1)).astype(np.int64), invoked)
    exists = np.minimum(np.searchsorted(effect, r_at, side="right"), applied)
    found = entry < exists
    lac = np.maximum(exists - 1 - rng.geometric(0.6, reads) + 1, -1)
    r_crash = rng.random(reads) < _CRASH
    # a crashed reader continues under a fresh process id
    retired: NDArray[np.int64] = np.cumsum(r_crash) - r_crash  # crashes before each row
    if reads:
        retired -= retired[first_of[reader_of]]  # ... of its reader
    r_proc = first_process + n_sent + 3 + reader_of * (reads + 1) + retired

    # --- recovery, then final reads of every entry by one fresh process
    last = applied - 1
    final_proc = first_process + n_sent + 2
    n_final = applied
    ends = [done.max(initial=rec_done), r_done.max(initial=rec_done)]
    final0 = max(rec_done, *ends) + 1.0
    f_call = final0 + 2.0 * np.arange(n_final)
    f_done = f_call + 1.0

    # --- the lines: (t, process, type, f, ledger, kind, a, r)
    n_lines = 2 + 2 * n_sent + 2 * reads + 2 + 2 * n_final
    t = np.empty(n_lines)
    proc = np.empty(n_lines, np.int64)
    typ = np.empty(n_lines, np.int8)
    fc = np.empty(n_lines, np.int8)
    kind = np.empty(n_lines, np.int8)
    a = np.zeros(n_lines, np.int64)
    r = np.zeros(n_lines, np.int64)
    led = np.full(n_lines, ledger, np.int64)
    at = 0

    def put(  # noqa: PLR0917
        times: NDArray[Any] | float,
        process: NDArray[Any] | int,
        ty: NDArray[Any] | int,
        f: int,
        k: NDArray[Any] | int,
        av: NDArray[Any] | int = 0,
        rv: NDArray[Any] | int = 0,
        count: int = 1,
    ) -> None:
        nonlocal at
        s = slice(at, at + count)
        t[s], proc[s], typ[s], fc[s], kind[s], a[s], r[s] = times, process, ty, f, k, av, rv
        at += count

    put(0.0, first_process, INVOKE, CREATE_F, V_CREATE)
    led[0] = -1
    put(created, first_process, OK, CREATE_F, V_CREATE)
    idx = np.arange(n_sent)
    put(sent, add_proc, INVOKE, ADD_F, V_ADD, idx, data_r, n_sent)
    add_type = np.where(fenced, FAIL, np.where(add_crash, INFO, OK))
    add_kind = np.where(fenced, V_FENCED, np.where(add_crash, V_NULL, V_ADD))
    put(done, add_proc, add_type, ADD_F, add_kind, idx, data_r, n_sent)
    r_f = np.where(is_lac, LAC_F, READ_F)
    put(r_call, r_proc, INVOKE, 0, np.where(is_lac, V_NULL, V_READ), entry, 0, reads)
    fc[at - reads : at] = r_f
    r_kind = np.where(is_lac, V_LAC, np.where(found, V_FOUND, V_MISS))
    r_kind = np.where(r_crash, V_NULL, r_kind)
    r_a = np.where(is_lac, lac, entry)
    r_r = data_r[np.minimum(entry, max(n_sent - 1, 0))] if n_sent else 0
    put(r_done, r_proc, np.where(r_crash, INFO, OK), 0, r_kind, r_a, r_r, reads)
    fc[at - reads : at] = r_f
    put(rec_call, final_proc - 1, INVOKE, RECOVER_F, V_NULL)
    put(rec_done, final_proc - 1, OK, RECOVER_F, V_LAST, last)
    fidx = np.arange(n_final)
    put(f_call, final_proc, INVOKE, READ_F, V_READ, fidx, 0, n_final)
    put(f_done, final_proc, OK, READ_F, V_FOUND, fidx, data_r[:n_final], n_final)
    # Rows stay in this order (each invocation before its completion); the
    # batch is sorted by time once, in _merge.
    return LedgerColumns(
        t / (t.max() * (1 + 1e-9)), proc, typ, fc, led, kind, a, r, np.zeros(n_lines, np.int64)
    )


def _digits(v: NDArray[np.int64]) -> NDArray[np.int64]:
    """Decimal digits of |v| (at least 1)."""
    av = np.abs(v)
    nd = np.ones(len(v), np.int64)
    p = 10
    while (more := av >= p).any():
        nd += more
        p *= 10
    return nd


def format_rows(pieces: Sequence[str | NDArray[np.int64]], n: int) -> pa.Array:
    """An Arrow string array whose row i joins the pieces: a literal as is, an
    int64 array's i-th value in decimal. Each piece is laid out as a block of
    bytes with a mask (numbers right-aligned in a block as wide as the widest),
    and the masked bytes of all blocks, read row by row, are the strings: a
    few array operations per piece, where an f-string per row costs ~1 us."""
    import pyarrow as pa

    blocks: list[NDArray[np.uint8]] = []
    masks: list[NDArray[np.bool_]] = []
    for p in pieces:
        if isinstance(p, str):
            b = np.frombuffer(p.encode(), np.uint8)
            blocks.append(np.broadcast_to(b, (n, len(b))))
            masks.append(np.ones((n, len(b)), np.bool_))
            continue
        neg = p < 0
        nd = _digits(p) + neg
        width = int(nd.max(initial=1))
        powers = 10 ** np.arange(width - 1, -1, -1, dtype=np.int64)
        block = (np.abs(p)[:, None] // powers % 10 + 48).astype(np.uint8)
        cols = np.arange(width)
        block[neg, width - nd[neg]] = ord("-")
        blocks.append(block)
        masks.append(cols >= (width - nd)[:, None])
    mask = np.hstack(masks)
    buf = np.hstack(blocks)[mask]
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(mask.sum(axis=1), out=offsets[1:])
    if offsets[-1] >= 2**31:
        raise ValueError("too many bytes for one string array: format fewer rows at a time")
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(buf))


_CREATE_JSON: Final = json.dumps(CREATE_VALUE, separators=(",", ":"))


def _values(kind: NDArray[Any], c: dict[str, NDArray[Any]], texts: Sequence[str]) -> pa.Array:
    """The value column (JSON text) of rows with value kinds ``kind``."""
    import pyarrow as pa

    led, a, r = c["ledger"], c["a"], c["r"]
    data = '"data":"', led, ".", a, ".", r, '"}'
    templates: dict[int, tuple[str | NDArray[Any], ...]] = {
        V_CREATE: (_CREATE_JSON,),
        V_FENCED: ('{"error":"fenced"}',),
        V_ADD: ('{"entry":', a, ",", *data),
        V_READ: ('{"entry":', a, "}"),
        V_FOUND: ('{"entry":', a, ',"found":true,', *data),
        V_MISS: ('{"entry":', a, ',"found":false}'),
        V_LAC: ('{"lac":', a, "}"),
        V_LAST: ('{"last_entry":', a, "}"),
    }
    parts, where = [], []
    for k, template in templates.items():
        s = np.nonzero(kind == k)[0]
        if len(s):
            pieces = [p if isinstance(p, str) else p[s] for p in template]
            parts.append(format_rows(pieces, len(s)))
            where.append(s)
    s = np.nonzero(kind == V_LITERAL)[0]
    if len(s):
        parts.append(pa.array([texts[i] for i in c["literal"][s]], pa.string()))
        where.append(s)
    s = np.nonzero(kind == V_NULL)[0]
    parts.append(pa.nulls(len(s), pa.string()))
    where.append(s)
    perm = np.concatenate(where)
    inverse = np.empty_like(perm)
    inverse[perm] = np.arange(len(perm))
    return pa.concat_arrays(parts).take(pa.array(inverse))


def _merge(ledgers: Sequence[LedgerColumns], first_index: int) -> pa.Table:
    """Several ledgers' lines interleaved by time, as a table of the Parquet layout."""
    import pyarrow as pa

    names = ("t", "process", "type", "f", "ledger", "kind", "a", "r")
    c = {name: np.concatenate([getattr(x, name) for x in ledgers]) for name in names}
    texts: list[str] = []
    literal = []
    for x in ledgers:
        literal.append(x.literal + len(texts) if x.texts else np.zeros(len(x), np.int64))
        texts.extend(x.texts)
    c["literal"] = np.concatenate(literal)
    order = np.argsort(c["t"], kind="stable")
    c = {name: v[order] for name, v in c.items()}
    n = len(order)
    index = np.arange(first_index, first_index + n, dtype=np.int64)
    led = c["ledger"]
    return pa.table(
        {
            "index": index,
            "time": index * 1000,
            "process": c["process"],
            "type": pa.array(TYPES).take(pa.array(c["type"])),
            "f": pa.array(FS).take(pa.array(c["f"])),
            "ledger": pa.array(led, mask=led < 0),
            "value": _values(c["kind"], c, texts),
        },
        schema=parquet_schema(),
    )


def _from_ops(ops: Sequence[Op]) -> LedgerColumns:
    """A (planted) ledger's Ops as columns whose values are carried as JSON text."""
    n = len(ops)
    texts = [json.dumps(op.value, separators=(",", ":")) for op in ops if op.value is not None]
    kind = np.array([V_NULL if op.value is None else V_LITERAL for op in ops], np.int8)
    return LedgerColumns(
        t=(np.arange(n) + 0.5) / n,
        process=np.array([int(op.process) for op in ops], np.int64),
        type=np.array([TYPES.index(op.type) for op in ops], np.int8),
        f=np.array([FS.index(op.f) for op in ops], np.int8),
        ledger=np.array([-1 if op.ledger is None else op.ledger for op in ops], np.int64),
        kind=kind,
        a=np.zeros(n, np.int64),
        r=np.zeros(n, np.int64),
        literal=np.cumsum(kind == V_LITERAL) - 1,
        texts=texts,
    )


def columnar_history(
    ops: int, ledgers: int, *, seed: int = 0, anomaly: str | None = None
) -> Iterator[pa.Table]:
    """About ``ops`` lines over ``ledgers`` ledgers as Arrow tables (the Parquet
    layout of :func:`bkref.linearizability.history_files.parquet_schema`), ledgers
    interleaved a batch at a time. The same arguments give the same history;
    ``anomaly`` plants one of that kind (:func:`plant`) in one ledger."""
    per_ledger = max(ops // max(ledgers, 1), 8)
    # 7 lines per add: its own 2, 1.5 reads (3), a final read (2)
    adds = max(1, per_ledger // 7)
    reads = adds * 3 // 2
    stride = max(1_000_000, 10 ** len(str(adds + 4 * reads + 10)))
    target = random.Random(seed).randrange(ledgers) + 1 if anomaly else -1
    size = max(1, min(64, 2_000_000 // per_ledger))
    batches = [
        _Batch(seed, range(s, min(s + size, ledgers + 1)), adds, reads, stride, target, anomaly)
        for s in range(1, ledgers + 1, size)
    ]
    workers = min(len(batches), os.cpu_count() or 1, 4)
    index = 0
    if workers < 2:
        for b in batches:
            table = _merge(b(), index)
            index += table.num_rows
            yield table
        return
    # Batches are independent (each ledger has its own seed): draw them in
    # worker processes, a few ahead, and renumber the lines here, in order.
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        pending: collections.deque[concurrent.futures.Future[pa.Table]] = collections.deque()
        todo = iter(batches)
        for b in itertools.islice(todo, workers + 1):
            pending.append(pool.submit(_merged, b))
        while pending:
            table = pending.popleft().result()
            for b in itertools.islice(todo, 1):
                pending.append(pool.submit(_merged, b))
            yield _renumber(table, index)
            index += table.num_rows


@dataclass(frozen=True)
class _Batch:
    """Ledgers drawn and interleaved together."""

    seed: int
    ledgers: range
    adds: int
    reads: int
    stride: int
    target: int
    anomaly: str | None

    def __call__(self) -> list[LedgerColumns]:
        cols = []
        for ledger in self.ledgers:
            first = (ledger - 1) * self.stride
            if ledger == self.target and self.anomaly is not None:
                planted = _planted_columns(
                    self.seed, ledger, self.adds, self.reads, first, self.anomaly
                )
                cols.append(planted)
            else:
                cols.append(columnar_ledger((self.seed,), ledger, self.adds, self.reads, first))
        return cols


def _merged(batch: _Batch) -> pa.Table:
    return _merge(batch(), 0)


def _renumber(table: pa.Table, first: int) -> pa.Table:
    import pyarrow as pa

    index = np.arange(first, first + table.num_rows, dtype=np.int64)
    columns = [pa.array(index), pa.array(index * 1000), *table.columns[2:]]
    return pa.Table.from_arrays(columns, schema=table.schema)


def _planted_columns(  # noqa: PLR0917
    seed: int, ledger: int, adds: int, reads: int, first: int, kind: str
) -> LedgerColumns:
    rng = random.Random(f"{seed}:{ledger}:{kind}")
    for attempt in range(100):
        cols = columnar_ledger((seed, 1 + attempt), ledger, adds, reads, first)
        ops = cols.sorted().ops()
        planted = plant(rng, ops, kind)
        if planted is not None:
            return _from_ops(planted)
    raise ValueError(f"could not plant {kind!r} in 100 generated ledgers; try more ops")


def write_columnar(tables: Iterable[pa.Table], path: Path) -> int:
    """Write tables to one Parquet file (``*.parquet``) or as JSON Lines; the count."""
    import pyarrow.parquet as pq

    if path.suffix != ".parquet":

        def rows() -> Iterator[Op]:
            for table in tables:
                for row in table.to_pylist():
                    text = row["value"]
                    yield Op(
                        row["index"],
                        row["time"],
                        row["process"],
                        row["type"],
                        row["f"],
                        row["ledger"],
                        None if text is None else json.loads(text),
                    )

        return write_history(rows(), path)
    n = 0
    # Dictionaries only where values repeat: the others are nearly all distinct.
    dictionary = ["type", "f", "ledger"]
    with pq.ParquetWriter(
        str(path), parquet_schema(), compression="zstd", use_dictionary=dictionary
    ) as writer:
        for table in tables:
            writer.write_table(table, row_group_size=1 << 20)
            n += table.num_rows
    return n
