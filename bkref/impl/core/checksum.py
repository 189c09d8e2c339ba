"""CRC32C (Castagnoli), the checksum of frames, journal records and the CRC32C digest."""

from __future__ import annotations

from typing import Protocol, cast

import crc32c as _crc32c


class _Crc32c(Protocol):
    def __call__(self, data: bytes | bytearray | memoryview, value: int = 0, /) -> int:
        """CRC32C of ``data``, continuing from ``value``."""
        ...


# The package's C function itself, typed: frames and journal records call it several
# times per add, and a Python wrapper around it cost a call each.
crc32c = cast(_Crc32c, _crc32c.crc32c)
