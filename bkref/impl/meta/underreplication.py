"""AutoRecovery's state in ZooKeeper, after BookKeeper's ZkLedgerUnderreplicationManager.

Under ``<root>/underreplication/``:

- ``ledgers/12/3456/urL7890``: one task per under-replicated ledger (split like the
  ledger's own path, so that no znode gets more children than ZooKeeper can list).
  Data: JSON ``{"replicas": {bookie: reason}, "priority": p, "ctime": ms, "failures": n}``.
  Marking always rewrites the task (its version changes) even when it already names
  the bookie: a worker's version-checked delete then cannot erase a mark it never saw
  (the spec's checker found that race; see ``bkref/spec/protocol.py``).
- ``locks/urL1234567890``: an ephemeral znode per ledger being repaired; its data is
  the worker's id. A worker that dies releases its locks with its session.
- ``disable``: while it exists nothing is re-replicated and the auditor publishes
  nothing new.
- ``auditorelection/V_<seq>``: ephemeral sequential znodes of the autorecovery nodes;
  the lowest is the auditor, and its sequence number is the election epoch.
- ``lostBookieRecoveryDelay``: seconds, as text. The auditor watches it: setting it,
  even to the same value, triggers an audit (``bkref shell triggeraudit``).
- ``decommission/<bookie>``: bookies being decommissioned.
- ``slots/<bookie>``: a kazoo semaphore bounding concurrent repair copies per bookie.
- ``redundant/<bookie>``: JSON list of the closed ledgers that bookie stores but no
  segment names (its GC publishes it, and deletes them after a wait).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.interfaces import IAsyncResult
from kazoo.recipe.lock import Semaphore

from bkref.impl.clock import SYSTEM_CLOCK, Clock
from bkref.impl.core.repair import Reason, Task
from bkref.impl.meta import layout
from bkref.impl.meta.znodes import ensure_paths

SEP = "V_"
_SEVERITY = {Reason.LOST: 0, Reason.LEAVING: 1, Reason.ENTRIES_MISSING: 2}


def base(root: str) -> str:
    return layout.underreplication(root)


def task_path(root: str, ledger_id: int) -> str:
    s = f"{ledger_id:010d}"
    return f"{base(root)}/ledgers/{s[:2]}/{s[2:6]}/urL{s[6:]}"


def lock_path(root: str, ledger_id: int) -> str:
    return f"{base(root)}/locks/urL{ledger_id:010d}"


@dataclass(frozen=True, slots=True)
class Auditor:
    node_id: str
    epoch: int


@dataclass(frozen=True)
class View:
    """What :meth:`UnderreplicationManager.view` read: per ledger its task (with the task
    znode's version) and its lock's holder (None: none), the auditor, the switch."""

    tasks: dict[int, tuple[Task, int] | None]
    locks: dict[int, str | None]
    auditor: Auditor | None
    enabled: bool


class UnderreplicationManager:
    def __init__(
        self, zk: KazooClient, root: str = "/ledgers", *, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self.zk = zk
        self.root = root
        self.base = base(root)
        self.clock = clock  # stamps new tasks (their age promotes them: repairPromoteAfterMs)

    def ensure_layout(self) -> None:
        subs = ("ledgers", "locks", "auditorelection", "decommission", "slots")
        ensure_paths(self.zk, [f"{self.base}/{sub}" for sub in subs])

    # ------------------------------------------------------------ tasks

    @staticmethod
    def _encode(task: Task) -> bytes:
        return json.dumps(
            {
                "replicas": {b: r.value for b, r in sorted(task.replicas.items())},
                "priority": task.priority,
                "ctime": task.ctime_ms,
                "failures": task.failures,
            },
            sort_keys=True,
        ).encode()

    @staticmethod
    def _decode(ledger_id: int, data: bytes) -> Task:
        d = json.loads(data)
        return Task(
            ledger_id,
            {b: Reason(r) for b, r in d["replicas"].items()},
            int(d["priority"]),
            int(d["ctime"]),
            int(d.get("failures", 0)),
        )

    def mark(
        self,
        ledger_id: int,
        replicas: Mapping[str, Reason],
        priority: int,
        *,
        rewrite: bool = True,
    ) -> Task:
        """Create the ledger's task or merge ``replicas`` into it, with a new version;
        without ``rewrite``, a task that lists every bookie of ``replicas`` already is
        left as it is (see :class:`bkref.impl.core.audit.Mark` for why the audit rewrites)."""
        path = task_path(self.root, ledger_id)
        while True:
            try:
                data, stat = self.zk.get(path)
            except NoNodeError:
                task = Task(ledger_id, dict(replicas), priority, self.clock.wall_ms())
                try:
                    self.zk.create(path, self._encode(task), makepath=True)
                    return task
                except NodeExistsError:
                    continue
            old = self._decode(ledger_id, data)
            if not rewrite and set(replicas) <= set(old.replicas):
                return old
            # A bookie keeps its most serious reason: lost, then leaving, then entries-missing.
            merged = dict(old.replicas)
            for b, r in replicas.items():
                if b not in merged or _SEVERITY[r] < _SEVERITY[merged[b]]:
                    merged[b] = r
            task = Task(ledger_id, merged, min(priority, old.priority), old.ctime_ms, old.failures)
            try:
                self.zk.set(path, self._encode(task), version=stat.version)
                return task
            except (BadVersionError, NoNodeError):
                continue

    def get(self, ledger_id: int) -> tuple[Task, int] | None:
        return self._task(ledger_id, self.zk.get_async(task_path(self.root, ledger_id)))

    def _task(self, ledger_id: int, read: IAsyncResult) -> tuple[Task, int] | None:
        """The task and its znode's version from a read of its znode (None: no task)."""
        try:
            data, stat = read.get()
        except NoNodeError:
            return None
        return self._decode(ledger_id, data), int(stat.version)

    def ledger_ids(self) -> list[int]:
        """The ledgers marked under-replicated (the task znodes' names; data not read)."""
        out: list[int] = []
        top = f"{self.base}/ledgers"
        for a in _children(self.zk, top):
            for b in _children(self.zk, f"{top}/{a}"):
                out += [
                    int(a + b + c[3:])
                    for c in _children(self.zk, f"{top}/{a}/{b}")
                    if c.startswith("urL")
                ]
        return out

    def tasks(self) -> list[tuple[Task, int]]:
        """Every task with its znode version."""
        return [got for lid in self.ledger_ids() if (got := self.get(lid)) is not None]

    def complete(self, ledger_id: int, version: int) -> bool:
        """Delete the task if it is still at ``version``; False if it was re-marked since."""
        try:
            self.zk.delete(task_path(self.root, ledger_id), version=version)
        except BadVersionError:
            return False
        except NoNodeError:
            return True
        return True

    def record_failure(self, ledger_id: int, version: int) -> None:
        """Count a failed attempt (best effort: a concurrent mark wins)."""
        got = self.get(ledger_id)
        if got is None or got[1] != version:
            return
        t = got[0]
        bumped = Task(t.ledger_id, t.replicas, t.priority, t.ctime_ms, t.failures + 1)
        with contextlib.suppress(BadVersionError, NoNodeError):
            self.zk.set(task_path(self.root, ledger_id), self._encode(bumped), version=version)

    # ------------------------------------------------------------ locks

    def try_lock(self, ledger_id: int, owner: str) -> bool:
        """Take the ledger's lock; True also when this session holds it already for
        ``owner``.

        A session can hold a lock it does not know of: a create whose reply was lost
        (ConnectionLoss after the server applied it), or an unlock that failed. The
        ephemeral node outlives the reconnect, so without this no worker, this one
        included, could take the ledger again until the session ends. The owner must
        match too: workers that share a session (a test harness) never take each
        other's locks."""
        path = lock_path(self.root, ledger_id)
        try:
            self.zk.create(path, owner.encode(), ephemeral=True, makepath=True)
        except NodeExistsError:
            return self.owns_lock(ledger_id) and self.lock_holder(ledger_id) == owner
        return True

    def owns_lock(self, ledger_id: int) -> bool:
        """This session holds the ledger's lock (false once our session expired)."""
        stat = self.zk.exists(lock_path(self.root, ledger_id))
        return stat is not None and stat.ephemeralOwner == self.zk.client_id[0]

    def unlock(self, ledger_id: int) -> None:
        """Release the lock if this session holds it (never another holder's)."""
        path = lock_path(self.root, ledger_id)
        stat = self.zk.exists(path)
        if stat is None or stat.ephemeralOwner != self.zk.client_id[0]:
            return
        with contextlib.suppress(NoNodeError, BadVersionError):
            self.zk.delete(path, version=stat.version)

    def lock_holder(self, ledger_id: int) -> str | None:
        return _holder(self.zk.get_async(lock_path(self.root, ledger_id)))

    # ------------------------------------------------------------ enable / disable

    def is_enabled(self) -> bool:
        return self.zk.exists(f"{self.base}/disable") is None

    def set_enabled(self, enabled: bool) -> None:
        path = f"{self.base}/disable"
        if enabled:
            with contextlib.suppress(NoNodeError):
                self.zk.delete(path)
        else:
            with contextlib.suppress(NodeExistsError):
                self.zk.create(path, b"", makepath=True)

    def watch_enabled(self, callback: Callable[[bool], bool | None]) -> None:
        """``callback(enabled)`` now and at every change (on kazoo's thread), until it
        returns False."""

        def on(_data: bytes | None, stat: object) -> bool | None:
            return callback(stat is None)

        self.zk.DataWatch(f"{self.base}/disable", on)

    # ------------------------------------------------------------ lostBookieRecoveryDelay

    def lost_bookie_recovery_delay(self, default: int) -> int:
        try:
            data, _ = self.zk.get(f"{self.base}/lostBookieRecoveryDelay")
        except NoNodeError:
            return default
        return int(data.decode() or default)

    def set_lost_bookie_recovery_delay(self, seconds: int) -> None:
        """Also triggers an audit: the auditor watches this znode."""
        path = f"{self.base}/lostBookieRecoveryDelay"
        try:
            self.zk.set(path, str(seconds).encode())
        except NoNodeError:
            try:
                self.zk.create(path, str(seconds).encode(), makepath=True)
            except NodeExistsError:
                self.zk.set(path, str(seconds).encode())

    # ------------------------------------------------------------ auditor election

    def join_election(self, node_id: str) -> str:
        """Our ephemeral vote; returns its path."""
        return str(
            self.zk.create(
                f"{self.base}/auditorelection/{SEP}",
                json.dumps({"id": node_id}).encode(),
                ephemeral=True,
                sequence=True,
                makepath=True,
            )
        )

    def auditor(self) -> Auditor | None:
        """The elected auditor: the lowest vote still alive."""
        return self._lowest_vote(_children(self.zk, f"{self.base}/auditorelection"))

    def _lowest_vote(self, votes: list[str]) -> Auditor | None:
        path = f"{self.base}/auditorelection"
        for name in sorted(votes, key=_seq):
            try:
                data, _ = self.zk.get(f"{path}/{name}")
            except NoNodeError:
                continue
            return Auditor(str(json.loads(data)["id"]), _seq(name))
        return None

    def view(self, ledger_ids: list[int]) -> View:
        """The tasks and locks of ``ledger_ids``, the auditor and the switch, read at once:
        the requests are pipelined (two round trips, not three per ledger and three)."""
        tasks = [(lid, self.zk.get_async(task_path(self.root, lid))) for lid in ledger_ids]
        locks = [(lid, self.zk.get_async(lock_path(self.root, lid))) for lid in ledger_ids]
        disabled = self.zk.exists_async(f"{self.base}/disable")
        votes = self.zk.get_children_async(f"{self.base}/auditorelection")
        try:
            names = list(votes.get())
        except NoNodeError:
            names = []
        return View(
            {lid: self._task(lid, read) for lid, read in tasks},
            {lid: _holder(read) for lid, read in locks},
            self._lowest_vote(names),
            disabled.get() is None,
        )

    # ------------------------------------------------------------ decommission

    def decommissioning(self) -> set[str]:
        return set(_children(self.zk, layout.decommissioning(self.root)))

    def set_decommissioning(self, bookie: str, on: bool) -> None:
        path = f"{layout.decommissioning(self.root)}/{bookie}"
        if on:
            with contextlib.suppress(NodeExistsError):
                self.zk.create(path, b"", makepath=True)
        else:
            with contextlib.suppress(NoNodeError):
                self.zk.delete(path)

    # ------------------------------------------------------------ redundant replicas

    def set_redundant(self, bookie: str, ledgers: list[int]) -> None:
        """What ``bookie`` stores that no segment names (published by its GC)."""
        path = f"{self.base}/redundant/{bookie}"
        data = json.dumps(ledgers).encode()
        try:
            self.zk.set(path, data)
        except NoNodeError:
            with contextlib.suppress(NodeExistsError):
                self.zk.create(path, data, makepath=True)

    def redundant(self) -> dict[int, list[str]]:
        """ledger -> bookies holding a copy that no segment names."""
        out: dict[int, list[str]] = {}
        for bookie in _children(self.zk, f"{self.base}/redundant"):
            try:
                data, _ = self.zk.get(f"{self.base}/redundant/{bookie}")
            except NoNodeError:
                continue
            for lid in json.loads(data or b"[]"):
                out.setdefault(int(lid), []).append(bookie)
        return out

    # ------------------------------------------------------------ repair slots

    def release_leaked(self) -> int:
        """Delete every ledger lock and repair-slot node (lease or the semaphore's own
        lock) that this session holds; how many. Call it only when this session holds
        none on purpose (a worker between rounds): a create whose reply was lost, or a
        delete that failed while ZooKeeper was out of reach, leaves an ephemeral node
        that outlives the reconnect and would keep every worker off that ledger, or
        every copy off that bookie, for as long as the session lives."""
        client_id = self.zk.client_id
        if client_id is None:  # no session (disconnected): nothing to find; a later round looks
            return 0
        session = client_id[0]
        paths = [f"{self.base}/locks/{c}" for c in _children(self.zk, f"{self.base}/locks")]
        for pool in _children(self.zk, f"{self.base}/slots"):
            top = f"{self.base}/slots/{pool}"
            paths += [f"{top}/{c}" for c in _children(self.zk, top)]
        released = 0
        for path in paths:
            stat = self.zk.exists(path)
            if stat is not None and stat.ephemeralOwner == session:
                with contextlib.suppress(NoNodeError):
                    self.zk.delete(path)
                    released += 1
        return released

    def slot(self, bookie: str, owner: str, limit: int) -> Semaphore:
        """The semaphore of ``bookie``'s repair slots (acquire with blocking=False)."""
        return self.zk.Semaphore(f"{self.base}/slots/{bookie}", owner, max_leases=limit)


def _seq(name: str) -> int:
    return int(name.rsplit("_", 1)[-1])


def _holder(read: IAsyncResult) -> str | None:
    """The lock's owner from a read of its znode (None: not locked)."""
    try:
        data, _ = read.get()
    except NoNodeError:
        return None
    return str(data.decode())


def _children(zk: KazooClient, path: str) -> list[str]:
    try:
        return list(zk.get_children(path))
    except NoNodeError:
        return []
