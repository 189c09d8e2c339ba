"""In-memory doubles for driving the core deterministically (tests, other implementations).

``SimBookie`` is a :class:`BookieCore` over a dict; ``SimCluster`` delivers the
actions of writers and recovery clients to them in an order the caller
chooses, so a Hypothesis test can explore interleavings. These are extra
doubles for fast tests; the real bookie is tested with real processes.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from bkref.impl.core.actions import (
    Action,
    SendAdd,
    SendRead,
    SendReadLac,
    WriteMetadata,
)
from bkref.impl.core.bookie import BookieCore, JournalAdd
from bkref.impl.core.frames import (
    AddRequest,
    AddResponse,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    Status,
)
from bkref.impl.core.metadata import LedgerMetadata


@dataclass
class SimBookie:
    name: str
    core: BookieCore = field(default_factory=BookieCore)
    entries: dict[tuple[int, int], bytes] = field(default_factory=dict)
    alive: bool = True

    def request(
        self, req: AddRequest | ReadRequest | ReadLacRequest
    ) -> AddResponse | ReadResponse | ReadLacResponse | None:
        if not self.alive:
            return None
        d = self.core.handle(req)
        for r in d.records:
            if isinstance(r, JournalAdd):
                self.entries[(r.ledger_id, r.entry_id)] = r.body
        self.core.on_durable(d.records)  # the sim's journal is durable at once
        if d.read is not None:
            return self.core.read_result(
                d.read, self.entries.get((d.read.ledger_id, d.read.entry_id))
            )
        reply = d.reply
        assert isinstance(reply, AddResponse | ReadResponse | ReadLacResponse)
        return reply


@dataclass
class Delivery:
    """A request in flight from a client to a bookie."""

    client: str
    action: SendAdd | SendRead | SendReadLac


@dataclass
class MetaStore:
    metadata: LedgerMetadata
    version: int = 0

    def cas(self, w: WriteMetadata) -> bool:
        if w.expected_version != self.version:
            return False
        self.metadata, self.version = w.metadata, self.version + 1
        return True


@dataclass
class SimCluster:
    bookies: dict[str, SimBookie]
    master_key: bytes
    inflight: list[Delivery] = field(default_factory=list)
    rng: random.Random = field(default_factory=lambda: random.Random(0))

    def post(self, client: str, actions: list[Action], on_other: Callable[[Action], None]) -> None:
        for a in actions:
            if isinstance(a, SendAdd | SendRead | SendReadLac):
                self.inflight.append(Delivery(client, a))
            else:
                on_other(a)

    def deliver(self, d: Delivery) -> AddResponse | ReadResponse | ReadLacResponse | None:
        a = d.action
        b = self.bookies[a.bookie]
        req: AddRequest | ReadRequest | ReadLacRequest
        if isinstance(a, SendAdd):
            req = AddRequest(0, a.ledger_id, a.entry_id, self.master_key, a.body, a.recovery)
        elif isinstance(a, SendRead):
            req = ReadRequest(
                0, a.ledger_id, a.entry_id, a.fence, self.master_key if a.fence else b""
            )
        else:
            req = ReadLacRequest(0, a.ledger_id, a.fence, self.master_key if a.fence else b"")
        return b.request(req)


def status_of(resp: AddResponse | ReadResponse | ReadLacResponse | None) -> Status:
    return Status.IO_ERROR if resp is None else resp.status
