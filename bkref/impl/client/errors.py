"""The client's errors: every failure of a ledger operation is a :class:`BKError`.

Each message says what was being done, what went wrong and what to do about it.
Errors of the layers below (kazoo's, the metadata store's) are never raised as
they are: the client raises one of these, with the original as ``__cause__``.
"""

from __future__ import annotations

from bkref.impl.core.frames import Status

__all__ = [
    "BKError",
    "CreateOutcomeUnknownError",
    "FencedError",
    "NoSuchEntryError",
    "WrongPasswordError",
    "ZooKeeperError",
]


class BKError(RuntimeError):
    """A ledger operation failed; ``status`` says how."""

    def __init__(self, message: str, status: Status = Status.IO_ERROR) -> None:
        super().__init__(message)
        self.status = status


class ZooKeeperError(BKError):
    """ZooKeeper failed during a client operation: it could not be reached (connection
    loss, session expiry, a timeout) or it refused the call. The message says what was
    being done and whether its outcome is known; ``__cause__`` is kazoo's error, or the
    metadata store's."""


class CreateOutcomeUnknownError(ZooKeeperError):
    """The write of a new ledger's metadata was sent and its answer lost: the ledger
    ``ledger_id`` may exist, open and empty, with no handle to it (as in BookKeeper, an
    orphan until a recovery closes it)."""

    def __init__(self, message: str, ledger_id: int) -> None:
        super().__init__(message)
        self.ledger_id = ledger_id


class FencedError(BKError):
    """A recovery client took the ledger over: this handle can no longer write to it."""

    def __init__(self, message: str) -> None:
        super().__init__(message, Status.FENCED)


class NoSuchEntryError(BKError):
    """The replicas that answered prove the entry absent (they cover its write set)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, Status.NO_SUCH_ENTRY)


class WrongPasswordError(BKError):
    """The ledger's password does not match the one given (or the bookies' master key)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, Status.UNAUTHORIZED)
