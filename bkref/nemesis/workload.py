"""The ledger workload: Jepsen clients that write, read, close, crash and recover ledgers.

Every client operation is recorded in the shared history format (invoke, then
ok, fail or info), through one :class:`Recorder`:

- Writers create a ledger and add entries with ``in_flight`` adds pipelined.
  As in BookKeeper's client the entry id is known when the add is invoked; a
  pipelined writer uses one logical process per add in flight. At the end of
  a ledger a writer closes it, or "crashes": it walks away with adds in
  flight and the ledger is recovered (opened with recovery, which fences)
  by another client a moment later. Some ledgers are recovered by another
  client *while their writer is still adding* (a racing recovery): fencing
  must stop that writer, so that nothing is acknowledged past the close.
- Readers read the LAC of a ledger and entries at or below the LAC they
  observed (BookKeeper readers do not read past the LAC).
- The final phase opens every ledger with recovery and reads each entry up
  to the last one: the durability check compares those reads with what was
  acknowledged.

Outcomes: an add that completes is ok; one rejected as fenced is ``fail``
with ``{"error": "fenced"}``; any other error or a timeout is ``info``
(unknown) and retires its process, as Jepsen does. Reads have no effect, so a
read that errs is ``fail``: it tells nothing about the ledger. A read records
``found: false`` only when every replica answered that the entry does not
exist (the client's ``NoSuchEntryError``), never when one could not be reached.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import os
import random
import signal
import sys
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kazoo.exceptions import KazooException

from bkref.impl.cli.plants import plant_argv
from bkref.impl.client.client import BookKeeper
from bkref.impl.client.errors import BKError, FencedError, NoSuchEntryError
from bkref.impl.client.handles import ReadHandle, WriteHandle
from bkref.linearizability.history import Op, Recorder

OP_TIMEOUT = 20.0  # seconds before an operation's outcome is declared unknown
# What a client operation may raise when the cluster misbehaves. The client lets
# kazoo's errors through (a ConnectionLoss during a metadata write, when a
# partition cuts ZooKeeper off): as in Jepsen, such an operation's outcome is
# unknown (info), or, for a read, nothing was observed (fail).
CLIENT_ERRORS = (BKError, TimeoutError, KazooException)


@dataclass(frozen=True)
class WorkloadSpec:
    writers: int = 3
    in_flight: int = 8
    readers: int = 2
    entries_per_ledger: int = 150
    crash_probability: float = 0.3  # a writer abandons its ledger instead of closing it
    race_probability: float = 0.2  # another client recovers the ledger while it is written
    ensemble: int = 3
    write_quorum: int = 2
    ack_quorum: int = 2
    password: bytes = b"bkref-campaign"
    # Writers in processes of their own (nemesis.writer_proc), which the nemesis's
    # kill-writer fault kills -9; the workload starts a new one after each death.
    process_writers: int = 1


@dataclass
class Workload:
    bk: BookKeeper
    recorder: Recorder
    spec: WorkloadSpec
    rng: random.Random
    ledgers: set[int] = field(default_factory=set)  # created (ok): read, then recovered at the end
    zk: str = ""  # ZooKeeper connect string, for the writer processes
    writer_pids: set[int] = field(default_factory=set)  # the writer processes alive now
    # Where the writer processes' own log lines go (appended), not the campaign's terminal.
    writer_log: Path | None = None
    plants: frozenset[str] = frozenset()  # planted bugs of the writer processes' clients
    trace_dir: Path | None = None  # the writer processes log their protocol steps here
    _next_process: int = 0
    _pending: set[asyncio.Task[None]] = field(default_factory=set)

    def kill_writer(self) -> int | None:
        """kill -9 one writer process (any thread may call it); its pid, or None."""
        for pid in sorted(self.writer_pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                return pid
        return None

    def process(self) -> int:
        """A fresh logical process id (never reused after an info completion)."""
        p = self._next_process
        self._next_process += 1
        return p

    # ------------------------------------------------------------ safety phase

    async def run(self, stop: asyncio.Event) -> None:
        """Write and read until ``stop`` is set; then let writers finish their ledger."""
        tasks = [self._writer(stop) for _ in range(self.spec.writers)]
        tasks += [self._process_writer(stop) for _ in range(self.spec.process_writers)]
        tasks += [self._reader(stop) for _ in range(self.spec.readers)]
        await asyncio.gather(*tasks)
        if self._pending:
            await asyncio.wait(self._pending, timeout=OP_TIMEOUT * 2)

    async def _writer(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            handle = await self._create()
            if handle is None:
                await asyncio.sleep(0.5)
                continue
            await self._write_ledger(handle, stop)

    async def _create(self) -> WriteHandle | None:
        s = self.spec
        value = {"ensemble": s.ensemble, "write_quorum": s.write_quorum, "ack_quorum": s.ack_quorum}
        inv = self.recorder.invoke(self.process(), "create", None, value)
        try:
            handle = await asyncio.wait_for(
                self.bk.create_ledger(s.ensemble, s.write_quorum, s.ack_quorum, s.password),
                OP_TIMEOUT,
            )
        except CLIENT_ERRORS as e:
            self.recorder.complete(inv, "info", {"error": _brief(e)})
            return None
        self.recorder.complete(inv, "ok", value, ledger=handle.ledger_id)
        self.ledgers.add(handle.ledger_id)
        return handle

    async def _write_ledger(self, handle: WriteHandle, stop: asyncio.Event) -> None:
        lid = handle.ledger_id
        free: list[int] = []
        slots = asyncio.Semaphore(self.spec.in_flight)
        broken = asyncio.Event()
        in_flight: set[asyncio.Future[int]] = set()

        def completed(fut: asyncio.Future[int], p: int, inv: Op, data: str) -> None:
            slots.release()
            in_flight.discard(fut)
            exc = fut.exception()
            if exc is None:
                self.recorder.complete(inv, "ok", {"entry": fut.result(), "data": data})
                free.append(p)
            elif isinstance(exc, FencedError):
                self.recorder.complete(inv, "fail", {"error": "fenced"})
                free.append(p)
                broken.set()
            else:
                self.recorder.complete(inv, "info", {"error": _brief(exc)})
                broken.set()

        # A racing recovery: another client opens the ledger with recovery while its
        # writer is alive and adding. Fencing must stop the writer: no add may be
        # acknowledged past the point where the recovery closes the ledger.
        race_at = (
            self.rng.randrange(1, self.spec.entries_per_ledger)
            if self.rng.random() < self.spec.race_probability
            else -1
        )
        for n in range(self.spec.entries_per_ledger):
            if n == race_at:
                self._spawn(self.recover_ledger(lid))
            await slots.acquire()
            if stop.is_set() or broken.is_set():
                slots.release()
                break
            p = free.pop() if free else self.process()
            entry = handle.writer.next_entry
            data = f"{lid}:{entry}:{self.rng.getrandbits(32):08x}"
            inv = self.recorder.invoke(p, "add", lid, {"entry": entry, "data": data})
            fut = handle.add_async(data.encode())
            in_flight.add(fut)
            fut.add_done_callback(functools.partial(completed, p=p, inv=inv, data=data))

        crash = broken.is_set() or self.rng.random() < self.spec.crash_probability
        if crash:
            # The writer walks away with its adds in flight; their outcomes are
            # still recorded when they arrive. Another client recovers the ledger.
            self._spawn(self._recover_later(lid))
            return
        if in_flight:
            await asyncio.wait(in_flight, timeout=OP_TIMEOUT)
        await self._close(handle)

    def writer_argv(self) -> list[str]:
        """The command line of a writer process (with the campaign's planted bugs)."""
        return [
            sys.executable,
            "-m",
            "bkref.nemesis.writer_proc",
            "--zk",
            self.zk,
            "--password",
            self.spec.password.decode(),
            *plant_argv(self.plants),
            *(["--trace", str(self.trace_dir)] if self.trace_dir is not None else []),
        ]

    async def _process_writer(self, stop: asyncio.Event) -> None:
        """Start a writer process, drive it ledger after ledger; start another if it dies."""
        while not stop.is_set():
            log = self.writer_log.open("ab") if self.writer_log is not None else None
            try:
                proc = await asyncio.create_subprocess_exec(
                    *self.writer_argv(),
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=log,
                )
            finally:
                if log is not None:
                    log.close()  # the child holds a descriptor of its own
            self.writer_pids.add(proc.pid)
            remote = _RemoteWriter(proc)
            try:
                while not stop.is_set() and await self._write_remote_ledger(remote, stop):
                    pass
            finally:
                self.writer_pids.discard(proc.pid)
                await remote.stop()

    async def _write_remote_ledger(self, remote: _RemoteWriter, stop: asyncio.Event) -> bool:
        """One ledger through a writer process; False once the process is dead."""
        s = self.spec
        value = {"ensemble": s.ensemble, "write_quorum": s.write_quorum, "ack_quorum": s.ack_quorum}
        inv = self.recorder.invoke(self.process(), "create", None, value)
        reply = await remote.call({"op": "create", **value})
        if "ledger" not in reply:
            self.recorder.complete(inv, "info", {"error": reply.get("error", "?")})
            await asyncio.sleep(0.5)
            return remote.alive
        lid = int(reply["ledger"])
        self.recorder.complete(inv, "ok", value, ledger=lid)
        self.ledgers.add(lid)
        slots = asyncio.Semaphore(s.in_flight)
        broken = asyncio.Event()
        free: list[int] = []
        in_flight: set[asyncio.Task[None]] = set()

        async def add(p: int, entry: int, data: str) -> None:
            inv = self.recorder.invoke(p, "add", lid, {"entry": entry, "data": data})
            try:
                got = await remote.call({"op": "add", "data": data})
            finally:
                slots.release()
            if got.get("entry") == entry:
                self.recorder.complete(inv, "ok", {"entry": entry, "data": data})
                free.append(p)
                return
            broken.set()
            if got.get("fenced"):
                self.recorder.complete(inv, "fail", {"error": "fenced"})
                free.append(p)
            else:  # an error, a dead process, or (never expected) another entry id
                self.recorder.complete(inv, "info", {"error": str(got)[:200]})

        for entry in range(s.entries_per_ledger):
            await slots.acquire()
            if stop.is_set() or broken.is_set() or not remote.alive:
                slots.release()
                break
            p = free.pop() if free else self.process()
            data = f"{lid}:{entry}:{self.rng.getrandbits(32):08x}"
            task = asyncio.ensure_future(add(p, entry, data))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
        if in_flight:
            await asyncio.wait(in_flight, timeout=OP_TIMEOUT * 2)
        if broken.is_set() or not remote.alive or self.rng.random() < s.crash_probability:
            self._spawn(self._recover_later(lid))  # the process died, or walks away
            return remote.alive
        inv = self.recorder.invoke(self.process(), "close", lid, None)
        got = await remote.call({"op": "close"})
        if "last_entry" in got:
            self.recorder.complete(inv, "ok", {"last_entry": got["last_entry"]})
        else:
            self.recorder.complete(inv, "info", {"error": str(got)[:200]})
            self._spawn(self._recover_later(lid))
        return remote.alive

    async def _close(self, handle: WriteHandle) -> None:
        inv = self.recorder.invoke(self.process(), "close", handle.ledger_id, None)
        try:
            await asyncio.wait_for(handle.close(), OP_TIMEOUT)
        except CLIENT_ERRORS as e:
            self.recorder.complete(inv, "info", {"error": _brief(e)})
            return
        self.recorder.complete(inv, "ok", {"last_entry": handle.current_metadata().last_entry})

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _recover_later(self, lid: int) -> None:
        await asyncio.sleep(self.rng.uniform(0.2, 2.0))
        await self.recover(lid)

    async def recover_ledger(self, lid: int) -> None:
        await self.recover(lid)

    async def recover(self, lid: int) -> int | None:
        """Open with recovery (fences the old writer, closes the ledger); the last entry."""
        inv = self.recorder.invoke(self.process(), "recover", lid, None)
        try:
            handle = await asyncio.wait_for(
                self.bk.open_ledger(lid, self.spec.password, recovery=True), OP_TIMEOUT
            )
        except CLIENT_ERRORS as e:
            # Recovery may have fenced bookies before it failed: its effect is unknown.
            self.recorder.complete(inv, "info", {"error": _brief(e)})
            return None
        last = handle.current_metadata().last_entry
        self.recorder.complete(inv, "ok", {"last_entry": last})
        return last

    async def _reader(self, stop: asyncio.Event) -> None:
        p = self.process()
        handles: dict[int, ReadHandle] = {}
        while not stop.is_set():
            await asyncio.sleep(self.rng.uniform(0.005, 0.05))
            if not self.ledgers:
                continue
            lid = self.rng.choice(sorted(self.ledgers))
            handle = handles.get(lid)
            if handle is None or self.rng.random() < 0.05:  # refresh: ensembles change
                try:
                    handle = await asyncio.wait_for(
                        self.bk.open_ledger(lid, self.spec.password, recovery=False), OP_TIMEOUT
                    )
                except CLIENT_ERRORS:
                    continue  # a metadata read, not a ledger operation: nothing to record
                handles[lid] = handle
            if handle.lac < 0 or self.rng.random() < 0.4:
                await self._read_lac(p, handle)
            else:
                await self.read(p, handle, self.rng.randint(0, handle.lac))

    async def _read_lac(self, p: int, handle: ReadHandle) -> None:
        inv = self.recorder.invoke(p, "read_lac", handle.ledger_id, None)
        try:
            lac = await asyncio.wait_for(handle.read_lac(), OP_TIMEOUT)
        except CLIENT_ERRORS as e:
            self.recorder.complete(inv, "fail", {"error": _brief(e)})
            return
        self.recorder.complete(inv, "ok", {"lac": lac})

    async def read(self, p: int, handle: ReadHandle, entry: int) -> bool:
        """Read one entry and record it; True if the entry was found."""
        inv = self.recorder.invoke(p, "read", handle.ledger_id, {"entry": entry})
        try:
            data = await asyncio.wait_for(handle.read_entry(entry), OP_TIMEOUT)
        except NoSuchEntryError:  # every replica answered: an observation, not a failure
            self.recorder.complete(inv, "ok", {"entry": entry, "found": False})
            return False
        except CLIENT_ERRORS as e:
            self.recorder.complete(inv, "fail", {"error": _brief(e)})
            return False
        self.recorder.complete(inv, "ok", {"entry": entry, "found": True, "data": data.decode()})
        return True

    # ------------------------------------------------------------ final phase

    async def final_reads(self, attempts: int = 3, parallel: int = 16) -> None:
        """Recover every ledger and read every entry up to its last (the durability check).

        Every ledger of the metadata store, not only those the workload knows: a
        writer process killed during a create leaves a ledger whose id it never
        reported, open for good unless someone recovers it (as an operator would).
        Reads run ``parallel`` at a time, each reader a process of its own.
        """
        readers = [self.process() for _ in range(parallel)]
        stored: set[int] = set()
        for _ in range(attempts):
            try:
                stored = set(await self.bk.list_ledgers())
                break
            except CLIENT_ERRORS:
                await asyncio.sleep(1.0)
        for lid in sorted(self.ledgers | stored):
            last: int | None = None
            for _ in range(attempts):
                last = await self.recover(lid)
                if last is not None:
                    break
                await asyncio.sleep(1.0)
            if last is None:
                continue
            handle = None
            for _ in range(attempts):
                try:
                    handle = await self.bk.open_ledger(lid, self.spec.password, recovery=False)
                    break
                except CLIENT_ERRORS:
                    await asyncio.sleep(1.0)
            if handle is None:
                continue  # its acknowledged entries go unread: the durability check says so
            entries = iter(range(last + 1))  # shared: each entry goes to one reader
            await asyncio.gather(*(self._read_each(p, handle, entries, attempts) for p in readers))

    async def _read_each(
        self, p: int, handle: ReadHandle, entries: Iterator[int], attempts: int
    ) -> None:
        for entry in entries:
            for _ in range(attempts):  # an error is not an answer: ask again
                if await self.read(p, handle, entry):
                    break


class _RemoteWriter:
    """The driver's end of a writer process: numbered commands, answers matched by id."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.alive = True
        self._ids = itertools.count()
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            reply = json.loads(line)
            fut = self._waiting.pop(reply.get("id"), None)
            if fut is not None and not fut.done():
                fut.set_result(reply)
        self.alive = False  # killed (or exited): whatever was in flight has no answer
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_result({"error": "the writer process died"})
        self._waiting.clear()

    async def call(self, cmd: dict[str, Any]) -> dict[str, Any]:
        if not self.alive:
            return {"error": "the writer process died"}
        k = next(self._ids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[k] = fut
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps({**cmd, "id": k}) + "\n").encode())
        try:
            return await asyncio.wait_for(fut, OP_TIMEOUT)
        except TimeoutError:
            self._waiting.pop(k, None)
            return {"error": f"no answer from the writer process in {OP_TIMEOUT} s"}

    async def stop(self) -> None:
        """Close its stdin (it exits without closing its ledger); kill it if it lingers."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 10)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()
        await self._reader


def _brief(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    return text if len(text) <= 200 else text[:197] + "..."
