"""Jepsen interop: bkref histories written as Jepsen writes history.edn, and read back.

The EDN syntax itself is :mod:`bkref.linearizability.edn`.

Jepsen's own tools (Knossos, Elle, a REPL) read a history as EDN maps, one per
line, in the order of ``jepsen.history.Op``'s fields::

    {:index 0, :time 12000, :type :invoke, :process 3, :f :add, :value [7 {:entry 0, :data "a"}]}

- ``:index`` counts 0, 1, 2, ... in file order (Jepsen's dense indices: a
  bkref history whose indices have gaps is renumbered); ``:time`` is bkref's
  ``time`` in nanoseconds and must not go back.
- ``:type`` is ``:invoke``, ``:ok``, ``:fail`` or ``:info``; ``:process`` an
  integer, or ``:nemesis``; ``:f`` the operation as a keyword (``:read_lac``
  keeps bkref's name; an ``f`` that is no keyword is written as a string).
- ``:value`` by model, as Jepsen's tests write it. A key (a register's or a
  ledger's id, a kv key) goes first in Jepsen's ``independent`` tuple
  ``[key value]``:

  - ``register``, ``cas-register``: a read is ``nil`` on invocation, then the
    value read; a write ``n``; a cas ``[old new]`` (Knossos' shapes). A history
    whose ops name a ledger (a register per id) writes every client op as
    ``[ledger value]``, an op without one as ``[nil value]``;
  - ``kv``: ``[key value]`` for get, put and append; a get is invoked with
    ``[key nil]``;
  - ``ledger``: ``[ledger value]`` for every client op, the ledger ``nil`` where
    bkref's is null (a create's invocation), and the value of
    :mod:`bkref.linearizability.history` with keyword keys:
    ``[7 {:entry 0, :data "a"}]``, ``[7 {:entry 0, :found false}]``,
    ``[7 {:lac 3}]``, ``[7 {:last_entry 3}]``, ``[nil {:ensemble 3, ...}]``.

- A failure's reason goes where Jepsen puts it, in ``:error``: a completion
  whose bkref value is ``{"error": E}`` (a fenced add) is written as
  ``:value [7 nil], :error :fenced``.
- A nemesis op's value is written as it is (maps with keyword keys); an op
  whose ledger the value cannot carry (a nemesis op, a kv op) has it in an
  extra key ``:ledger``, which Jepsen's checkers ignore.

Read back (:func:`read_edn`), an exported history gives the same ops (up to
the renumbered indices). The reader also takes histories Jepsen wrote: the
EDN it parses is maps, vectors, lists, sets, keywords, symbols, strings with
escapes, characters, integers, floats, nil, true, false, comments and ``#_``;
a tagged element (``#inst ...``, a record) is refused. Keywords and symbols
become their names (``:fenced`` -> ``"fenced"``), vectors, lists and sets
JSON lists. One map per line, or a whole file of maps (also inside one
``[...]``, as Knossos reads them). Maps with a ``:key`` are Porcupine's
key-value histories (``{:process 0, :type :invoke, :f :get, :key "a", :value
nil}``, no ``:index``: line order). A register history is read as keyed when
every client op's ``:value`` is a vector of two and no cas's second element
is anything but a vector of two or nil: an unkeyed read is invoked with
``nil``, an unkeyed cas is ``[old new]``. (An unkeyed history of only writes
of two-element vectors and cas to such or to nil would be misread: pass it
keyed.)

Jepsen differs from bkref in one reading: Knossos takes a read of ``nil`` as
"read something unknown", bkref as "read the empty register".
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping
from typing import IO, Any, Final, TypeGuard

from bkref.linearizability.edn import (
    Keyword,
    Symbol,
    dumps,
    iter_forms,
    keyword_or_string,
    to_json,
)
from bkref.linearizability.history import (
    JSON,
    NEMESIS,
    OP_TYPES,
    HistoryError,
    Op,
    Validator,
    op_from_json,
)

# ---------------------------------------------------------------- ops and models

LEDGER_ONLY: Final = frozenset({"create", "add", "read_lac", "close", "recover"})
KV_OPS: Final = frozenset({"get", "put", "append"})
FAMILIES: Final = {
    "ledger": "ledger",
    "kv": "kv",
    "register": "register",
    "cas-register": "register",
}

K_INDEX, K_TIME, K_TYPE, K_PROCESS = (Keyword(n) for n in ("index", "time", "type", "process"))
K_F, K_VALUE, K_ERROR, K_LEDGER, K_KEY = (
    Keyword(n) for n in ("f", "value", "error", "ledger", "key")
)
K_ENTRY: Final = Keyword("entry")
_K_NEMESIS: Final = Keyword(NEMESIS)


def _error_of(op: Op) -> str | None:
    """The reason of a failed or crashed op whose value is ``{"error": reason}``."""
    v = op.value
    if op.type in ("fail", "info") and type(v) is dict and len(v) == 1:
        e = v.get("error")
        if isinstance(e, str):
            return e
    return None


def _decided(register: str | None, clients: bool) -> str:
    if register is not None:
        return register
    if clients:
        raise HistoryError(
            "cannot tell the model from the operations (no ledger, kv or register op); pass --model"
        )
    return "ledger"  # no client op, nothing to check: the ledger model says so


def _model_of(client_ops: Iterable[tuple[str | None, bool]]) -> str:
    """The model of a history from ``(f, reads a ledger entry)`` of its client ops, in
    order: the first op only one model has decides; reads and writes alone, a register."""
    register, clients = None, False
    for f, reads_entry in client_ops:
        if f in LEDGER_ONLY or reads_entry:
            return "ledger"
        if f in KV_OPS:
            return "kv"
        if f == "cas":
            return "cas-register"
        if f in ("read", "write"):
            register = "register"
        clients = True
    return _decided(register, clients)


def infer_model(ops: Iterable[Op]) -> str:
    """The model a bkref history's ops belong to, from their ``f`` and values."""
    return _model_of(
        (op.f, op.f == "read" and isinstance(op.value, Mapping) and "entry" in op.value)
        for op in ops
        if not op.is_nemesis
    )


class EdnWriter:
    """Writes ops as Jepsen's history.edn lines for one model.

    ``keyed`` (registers only): write ``[ledger value]`` tuples; choose it when
    any client op names a ledger, so that every op of the file has one shape.
    """

    def __init__(self, stream: IO[str], model: str, *, keyed: bool = False) -> None:
        if model not in FAMILIES:
            raise ValueError(f"unknown model {model!r}; the models are {sorted(FAMILIES)}")
        self._stream = stream
        self._family = FAMILIES[model]
        self._keyed = keyed or self._family == "ledger"
        self._index = 0
        self._time = 0
        self._f_cache: dict[str, str] = {}

    def write(self, op: Op) -> None:
        if op.time < self._time:
            raise HistoryError(
                f"index {op.index}: time goes back ({op.time} ns after {self._time} ns); "
                "Jepsen's :time must not decrease"
            )
        self._time = op.time
        f = self._f_cache.get(op.f)
        if f is None:
            f = self._f_cache[op.f] = keyword_or_string(op.f)
        process = ":nemesis" if op.is_nemesis else str(op.process)
        try:
            value, extra = self._value(op)
        except ValueError as e:
            raise HistoryError(f"index {op.index}: {e}") from None
        self._stream.write(
            f"{{:index {self._index}, :time {op.time}, :type :{op.type}, "
            f":process {process}, :f {f}, :value {value}{extra}}}\n"
        )
        self._index += 1

    def _value(self, op: Op) -> tuple[str, str]:
        """The ``:value`` text and any extra keys (``:error``, ``:ledger``)."""
        error = _error_of(op)
        extra = "" if error is None else ", :error " + keyword_or_string(error)
        value = None if error is not None else op.value
        if op.is_nemesis or self._family == "kv":
            if op.ledger is not None:
                extra += f", :ledger {op.ledger}"
            if op.is_nemesis or value is None:
                return dumps(value), extra
            if not (
                isinstance(value, Mapping) and "key" in value and value.keys() <= {"key", "value"}
            ):
                raise ValueError(f"a kv value must be {{'key': k, 'value': v}}, got {value!r}")
            return f"[{dumps(value['key'])} {dumps(value.get('value'))}]", extra
        if self._keyed:
            key = "nil" if op.ledger is None else str(op.ledger)
            return f"[{key} {dumps(value)}]", extra
        if op.ledger is not None:
            raise ValueError(
                f"op names ledger {op.ledger} but the history is written unkeyed; "
                "write it keyed (every op as [ledger value])"
            )
        return dumps(value), extra


def plan_export(ops: Iterable[Op], model: str | None = None) -> tuple[str, bool]:
    """(model, keyed) for writing ``ops``: the model given or inferred; keyed
    when a register history names a ledger (reads all ops for a register)."""
    it = iter(ops)
    if model is None:
        seen: list[Op] = []

        def remember() -> Iterator[Op]:
            for op in it:
                seen.append(op)
                yield op

        model = infer_model(remember())
        rest: Iterable[Op] = itertools.chain(seen, it)  # read on only for a register
    else:
        rest = it
    if FAMILIES.get(model) != "register":
        return model, model == "ledger"
    return model, any(op.ledger is not None for op in rest if not op.is_nemesis)


def write_edn(ops: Iterable[Op], stream: IO[str], model: str, *, keyed: bool = False) -> int:
    """Write ``ops`` as EDN lines to ``stream``; returns how many were written."""
    w = EdnWriter(stream, model, keyed=keyed)
    n = 0
    for op in ops:
        w.write(op)
        n += 1
    return n


# ---------------------------------------------------------------- reading


def read_text(path: str) -> str:
    """A UTF-8 file's text; HistoryError naming the line of a byte that is not UTF-8."""
    try:
        with open(path, "rb") as stream:
            data = stream.read()
    except OSError as e:
        raise HistoryError(f"cannot read: {e.strerror or e}", source=path) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line_start = data.rfind(b"\n", 0, e.start) + 1
        raise HistoryError(
            f"not UTF-8 text (byte 0x{data[e.start : e.start + 1].hex()} at byte "
            f"{e.start - line_start + 1}); expected EDN maps, one per line",
            line=data.count(b"\n", 0, e.start) + 1,
            source=path,
        ) from None


def iter_op_maps(text: str, source: str) -> Iterator[tuple[int, dict[Any, Any]]]:
    """(line, map) of each op of an EDN history: maps, one per line or all in one vector."""
    for line, form in iter_forms(text, source, unwrap=True):
        if not isinstance(form, dict):
            raise HistoryError(
                f"expected an op map {{:type ..., :f ..., :process ...}}, got {form!r}",
                line=line,
                source=source,
            )
        yield line, form


def _is_pair(v: object) -> TypeGuard[tuple[Any, ...]]:
    return isinstance(v, tuple) and len(v) == 2


def _client(m: Mapping[Any, Any]) -> bool:
    p = m.get(K_PROCESS)
    return p is not _K_NEMESIS and p != NEMESIS


def _name(v: object) -> str | None:
    return v.name if isinstance(v, Keyword | Symbol) else v if isinstance(v, str) else None


def infer_edn_model(maps: Iterable[tuple[int, Mapping[Any, Any]]]) -> str:
    """The model of an EDN history from its ops' ``:f`` and ``:value`` shapes."""

    def client_ops() -> Iterator[tuple[str | None, bool]]:
        for _, m in maps:
            if not _client(m):
                continue
            if K_KEY in m:  # Porcupine's key-value maps
                yield "get", False
                continue
            f, v = _name(m.get(K_F)), m.get(K_VALUE)
            yield f, f == "read" and _is_pair(v) and isinstance(v[1], dict) and K_ENTRY in v[1]

    return _model_of(client_ops())


def _keyed_registers(maps: Iterable[tuple[int, Mapping[Any, Any]]]) -> bool:
    """Whether a register history uses Jepsen's ``[key value]`` tuples (see the module doc)."""
    any_client = False
    for _, m in maps:
        if not _client(m):
            continue
        any_client = True
        v = m.get(K_VALUE)
        if not _is_pair(v):
            return False
        if _name(m.get(K_F)) == "cas" and v[1] is not None and not _is_pair(v[1]):
            return False  # [old new], not [key [old new]] (nil: a crashed cas's value)
    return any_client


class _OpReader:
    """Turns op maps into bkref ops for one model."""

    def __init__(self, source: str, model: str, keyed: bool) -> None:
        self.source = source
        self.family = FAMILIES[model]
        self.keyed = keyed
        self.index = 0

    def op(self, line: int, m: Mapping[Any, Any]) -> Op:
        def bad(message: str) -> HistoryError:
            return HistoryError(message, line=line, source=self.source)

        if K_PROCESS not in m:
            raise bad("missing :process (an integer, or :nemesis)")
        p = m[K_PROCESS]
        process = NEMESIS if p is _K_NEMESIS else p
        if K_TYPE not in m:
            raise bad("missing :type (:invoke, :ok, :fail or :info)")
        typ = _name(m[K_TYPE]) if isinstance(m[K_TYPE], Keyword) else None
        if typ not in OP_TYPES:
            raise bad(f"unknown :type {m[K_TYPE]!r}; the types are :invoke, :ok, :fail, :info")
        f = _name(m.get(K_F))
        if f is None:
            raise bad(f":f must be a keyword or a string, got {m.get(K_F)!r}")
        index = m.get(K_INDEX, self.index)
        self.index = (index if type(index) is int else self.index) + 1
        try:
            ledger, value = self._value(m, process == NEMESIS)
        except ValueError as e:
            raise bad(str(e)) from None
        obj = {
            "index": index,
            "time": m.get(K_TIME, line),
            "process": process,
            "type": typ,
            "f": f,
            "ledger": ledger,
            "value": value,
        }
        return op_from_json(obj, line=line, source=self.source)

    def _value(self, m: Mapping[Any, Any], nemesis: bool) -> tuple[object, JSON]:
        raw = m.get(K_VALUE)
        error = m.get(K_ERROR)
        value: JSON = {"error": to_json(error)} if error is not None else None
        ledger = m.get(K_LEDGER)
        if nemesis or (self.family == "register" and not self.keyed):
            return ledger, to_json(raw) if error is None else value
        if self.family == "kv":
            if K_KEY in m:  # Porcupine's maps
                return ledger, {"key": to_json(m[K_KEY]), "value": to_json(raw)}
            if error is not None or raw is None:
                return ledger, value
            if not _is_pair(raw):
                raise ValueError(f"a kv op's :value must be [key value], got {raw!r}")
            return ledger, {"key": to_json(raw[0]), "value": to_json(raw[1])}
        if not _is_pair(raw):
            what = "a ledger op's" if self.family == "ledger" else "a keyed register op's"
            raise ValueError(f"{what} :value must be [ledger value], got {raw!r}")
        key = raw[0]
        if key is not None and type(key) is not int:
            raise ValueError(
                f"the ledger in :value [ledger value] must be an integer or nil, got {key!r}"
            )
        return key, to_json(raw[1]) if error is None else value


def read_edn(path: str, *, model: str | None = None, check: bool = True) -> Iterator[Op]:
    """Stream the ops of an EDN history file for ``model`` (default: inferred).

    Histories with ``:index`` (Jepsen's, bkref's export) are validated as bkref
    histories unless ``check`` is false; Porcupine's maps (line order, no
    ``:index``) are not, as their rules differ (a process may be reused)."""
    text = read_text(path)
    if model is None:
        model = infer_edn_model(iter_op_maps(text, path))
    if model not in FAMILIES:
        raise HistoryError(f"unknown model {model!r}; the models are {sorted(FAMILIES)}")
    keyed = FAMILIES[model] == "register" and _keyed_registers(iter_op_maps(text, path))
    reader = _OpReader(path, model, keyed)
    validator: Validator | None = None
    first = True
    for line, m in iter_op_maps(text, path):
        op = reader.op(line, m)
        if first:
            first = False
            validator = Validator(path) if check and K_INDEX in m else None
        yield validator.check(op, line) if validator is not None else op


def edn_model(path: str) -> str:
    """The model of the EDN history at ``path``, inferred from its ops."""
    return infer_edn_model(iter_op_maps(read_text(path), path))
