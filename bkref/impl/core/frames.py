"""Wire frames between clients and bookies: length-prefixed, versioned, checksummed.

Layout of one frame (big-endian)::

    u32 length        bytes that follow (header + body + checksum)
    2s  magic         b"BK"
    u8  version       PROTOCOL_VERSION
    u8  op            Op
    u64 request_id    chosen by the client, echoed in the response
    ... body          per op, see the codecs below
    u32 crc32c        of everything after the length field, up to the checksum

The decoder is incremental (feed bytes, get messages) and never raises on bad
input without saying what was wrong: a :class:`FrameError` names the problem,
carries the request id when it could be read, and says whether the stream is
still in sync (``fatal`` is true when the length itself cannot be trusted, so
the connection must be closed after the error response).
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import cast

from bkref.impl.core.checksum import crc32c

PROTOCOL_VERSION = 1
MAGIC = b"BK"
DEFAULT_MAX_FRAME = 5 * 1024 * 1024 + 1024  # BookKeeper's nettyMaxFrameSizeBytes is 5 MiB

_LEN = struct.Struct(">I")
_HEAD = struct.Struct(">2sBBQ")
_CRC = struct.Struct(">I")
MIN_FRAME = _HEAD.size + _CRC.size


class Op(enum.IntEnum):
    ADD = 1
    READ = 2
    READ_LAC = 3
    ADD_RESPONSE = 11
    READ_RESPONSE = 12
    READ_LAC_RESPONSE = 13
    ERROR_RESPONSE = 19


class Status(enum.IntEnum):
    """Response codes, named after BookKeeper's BKException codes where one exists."""

    OK = 0
    NO_SUCH_LEDGER = 1
    NO_SUCH_ENTRY = 2
    FENCED = 3
    UNAUTHORIZED = 4  # wrong master key (ledger password)
    BAD_REQUEST = 5  # malformed frame or message
    TOO_LARGE = 6
    READ_ONLY = 7
    IO_ERROR = 8
    UNSUPPORTED_VERSION = 9


ADD_FLAG_RECOVERY = 0x1
READ_FLAG_FENCE = 0x1


@dataclass(frozen=True, slots=True)
class AddRequest:
    """Store ``body`` (a digested entry) for ``ledger_id``/``entry_id``.

    ``recovery`` bypasses fencing: it is how a recovery client writes back.
    """

    request_id: int
    ledger_id: int
    entry_id: int
    master_key: bytes
    body: bytes
    recovery: bool = False


@dataclass(frozen=True, slots=True)
class ReadRequest:
    """Read one entry; with ``fence`` the bookie first fences the ledger (needs the key)."""

    request_id: int
    ledger_id: int
    entry_id: int
    fence: bool = False
    master_key: bytes = b""


@dataclass(frozen=True, slots=True)
class ReadLacRequest:
    """Ask for the highest LAC the bookie has seen; with ``fence``, fence the ledger first."""

    request_id: int
    ledger_id: int
    fence: bool = False
    master_key: bytes = b""


@dataclass(frozen=True, slots=True)
class AddResponse:
    request_id: int
    status: Status
    ledger_id: int
    entry_id: int


@dataclass(frozen=True, slots=True)
class ReadResponse:
    request_id: int
    status: Status
    ledger_id: int
    entry_id: int
    body: bytes = b""


@dataclass(frozen=True, slots=True)
class ReadLacResponse:
    """``lac``: highest piggybacked LAC; ``last_entry``: highest entry stored (-1: none)."""

    request_id: int
    status: Status
    ledger_id: int
    lac: int
    last_entry: int


@dataclass(frozen=True, slots=True)
class ErrorResponse:
    """The bookie could not process a frame: ``message`` says what was wrong."""

    request_id: int
    status: Status
    message: str


Request = AddRequest | ReadRequest | ReadLacRequest
Response = AddResponse | ReadResponse | ReadLacResponse | ErrorResponse
Message = Request | Response


class FrameError(ValueError):
    """The peer sent a frame we cannot process (a remote protocol violation)."""

    def __init__(
        self,
        reason: str,
        *,
        request_id: int = 0,
        fatal: bool = False,
        status: Status = Status.BAD_REQUEST,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.request_id = request_id
        self.fatal = fatal
        self.status = status


# ---------------------------------------------------------------- encoding

_ADD = struct.Struct(">QQBH")  # ledger, entry, flags, key length (then key, u32 len, body)
_READ = struct.Struct(">QQBH")  # ledger, entry, flags, key length (then key)
_READ_LAC = struct.Struct(">QBH")  # ledger, flags, key length (then key)
_ADD_RESP = struct.Struct(">HQQ")  # status, ledger, entry
_READ_RESP = struct.Struct(">HQQI")  # status, ledger, entry, body length (then body)
_READ_LAC_RESP = struct.Struct(">HQqq")  # status, ledger, lac, last entry
_ERR = struct.Struct(">HH")  # status, message length (then utf-8 message)
_U32 = struct.Struct(">I")
# The length field, the header and an add's (or an add response's) fields in one struct.
_ADD_FRAME = struct.Struct(">I2sBBQQQBH")
_ADD_RESP_FRAME = struct.Struct(">I2sBBQHQQ")

MAX_KEY = 256


def _body(msg: Message) -> tuple[Op, bytes]:
    if isinstance(msg, AddRequest):
        flags = ADD_FLAG_RECOVERY if msg.recovery else 0
        return Op.ADD, b"".join(
            (
                _ADD.pack(msg.ledger_id, msg.entry_id, flags, len(msg.master_key)),
                msg.master_key,
                _U32.pack(len(msg.body)),
                msg.body,
            )
        )
    if isinstance(msg, ReadRequest):
        flags = READ_FLAG_FENCE if msg.fence else 0
        return Op.READ, _READ.pack(
            msg.ledger_id, msg.entry_id, flags, len(msg.master_key)
        ) + msg.master_key
    if isinstance(msg, ReadLacRequest):
        flags = READ_FLAG_FENCE if msg.fence else 0
        return Op.READ_LAC, _READ_LAC.pack(msg.ledger_id, flags, len(msg.master_key)) + (
            msg.master_key
        )
    if isinstance(msg, AddResponse):
        return Op.ADD_RESPONSE, _ADD_RESP.pack(msg.status, msg.ledger_id, msg.entry_id)
    if isinstance(msg, ReadResponse):
        return Op.READ_RESPONSE, _READ_RESP.pack(
            msg.status, msg.ledger_id, msg.entry_id, len(msg.body)
        ) + msg.body
    if isinstance(msg, ReadLacResponse):
        return Op.READ_LAC_RESPONSE, _READ_LAC_RESP.pack(
            msg.status, msg.ledger_id, msg.lac, msg.last_entry
        )
    text = msg.message.encode("utf-8")[:4096]
    return Op.ERROR_RESPONSE, _ERR.pack(msg.status, len(text)) + text


def encode(msg: Message) -> bytes:
    """One complete frame for ``msg``."""
    kind = type(msg)
    if kind is AddRequest:  # the hot paths: one struct for length, header and fields
        a = cast(AddRequest, msg)
        return encode_add(
            a.request_id, a.ledger_id, a.entry_id, a.master_key, a.body, recovery=a.recovery
        )
    if kind is AddResponse:
        r = cast(AddResponse, msg)
        head = _ADD_RESP_FRAME.pack(
            _ADD_RESP_FRAME.size, MAGIC, PROTOCOL_VERSION, Op.ADD_RESPONSE, r.request_id,
            r.status, r.ledger_id, r.entry_id,
        )  # fmt: skip
        return head + _CRC.pack(crc32c(head[_LEN.size :]))
    return _encode_any(msg)


def _encode_any(msg: Message) -> bytes:
    """:func:`encode` for every message, by its body codec (the hot paths' reference)."""
    op, body = _body(msg)
    inner = _HEAD.pack(MAGIC, PROTOCOL_VERSION, op, msg.request_id) + body
    return _LEN.pack(len(inner) + _CRC.size) + inner + _CRC.pack(crc32c(inner))


def encode_add(
    request_id: int,
    ledger_id: int,
    entry_id: int,
    master_key: bytes,
    body: bytes,
    *,
    recovery: bool,
) -> bytes:
    """``encode(AddRequest(...))`` without the request object: a client sends Wq of these
    per add, and building a frozen object costs more than packing it."""
    flags = ADD_FLAG_RECOVERY if recovery else 0
    size = _HEAD.size + _ADD.size + len(master_key) + _U32.size + len(body) + _CRC.size
    head = _ADD_FRAME.pack(
        size, MAGIC, PROTOCOL_VERSION, Op.ADD, request_id,
        ledger_id, entry_id, flags, len(master_key),
    )  # fmt: skip
    # Copying a KiB costs less than a checksum call per part (measured).
    frame = b"".join((head, master_key, _U32.pack(len(body)), body))
    return frame + _CRC.pack(crc32c(frame[_LEN.size :]))


# ---------------------------------------------------------------- decoding


class _Reader:
    """Reads one frame's body, ``data[pos:end]``, in place (offsets, no copies)."""

    def __init__(self, data: memoryview, pos: int, end: int, request_id: int) -> None:
        self.data = data
        self.start = self.pos = pos
        self.end = end
        self.request_id = request_id

    def take(self, st: struct.Struct, what: str) -> tuple[int, ...]:
        if self.pos + st.size > self.end:
            raise FrameError(
                f"{what}: frame ends after {self.end - self.start} bytes, {st.size} more needed",
                request_id=self.request_id,
            )
        vals = st.unpack_from(self.data, self.pos)
        self.pos += st.size
        return vals

    def raw(self, n: int, what: str) -> bytes:
        if self.pos + n > self.end:
            raise FrameError(
                f"{what}: declares {n} bytes but only {self.end - self.pos} remain",
                request_id=self.request_id,
            )
        out = bytes(self.data[self.pos : self.pos + n])
        self.pos += n
        return out

    def key(self, n: int) -> bytes:
        if n > MAX_KEY:
            raise FrameError(
                f"master key of {n} bytes exceeds {MAX_KEY}", request_id=self.request_id
            )
        return self.raw(n, "master key")

    def end_of(self, op: Op) -> None:
        if self.pos != self.end:
            raise FrameError(
                f"{op.name}: {self.end - self.pos} unexpected trailing bytes",
                request_id=self.request_id,
            )


# Codes to members by a dict: calling an IntEnum costs a microsecond, several per add.
_STATUSES = {int(s): s for s in Status}
_OPS = {int(o): o for o in Op}


def _status(value: int, rid: int) -> Status:
    s = _STATUSES.get(value)
    if s is None:
        raise FrameError(f"unknown status code {value}", request_id=rid)
    return s


def _decode_body(op: Op, rid: int, r: _Reader) -> Message:
    msg: Message
    if op is Op.ADD:
        ledger, entry, flags, klen = r.take(_ADD, "ADD header")
        key = r.key(klen)
        (blen,) = r.take(_U32, "ADD body length")
        msg = AddRequest(
            rid, ledger, entry, key, r.raw(blen, "ADD body"), bool(flags & ADD_FLAG_RECOVERY)
        )
    elif op is Op.ADD_RESPONSE:
        st, ledger, entry = r.take(_ADD_RESP, "ADD_RESPONSE")
        msg = AddResponse(rid, _status(st, rid), ledger, entry)
    elif op is Op.READ:
        ledger, entry, flags, klen = r.take(_READ, "READ header")
        msg = ReadRequest(rid, ledger, entry, bool(flags & READ_FLAG_FENCE), r.key(klen))
    elif op is Op.READ_LAC:
        ledger, flags, klen = r.take(_READ_LAC, "READ_LAC header")
        msg = ReadLacRequest(rid, ledger, bool(flags & READ_FLAG_FENCE), r.key(klen))
    elif op is Op.READ_RESPONSE:
        st, ledger, entry, blen = r.take(_READ_RESP, "READ_RESPONSE")
        msg = ReadResponse(rid, _status(st, rid), ledger, entry, r.raw(blen, "READ body"))
    elif op is Op.READ_LAC_RESPONSE:
        st, ledger, lac, last = r.take(_READ_LAC_RESP, "READ_LAC_RESPONSE")
        msg = ReadLacResponse(rid, _status(st, rid), ledger, lac, last)
    else:
        st, mlen = r.take(_ERR, "ERROR_RESPONSE")
        text = r.raw(mlen, "error message").decode("utf-8", errors="replace")
        msg = ErrorResponse(rid, _status(st, rid), text)
    r.end_of(op)
    return msg


def decode_frame(inner: bytes) -> Message:
    """Decode the bytes after a frame's length field (header, body, checksum)."""
    with memoryview(inner) as view:
        return _decode(view, 0, len(inner))


def _decode(data: memoryview, start: int, end: int) -> Message:
    """:func:`decode_frame` of ``data[start:end]``, read in place (slices copy nothing)."""
    size = end - start
    if size < MIN_FRAME:
        raise FrameError(
            f"frame of {size} bytes is shorter than the "
            f"{MIN_FRAME}-byte minimum (header + checksum)"
        )
    magic, version, op_code, rid = _HEAD.unpack_from(data, start)
    if magic != MAGIC:
        raise FrameError(f"bad magic {magic!r} (expected {MAGIC!r}): not a bkref peer?", fatal=True)
    (want,) = _CRC.unpack_from(data, end - _CRC.size)
    got = crc32c(data[start : end - _CRC.size])
    if want != got:
        raise FrameError(
            f"frame checksum mismatch (sent {want:#010x}, computed {got:#010x}): "
            "corrupted in transit",
            request_id=rid,
        )
    if version != PROTOCOL_VERSION:
        raise FrameError(
            f"protocol version {version} is not supported (this bookie speaks "
            f"{PROTOCOL_VERSION}); upgrade the older side",
            request_id=rid,
            status=Status.UNSUPPORTED_VERSION,
        )
    op = _OPS.get(op_code)
    if op is None:
        raise FrameError(f"unknown op code {op_code}", request_id=rid)
    return _decode_body(op, rid, _Reader(data, start + _HEAD.size, end - _CRC.size, rid))


class FrameDecoder:
    """Incremental decoder: ``feed`` bytes, get complete messages and errors, in stream order.

    A bad frame whose length is plausible is skipped and reported as a
    :class:`FrameError` item; the stream stays in sync and later frames decode.
    A fatal error (an impossible length or magic) is the last item: the stream
    is lost and the caller should answer it and close the connection.
    """

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()
        self.broken: FrameError | None = None

    def feed(self, data: bytes) -> list[Message | FrameError]:
        if self.broken is not None:
            return [self.broken]
        buf = self._buf
        buf += data
        out: list[Message | FrameError] = []
        # Frames are decoded where they lie, and the consumed prefix dropped once at the
        # end: a window of adds arrives as one read of many frames.
        pos, size = 0, len(buf)
        with memoryview(buf) as view:
            while size - pos >= _LEN.size and self.broken is None:
                (n,) = _LEN.unpack_from(view, pos)
                if n > self.max_frame:
                    self.broken = FrameError(
                        f"frame length {n} exceeds the maximum of {self.max_frame} bytes "
                        "(split the payload or raise nettyMaxFrameSizeBytes)",
                        fatal=True,
                        status=Status.TOO_LARGE,
                    )
                elif n < MIN_FRAME:
                    self.broken = FrameError(
                        f"frame length {n} is below the {MIN_FRAME}-byte minimum", fatal=True
                    )
                if self.broken is not None:
                    out.append(self.broken)
                    break
                end = pos + _LEN.size + n
                if end > size:
                    break
                try:
                    out.append(_decode(view, pos + _LEN.size, end))
                except FrameError as e:
                    out.append(e)
                    if e.fatal:
                        self.broken = e
                pos = end
        if self.broken is not None:
            buf.clear()
        else:
            del buf[:pos]
        return out

    @property
    def buffered(self) -> int:
        return len(self._buf)
