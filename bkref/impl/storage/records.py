"""Journal record encoding (the core's JournalRecord values as bytes on disk).

One record: ``u32 length | u32 crc32c | u8 type | u64 ledger | u64 entry | payload``;
the length counts what follows it, the checksum covers type through payload.
A torn write at the tail of a journal shows up as a short or mismatching record.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

from bkref.impl.core.bookie import JournalAdd, JournalFence, JournalMasterKey, JournalRecord
from bkref.impl.core.checksum import crc32c

_HEAD = struct.Struct(">II")
_BODY = struct.Struct(">BQQ")
ADD, MASTER_KEY, FENCE = 1, 2, 3


def encode_record(r: JournalRecord) -> bytes:
    if isinstance(r, JournalAdd):
        inner = _BODY.pack(ADD, r.ledger_id, r.entry_id) + r.body
    elif isinstance(r, JournalMasterKey):
        inner = _BODY.pack(MASTER_KEY, r.ledger_id, 0) + r.master_key
    else:
        inner = _BODY.pack(FENCE, r.ledger_id, 0)
    return _HEAD.pack(len(inner) + 4, crc32c(inner)) + inner


@dataclass(frozen=True, slots=True)
class BadTail:
    """Where decoding stopped, and why (the bytes after ``offset`` were never acknowledged)."""

    offset: int
    trailing: int
    reason: str


def decode_records(
    data: bytes, start: int = 0
) -> Iterator[tuple[int, int, JournalRecord] | BadTail]:
    """``(offset, end, record)`` for each record from ``start``; a :class:`BadTail` ends it."""
    pos = start
    while pos < len(data):
        if len(data) - pos < _HEAD.size:
            yield BadTail(pos, len(data) - pos, "record header cut short")
            return
        length, crc = _HEAD.unpack_from(data, pos)
        end = pos + 4 + length
        if length < 4 + _BODY.size or end > len(data):
            yield BadTail(
                pos,
                len(data) - pos,
                f"record declares {length} bytes, {len(data) - pos - 4} remain",
            )
            return
        inner = data[pos + _HEAD.size : end]
        if crc32c(inner) != crc:
            yield BadTail(pos, len(data) - pos, "record checksum mismatch")
            return
        kind, ledger, entry = _BODY.unpack_from(inner, 0)
        payload = inner[_BODY.size :]
        rec: JournalRecord
        if kind == ADD:
            rec = JournalAdd(ledger, entry, payload)
        elif kind == MASTER_KEY:
            rec = JournalMasterKey(ledger, payload)
        elif kind == FENCE:
            rec = JournalFence(ledger)
        else:
            yield BadTail(pos, len(data) - pos, f"unknown record type {kind}")
            return
        yield pos, end, rec
        pos = end
