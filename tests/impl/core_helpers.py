"""Ledger metadata for the tests of the sans-I/O cores: five bookie ids and a builder."""

from __future__ import annotations

from bkref.impl.core.digest import DigestType
from bkref.impl.core.metadata import LedgerMetadata, Segment

A, B, C, D, E = "a:1", "b:1", "c:1", "d:1", "e:1"


def ledger_md(
    segments: tuple[Segment, ...],
    *,
    closed_at: int | None = None,
    e: int = 3,
    wq: int = 2,
    aq: int = 2,
    password: bytes = b"",
) -> LedgerMetadata:
    """A ledger of these segments (CRC32C digests), closed at entry ``closed_at`` if given."""
    md = LedgerMetadata(e, wq, aq, segments, DigestType.CRC32C, "h", password=password)
    return md.closed(closed_at, 0) if closed_at is not None else md
