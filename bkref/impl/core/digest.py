"""Entry digests and ledger keys.

A stored entry (the body of an add, returned by reads) is::

    u64 ledger_id, u64 entry_id, i64 lac, u64 length   (header; the bookie reads these)
    digest                                             (4 bytes CRC32C or 32 bytes HMAC-SHA256)
    data                                               (the application's bytes)

``lac`` is the writer's LastAddConfirmed when it sent the entry (piggybacked),
``length`` the ledger's length in bytes including this entry. The digest covers
the header and the data. HMAC-SHA256 is keyed by a key derived from the ledger
password; CRC32C is not keyed (the bookie's master-key check protects writes).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import struct
from dataclasses import dataclass
from typing import cast

from bkref.impl.core.checksum import crc32c

HEADER = struct.Struct(">QQqQ")


class DigestType(enum.Enum):
    CRC32C = "CRC32C"
    HMAC = "HMAC"  # HMAC-SHA256, keyed by the password


def master_key(password: bytes) -> bytes:
    """The key a bookie checks on add and fence; derived, so the password never travels."""
    return hashlib.sha256(b"bkref-ledger-master-key\0" + password).digest()


def password_hash(password: bytes) -> str:
    """What ledger metadata stores, so an opener can tell a wrong password before any read."""
    return hashlib.sha256(b"bkref-ledger-password\0" + password).hexdigest()


class DigestMismatchError(ValueError):
    """An entry's digest does not match its contents: corrupt on disk or forged."""


@dataclass(frozen=True, slots=True)
class Entry:
    ledger_id: int
    entry_id: int
    lac: int
    length: int
    data: bytes


@dataclass(frozen=True, slots=True)
class EntryHeader:
    ledger_id: int
    entry_id: int
    lac: int
    length: int


def peek_header(body: bytes) -> EntryHeader:
    """The header fields a bookie interprets, without checking the digest."""
    return EntryHeader(*peek_fields(body))


def peek_fields(body: bytes) -> tuple[int, int, int, int]:
    """:func:`peek_header`'s fields as a tuple (ledger, entry, LAC, length): a bookie reads
    them twice per add, and a frozen object costs more than the unpacking."""
    if len(body) < HEADER.size:
        raise ValueError(
            f"entry body of {len(body)} bytes is shorter than its {HEADER.size}-byte header"
        )
    return cast(tuple[int, int, int, int], HEADER.unpack_from(body, 0))


def content_fingerprint(body: bytes) -> str:
    """What every replica of an entry must agree on, as 8 hex digits.

    Replicas of one entry need not be the same bytes: a recovery's write-back and a
    repair's copy carry their own piggybacked LAC (as BookKeeper's recovery adds do),
    and the digest covers it. A CRC32C-signed body that verifies (no password is
    needed for that) is fingerprinted by its ids, length and data, without the LAC
    and the digest. Any other body (HMAC-signed, whose digest cannot be told from the
    data without the password, or a CRC32C body that fails verification: a flipped
    byte anywhere) is fingerprinted whole, so that it matches only identical bytes.
    """
    h = HEADER.size
    if len(body) >= h + 4:
        header, data = body[:h], body[h + 4 :]
        if body[h : h + 4] == struct.pack(">I", crc32c(data, crc32c(header))):
            ledger_id, entry_id, _lac, length = HEADER.unpack(header)
            ids = struct.pack(">QQQ", ledger_id, entry_id, length)
            return f"{crc32c(data, crc32c(ids)):08x}"
    return f"{crc32c(body):08x}"


class Digest:
    """Signs and verifies entries of one ledger."""

    def __init__(self, kind: DigestType, password: bytes) -> None:
        self.kind = kind
        self._mac_key = hashlib.sha256(b"bkref-mac-key\0" + password).digest()
        self.size = 4 if kind is DigestType.CRC32C else 32

    def _digest(self, header: bytes, data: bytes) -> bytes:
        if self.kind is DigestType.CRC32C:
            return struct.pack(">I", crc32c(data, crc32c(header)))
        mac = hmac.new(self._mac_key, header, hashlib.sha256)
        mac.update(data)
        return mac.digest()

    def sign(self, ledger_id: int, entry_id: int, lac: int, length: int, data: bytes) -> bytes:
        header = HEADER.pack(ledger_id, entry_id, lac, length)
        return header + self._digest(header, data) + data

    def verify(self, body: bytes, ledger_id: int, entry_id: int) -> Entry:
        """The entry in ``body``, or :class:`DigestMismatchError` saying what did not match."""
        if len(body) < HEADER.size + self.size:
            raise DigestMismatchError(
                f"ledger {ledger_id} entry {entry_id}: body of {len(body)} bytes is shorter "
                f"than header + {self.kind.value} digest"
            )
        header = body[: HEADER.size]
        got = body[HEADER.size : HEADER.size + self.size]
        data = body[HEADER.size + self.size :]
        if not hmac.compare_digest(got, self._digest(header, data)):
            raise DigestMismatchError(
                f"ledger {ledger_id} entry {entry_id}: {self.kind.value} digest mismatch "
                "(corrupt copy, or a wrong password)"
            )
        h = EntryHeader(*HEADER.unpack(header))
        if (h.ledger_id, h.entry_id) != (ledger_id, entry_id):
            raise DigestMismatchError(
                f"asked for ledger {ledger_id} entry {entry_id}, the body is ledger "
                f"{h.ledger_id} entry {h.entry_id}"
            )
        return Entry(h.ledger_id, h.entry_id, h.lac, h.length, data)
