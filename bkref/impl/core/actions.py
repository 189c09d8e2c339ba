"""Actions the core asks its shell to perform, and the core's error kinds.

The shell performs them in list order. Ordering rules the core relies on:
a ``WriteMetadata`` must land (versioned CAS) before the shell reports it with
``on_metadata_written``; sends may go out in any order; completions are
delivered to the application in the order given (entry order for adds).
"""

from __future__ import annotations

from dataclasses import dataclass

from bkref.impl.core.frames import Status
from bkref.impl.core.metadata import LedgerMetadata


class LocalProtocolError(RuntimeError):
    """The caller misused the state machine (names the role, state and event)."""


@dataclass(frozen=True, slots=True)
class SendAdd:
    bookie: str
    ledger_id: int
    entry_id: int
    body: bytes
    recovery: bool = False


@dataclass(frozen=True, slots=True)
class SendRead:
    bookie: str
    ledger_id: int
    entry_id: int
    fence: bool = False


@dataclass(frozen=True, slots=True)
class SendReadLac:
    bookie: str
    ledger_id: int
    fence: bool = False


@dataclass(frozen=True, slots=True)
class WriteMetadata:
    """CAS the ledger's metadata from ``expected_version`` to ``metadata``."""

    metadata: LedgerMetadata
    expected_version: int
    reason: str


@dataclass(frozen=True, slots=True)
class NeedReplacement:
    """Choose a writable bookie to replace ``failed`` (not in ``ensemble``, another domain)."""

    failed: str
    ensemble: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class AddCompleted:
    entry_id: int
    status: Status
    message: str = ""


@dataclass(frozen=True, slots=True)
class CloseCompleted:
    ok: bool
    last_entry: int
    length: int
    message: str = ""


@dataclass(frozen=True, slots=True)
class RecoveryCompleted:
    ok: bool
    last_entry: int
    length: int
    message: str = ""


@dataclass(frozen=True, slots=True)
class ReadCompleted:
    """A client's read of one entry is decided (:class:`bkref.impl.core.reads.EntryReader`):
    OK with ``data``; NO_SUCH_ENTRY, proved absent; IO_ERROR, unknown. ``message``
    says why when not OK; ``digest_mismatches`` lists the replicas whose copy failed
    its digest check, as (bookie, what was wrong)."""

    entry_id: int
    status: Status
    data: bytes = b""
    message: str = ""
    digest_mismatches: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class ReadLacCompleted:
    """A client's LAC read is decided (:class:`bkref.impl.core.reads.LacReader`): with ``ok``,
    ``lac`` is the last add confirmed; without, ``message`` says why it is unknown."""

    ok: bool
    lac: int
    message: str = ""


Action = (
    SendAdd
    | SendRead
    | SendReadLac
    | WriteMetadata
    | NeedReplacement
    | AddCompleted
    | CloseCompleted
    | RecoveryCompleted
)
