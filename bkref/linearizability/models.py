"""Sequential models for the generic checker: register, cas-register, kv, ledger.

A model is pure data plus pure functions:

- ``prepare(operation)`` turns a paired history operation into the model's
  input, the key of its partition, and whether its outcome is known (an ``ok``
  completion) or unknown (``info``, never completed); it returns None for an
  operation that certainly did not happen (``fail``) and so constrains nothing.
  Keys are independent objects (P-compositionality): the checker splits the
  history by key and checks each part alone.
- ``init(inputs)`` gives the initial states of one partition.
- ``step(state, input)`` gives the set of states after the operation takes
  effect, or None (or an empty set) if it cannot take effect in ``state``.
  Several states express nondeterminism; an input whose outcome is unknown
  must allow every outcome.
- ``step1(state, input)``, for deterministic models only: the one state after
  the operation, or ``NO``; the same as ``step`` without building a set, which
  the search would otherwise pay for on every step.
- ``is_read(input)``, optional: true if the operation never changes a state
  (it is allowed in a state or not, and leaves it as it is). The search takes
  such an operation as soon as it can, without trying the other orders.

The ledger model is the spec's (``bkref.spec.ledger_model``); this module only
translates history operations into its ``LedgerOp``. Models are looked up by
name (``MODELS``) so that worker processes can find them.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, Final

from bkref.linearizability.history import JSON, HistoryError, Operation
from bkref.spec import ledger_model
from bkref.spec.ledger_model import LedgerOp

Prepared = tuple[Hashable, Any, bool]  # key, model input, outcome known


@dataclass(frozen=True)
class Model:
    """A sequential specification, as the generic checker uses it."""

    name: str
    prepare: Callable[[Operation], Prepared | None]
    init: Callable[[Sequence[Any]], AbstractSet[Any]]
    step: Callable[[Any, Any], AbstractSet[Any] | None]
    describe: Callable[[Any], str]
    help: str
    step1: Callable[[Any, Any], Any] | None = None  # deterministic: a state or NO
    is_read: Callable[[Any], bool] | None = None  # never changes a state


NO: Final = object()  # step1: the operation cannot take effect in this state


def freeze(value: JSON) -> Hashable:
    """A hashable copy of a JSON value (model states are set members)."""
    if isinstance(value, list):
        return tuple(freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, freeze(v)) for k, v in value.items()))
    return value  # type: ignore[no-any-return]


UNKNOWN: Final = object()  # an output the history does not know


# ---------------------------------------------------------------- registers
# Input: (f, argument, output). A read's argument is unused; a cas's is (from, to).


def _register_prepare(op: Operation, allow_cas: bool) -> Prepared | None:
    if op.f not in ("read", "write") and not (allow_cas and op.f == "cas"):
        raise HistoryError(f"index {op.call}: a register has no operation {op.f!r}")
    if op.status == "fail":
        return None  # it did not happen; a read that failed observed nothing
    known = op.status == "ok"
    if op.f == "read":
        return op.ledger, ("read", None, freeze(op.output) if known else UNKNOWN), known
    if op.f == "write":
        return op.ledger, ("write", freeze(op.input), None), known
    arg = op.input
    if not (isinstance(arg, list) and len(arg) == 2):
        raise HistoryError(f"index {op.call}: cas takes [from, to], got {arg!r}")
    return op.ledger, ("cas", (freeze(arg[0]), freeze(arg[1])), None), known


def _register_init(_inputs: Sequence[Any]) -> AbstractSet[Any]:
    return frozenset({None})  # an empty register reads as null


def _register_step(state: object, inp: tuple[str, Any, Any]) -> AbstractSet[Any] | None:
    f, arg, out = inp
    if f == "read":
        return frozenset({state}) if out is UNKNOWN or out == state else None
    if f == "write":
        return frozenset({arg})
    frm, to = arg
    # A cas with an unknown outcome that did not match had no effect: the
    # same as never happening, which the checker always allows.
    return frozenset({to}) if state == frm else None


def _register_step1(state: object, inp: tuple[str, Any, Any]) -> object:
    f, arg, out = inp
    if f == "read":
        return state if out is UNKNOWN or out == state else NO
    if f == "write":
        return arg
    return arg[1] if state == arg[0] else NO


def _is_read(inp: tuple[str, Any, Any]) -> bool:
    return inp[0] in ("read", "get")


def _register_describe(inp: tuple[str, Any, Any]) -> str:
    f, arg, out = inp
    if f == "read":
        return f"read() -> {'?' if out is UNKNOWN else out}"
    if f == "write":
        return f"write({arg})"
    return f"cas({arg[0]} -> {arg[1]})"


def _cas_prepare(op: Operation) -> Prepared | None:
    return _register_prepare(op, allow_cas=True)


def _plain_prepare(op: Operation) -> Prepared | None:
    return _register_prepare(op, allow_cas=False)


REGISTER: Final = Model(
    name="register",
    prepare=_plain_prepare,
    init=_register_init,
    step=_register_step,
    describe=_register_describe,
    help="read/write register per `ledger` id (null: one register); starts null",
    step1=_register_step1,
    is_read=_is_read,
)

CAS_REGISTER: Final = Model(
    name="cas-register",
    prepare=_cas_prepare,
    init=_register_init,
    step=_register_step,
    describe=_register_describe,
    help="read/write/cas register (cas value [from, to]; fail: did not happen)",
    step1=_register_step1,
    is_read=_is_read,
)


# ---------------------------------------------------------------- key-value with append
# Value of every kv operation: {"key": k, "value": v}. Input: (f, argument, output).


_KV_FS: Final = frozenset({"get", "put", "append"})


def _kv_prepare(op: Operation) -> Prepared | None:
    # The invocation and completion taken once: Operation's properties cost a call
    # each, and this runs once per operation.
    invoke, complete = op
    f = invoke.f
    if f not in _KV_FS:
        raise HistoryError(f"index {invoke.index}: a key-value store has no operation {f!r}")
    inp = invoke.value
    # type() first: the ABC check is slow.
    if not (type(inp) is dict or isinstance(inp, Mapping)) or "key" not in inp:
        raise HistoryError(f"index {invoke.index}: kv value must be {{'key': k, 'value': v}}")
    done = None if complete is None else complete.type
    if done is not None and done not in {"ok", "info"}:
        return None  # failed: it did not happen
    known = done == "ok"
    k = inp["key"]
    key = k if type(k) is str else freeze(k)
    if f == "get":
        output: JSON = complete.value if known and complete is not None else None
        mapping = known and (type(output) is dict or isinstance(output, Mapping))
        out = output.get("value") if mapping else UNKNOWN
        return key, ("get", None, "" if out is None else out), known
    arg = inp.get("value")
    if not isinstance(arg, str):
        raise HistoryError(f"index {invoke.index}: {f} needs a string value, got {arg!r}")
    return key, (f, arg, None), known


def _kv_init(_inputs: Sequence[Any]) -> AbstractSet[Any]:
    return frozenset({""})


def _kv_step(state: object, inp: tuple[str, Any, Any]) -> AbstractSet[Any] | None:
    f, arg, out = inp
    if f == "get":
        return frozenset({state}) if out is UNKNOWN or out == state else None
    if f == "put":
        return frozenset({arg})
    return frozenset({state + arg})


def _kv_step1(state: str, inp: tuple[str, Any, Any]) -> object:
    f, arg, out = inp
    if f == "get":
        return state if out is UNKNOWN or out == state else NO
    if f == "put":
        return arg
    return state + arg


def _kv_describe(inp: tuple[str, Any, Any]) -> str:
    f, arg, out = inp
    if f == "get":
        return f"get() -> {'?' if out is UNKNOWN else repr(out)}"
    return f"{f}({arg!r})"


KV: Final = Model(
    name="kv",
    prepare=_kv_prepare,
    init=_kv_init,
    step=_kv_step,
    describe=_kv_describe,
    help="string key-value store: get/put/append, value {'key': k, 'value': v}; starts ''",
    step1=_kv_step1,
    is_read=_is_read,
)


# ---------------------------------------------------------------- the ledger


def _int(value: JSON, name: str, where: int, low: int) -> int:
    if type(value) is not int or value < low:
        raise HistoryError(f"index {where}: {name} must be an integer >= {low}, got {value!r}")
    return value


def _field(value: JSON, name: str, where: int) -> JSON:
    if type(value) is dict and name in value:  # the common case, without the ABC check
        return value[name]
    if not isinstance(value, Mapping) or name not in value:
        raise HistoryError(f"index {where}: expected a value with {name!r}, got {value!r}")
    return value[name]


def to_ledger_op(
    f: str, status: str, inp: JSON, out: JSON, where: int
) -> tuple[LedgerOp, bool] | None:
    """The model's view of one ledger operation and whether its outcome is known.

    None for an operation that certainly did not happen. One exception to
    ``fail`` meaning "did not happen": an add that failed as fenced may still
    be in the ledger (recovery may have found it on a bookie that took it
    before the fence), so it is indeterminate, like ``info``.
    """
    if f not in ledger_model.OPERATIONS:
        raise HistoryError(f"index {where}: a ledger has no operation {f!r}")
    if status == "fail":
        if f == "add" and isinstance(out, Mapping) and out.get("error") == "fenced":
            status = "info"
        else:
            return None
    known = status == "ok"
    if f == "add":
        entry = _int(_field(inp, "entry", where), "entry", where, 0)
        data = _field(inp, "data", where)
        if not isinstance(data, str):
            raise HistoryError(f"index {where}: add data must be a string, got {data!r}")
        return LedgerOp("add", entry, data, known=known), known
    if f == "read":
        entry = _int(_field(inp, "entry", where), "entry", where, 0)
        if not known:
            return LedgerOp("read", entry, known=False), False
        found = _field(out, "found", where)
        if type(found) is not bool:
            raise HistoryError(f"index {where}: found must be true or false, got {found!r}")
        data = _field(out, "data", where) if found else None
        if found and not isinstance(data, str):
            raise HistoryError(f"index {where}: read data must be a string, got {data!r}")
        return LedgerOp("read", entry, data, found), True
    if f == "read_lac":
        if not known:
            return LedgerOp("read_lac", known=False), False
        lac = _int(_field(out, "lac", where), "lac", where, -1)
        return LedgerOp("read_lac", result=lac), True
    if f in ("close", "recover"):
        if not known:
            return LedgerOp(f, known=False), False
        last = _int(_field(out, "last_entry", where), "last_entry", where, -1)
        return LedgerOp(f, result=last), True
    return LedgerOp("create", known=known), known


def _ledger_prepare(op: Operation) -> Prepared | None:
    if op.ledger is None:
        if op.f == "create":
            return None  # a create that never told its ledger id concerns no ledger we see
        raise HistoryError(f"index {op.call}: {op.f!r} names no ledger")
    r = to_ledger_op(op.f, op.status, op.input, op.output, op.call)
    return None if r is None else (op.ledger, r[0], r[1])


def _ledger_init(inputs: Sequence[Any]) -> AbstractSet[Any]:
    created = not any(i.f == "create" for i in inputs)
    return frozenset({ledger_model.initial_state(created)})


def _ledger_step1(state: ledger_model.LedgerState, op: LedgerOp) -> object:
    after = ledger_model.step(state, op)
    if not after:
        return NO
    (only,) = after  # the ledger model is deterministic
    return only


def _ledger_is_read(op: LedgerOp) -> bool:
    return op.f in ("read", "read_lac")


def describe_ledger_op(op: LedgerOp) -> str:
    if op.f == "add":
        return f"add({op.entry}, {op.data!r})" + ("" if op.known else " ?")
    if not op.known:
        return f"{op.f}{'(' + str(op.entry) + ')' if op.f == 'read' else '()'} -> ?"
    if op.f == "read":
        return f"read({op.entry}) -> " + (repr(op.data) if op.found else "not found")
    if op.f == "read_lac":
        return f"read_lac() -> {op.result}"
    if op.f in ("close", "recover"):
        return f"{op.f}() -> last entry {op.result}"
    return "create()"


LEDGER: Final = Model(
    name="ledger",
    prepare=_ledger_prepare,
    init=_ledger_init,
    step=ledger_model.step,  # directly: the search calls it millions of times
    describe=describe_ledger_op,
    help="BookKeeper ledgers (spec.ledger_model), one partition per ledger id",
    step1=_ledger_step1,
    is_read=_ledger_is_read,
)

MODELS: Final[Mapping[str, Model]] = {m.name: m for m in (REGISTER, CAS_REGISTER, KV, LEDGER)}
