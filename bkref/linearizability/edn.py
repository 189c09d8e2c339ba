"""EDN, the notation Jepsen writes its histories in: a reader and a writer of values.

:func:`iter_forms` and :func:`loads` parse the EDN that Jepsen writes: maps,
vectors, lists, sets, keywords, symbols, strings with escapes, characters,
integers, floats, nil, true, false, comments and ``#_``; a tagged element
(``#inst ...``, a record) is refused with the line it is on. :func:`to_json`
turns a parsed value into JSON (keywords and symbols become their names;
vectors, lists and sets lists); :func:`dumps` writes a JSON value as EDN.
How a bkref history maps onto Jepsen's op maps is
:mod:`bkref.linearizability.edn_history`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar, Final, Self

from bkref.linearizability.history import (
    JSON,
    HistoryError,
)

# ---------------------------------------------------------------- EDN values


class _Named:
    """A keyword or a symbol, interned: one object per name, so identity is
    equality and hashing is cheap (every op map is keyed by keywords)."""

    __slots__ = ("name",)
    _interned: ClassVar[dict[str, Any]]
    name: str

    def __new__(cls, name: str) -> Self:
        found: Self | None = cls._interned.get(name)
        if found is None:
            found = object.__new__(cls)
            found.name = name
            cls._interned[name] = found
        return found

    def __reduce__(self) -> tuple[type, tuple[str]]:
        return type(self), (self.name,)  # copies stay interned


class Keyword(_Named):
    """An EDN keyword; ``name`` without the colon (``"ns/name"`` with a namespace)."""

    __slots__ = ()
    _interned: ClassVar[dict[str, Keyword]] = {}

    def __repr__(self) -> str:
        return ":" + self.name


class Symbol(_Named):
    """An EDN symbol."""

    __slots__ = ()
    _interned: ClassVar[dict[str, Symbol]] = {}

    def __repr__(self) -> str:
        return self.name


class EdnList(tuple[Any, ...]):
    """An EDN list ``( ... )``; vectors are plain tuples (hashable, as EDN
    values may be map keys and set members)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "EdnList(" + super().__repr__() + ")"


# ---------------------------------------------------------------- the parser

_DELIMS: Final = r"\s,;\"()\[\]{}\\"
_TOKEN: Final = re.compile(
    rf"""(?:[\s,]|;[^\n]*)*+                 # whitespace, commas, comments (possessive)
    (?:
      (?P<atom>[^{_DELIMS}\#][^{_DELIMS}]*)  # number, keyword, symbol, nil, true, false
     |(?P<str>"[^"\\]*(?:\\.[^"\\]*)*")
     |(?P<open>[\[({{]|\#\{{)
     |(?P<close>[\])}}])
     |(?P<discard>\#_)
     |(?P<tag>\#[^{_DELIMS}]*)
     |(?P<char>\\(?:newline|space|tab|return|formfeed|backspace|u[0-9A-Fa-f]{{4}}|\S))
     |(?P<end>\Z)
     |(?P<bad>.)
    )""",
    re.VERBOSE | re.DOTALL,
)
_INT: Final = re.compile(r"[+-]?(?:0|[1-9]\d*)N?")
_FLOAT: Final = re.compile(r"[+-]?(?:0|[1-9]\d*)(?:\.\d*)?(?:[eE][+-]?\d+)?M?")
_SYMBOL: Final = re.compile(r"(?![+\-.]\d)[^\d:/#'][^/]*(?:/[^/]+)?|/")
_ESCAPE: Final = re.compile(r"\\(u[0-9A-Fa-f]{4}|.)", re.DOTALL)
_ESCAPES: Final = {"t": "\t", "r": "\r", "n": "\n", "\\": "\\", '"': '"', "b": "\b", "f": "\f"}
_CHARS: Final = {
    "newline": "\n",
    "space": " ",
    "tab": "\t",
    "return": "\r",
    "formfeed": "\f",
    "backspace": "\b",
}
_CLOSERS: Final = {"[": "]", "(": ")", "{": "}", "#{": "}"}
_WHAT: Final = {"[": "vector", "(": "list", "{": "map", "#{": "set"}
_CONSTANTS: Final[dict[str, object]] = {"nil": None, "true": True, "false": False}
_MISSING: Final = object()


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _atom(tok: str) -> object:
    """The value of a bare token; ValueError with the reason if it is none."""
    c = tok[0]
    if c == ":":
        name = tok[1:]
        if not name or name[0] in ":/" or name.endswith("/"):
            raise ValueError(f"bad keyword {tok!r}")
        return Keyword(name)
    if c.isdigit() or (c in "+-" and len(tok) > 1 and tok[1].isdigit()):
        if _INT.fullmatch(tok):
            return int(tok.rstrip("N"))
        if _FLOAT.fullmatch(tok):
            return float(tok.rstrip("M"))
        raise ValueError(f"cannot read the number {tok!r} (EDN integers and floats only)")
    if tok in _CONSTANTS:
        return _CONSTANTS[tok]
    if _SYMBOL.fullmatch(tok):
        return Symbol(tok)
    raise ValueError(f"cannot read {tok!r}")


def _unescape(m: re.Match[str]) -> str:
    e = m.group(1)
    if e[0] == "u" and len(e) == 5:
        return chr(int(e[1:], 16))
    try:
        return _ESCAPES[e]
    except KeyError:
        raise ValueError(f"bad escape \\{e} in a string") from None


def _collection(opener: str, items: list[Any]) -> object:
    if opener == "[":
        return tuple(items)
    if opener == "(":
        return EdnList(items)
    try:
        if opener == "#{":
            members = frozenset(items)
            if len(members) != len(items):
                raise ValueError("a set with a duplicate member")
            return members
        if len(items) % 2:
            raise ValueError(
                f"a map with an odd number of forms ({len(items)}): a key without its value"
            )
        out = dict(zip(items[::2], items[1::2], strict=True))
    except TypeError:  # a map (a dict) as a map key or a set member
        raise ValueError("a map cannot be a map key or a set member here") from None
    if len(out) * 2 != len(items):
        raise ValueError("a map with a duplicate key")
    return out


def iter_forms(
    text: str, source: str = "edn", *, unwrap: bool = False
) -> Iterator[tuple[int, Any]]:
    """(line, form) for each top-level form of ``text``; ``unwrap``: the forms
    of a first top-level vector or list count as top-level forms (a whole
    history in one ``[...]``). HistoryError naming the line on bad EDN."""
    # Frames of open collections: [opener, items, start offset]; opener "#_"
    # discards the next form, "top" is an unwrapped vector.
    stack: list[tuple[str, list[Any], int]] = []
    seen_form = False
    last_pos, last_line = 0, 1
    atoms: dict[str, object] = dict(_CONSTANTS)

    def fail(message: str, pos: int) -> HistoryError:
        return HistoryError(message, line=_line(text, pos), source=source)

    for m in _TOKEN.finditer(text):
        kind = m.lastgroup or "end"
        if kind == "end":  # trailing whitespace and comments
            break
        start = m.start(kind)
        tok = m.group(kind)
        value: object
        if kind == "atom":
            # Fast paths: most atoms are keywords seen before or plain integers.
            value = atoms.get(tok, _MISSING)
            if value is _MISSING:
                if tok.isdigit() and (tok[0] != "0" or len(tok) == 1):
                    value = int(tok)
                else:
                    try:
                        value = _atom(tok)
                    except ValueError as e:
                        raise fail(str(e), start) from None
                    if isinstance(value, _Named):
                        atoms[tok] = value
        elif kind == "str":
            body = tok[1:-1]
            try:
                value = _ESCAPE.sub(_unescape, body) if "\\" in body else body
            except ValueError as e:
                raise fail(str(e), start) from None
        elif kind == "open":
            if unwrap and not stack and not seen_form and tok in "[(":
                stack.append(("top", [], start))
            else:
                stack.append((tok, [], start))
            seen_form = True
            continue
        elif kind == "close":
            if not stack:
                raise fail(f"unmatched {tok!r}: nothing is open here", start)
            if stack[-1][0] == "#_":
                raise fail(f"'#_' has no form to discard before {tok!r}", start)
            opener, items, start = stack.pop()
            if opener == "top":
                if tok != ("]" if text[start] == "[" else ")"):
                    raise fail(f"{tok!r} closes the history's {text[start]!r}", m.start(kind))
                continue
            if _CLOSERS[opener] != tok:
                raise fail(
                    f"{tok!r} does not close the {_WHAT[opener]} opened on line "
                    f"{_line(text, start)} with {opener!r}",
                    m.start(kind),
                )
            try:
                value = _collection(opener, items)
            except ValueError as e:
                raise fail(f"{e} (the {_WHAT[opener]} starting here)", start) from None
        elif kind == "discard":
            stack.append(("#_", [], start))
            continue
        elif kind == "char":
            body = tok[1:]
            value = _CHARS.get(body) or (chr(int(body[1:], 16)) if len(body) == 5 else body)
        elif kind == "tag":
            raise fail(
                f"tagged element {tok!r} is not supported: bkref reads plain EDN "
                "(maps, vectors, lists, sets, keywords, strings, numbers, nil, booleans)",
                start,
            )
        elif tok == '"':
            raise fail("unterminated string (no closing '\"')", start)
        else:
            raise fail(f"unexpected character {tok!r}", start)
        seen_form = True
        if stack and stack[-1][0] == "#_":  # a discarded form vanishes
            stack.pop()
        elif stack and stack[-1][0] != "top":
            stack[-1][1].append(value)
        else:
            last_line += text.count("\n", last_pos, start)
            last_pos = start
            yield last_line, value
    if stack:
        opener, _, start = stack[-1]
        what = "history's vector" if opener == "top" else _WHAT.get(opener, "#_ discard")
        raise fail(f"unterminated {what}: the file ends before it is closed", start)


def loads(text: str, source: str = "edn") -> Any:  # noqa: ANN401 - any EDN value
    """The one EDN form in ``text``; HistoryError if there is none or more."""
    forms = [f for _, f in iter_forms(text, source)]
    if len(forms) != 1:
        raise HistoryError(f"expected one EDN form, found {len(forms)}", source=source)
    return forms[0]


def to_json(value: object) -> JSON:
    """An EDN value as JSON: keywords and symbols by name, vectors, lists and
    sets as lists (a set sorted by its text), map keys as strings."""
    if value is None or type(value) in (str, int, bool):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value} is not a JSON number")
        return value
    if isinstance(value, _Named):
        return value.name
    if isinstance(value, tuple):
        return [to_json(v) for v in value]
    if isinstance(value, frozenset):
        return sorted((to_json(v) for v in value), key=dumps)
    if isinstance(value, dict):
        out: dict[str, JSON] = {}
        for k, v in value.items():
            if isinstance(k, _Named):
                key = k.name
            elif isinstance(k, str | int) and not isinstance(k, bool):
                key = str(k)
            else:
                raise ValueError(f"a map key must be a keyword, string or integer, got {k!r}")
            out[key] = to_json(v)
        return out
    raise ValueError(f"cannot read {value!r} as a JSON value")


# ---------------------------------------------------------------- the writer

_KEYWORD_NAME: Final = re.compile(r"[A-Za-z*!_?<>=][A-Za-z0-9*!_?<>=+\-.]*")
_NEEDS_ESCAPE: Final = re.compile(r'["\\\x00-\x1f\x7f\ud800-\udfff]')
_STRING_ESCAPES: Final = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _escape_char(m: re.Match[str]) -> str:
    c = m.group()
    return _STRING_ESCAPES.get(c) or f"\\u{ord(c):04x}"


def dumps_string(s: str) -> str:
    """``s`` as an EDN string literal (control characters and lone surrogates as ``\\uXXXX``)."""
    if _NEEDS_ESCAPE.search(s) is None:
        return '"' + s + '"'
    return '"' + _NEEDS_ESCAPE.sub(_escape_char, s) + '"'


def keyword_or_string(name: str) -> str:
    """``:name`` if ``name`` reads back as that keyword, else the string literal."""
    return ":" + name if _KEYWORD_NAME.fullmatch(name) else dumps_string(name)


def dumps(value: JSON) -> str:
    """A JSON value as EDN text: objects as maps with keyword keys (string keys
    where a key is no keyword), arrays as vectors."""
    if value is None:
        return "nil"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if type(value) is int:
        return str(value)
    if isinstance(value, str):
        return dumps_string(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value} has no EDN form that Jepsen reads")
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + " ".join(dumps(v) for v in value) + "]"
    if isinstance(value, Mapping):
        parts = []
        for k, v in value.items():
            if not isinstance(k, str):
                raise ValueError(f"a map key must be a string, got {k!r}")
            parts.append(keyword_or_string(k) + " " + dumps(v))
        return "{" + ", ".join(parts) + "}"
    raise ValueError(f"{value!r} is not a JSON value")
