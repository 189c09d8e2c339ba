"""Ledger metadata, bookie registrations and cookies in ZooKeeper, through kazoo.

Synchronous (kazoo runs its own thread); asyncio callers use ``asyncio.to_thread``.
Every update of existing metadata is a versioned CAS (``set(path, data, version)``):
a :class:`MetadataConflictError` carries what ZooKeeper holds now.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    NodeExistsError,
    NoNodeError,
    OperationTimeoutError,
    SessionExpiredError,
)
from kazoo.interfaces import IAsyncResult

from bkref.impl.clock import SYSTEM_CLOCK, Clock
from bkref.impl.core.metadata import LedgerMetadata
from bkref.impl.meta import layout as paths
from bkref.impl.meta.znodes import ensure_paths


class NoSuchLedgerError(KeyError):
    def __str__(self) -> str:
        return f"ledger {self.args[0]} does not exist (no metadata in ZooKeeper)"


class MetadataConflictError(RuntimeError):
    """A CAS lost: ``current``/``version`` is the metadata ZooKeeper holds now."""

    def __init__(self, ledger_id: int, current: LedgerMetadata | None, version: int) -> None:
        super().__init__(
            f"ledger {ledger_id}: metadata changed concurrently (now version {version})"
        )
        self.ledger_id = ledger_id
        self.current = current
        self.version = version


class MetadataUnavailableError(RuntimeError):
    """ZooKeeper could not be reached in time; the message says what is unknown."""


# Errors after which a write may or may not have happened.
UNKNOWN_OUTCOME = (ConnectionLoss, OperationTimeoutError, SessionExpiredError)


@dataclass(frozen=True, slots=True)
class BookieInfo:
    bookie_id: str  # host:port
    rack: str
    readonly: bool


def connect(hosts: str, timeout: float = 15.0, session_timeout: float = 10.0) -> KazooClient:
    zk = KazooClient(hosts=hosts, timeout=session_timeout)
    zk.start(timeout=timeout)
    return zk


class ZkMetadataStore:
    def __init__(
        self, zk: KazooClient, root: str = paths.DEFAULT_ROOT, *, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self.zk = zk
        self.root = root
        self.clock = clock  # for cas_ledger's patience

    # ------------------------------------------------------------ cluster layout

    def ensure_layout(self) -> str:
        """Create the znodes a cluster needs (idempotent); returns the instance id."""
        ensure_paths(
            self.zk,
            (
                paths.available(self.root),
                paths.readonly(self.root),
                paths.cookies(self.root),
                paths.idgen(self.root),
            ),
        )
        with contextlib.suppress(NodeExistsError):
            self.zk.create(paths.layout(self.root), b"bkref-hierarchical\n1\n")
        with contextlib.suppress(NodeExistsError):
            self.zk.create(paths.instance_id(self.root), str(uuid.uuid4()).encode())
        return self.instance_id()

    def instance_id(self) -> str:
        try:
            data, _ = self.zk.get(paths.instance_id(self.root))
        except NoNodeError:
            raise RuntimeError(
                f"no cluster at {self.root} in ZooKeeper (no INSTANCEID); start a bookie or run "
                "`bkref cluster up` to create it"
            ) from None
        return str(data.decode())

    # ------------------------------------------------------------ ledgers

    def new_ledger_id(self) -> int:
        path = self.zk.create(paths.idgen(self.root) + "/ID-", b"", sequence=True)
        self.zk.delete(path)
        return int(path.rsplit("-", 1)[1])

    def create_ledger(self, metadata: LedgerMetadata) -> tuple[int, int]:
        """A new ledger id and its metadata; returns (ledger id, version)."""
        while True:
            lid = self.new_ledger_id()
            if self.create_ledger_at(lid, metadata):
                return lid, 0

    def create_ledger_at(self, ledger_id: int, metadata: LedgerMetadata) -> bool:
        """``ledger_id``'s metadata, version 0; False if that ledger exists already."""
        try:
            self.zk.create(
                paths.ledger_path(self.root, ledger_id), metadata.serialize(), makepath=True
            )
        except NodeExistsError:
            return False
        return True

    def read_ledger(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        got = _ledger(self.zk.get_async(paths.ledger_path(self.root, ledger_id)))
        if got is None:
            raise NoSuchLedgerError(ledger_id)
        return got

    def read_ledgers(self, ledger_ids: list[int]) -> dict[int, tuple[LedgerMetadata, int] | None]:
        """Each ledger's metadata and version (None: no such ledger), the reads pipelined
        (one round trip, not one per ledger)."""
        reads = [(lid, self.zk.get_async(paths.ledger_path(self.root, lid))) for lid in ledger_ids]
        return {lid: _ledger(read) for lid, read in reads}

    def write_ledger(self, ledger_id: int, metadata: LedgerMetadata, version: int) -> int:
        """CAS from ``version``; returns the new version or raises MetadataConflictError."""
        try:
            stat = self.zk.set(
                paths.ledger_path(self.root, ledger_id), metadata.serialize(), version=version
            )
        except BadVersionError:
            try:
                cur, ver = self.read_ledger(ledger_id)
            except NoSuchLedgerError:
                raise MetadataConflictError(ledger_id, None, -1) from None
            raise MetadataConflictError(ledger_id, cur, ver) from None
        except NoNodeError:
            raise NoSuchLedgerError(ledger_id) from None
        return int(stat.version)

    def cas_ledger(
        self, ledger_id: int, metadata: LedgerMetadata, version: int, patience: float = 30.0
    ) -> int:
        """:meth:`write_ledger`, resolving a lost connection: read back, and count the write
        as done if ZooKeeper holds exactly ``metadata`` at a newer version, retry if it still
        holds ``version``, else raise MetadataConflictError."""
        return self.cas_ledger_resolved(ledger_id, metadata, version, patience)[0]

    def cas_ledger_resolved(
        self, ledger_id: int, metadata: LedgerMetadata, version: int, patience: float = 30.0
    ) -> tuple[int, bool]:
        """:meth:`cas_ledger`, and whether its outcome was read back after a lost connection:
        then the metadata may be another client's identical write (two recoveries that
        closed the ledger alike), which no read can tell from its own."""
        deadline = self.clock.monotonic_ms() + round(patience * 1000)
        while True:
            try:
                return self.write_ledger(ledger_id, metadata, version), False
            except UNKNOWN_OUTCOME as e:
                first = e
            while True:
                if self.clock.monotonic_ms() > deadline:
                    raise MetadataUnavailableError(
                        f"ZooKeeper unreachable for {patience:.0f} s while updating ledger "
                        f"{ledger_id} ({first!r}); whether the update landed is unknown, so "
                        "this handle stops. Reopen the ledger once ZooKeeper is back."
                    )
                time.sleep(0.2)
                try:
                    current, cur_version = self.read_ledger(ledger_id)
                    break
                except UNKNOWN_OUTCOME:
                    continue
            if cur_version > version and current == metadata:
                return cur_version, True
            if cur_version != version:
                raise MetadataConflictError(ledger_id, current, cur_version)

    def delete_ledger(self, ledger_id: int, version: int = -1) -> None:
        try:
            self.zk.delete(paths.ledger_path(self.root, ledger_id), version=version)
        except NoNodeError:
            raise NoSuchLedgerError(ledger_id) from None

    def list_ledgers(self) -> list[int]:
        out: list[int] = []
        for a in self.zk.get_children(self.root):
            if a in paths.RESERVED or not a.isdigit():
                continue
            for b in self.zk.get_children(f"{self.root}/{a}"):
                out.extend(
                    paths.ledger_id_from_path((a, b, c))
                    for c in self.zk.get_children(f"{self.root}/{a}/{b}")
                    if c.startswith("L")
                )
        return sorted(out)

    # ------------------------------------------------------------ bookies

    def register(self, bookie_id: str, *, rack: str, readonly: bool) -> str:
        """Create this bookie's ephemeral znode (writable or read-only) and remove the other."""
        info = json.dumps({"rack": rack, "registered": self.clock.wall_ms()}).encode()
        want = (
            f"{paths.readonly(self.root) if readonly else paths.available(self.root)}/{bookie_id}"
        )
        other = (
            f"{paths.available(self.root) if readonly else paths.readonly(self.root)}/{bookie_id}"
        )
        with contextlib.suppress(NoNodeError):
            self.zk.delete(other)
        try:
            self.zk.create(want, info, ephemeral=True, makepath=True)
        except NodeExistsError:
            _data, stat = self.zk.get(want)
            if stat.ephemeralOwner != self.zk.client_id[0]:
                raise RuntimeError(
                    f"bookie {bookie_id} is already registered by another session "
                    f"(owner {stat.ephemeralOwner:#x}): is another bookie running with the "
                    "same address?"
                ) from None
        return want

    def _registrations(self) -> list[tuple[bool, str, str]]:
        """(read-only, parent path, bookie id) of every registration: one round trip."""
        lists = [
            (ro, path, self.zk.get_children_async(path))
            for ro, path in ((False, paths.available(self.root)), (True, paths.readonly(self.root)))
        ]
        out = []
        for ro, path, listed in lists:
            try:
                names = listed.get()
            except NoNodeError:
                continue
            out += [(ro, path, name) for name in names if name != paths.READONLY]
        return out

    def bookie_ids(self) -> set[str]:
        """The id of every registered bookie, writable and read-only, without reading
        their racks: one round trip."""
        return {name for _ro, _path, name in self._registrations()}

    def bookies(self) -> list[BookieInfo]:
        """Every registered bookie, writable and read-only. The reads are pipelined (two
        round trips, not one per bookie): the auditor and every worker's check read them."""
        out: list[BookieInfo] = []
        reads = [
            (ro, name, self.zk.get_async(f"{path}/{name}"))
            for ro, path, name in self._registrations()
        ]
        for ro, name, read in reads:
            try:
                data, _ = read.get()
                rack = str(json.loads(data or b"{}").get("rack", name))
            except (NoNodeError, ValueError):
                continue
            out.append(BookieInfo(name, rack, ro))
        return sorted(out, key=lambda b: (b.readonly, b.bookie_id))

    def writable_bookies(self) -> dict[str, str]:
        """bookie id -> failure domain, for placement (not read-only, not decommissioning)."""
        try:
            leaving = set(self.zk.get_children(paths.decommissioning(self.root)))
        except NoNodeError:
            leaving = set()
        return {
            b.bookie_id: b.rack
            for b in self.bookies()
            if not b.readonly and b.bookie_id not in leaving
        }

    # ------------------------------------------------------------ cookies

    def read_cookie(self, bookie_id: str) -> tuple[dict[str, Any], int] | None:
        try:
            data, stat = self.zk.get(f"{paths.cookies(self.root)}/{bookie_id}")
        except NoNodeError:
            return None
        return json.loads(data), int(stat.version)

    def delete_cookie(self, bookie_id: str) -> bool:
        """Forget a decommissioned bookie's cookie; False if there was none."""
        try:
            self.zk.delete(f"{paths.cookies(self.root)}/{bookie_id}")
        except NoNodeError:
            return False
        return True

    def write_cookie(self, bookie_id: str, cookie: dict[str, Any]) -> None:
        path = f"{paths.cookies(self.root)}/{bookie_id}"
        data = json.dumps(cookie, sort_keys=True).encode()
        try:
            self.zk.create(path, data, makepath=True)
        except NodeExistsError:
            raise RuntimeError(
                f"cookie of bookie {bookie_id} already exists in ZooKeeper"
            ) from None


def _ledger(read: IAsyncResult) -> tuple[LedgerMetadata, int] | None:
    """A ledger's metadata and version from a read of its znode (None: no such ledger)."""
    try:
        data, stat = read.get()
    except NoNodeError:
        return None
    return LedgerMetadata.deserialize(data), int(stat.version)
