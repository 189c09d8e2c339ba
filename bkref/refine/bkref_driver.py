"""bkref's own implementation as a refinement driver: real bookies, writer and recovery.

Per example, in this process:

- ledger metadata in a real ZooKeeper, through ``bkref.impl.meta.store``, under a
  fresh root znode (removed after the example);
- per bookie, a ``BookieCore`` over ``BookieStorage`` on real files in a
  temporary directory (journal with fsync, entry logs, index); a crash
  abandons the storage as a killed process would and a restart replays it
  (:mod:`bkref.refine.bkref_bookie`);
- the writer (``LedgerWriter``) and one ``LedgerRecovery`` per recovery client of
  the config (:mod:`bkref.refine.bkref_recovery`), the sans-I/O cores that bkref's
  client runs; one read handle per reader (:mod:`bkref.refine.bkref_readers`);
- with AutoRecovery, per worker node a ``WorkerCore`` and an ``AuditorCore``
  (:mod:`bkref.refine.bkref_autorecovery`), and the bookies registered in ZooKeeper;
- the config's closed ledgers, written through the bookie cores and created
  closed in the metadata store before the first step;
- the network is this harness: every request a core sends stays in flight
  here until a spec step delivers, loses or duplicates it.

A spec step is performed by the calls that make the implementation take it
(:meth:`BkrefDriver.perform`, one branch per action). Steps the implementation
takes by itself in the same call are reported as follow-ups; steps it has no
way to take are refused with the reason. ``bkref.refine.bkref_abstraction`` maps the
state back to the spec's variables.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kazoo.client import KazooClient

from bkref.impl.core.actions import (
    Action,
    AddCompleted,
    CloseCompleted,
    NeedReplacement,
    SendAdd,
    SendRead,
    SendReadLac,
    WriteMetadata,
)
from bkref.impl.core.digest import Digest, DigestType, master_key, password_hash, peek_header
from bkref.impl.core.frames import (
    AddRequest,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    Status,
)
from bkref.impl.core.metadata import LedgerMetadata, Segment
from bkref.impl.core.planted import validate
from bkref.impl.core.recovery import RecoveryPhase
from bkref.impl.core.writer import LedgerWriter
from bkref.impl.meta import layout
from bkref.impl.meta.store import MetadataConflictError, ZkMetadataStore
from bkref.refine.bkref_autorecovery import AutoRecoveryActors, CannotDecideError
from bkref.refine.bkref_bookie import Bookie
from bkref.refine.bkref_readers import Readers
from bkref.refine.bkref_recovery import ORPHAN, CannotTakeStepError, RecoveryClients
from bkref.refine.driver import ImplementationError, Performed
from bkref.spec import protocol as sp
from bkref.spec.config import Config
from bkref.spec.protocol import Label, Msg, State

PASSWORD = b"refine"


WRITER = -1  # InFlight.sender of the writer's requests


@dataclass
class InFlight:
    """A request a core sent: the spec's message and the implementation's action."""

    msg: Msg
    action: SendAdd | SendRead | SendReadLac
    sender: int  # WRITER, the recovery client's index, or ORPHAN (its attempt gave up)


class BkrefDriver:
    """Drives bkref's bookie, writer and recovery cores through spec steps."""

    name = "bkref"

    def __init__(
        self, zk: KazooClient, workdir: Path | None = None, plants: frozenset[str] = frozenset()
    ) -> None:
        self.zk, self.workdir, self.plants = zk, workdir, validate(plants)
        self.cfg: Config | None = None

    # ------------------------------------------------------------ what it can run

    def unsupported(self, cfg: Config) -> list[str]:
        return self.unsupported_reasons(cfg)

    @staticmethod
    def unsupported_reasons(cfg: Config) -> list[str]:
        why = []
        if cfg.mutants:
            why.append("spec mutants (run the correct spec against a planted implementation)")
        return why

    # ------------------------------------------------------------ lifecycle

    def start(self, cfg: Config) -> None:
        why = self.unsupported(cfg)
        if why:
            raise ImplementationError(f"config {cfg.name} is not supported: {'; '.join(why)}")
        self.cfg = cfg
        self.root = f"/refine-{uuid.uuid4().hex[:12]}"
        self.store = ZkMetadataStore(self.zk, self.root)
        self.store.ensure_layout()
        self.dir = Path(tempfile.mkdtemp(prefix="bkref-refine-", dir=self.workdir))
        self.bookies = [
            Bookie(f"b{i}", self.dir / f"b{i}", self.plants) for i in range(cfg.bookies)
        ]
        for b in self.bookies:
            b.open(self.store)
        self.index = {b.name: i for i, b in enumerate(self.bookies)}
        self.digest = Digest(DigestType.CRC32C, PASSWORD)
        self.key = master_key(PASSWORD)
        self.ledger_id = -1
        self._request_id = 0
        self.closed_ids = [self._closed_ledger() for _ in range(cfg.closed_ledgers)]
        self.writer: LedgerWriter | None = None
        self.rcs = RecoveryClients(self, cfg.recovery_clients)
        self.readers = Readers(self, cfg.readers)
        self.recovery_requested = False  # a worker asked for the ledger's recovery
        self.writer_cas: WriteMetadata | None = None  # the ensemble-change CAS in flight
        self.inflight: list[InFlight] = []
        self.used = [0] * (sp.B_LOCK + 1)  # faults injected, per budget slot
        if cfg.writer and (cfg.writer_ledger_created or cfg.two_segments):
            self._existing_writer()
        self.autorecovery: AutoRecoveryActors | None = None
        if cfg.autorecovery:
            self.autorecovery = AutoRecoveryActors(self)

    def _new_metadata(self, ensemble: tuple[str, ...]) -> LedgerMetadata:
        """A new ledger's metadata under the config's quorums, on ``ensemble``."""
        cfg = self._cfg()
        return LedgerMetadata(
            cfg.ensemble,
            cfg.write_quorum,
            cfg.ack_quorum,
            (Segment(0, ensemble),),
            DigestType.CRC32C,
            password_hash(PASSWORD),
            password=PASSWORD,
        )

    def _closed_ledger(self) -> int:
        """A ledger of ``closed_entries`` entries on the first E bookies, each entry on its
        whole write set, created CLOSED (the spec's initial closed ledgers)."""
        cfg = self._cfg()
        ensemble = tuple(b.name for b in self.bookies[: cfg.ensemble])
        md = self._new_metadata(ensemble)
        data = [f"closed entry {e}".encode() for e in range(cfg.closed_entries)]
        lid, _version = self.store.create_ledger(
            md.closed(cfg.closed_entries - 1, sum(len(x) for x in data))
        )
        length = 0
        for e, x in enumerate(data):
            length += len(x)
            body = self.digest.sign(lid, e, e - 1, length, x)
            for i in md.quorum.write_set(e):
                node = self.bookies[self.index[ensemble[i]]]
                node.serve(AddRequest(self._next_id(), lid, e, self.key, body, True))
        return lid

    def _existing_writer(self) -> None:
        """The writer's ledger as the spec's initial state has it: created on the first E
        bookies; with ``first_entry_confirmed`` (or ``two_segments``) e0 sent to its whole
        write set and acknowledged by it; with ``two_segments`` then bookie E-1 replaced
        by bookie E from e1 on, by the writer's own ensemble change."""
        cfg = self._cfg()
        self._writer_creates_ledger(tuple(range(cfg.ensemble)))
        w = self._writer()
        if not (cfg.first_entry_confirmed or cfg.two_segments):
            return
        w.add(b"entry 0")
        for a in w.take_actions():
            if not isinstance(a, SendAdd):
                raise ImplementationError(f"the writer asked for {a} adding e0")
            status = self._deliver(InFlight((sp.ADD, self.index[a.bookie], 0, -1, 0), a, WRITER))
            assert isinstance(status, Status)
            w.on_add_response(a.bookie, 0, status)
        w.take_actions()  # e0's completion, to the application
        if w.lac != 0:
            raise ImplementationError(f"the writer's LAC is {w.lac} after e0 was acknowledged")
        if cfg.two_segments:
            self._writer_changes_ensemble(cfg.ensemble - 1, cfg.ensemble)
            self._writer_completes_ensemble_change()

    def ledger_ids(self) -> list[int]:
        """bkref's ledger id of each spec ledger, by the spec's index (-1: not created)."""
        return list(self.closed_ids) + ([self.ledger_id] if self._cfg().writer else [])

    def spec_ledger(self, ledger_id: int) -> int:
        """The spec's index of bkref's ledger ``ledger_id``."""
        cfg = self._cfg()
        if ledger_id == self.ledger_id and cfg.writer:
            return cfg.writer_ledger
        if ledger_id in self.closed_ids:
            return self.closed_ids.index(ledger_id)
        raise ImplementationError(f"ledger {ledger_id} is none of the spec's ledgers")

    def stop(self) -> None:
        for b in getattr(self, "bookies", []):
            if b.storage is not None:
                b.storage.close()
                b.storage = None
        if getattr(self, "dir", None) is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
        if getattr(self, "root", None):
            delete_tree(self.zk, self.root)
            self.root = ""

    # ------------------------------------------------------------ the network

    def post(self, sender: int, actions: list[Action]) -> list[Action]:
        """Put the requests among ``actions`` in flight; return the others. ``sender``:
        WRITER or a recovery client's index, which the spec's messages carry (a recovery
        add as index + 1, a writer's add as 0)."""
        rest: list[Action] = []
        for a in actions:
            b = self.index.get(getattr(a, "bookie", ""), -1)
            if isinstance(a, SendAdd):
                lac = peek_header(a.body).lac
                msg = (sp.ADD, b, a.entry_id, lac, sender + 1 if a.recovery else 0)
            elif isinstance(a, SendReadLac):
                # An unfenced LAC read (only a planted bug sends one) has no spec message
                # of its own: it goes as the fencing read it should have been.
                msg = (sp.FENCE, b, -1, 0, sender)
                self.rcs.last_request[(sender, b, -1)] = a
            elif isinstance(a, SendRead):
                msg = (sp.READ, b, a.entry_id, 1 if a.fence else 0, sender)
                self.rcs.last_request[(sender, b, a.entry_id)] = a
            else:
                rest.append(a)
                continue
            if b < 0:
                raise ImplementationError(f"{sender} sent to an unknown bookie: {a}")
            self.inflight.append(InFlight(msg, a, sender))
        return rest

    def _take(self, m: Msg) -> InFlight:
        for i, f in enumerate(self.inflight):
            if f.msg == m:
                return self.inflight.pop(i)
        raise CannotTakeStepError(f"no such request in flight: {sp.show_message(m)}")

    def _next_id(self) -> int:
        self._request_id += 1
        return self._request_id

    def _deliver(self, f: InFlight) -> ReadLacResponse | ReadResponse | Status:
        """Hand ``f`` to its bookie: decide, persist (fsync) the records, answer."""
        node = self.bookies[f.msg[1]]
        a = f.action
        key = self.key if isinstance(a, SendAdd) or a.fence else b""
        if isinstance(a, SendAdd):
            rid = self._next_id()
            return node.serve(
                AddRequest(rid, a.ledger_id, a.entry_id, key, a.body, a.recovery)
            ).status
        if isinstance(a, SendReadLac):
            reply = node.serve(ReadLacRequest(self._next_id(), a.ledger_id, a.fence, key))
            assert isinstance(reply, ReadLacResponse)
            return reply
        reply = node.serve(ReadRequest(self._next_id(), a.ledger_id, a.entry_id, a.fence, key))
        assert isinstance(reply, ReadResponse)
        return reply

    # ------------------------------------------------------------ spec steps

    def perform(self, label: Label) -> Performed:
        name, args = label
        ar = self.autorecovery
        try:
            if name.startswith("worker_") and name != "worker_loses_lock" and ar is not None:
                # A worker decides for itself: the step asked for is its turn.
                w, fail = int(str(args[0])), name == "worker_fails_repair"
                return Performed(decided=ar.worker_turn(w, fail_copies=fail))
            handler: Callable[..., tuple[Label, ...]] | None = getattr(self, "_" + name, None)
            if handler is None and name.startswith("recovery_client_"):
                handler = getattr(self.rcs, name, None)
            if handler is None and name.startswith("reader_"):
                handler = getattr(self.readers, name, None)
            if handler is None and ar is not None:
                handler = getattr(ar, name, None)
            if handler is None:
                return Performed(refused=f"{name} is not driven by the {self.name} adapter")
            return Performed(followups=handler(*args))
        except (CannotTakeStepError, CannotDecideError) as e:
            return Performed(refused=str(e))

    # writer

    def _writer_creates_ledger(self, ens: tuple[int, ...]) -> tuple[Label, ...]:
        md = self._new_metadata(tuple(self.bookies[b].name for b in ens))
        self.ledger_id, version = self.store.create_ledger(md)
        self.writer = LedgerWriter(self.ledger_id, md, version, self.digest, plants=self.plants)
        return ()

    def _writer_sends_add(self) -> tuple[Label, ...]:
        w = self._writer()
        w.add(f"entry {w.next_entry}".encode())
        self._writer_actions()
        return ()

    def _writer_changes_ensemble(self, failed: int, new: int) -> tuple[Label, ...]:
        w = self._writer()
        w.on_bookie_failed(self.bookies[failed].name)
        need = [a for a in self.post(WRITER, w.take_actions()) if isinstance(a, NeedReplacement)]
        if len(need) != 1:
            raise ImplementationError(f"the writer asked for {len(need)} replacements, not 1")
        w.replace(need[0].failed, self.bookies[new].name)
        cas = [a for a in self.post(WRITER, w.take_actions()) if isinstance(a, WriteMetadata)]
        if len(cas) != 1:
            raise ImplementationError(f"the writer asked for {len(cas)} metadata writes, not 1")
        self.writer_cas = cas[0]
        return ()

    def _writer_completes_ensemble_change(self) -> tuple[Label, ...]:
        if self.writer_cas is None:
            raise CannotTakeStepError("the writer has no ensemble change in flight")
        w = self._writer()
        before = self.sent_by(WRITER)
        self.cas(self.writer_cas, w.on_metadata_written, w.on_metadata_conflict)
        self.writer_cas = None
        self._writer_actions()
        return self.resends(before, WRITER, "writer_resends_add")

    def _writer_resends_add(self, e: int, b: int) -> tuple[Label, ...]:
        raise CannotTakeStepError("the writer re-sends only as its ensemble change lands")

    def _writer_closes_ledger(self) -> tuple[Label, ...]:
        w = self._writer()
        w.close()
        self._writer_actions()
        return ()

    def _writer_actions(self) -> None:
        """Post the writer's sends and run its metadata writes (a close, or a retry after a
        conflict) at once: the spec's close and CAS steps are one step each."""
        w = self._writer()
        for a in self.post(WRITER, w.take_actions()):
            if isinstance(a, AddCompleted | CloseCompleted):
                continue  # to the application
            if isinstance(a, WriteMetadata):
                self.cas(a, w.on_metadata_written, w.on_metadata_conflict)
                self._writer_actions()
                continue
            raise ImplementationError(f"the writer asked for {a}, which no spec step is here")

    # bookies and network

    def _bookie_handles_add(self, m: Msg, reply_lost: int) -> tuple[Label, ...]:
        f = self._take(m)
        status = self._deliver(f)
        assert isinstance(status, Status)
        if self._unheard(f, reply_lost):
            return ()
        if f.sender == WRITER:
            self._writer().on_add_response(f.action.bookie, m[2], status)
            self._writer_actions()
            return ()
        self.rcs.get(f.sender).on_add_response(f.action.bookie, m[2], status)
        self.rcs.actions(f.sender)
        return ()

    def _unheard(self, f: InFlight, reply_lost: int) -> bool:
        """The reply to ``f`` is lost (a fault spent), or nobody waits for it (an orphan)."""
        if reply_lost:
            self.used[sp.B_LOSS] += 1
        return bool(reply_lost) or f.sender == ORPHAN

    def _bookie_handles_fencing_lac_read(self, m: Msg, reply_lost: int) -> tuple[Label, ...]:
        f = self._take(m)
        reply = self._deliver(f)
        assert isinstance(reply, ReadLacResponse)
        if self._unheard(f, reply_lost):
            return ()
        c = f.sender
        rc = self.rcs.get(c)
        was = rc.phase
        rc.on_read_lac_response(f.action.bookie, reply.status, reply.lac)
        self.rcs.actions(c)
        if was is RecoveryPhase.FENCING and rc.phase is not RecoveryPhase.FENCING:
            return (("recovery_client_completes_fencing", (c,)),)
        return ()

    def _bookie_handles_recovery_read(self, m: Msg, reply_lost: int) -> tuple[Label, ...]:
        f = self._take(m)
        reply = self._deliver(f)
        assert isinstance(reply, ReadResponse)
        if self._unheard(f, reply_lost):
            return ()
        self.rcs.get(f.sender).on_read_response(f.action.bookie, m[2], reply.status, reply.body)
        self.rcs.actions(f.sender)
        return ()

    def _bookie_crashes(self, b: int) -> tuple[Label, ...]:
        self.bookies[b].crash()
        self.inflight = [f for f in self.inflight if f.msg[1] != b]
        self.used[sp.B_CRASH] += 1
        if self.autorecovery is not None and self._unregister(b):
            self.autorecovery.bookies_changed()
        return ()

    def _unregister(self, b: int) -> bool:
        """Its session, and so its registration, is gone; False if it was gone already."""
        path = f"{layout.available(self.root)}/{self.bookies[b].name}"
        if self.zk.exists(path) is None:
            return False
        self.zk.delete(path)
        return True

    def _bookie_loses_session(self, b: int) -> tuple[Label, ...]:
        """ZooKeeper expires the bookie's session: its registration znode goes, as the
        server deletes a dead session's ephemeral nodes; the bookie serves on."""
        if self.autorecovery is None or not self._unregister(b):
            raise CannotTakeStepError(f"b{b} has no registration to lose")
        self.used[sp.B_SESSION] += 1
        self.autorecovery.bookies_changed()
        return ()

    def _bookie_registers_again(self, b: int) -> tuple[Label, ...]:
        """Its new session registers it, as ``bkref.impl.bookie.registration`` does on
        kazoo's CONNECTED after LOST."""
        if self.autorecovery is None:
            raise CannotTakeStepError(f"b{b} registers only where AutoRecovery watches")
        self.autorecovery.register(b)
        self.autorecovery.bookies_changed()
        return ()

    def _bookie_restarts(self, b: int) -> tuple[Label, ...]:
        if self.bookies[b].open(self.store) and self.autorecovery is not None:
            self.autorecovery.register(b)
            self.autorecovery.bookies_changed()
        return ()

    def _bookie_restarts_with_wiped_disk(self, b: int) -> tuple[Label, ...]:
        self.bookies[b].wipe()
        self.used[sp.B_WIPE] += 1
        return self._bookie_restarts(b)

    def _network_loses_message(self, m: Msg) -> tuple[Label, ...]:
        self._take(m)
        self.used[sp.B_LOSS] += 1
        return ()

    def _network_duplicates_message(self, m: Msg) -> tuple[Label, ...]:
        f = self._take(m)
        self.inflight += [f, InFlight(f.msg, f.action, f.sender)]
        self.used[sp.B_DUP] += 1
        return ()

    # ------------------------------------------------------------ helpers

    def cas(
        self,
        w: WriteMetadata,
        written: Callable[[int], None],
        conflict: Callable[[LedgerMetadata, int], None],
    ) -> None:
        try:
            version = self.store.write_ledger(self.ledger_id, w.metadata, w.expected_version)
        except MetadataConflictError as e:
            if e.current is None:
                raise ImplementationError(f"ledger {self.ledger_id} vanished") from e
            conflict(e.current, e.version)
        else:
            written(version)

    def sent_by(self, sender: int) -> list[Msg]:
        return [f.msg for f in self.inflight if f.sender == sender]

    def resends(
        self, before: list[Msg], sender: int, action: str, first: tuple[int, ...] = ()
    ) -> tuple[Label, ...]:
        """The adds ``sender`` put in flight since ``before``, as follow-ups
        ``action(*first, e, b)`` (``first``: the recovery client's index)."""
        after = self.sent_by(sender)
        for m in before:
            after.remove(m)
        return tuple((action, (*first, m[2], m[1])) for m in after if m[0] == sp.ADD)

    def _cfg(self) -> Config:
        assert self.cfg is not None
        return self.cfg

    def _writer(self) -> LedgerWriter:
        if self.writer is None:
            raise CannotTakeStepError("no writer yet")
        return self.writer

    # ------------------------------------------------------------ observation

    def abstract(self) -> State:
        from bkref.refine.bkref_abstraction import abstract

        return abstract(self)


def delete_tree(zk: KazooClient, root: str) -> None:
    """Delete ``root`` and every znode under it: each level's children are listed at
    once (pipelined), then every znode goes in one multi, children first.
    ``KazooClient.delete(..., recursive=True)`` waits for two round trips per znode (a
    sixth of each example), and a delete per znode costs the client a request each."""
    levels = [[root]]
    while levels[-1]:
        asks = [(path, zk.get_children_async(path)) for path in levels[-1]]
        levels.append([f"{path}/{c}" for path, ask in asks for c in ask.get()])
    t = zk.transaction()
    for level in reversed(levels):
        for path in level:
            t.delete(path)
    failed = [r for r in t.commit() if isinstance(r, Exception)]
    if failed:
        raise ImplementationError(f"deleting {root} failed: {failed[0]!r}")
