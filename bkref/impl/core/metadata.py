"""Ledger metadata: the record kept in ZooKeeper, and its versioned serialization.

A ledger is OPEN while its writer adds, IN_RECOVERY once a recovery client has
taken it over, CLOSED when its last entry is fixed. Its segments (BookKeeper
calls them fragments) map a first entry id to the ensemble that stores the
entries from there on; only the last segment of an open ledger can grow.
"""

from __future__ import annotations

import base64
import binascii
import enum
import json
from dataclasses import dataclass, field, replace
from typing import Any

from bkref.impl.core.digest import DigestType
from bkref.impl.core.quorum import Quorum

FORMAT_VERSION = 1


class LedgerState(enum.Enum):
    OPEN = "OPEN"
    IN_RECOVERY = "IN_RECOVERY"
    CLOSED = "CLOSED"


class MetadataFormatError(ValueError):
    """Stored ledger metadata cannot be parsed; the message names the field."""


@dataclass(frozen=True, slots=True)
class Segment:
    first_entry: int
    ensemble: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class LedgerMetadata:
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    segments: tuple[Segment, ...]
    digest_type: DigestType
    password_hash: str
    state: LedgerState = LedgerState.OPEN
    last_entry: int = -1
    length: int = 0
    ctime_ms: int = 0
    custom: tuple[tuple[str, str], ...] = field(default=())
    # As BookKeeper stores it since 4.x, so that the auditor, replication workers and
    # manual recovery can read and write a ledger without being told its password.
    password: bytes = b""

    @property
    def quorum(self) -> Quorum:
        return Quorum(self.ensemble_size, self.write_quorum, self.ack_quorum)

    @property
    def is_closed(self) -> bool:
        return self.state is LedgerState.CLOSED

    def ensemble_for(self, entry_id: int) -> tuple[str, ...]:
        """The ensemble of the segment that holds ``entry_id``."""
        chosen = self.segments[0]
        for seg in self.segments:
            if seg.first_entry <= entry_id:
                chosen = seg
            else:
                break
        return chosen.ensemble

    @property
    def last_segment(self) -> Segment:
        return self.segments[-1]

    def with_segment(self, first_entry: int, ensemble: tuple[str, ...]) -> LedgerMetadata:
        """A new last segment from ``first_entry`` (replacing one that starts there)."""
        kept = tuple(s for s in self.segments if s.first_entry < first_entry)
        return replace(self, segments=(*kept, Segment(first_entry, ensemble)))

    def closed(self, last_entry: int, length: int) -> LedgerMetadata:
        # Every segment is kept, as BookKeeper keeps them: one that starts after the last
        # entry is empty (repair skips it) but still names the bookies the closer chose.
        return replace(self, state=LedgerState.CLOSED, last_entry=last_entry, length=length)

    def bookies(self) -> set[str]:
        return {b for s in self.segments for b in s.ensemble}

    # ------------------------------------------------------------ serialization

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT_VERSION,
            "state": self.state.value,
            "ensembleSize": self.ensemble_size,
            "writeQuorumSize": self.write_quorum,
            "ackQuorumSize": self.ack_quorum,
            "lastEntryId": self.last_entry,
            "length": self.length,
            "digestType": self.digest_type.value,
            "passwordHash": self.password_hash,
            "ctime": self.ctime_ms,
            "segments": [
                {"firstEntryId": s.first_entry, "ensemble": list(s.ensemble)} for s in self.segments
            ],
            "customMetadata": dict(self.custom),
            "password": base64.b64encode(self.password).decode(),
        }

    def serialize(self) -> bytes:
        """Canonical JSON (keys sorted): the same metadata is the same znode bytes whoever
        wrote it, so `bkref shell ledgermetadata` output and znode dumps compare as text."""
        return json.dumps(self.to_json(), sort_keys=True).encode()

    @staticmethod
    def deserialize(data: bytes) -> LedgerMetadata:
        try:
            d = json.loads(data)
            if d.get("format") != FORMAT_VERSION:
                raise MetadataFormatError(
                    f"metadata format {d.get('format')!r} is not {FORMAT_VERSION}: written by "
                    "another version of bkref"
                )
            segs = tuple(
                Segment(int(s["firstEntryId"]), tuple(s["ensemble"])) for s in d["segments"]
            )
            return LedgerMetadata(
                ensemble_size=int(d["ensembleSize"]),
                write_quorum=int(d["writeQuorumSize"]),
                ack_quorum=int(d["ackQuorumSize"]),
                segments=segs,
                digest_type=DigestType(d["digestType"]),
                password_hash=str(d["passwordHash"]),
                state=LedgerState(d["state"]),
                last_entry=int(d["lastEntryId"]),
                length=int(d["length"]),
                ctime_ms=int(d["ctime"]),
                custom=tuple(sorted(d.get("customMetadata", {}).items())),
                password=base64.b64decode(d.get("password", ""), validate=True),
            )
        except MetadataFormatError:
            raise
        except (ValueError, KeyError, TypeError, binascii.Error) as e:
            raise MetadataFormatError(f"cannot parse ledger metadata: {e!r}") from e
