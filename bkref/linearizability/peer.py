"""Readers for two peer formats, so bkref's checkers can judge others' histories.

- Jepsen's log lines for a compare-and-set register (as recorded against etcd):
  ``INFO  jepsen.util - PROCESS  :TYPE  :F  VALUE`` with F ``read`` (value
  read, ``nil`` if none), ``write`` (value) or ``cas`` (``[FROM TO]``). A read
  that ends as ``:fail :read :timed-out`` observed nothing. Check these with
  the ``cas-register`` model.
- EDN maps, one per line, for a key-value store with append:
  ``{:process P, :type :invoke, :f :get, :key "K", :value V}``. Check these
  with the ``kv`` model. They are read by the EDN reader of
  :mod:`bkref.linearizability.edn_history`, which also reads Jepsen's history.edn.

Both become bkref ops (``Op``) in line order: ``index`` and ``time`` are the
line number, the register's value goes to ``value`` as JSON, a kv operation's
value becomes ``{"key": K, "value": V}``. Neither reader applies the bkref
validator: the peers' rules differ (a Jepsen process that timed out may be
reused), and pairing only needs one open invocation per process.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from bkref.linearizability import edn, edn_history
from bkref.linearizability.edn import to_json
from bkref.linearizability.history import JSON, OP_TYPES, HistoryError, Op, OpType

_JEPSEN_LINE: Final = re.compile(
    r"^INFO\s+jepsen\.util\s+-\s+(?P<process>\d+)\s+:(?P<type>\w+)\s+:(?P<f>[\w-]+)\s*(?P<value>.*?)\s*$"
)
_EDN_START: Final = re.compile(r"(?:\{\s*:|[\[(]\s*(?:\{\s*:|$)|;)")


def _edn_value(text: str, line: int, source: str) -> JSON:
    """A value of a Jepsen log line, read as EDN (keywords by name: ``:timed-out``)."""
    try:
        return to_json(edn.loads(text))
    except (HistoryError, ValueError) as e:
        reason = e.reason if isinstance(e, HistoryError) else str(e)
        raise HistoryError(
            f"cannot read the EDN value {text!r}: {reason}", line=line, source=source
        ) from None


def _op_type(text: str, line: int, source: str) -> OpType:
    for t in OP_TYPES:
        if t == text:
            return t
    raise HistoryError(f"unknown type {text!r}", line=line, source=source)


def _lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of a UTF-8 file; a file that cannot be read, or a
    line that is not UTF-8, is a :class:`HistoryError` naming file and line."""
    source = str(path)
    try:
        stream = open(path, "rb")  # noqa: SIM115 - closed below, after the generator ends
    except OSError as e:
        raise HistoryError(f"cannot read: {e.strerror or e}", source=source) from None
    with stream:
        for n, raw in enumerate(stream, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                byte = raw[e.start : e.start + 1].hex()
                raise HistoryError(
                    f"not UTF-8 text (byte 0x{byte} at byte {e.start + 1}); expected "
                    "a Jepsen log or EDN maps, one per line",
                    line=n,
                    source=source,
                ) from None
            yield n, text


def read_jepsen_log(path: str | Path) -> Iterator[Op]:
    """Ops of a Jepsen cas-register log; lines that are not operations are skipped."""
    source = str(path)
    index = 0
    for n, raw in _lines(path):
        m = _JEPSEN_LINE.match(raw)
        if m is None:
            continue
        typ = _op_type(m["type"], n, source)
        value = _edn_value(m["value"], n, source) if m["value"] else None
        yield Op(index, n, int(m["process"]), typ, m["f"], None, value)
        index += 1


def read_edn_kv(path: str | Path) -> Iterator[Op]:
    """Ops of a key-value history written as EDN maps, one per line: Porcupine's
    maps with ``:key``, or Jepsen's ``[key value]`` tuples (:mod:`bkref.linearizability.edn`)."""
    return edn_history.read_edn(str(path), model="kv", check=False)


def sniff(path: str | Path) -> str:
    """The format of a history file: ``jepsen-log``, ``edn`` or ``bkref``."""
    p = Path(path)
    if p.is_dir() or p.suffix == ".parquet":
        return "bkref"
    try:
        with open(p, encoding="utf-8", errors="replace") as stream:
            for raw in stream:
                text = raw.strip()
                if not text:
                    continue
                if _JEPSEN_LINE.match(text) or text.startswith("INFO"):
                    return "jepsen-log"
                if _EDN_START.match(text):
                    return "edn"
                return "bkref"
    except OSError as e:
        raise HistoryError(f"cannot read: {e.strerror or e}", source=str(path)) from None
    return "bkref"
