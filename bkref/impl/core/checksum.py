"""CRC32C (Castagnoli), the checksum of frames, journal records and the CRC32C digest."""

from __future__ import annotations

import crc32c as _crc32c


def crc32c(data: bytes, value: int = 0) -> int:
    """CRC32C of ``data``, continuing from ``value``."""
    return int(_crc32c.crc32c(data, value))
