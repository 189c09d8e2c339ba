"""bkref's readers in the refinement driver: one read handle per spec reader.

A spec reader is what ``Client.open_ledger(recovery=False)`` gives an
application: a ``ReadHandle`` whose LAC comes from the metadata (a closed
ledger) or from a LAC read of the bookies (``LacReader``), and whose reads
stop at ``ReadHandle.last_entry``. The handle's logic runs here on the
handle itself; its bookie requests are served at once by the driver's
bookies, so a step's answers reflect the bookies as the spec has them:

- ``reader_opens_ledger``: the stored metadata; a closed ledger's handle
  starts at its last entry, an open one with a ``LacReader`` pending;
- ``reader_reads_lac``: a new ``LacReader`` pending;
- ``reader_receives_lac(b)``: the pending ``LacReader`` asks every bookie of
  the handle's last ensemble and takes the maximum, as bkref's does. The spec's
  step takes bookie ``b``'s LAC alone (BookKeeper's long poll and
  ``tryReadLastAddConfirmed`` do): when the maximum is another bookie's, bkref
  cannot take the step (refused, counted);
- ``reader_reads_entry(e, b)``: bookie ``b`` serves the read and the handle's
  digest verifies it, within ``ReadHandle.last_entry``. A BookKeeper V3 read
  answer carries the bookie's LAC, which raises the handle's; bkref's carries
  none: when ``b``'s LAC is above the handle's, refused;
- ``reader_sees_close``: the stored metadata handed to ``ReadHandle.on_metadata``,
  as the client's watch of the ledger's znode does (``ZkCalls.watch_ledger``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from bkref.impl.client.handles import ReadHandle
from bkref.impl.core.actions import SendReadLac
from bkref.impl.core.digest import DigestMismatchError
from bkref.impl.core.frames import (
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    Status,
)
from bkref.impl.core.reads import LacReader
from bkref.refine.bkref_recovery import CannotTakeStepError
from bkref.refine.driver import ImplementationError
from bkref.spec import protocol as sp
from bkref.spec.protocol import Label

if TYPE_CHECKING:
    from bkref.impl.client.driver import Client
    from bkref.refine.bkref_driver import BkrefDriver


@dataclass
class Reader:
    handle: ReadHandle | None = None
    pending: LacReader | None = None  # a LAC read in flight
    returned: set[int] = field(default_factory=set)  # entries handed to the application


class Readers:
    """The config's readers, driven through spec steps (method names are the steps)."""

    def __init__(self, d: BkrefDriver, readers: int) -> None:
        self.d = d
        self.readers = [Reader() for _ in range(readers)]

    def abstract(self) -> tuple[tuple[int, int, int, int], ...]:
        """``State.rd``: (handle, LAC, LAC read in flight, entries returned) per reader."""
        out = []
        for rd in self.readers:
            h = rd.handle
            if h is None:
                out.append((sp.RD_NONE, -1, 0, 0))
                continue
            state = sp.RD_CLOSED if h.metadata.is_closed else sp.RD_OPEN
            lac = h.metadata.last_entry if h.metadata.is_closed else h.lac
            returned = sum(1 << e for e in rd.returned)
            out.append((state, lac, 1 if rd.pending is not None else 0, returned))
        return tuple(out)

    def _get(self, r: int) -> tuple[Reader, ReadHandle]:
        rd = self.readers[r]
        if rd.handle is None:
            raise CannotTakeStepError(f"reader {r} has not opened the ledger")
        return rd, rd.handle

    def _lac_of(self, b: int) -> int:
        """Bookie ``b``'s LAC of the writer's ledger, as a LAC read of it answers."""
        d = self.d
        reply = d.bookies[b].serve(ReadLacRequest(d._next_id(), d.ledger_id, False, b""))
        assert isinstance(reply, ReadLacResponse)
        return reply.lac

    # ------------------------------------------------------------ spec steps

    def reader_opens_ledger(self, r: int) -> tuple[Label, ...]:
        d = self.d
        md, version = d.store.read_ledger(d.ledger_id)
        # The handle's bookie traffic goes through this driver, never through a client.
        h = ReadHandle(cast("Client", None), d.ledger_id, md, version, md.password)
        rd = self.readers[r]
        rd.handle = h
        if not md.is_closed:
            rd.pending = LacReader(d.ledger_id, md)  # open_ledger's read_lac
        return ()

    def reader_reads_lac(self, r: int) -> tuple[Label, ...]:
        rd, h = self._get(r)
        rd.pending = LacReader(self.d.ledger_id, h.current_metadata())
        return ()

    def reader_receives_lac(self, r: int, b: int) -> tuple[Label, ...]:
        d = self.d
        rd, h = self._get(r)
        reader = rd.pending
        if reader is None:
            raise CannotTakeStepError(f"reader {r} has no LAC read in flight")
        reader.start()
        for a in reader.take_actions():
            if not isinstance(a, SendReadLac):
                continue
            node = d.bookies[d.index[a.bookie]]
            if node.up != sp.UP:
                reader.on_bookie_unavailable(a.bookie, "down")
                continue
            reply = node.serve(ReadLacRequest(d._next_id(), d.ledger_id, False, b""))
            assert isinstance(reply, ReadLacResponse)
            reader.on_read_lac_response(a.bookie, reply.status, reply.lac)
        done = reader.result
        if done is None or not done.ok:
            raise CannotTakeStepError(f"reader {r}'s LAC read is not covered: {done}")
        want = max(h.lac, self._lac_of(b))
        if max(h.lac, done.lac) != want:
            # The machine must not see a half-taken step: nothing changed yet.
            rd.pending = LacReader(d.ledger_id, reader.metadata)
            raise CannotTakeStepError(
                f"bkref's LAC read takes the maximum of the last ensemble ({done.lac}), "
                f"not b{b}'s alone"
            )
        h.lac = want
        rd.pending = None
        return ()

    def reader_reads_entry(self, r: int, e: int, b: int) -> tuple[Label, ...]:
        d = self.d
        rd, h = self._get(r)
        if e > h.last_entry:
            raise CannotTakeStepError(f"reader {r}'s handle ends at {h.last_entry}, not {e}")
        if self._lac_of(b) > h.lac and not h.metadata.is_closed:
            raise CannotTakeStepError("bkref's read answer carries no LAC to raise the handle's")
        reply = d.bookies[b].serve(ReadRequest(d._next_id(), d.ledger_id, e, False, b""))
        assert isinstance(reply, ReadResponse)
        if reply.status is not Status.OK:
            raise ImplementationError(f"reader {r} read e{e} from b{b}: {reply.status.name}")
        try:
            h.digest.verify(reply.body, d.ledger_id, e)
        except DigestMismatchError as err:
            raise ImplementationError(f"reader {r} read e{e} from b{b}: {err}") from err
        rd.returned.add(e)
        return ()

    def reader_sees_close(self, r: int) -> tuple[Label, ...]:
        # What the client's metadata watch hands the handle (ZkCalls.watch_ledger).
        _rd, h = self._get(r)
        h.on_metadata(*self.d.store.read_ledger(self.d.ledger_id))
        if not h.metadata.is_closed:
            raise ImplementationError(f"reader {r} saw metadata that is not closed")
        return ()
