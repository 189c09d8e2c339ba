"""The bookie's sans-I/O core: master keys, fencing, read-only mode and request dispatch.

Each test hands requests to :class:`BookieCore` and checks the decision it returns
(what to journal, what to reply), with no storage or network under it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from bkref.impl.core.bookie import BookieCore, JournalFence
from bkref.impl.core.digest import Digest, DigestType, master_key
from bkref.impl.core.frames import (
    AddRequest,
    AddResponse,
    ErrorResponse,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    Status,
)

PW = b"secret"


def test_bookie_rejects_wrong_master_key_on_add_and_fence() -> None:
    core = BookieCore()
    body = Digest(DigestType.CRC32C, PW).sign(1, 0, -1, 1, b"a")
    assert core.handle(AddRequest(1, 1, 0, master_key(PW), body)).reply is not None
    bad = core.handle(AddRequest(2, 1, 0, master_key(b"nope"), body))
    assert getattr(bad.reply, "status", None) is Status.UNAUTHORIZED
    fence = core.handle(ReadRequest(3, 1, 0, fence=True, master_key=master_key(b"nope")))
    assert getattr(fence.reply, "status", None) is Status.UNAUTHORIZED
    assert not core.ledgers[1].fenced


def test_bookie_fences_then_rejects_plain_adds_but_accepts_recovery_adds() -> None:
    core = BookieCore()
    key = master_key(PW)
    d = core.handle(ReadRequest(1, 1, 0, fence=True, master_key=key))
    assert d.records  # master key and fence must be journaled before the reply
    body = Digest(DigestType.CRC32C, PW).sign(1, 0, -1, 1, b"a")
    assert (
        getattr(core.handle(AddRequest(2, 1, 0, key, body)).reply, "status", None) is Status.FENCED
    )
    assert (
        getattr(core.handle(AddRequest(3, 1, 0, key, body, recovery=True)).reply, "status", None)
        is Status.OK
    )


def test_read_only_bookie_rejects_adds() -> None:
    core = BookieCore(read_only=True)
    body = Digest(DigestType.CRC32C, PW).sign(1, 0, -1, 1, b"a")
    assert (
        getattr(core.handle(AddRequest(1, 1, 0, master_key(PW), body)).reply, "status", None)
        is Status.READ_ONLY
    )


@dataclass(frozen=True)
class _NewRequest:
    """A request type this bookie does not know (from a newer client, say)."""

    request_id: int
    ledger_id: int


def test_bookie_dispatches_each_request_type_and_answers_anything_else_bad_request() -> None:
    core = BookieCore()
    key = master_key(PW)
    body = Digest(DigestType.CRC32C, PW).sign(1, 0, -1, 1, b"a")
    add = core.handle(AddRequest(1, 1, 0, key, body))
    assert add.reply == AddResponse(1, Status.OK, 1, 0)
    read = core.handle(ReadRequest(2, 1, 0))
    assert (read.reply, read.read) == (None, ReadRequest(2, 1, 0))  # storage looks it up
    lac = core.handle(ReadLacRequest(3, 1))
    assert lac.reply == ReadLacResponse(3, Status.OK, 1, -1, 0)
    before = {lid: replace(info) for lid, info in core.ledgers.items()}
    others: list[tuple[object, str]] = [
        (AddResponse(4, Status.OK, 1, 0), "AddResponse"),
        (ReadLacResponse(5, Status.OK, 1, 0, 0), "ReadLacResponse"),
        (ErrorResponse(6, Status.IO_ERROR, "x"), "ErrorResponse"),
        (_NewRequest(7, 1), "_NewRequest"),
    ]
    for msg, name in others:
        d = core.handle(msg)  # type: ignore[arg-type]  # not a request: that is the point
        assert (d.records, d.read) == ((), None)  # nothing persisted, nothing looked up
        assert isinstance(d.reply, ErrorResponse)
        assert d.reply.request_id == getattr(msg, "request_id")  # noqa: B009
        assert d.reply.status is Status.BAD_REQUEST
        assert d.reply.message.endswith(f"not {name}")
    assert core.ledgers == before


def test_a_refused_fencing_read_lac_reveals_no_lac_and_fences_nothing() -> None:
    """A fencing read-LAC with a wrong (or no) master key is UNAUTHORIZED, and like the
    NO_SUCH_LEDGER answer it carries no LAC and no last entry (-1, -1): the caller
    learns nothing of a ledger it may not fence."""
    core = BookieCore()
    key = master_key(PW)
    body = Digest(DigestType.CRC32C, PW).sign(1, 0, -1, 1, b"a")
    assert core.handle(AddRequest(1, 1, 0, key, body)).reply == AddResponse(1, Status.OK, 1, 0)
    for rid, wrong in ((2, master_key(b"nope")), (3, b"")):
        d = core.handle(ReadLacRequest(rid, 1, fence=True, master_key=wrong))
        assert d.reply == ReadLacResponse(rid, Status.UNAUTHORIZED, 1, -1, -1)
        assert d.records == ()
    assert not core.ledgers[1].fenced
    d = core.handle(ReadLacRequest(4, 9, fence=True, master_key=b""))  # unknown ledger
    assert d.reply == ReadLacResponse(4, Status.UNAUTHORIZED, 9, -1, -1)
    assert 9 not in core.ledgers


def test_a_fence_request_while_the_first_fence_is_journaled_waits_for_a_durable_fence() -> None:
    """Two fencing requests, the second decided before the first one's fence is durable:
    each reply waits for a journaled fence (the second journals it again, after the
    first), as BookKeeper's ``fenceAndLogInJournal`` has a later fence request wait on
    the first one's journal write. Answered at once, the second told a recovery the
    bookie was fenced while a crash could still forget the fence (a soak run's trace
    check: "came back unfenced"). Once the fence is durable, a fence request waits for
    nothing."""
    core = BookieCore()
    key = master_key(PW)
    body = Digest(DigestType.CRC32C, PW).sign(1, 0, -1, 1, b"a")
    add = core.handle(AddRequest(1, 1, 0, key, body))
    core.on_durable(add.records)
    first = core.handle(ReadLacRequest(2, 1, fence=True, master_key=key))
    assert first.records == (JournalFence(1),)
    second = core.handle(ReadRequest(3, 1, 0, True, key))
    assert second.records == (JournalFence(1),)
    assert second.read is not None  # looked up and answered after the fsync
    core.on_durable(first.records)
    core.on_durable(second.records)
    third = core.handle(ReadRequest(4, 1, 0, True, key))
    assert third.records == ()
    assert core.ledgers[1].fenced


def test_a_lac_read_of_a_ledger_the_bookie_does_not_have_reports_no_lac_and_no_entry() -> None:
    # ReadLacResponse's fields: -1 is "none", the same as for a ledger with no entry yet.
    core = BookieCore()
    d = core.handle(ReadLacRequest(9, 1))
    assert d.reply == ReadLacResponse(9, Status.NO_SUCH_LEDGER, 1, -1, -1)
    assert d.records == ()


def test_a_ledger_fenced_before_its_first_entry_reports_no_lac_and_no_entry() -> None:
    # A recovery may fence a ledger whose writer never reached this bookie: -1 for both,
    # as for a ledger the bookie does not have, and recovery reads from entry 0.
    core = BookieCore()
    key = master_key(PW)
    d = core.handle(ReadLacRequest(9, 1, fence=True, master_key=key))
    assert d.reply == ReadLacResponse(9, Status.OK, 1, -1, -1)
    core.on_durable(d.records)
    again = core.handle(ReadLacRequest(10, 1))
    assert again.reply == ReadLacResponse(10, Status.OK, 1, -1, -1)
