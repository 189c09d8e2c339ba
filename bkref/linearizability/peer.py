"""Readers for two peer formats, so bkref's checkers can judge others' histories.

- Jepsen's log lines for a compare-and-set register (as recorded against etcd):
  ``INFO  jepsen.util - PROCESS  :TYPE  :F  VALUE`` with F ``read`` (value
  read, ``nil`` if none), ``write`` (value) or ``cas`` (``[FROM TO]``). A read
  that ends as ``:fail :read :timed-out`` observed nothing. Check these with
  the ``cas-register`` model.
- EDN maps, one per line, for a key-value store with append:
  ``{:process P, :type :invoke, :f :get, :key "K", :value V}``. Check these
  with the ``kv`` model.

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

from bkref.linearizability.history import JSON, OP_TYPES, HistoryError, Op, OpType

_JEPSEN_LINE: Final = re.compile(
    r"^INFO\s+jepsen\.util\s+-\s+(?P<process>\d+)\s+:(?P<type>\w+)\s+:(?P<f>[\w-]+)\s*(?P<value>.*?)\s*$"
)
_EDN_PAIR: Final = re.compile(
    r':(?P<k>[\w-]+)\s+(?P<v>"(?:[^"\\]|\\.)*"|:[\w-]+|nil|true|false|-?\d+|\[[^\]]*\])'
)


def _edn_value(text: str, where: str) -> JSON:
    if text == "nil":
        return None
    if text in ("true", "false"):
        return text == "true"
    if text.startswith('"'):
        return text[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    if text.startswith(":"):
        return text[1:]
    if text.startswith("["):
        return [_edn_value(t, where) for t in text[1:-1].split()]
    try:
        return int(text)
    except ValueError:
        raise HistoryError(f"cannot read the EDN value {text!r}", source=where) from None


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
        value = _edn_value(m["value"], f"{source} line {n}") if m["value"] else None
        yield Op(index, n, int(m["process"]), typ, m["f"], None, value)
        index += 1


def read_edn_kv(path: str | Path) -> Iterator[Op]:
    """Ops of a key-value history written as one EDN map per line."""
    source = str(path)
    index = 0
    for n, raw in _lines(path):
        text = raw.strip()
        if not text:
            continue
        if not (text.startswith("{") and text.endswith("}")):
            raise HistoryError("expected an EDN map {...}", line=n, source=source)
        fields = {
            m["k"]: _edn_value(m["v"], f"{source} line {n}") for m in _EDN_PAIR.finditer(text)
        }
        missing = [k for k in ("process", "type", "f") if k not in fields]
        if missing:
            raise HistoryError(f"missing {missing}", line=n, source=source)
        process, f = fields["process"], fields["f"]
        if type(process) is not int or not isinstance(f, str):
            raise HistoryError("bad :process or :f", line=n, source=source)
        typ = _op_type(str(fields["type"]), n, source)
        value = {"key": fields.get("key"), "value": fields.get("value")}
        yield Op(index, n, process, typ, f, None, value)
        index += 1


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
                if text.startswith("{:"):
                    return "edn"
                return "bkref"
    except OSError as e:
        raise HistoryError(f"cannot read: {e.strerror or e}", source=str(path)) from None
    return "bkref"
