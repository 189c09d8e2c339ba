"""bkref's own implementation as a refinement driver: real bookies, writer and recovery.

Per example, in this process:

- ledger metadata in a real ZooKeeper, through ``bkref.impl.meta.store``, under a
  fresh root znode (removed after the example);
- per bookie, a ``BookieCore`` over ``BookieStorage`` on real files in a
  temporary directory (journal with fsync, entry logs, index); a crash
  abandons the storage as a killed process would and a restart replays it
  (:mod:`bkref.refine.bkref_bookie`);
- the writer (``LedgerWriter``) and one ``LedgerRecovery`` per recovery client of
  the config, the sans-I/O cores that bkref's client runs;
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
    RecoveryCompleted,
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
from bkref.impl.core.recovery import LedgerRecovery, RecoveryPhase
from bkref.impl.core.writer import LedgerWriter
from bkref.impl.meta import layout
from bkref.impl.meta.store import MetadataConflictError, ZkMetadataStore
from bkref.refine.bkref_autorecovery import AutoRecoveryActors, CannotDecideError
from bkref.refine.bkref_bookie import Bookie
from bkref.refine.driver import ImplementationError, Performed
from bkref.spec import protocol as sp
from bkref.spec.config import Config
from bkref.spec.protocol import Label, Msg, State

PASSWORD = b"refine"


WRITER = -1  # InFlight.sender of the writer's requests


class CannotTakeStepError(Exception):
    """The implementation has no way to take this spec step now (the reason)."""


@dataclass
class InFlight:
    """A request a core sent: the spec's message and the implementation's action."""

    msg: Msg
    action: SendAdd | SendRead | SendReadLac
    sender: int  # WRITER, or the recovery client's index


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
        self.recoveries: list[LedgerRecovery | None] = [None] * cfg.recovery_clients
        self.recovery_requested = False  # a worker asked for the ledger's recovery
        # Per recovery client, the close CAS it asked for (held for the spec's close step).
        self.recovery_close: list[WriteMetadata | None] = [None] * cfg.recovery_clients
        self.writer_cas: WriteMetadata | None = None  # the ensemble-change CAS in flight
        # The last read each recovery client sent, by (client, bookie, entry; -1: fencing).
        self.last_request: dict[tuple[int, int, int], SendRead | SendReadLac] = {}
        self.inflight: list[InFlight] = []
        self.used = [0] * 6  # faults injected, per budget slot
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
            self.zk.delete(self.root, recursive=True)
            self.root = ""

    # ------------------------------------------------------------ the network

    def _post(self, sender: int, actions: list[Action]) -> list[Action]:
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
                self.last_request[(sender, b, -1)] = a
            elif isinstance(a, SendRead):
                msg = (sp.READ, b, a.entry_id, 1 if a.fence else 0, sender)
                self.last_request[(sender, b, a.entry_id)] = a
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
        raise CannotTakeStepError(f"no such request in flight: {sp.format_label(('', (m,)))}")

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
            if name.startswith("worker_") and ar is not None:
                # A worker decides for itself: the step asked for is its turn.
                return Performed(decided=ar.worker_turn(int(str(args[0]))))
            handler: Callable[..., tuple[Label, ...]] | None = getattr(self, "_" + name, None)
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
        need = [a for a in self._post(WRITER, w.take_actions()) if isinstance(a, NeedReplacement)]
        if len(need) != 1:
            raise ImplementationError(f"the writer asked for {len(need)} replacements, not 1")
        w.replace(need[0].failed, self.bookies[new].name)
        cas = [a for a in self._post(WRITER, w.take_actions()) if isinstance(a, WriteMetadata)]
        if len(cas) != 1:
            raise ImplementationError(f"the writer asked for {len(cas)} metadata writes, not 1")
        self.writer_cas = cas[0]
        return ()

    def _writer_completes_ensemble_change(self) -> tuple[Label, ...]:
        if self.writer_cas is None:
            raise CannotTakeStepError("the writer has no ensemble change in flight")
        w = self._writer()
        before = self._sent_by(WRITER)
        self._cas(self.writer_cas, w.on_metadata_written, w.on_metadata_conflict)
        self.writer_cas = None
        self._writer_actions()
        return self._resends(before, WRITER, "writer_resends_add")

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
        for a in self._post(WRITER, w.take_actions()):
            if isinstance(a, AddCompleted | CloseCompleted):
                continue  # to the application
            if isinstance(a, WriteMetadata):
                self._cas(a, w.on_metadata_written, w.on_metadata_conflict)
                self._writer_actions()
                continue
            raise ImplementationError(f"the writer asked for {a}, which no spec step is here")

    # bookies and network

    def _bookie_handles_add(self, m: Msg, reply_lost: int) -> tuple[Label, ...]:
        f = self._take(m)
        status = self._deliver(f)
        assert isinstance(status, Status)
        if reply_lost:
            self.used[sp.B_LOSS] += 1
            return ()
        if f.sender == WRITER:
            self._writer().on_add_response(f.action.bookie, m[2], status)
            self._writer_actions()
            return ()
        self._recovery(f.sender).on_add_response(f.action.bookie, m[2], status)
        self._recovery_actions(f.sender)
        return ()

    def _bookie_handles_fencing_lac_read(self, m: Msg, reply_lost: int) -> tuple[Label, ...]:
        f = self._take(m)
        reply = self._deliver(f)
        assert isinstance(reply, ReadLacResponse)
        if reply_lost:
            self.used[sp.B_LOSS] += 1
            return ()
        c = f.sender
        rc = self._recovery(c)
        was = rc.phase
        rc.on_read_lac_response(f.action.bookie, reply.status, reply.lac)
        self._recovery_actions(c)
        if was is RecoveryPhase.FENCING and rc.phase is not RecoveryPhase.FENCING:
            return (("recovery_client_completes_fencing", (c,)),)
        return ()

    def _bookie_handles_recovery_read(self, m: Msg, reply_lost: int) -> tuple[Label, ...]:
        f = self._take(m)
        reply = self._deliver(f)
        assert isinstance(reply, ReadResponse)
        if reply_lost:
            self.used[sp.B_LOSS] += 1
            return ()
        self._recovery(f.sender).on_read_response(f.action.bookie, m[2], reply.status, reply.body)
        self._recovery_actions(f.sender)
        return ()

    def _bookie_crashes(self, b: int) -> tuple[Label, ...]:
        self.bookies[b].crash()
        self.inflight = [f for f in self.inflight if f.msg[1] != b]
        self.used[sp.B_CRASH] += 1
        if self.autorecovery is not None:  # its session, and so its registration, is gone
            self.zk.delete(f"{layout.available(self.root)}/{self.bookies[b].name}")
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

    # recovery clients

    def _recovery_client_starts_recovery(self, c: int) -> tuple[Label, ...]:
        md, version = self.store.read_ledger(self.ledger_id)
        rc = LedgerRecovery(
            self.ledger_id,
            md,
            version,
            Digest(md.digest_type, md.password),
            plants=self.plants,
        )
        self.recoveries[c] = rc
        rc.start()
        for _ in range(10):  # a conflict (the writer changed its ensemble) starts over
            marks = [a for a in self._post(c, rc.take_actions()) if isinstance(a, WriteMetadata)]
            if not marks:
                break
            self._cas(marks[0], rc.on_metadata_written, rc.on_metadata_conflict)
        return ()

    def _recovery_client_completes_fencing(self, _c: int) -> tuple[Label, ...]:
        raise CannotTakeStepError("recovery starts reading as soon as fencing covers the ensemble")

    def _recovery_client_retries_request(self, c: int, b: int) -> tuple[Label, ...]:
        rc = self._recovery(c)
        key = (c, b, -1) if rc.phase is RecoveryPhase.FENCING else (c, b, rc.reading)
        req = self.last_request.get(key)
        if req is None:
            raise CannotTakeStepError(f"recovery client {c} sent nothing to b{b} for {key[2]}")
        self._post(c, [req])
        return ()

    def _recovery_client_changes_ensemble(self, c: int, failed: int, new: int) -> tuple[Label, ...]:
        # The spec's timeout: a write-back to ``failed`` unanswered and no longer in flight.
        # bkref's recovery learns of it as an error answer for that entry, as its client
        # shell reports a lost connection.
        rc = self._recovery(c)
        if self.recovery_close[c] is not None:
            # bkref's recovery computes its close when the last write-back reaches ack
            # quorum, and the spec offers no replacement after that (D21, settled in
            # recovery_client_changes_ensemble): reaching here is a disagreement to count.
            raise CannotTakeStepError("recovery already asked to close (D21)")
        name = self.bookies[failed].name
        waiting = [
            e
            for e, acked in sorted(rc.writeback_acks().items())
            if name in (ens := rc.metadata.ensemble_for(e))
            and ens.index(name) in rc.quorum.write_set(e)
            and ens.index(name) not in acked
            and not any(
                f.msg[:3] == (sp.ADD, failed, e) and f.msg[4] == c + 1 for f in self.inflight
            )
        ]
        if not waiting:
            raise CannotTakeStepError(f"no write-back to b{failed} is unanswered")
        before = self._sent_by(c)
        rc.on_add_response(name, waiting[0], Status.IO_ERROR)
        for a in self._post(c, rc.take_actions()):
            if not isinstance(a, NeedReplacement):
                raise ImplementationError(f"recovery asked for {a} instead of a replacement")
            rc.replace(a.failed, self.bookies[new].name)
        self._recovery_actions(c)
        return self._resends(before, c, "recovery_client_resends_add", (c,))

    def _recovery_client_resends_add(self, _c: int, e: int, b: int) -> tuple[Label, ...]:
        # bkref's recovery re-sends as it replaces a bookie (the follow-ups of that step),
        # and only entries not yet at ack quorum, as BookKeeper's pending adds. The spec
        # also lets it copy an entry already at Aq to the new bookie: harmless, not done.
        raise CannotTakeStepError("recovery re-sends only when it replaces a bookie")

    def _recovery_client_closes_ledger(self, c: int) -> tuple[Label, ...]:
        if self.recovery_close[c] is None:
            raise CannotTakeStepError(f"recovery client {c} has not asked to close")
        rc = self._recovery(c)
        # A close that conflicts with a worker's swap is retried on the new version at once:
        # the spec's close merges in the same step. One that finds the ledger closed by
        # another client ends there, reporting that close.
        while (cas := self.recovery_close[c]) is not None:
            self.recovery_close[c] = None
            self._cas(cas, rc.on_metadata_written, rc.on_metadata_conflict)
            self._recovery_actions(c)
        return ()

    def _recovery_actions(self, c: int) -> None:
        """Post client ``c``'s requests, hold its close CAS for the spec's close step."""
        rc = self._recovery(c)
        for a in self._post(c, rc.take_actions()):
            if isinstance(a, WriteMetadata):
                self.recovery_close[c] = a
            elif isinstance(a, RecoveryCompleted):
                if not a.ok:
                    raise ImplementationError(f"recovery client {c} failed: {a.message}")
            else:
                raise ImplementationError(f"recovery asked for {a}, which no spec step is")

    # ------------------------------------------------------------ helpers

    def _cas(
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

    def _sent_by(self, sender: int) -> list[Msg]:
        return [f.msg for f in self.inflight if f.sender == sender]

    def _resends(
        self, before: list[Msg], sender: int, action: str, first: tuple[int, ...] = ()
    ) -> tuple[Label, ...]:
        """The adds ``sender`` put in flight since ``before``, as follow-ups
        ``action(*first, e, b)`` (``first``: the recovery client's index)."""
        after = self._sent_by(sender)
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

    def _recovery(self, c: int) -> LedgerRecovery:
        rc = self.recoveries[c]
        if rc is None:
            raise CannotTakeStepError(f"no recovery client {c} yet")
        return rc

    # ------------------------------------------------------------ observation

    def abstract(self) -> State:
        from bkref.refine.bkref_abstraction import abstract

        return abstract(self)
