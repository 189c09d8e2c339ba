"""The bookie reads and writes a refinement worker makes on the driver's real bookies: a
copy's recovery adds and the open-ledger LAC read (``bkref.refine.bkref_autorecovery``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bkref.impl.core.audit import Verdict, judge
from bkref.impl.core.digest import Digest, master_key
from bkref.impl.core.frames import (
    AddRequest,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    Status,
)
from bkref.impl.core.metadata import LedgerMetadata
from bkref.impl.core.repair_run import Copy, ReadOpenLac

if TYPE_CHECKING:
    from bkref.refine.bkref_driver import BkrefDriver


class CopyFailedError(Exception):
    """A copy could not be made (as the replicator's ``RepairError``)."""


def open_lac(d: BkrefDriver, act: ReadOpenLac) -> int:
    """The highest LAC the live ``bookies`` report, read without fencing."""
    lac = -1
    for name in act.bookies:
        node = d.bookies[d.index[name]]
        if node.core is None:
            continue
        reply = node.serve(ReadLacRequest(d._next_id(), act.ledger_id, False, b""))
        if isinstance(reply, ReadLacResponse) and reply.status is Status.OK:
            lac = max(lac, reply.lac)
    return lac


def copy_fragment(d: BkrefDriver, act: Copy) -> tuple[int, int]:
    """Copy the fragment's entries to the target with recovery adds, each read from a
    live replica that holds it, as ``bkref.impl.autorecovery.replicator.copy_fragment``."""
    md: LedgerMetadata = act.metadata
    frag = act.fragment
    lid = frag.ledger_id
    target = d.bookies[d.index[act.target]]
    if target.core is None:
        raise CopyFailedError(f"target {act.target} is down")
    key = master_key(md.password)
    digest = Digest(md.digest_type, md.password)
    entries = nbytes = 0
    for e in frag.entries(md):
        body = None
        for src in frag.copy_sources(md, e, act.target, act.avoid):
            node = d.bookies[d.index[src]]
            if node.core is None:
                continue
            resp = node.serve(ReadRequest(d._next_id(), lid, e))
            if judge(resp, digest, lid, e) is Verdict.INTACT:
                assert isinstance(resp, ReadResponse)
                body = resp.body
                break
        if body is None:
            raise CopyFailedError(f"ledger {lid} entry {e}: no live replica holds it intact")
        reply = target.serve(AddRequest(d._next_id(), lid, e, key, body, recovery=True))
        if reply.status is not Status.OK:
            raise CopyFailedError(f"target {act.target} refused entry {e}: {reply.status}")
        entries += 1
        nbytes += len(body)
    return entries, nbytes
