"""The journal: group commit, fsynced before an add is acknowledged.

A thread takes queued records, waits up to ``journalMaxGroupWaitMSec`` (or
until ``journalBufferedWritesThreshold`` bytes) to gather more, writes them
with one ``write`` and one ``fdatasync`` (when ``journalSyncData``), and only
then runs their callbacks, which send the replies. Files are
``journal-<id>.txn``; a new file starts when one passes ``journalMaxSizeMB``.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bkref.impl.core.planted import active as planted
from bkref.impl.storage.disk import OS_DISK, Disk

log = logging.getLogger(__name__)

Callback = Callable[[BaseException | None], None]


@dataclass(frozen=True, slots=True, order=True)
class LogMark:
    """A position in the journal: file id and offset (BookKeeper's txnLogId/txnLogPos)."""

    journal_id: int
    offset: int


def journal_path(directory: Path, journal_id: int) -> Path:
    return directory / f"journal-{journal_id:08d}.txn"


def journal_ids(directory: Path) -> list[int]:
    return sorted(int(p.stem.split("-")[1]) for p in directory.glob("journal-*.txn"))


class Journal:
    def __init__(
        self,
        directory: Path,
        journal_id: int,
        *,
        sync_data: bool = True,
        max_group_wait_ms: float = 2.0,
        buffered_threshold: int = 512 * 1024,
        max_size: int = 2048 * 1024 * 1024,
        flush_when_queue_empty: bool = False,
        disk: Disk = OS_DISK,
        plants: frozenset[str] = frozenset(),
    ) -> None:
        self.directory = directory
        self._disk = disk
        self.sync_data = sync_data
        self.max_group_wait = max_group_wait_ms / 1000.0
        self.buffered_threshold = buffered_threshold
        self.max_size = max_size
        self.flush_when_queue_empty = flush_when_queue_empty
        # PLANTED BUG switch (test-only, bkref/impl/core/planted.py): acknowledge before the fsync.
        self._ack_before_fsync = planted("ack-before-fsync", plants)
        self._queue: queue.Queue[tuple[bytes, Callback, float] | None] = queue.Queue()
        self._id = journal_id
        self._fd = self._open(journal_id)
        self._size = 0
        self._mark = LogMark(journal_id, 0)
        self._mark_lock = threading.Lock()
        self.batches = 0
        self.records = 0
        self.wait_seconds = 0.0  # sum over records of queue-to-durable time
        # Told of each group commit on the journal thread: its fdatasync's seconds (None:
        # not synced) and each record's queue-to-durable seconds (the bookie's metrics).
        self.on_commit: Callable[[float | None, list[float]], None] | None = None
        self._last_sync: float | None = None
        self._thread = threading.Thread(target=self._run, name="journal", daemon=True)
        self._thread.start()

    def _open(self, journal_id: int) -> int:
        fd = self._disk.open(
            journal_path(self.directory, journal_id), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644
        )
        try:
            self._disk.fsync_dir(self.directory)
        except BaseException:
            self._disk.close(fd)  # nobody else holds it
            raise
        return fd

    def append(self, data: bytes, callback: Callback) -> None:
        """Queue encoded records; ``callback(None)`` runs on the journal thread once durable."""
        self._queue.put((data, callback, time.monotonic()))

    def mark(self) -> LogMark:
        """Everything before this position is written (and synced, if journalSyncData)."""
        with self._mark_lock:
            return self._mark

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
        self._disk.close(self._fd)

    def _run(self) -> None:
        stop = False
        while not stop:
            item = self._queue.get()
            if item is None:
                break
            batch = [(item[0], item[1])]
            queued = [item[2]]
            size = len(item[0])
            # As BookKeeper: the oldest record of a group waits at most maxGroupWait since it
            # was queued (time spent queued behind the previous fsync counts).
            deadline = item[2] + self.max_group_wait
            while size < self.buffered_threshold:
                timeout = deadline - time.monotonic()
                if timeout <= 0 or (self.flush_when_queue_empty and self._queue.empty()):
                    break
                try:
                    nxt = self._queue.get(timeout=timeout)
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                batch.append((nxt[0], nxt[1]))
                queued.append(nxt[2])
                size += len(nxt[0])
            self._commit(batch)
            now = time.monotonic()
            self.wait_seconds += sum(now - q for q in queued)
            if self.on_commit is not None:
                self.on_commit(self._last_sync, [now - q for q in queued])

    def _commit(self, batch: list[tuple[bytes, Callback]]) -> None:
        err: BaseException | None = None
        try:
            data = b"".join(d for d, _ in batch)
            view = memoryview(data)
            while view:
                n = self._disk.write(self._fd, view)
                view = view[n:]
            self._last_sync = None
            if self.sync_data and not self._ack_before_fsync:  # the plant syncs only on roll
                synced = time.monotonic()
                self._disk.fdatasync(self._fd)
                self._last_sync = time.monotonic() - synced
            self._size += len(data)
            with self._mark_lock:
                self._mark = LogMark(self._id, self._size)
            self.batches += 1
            self.records += len(batch)
            if self._size >= self.max_size:
                self._roll()
        except OSError as e:  # a failed journal write must not be acknowledged
            log.error("journal write failed: %s; the adds of this batch are not acknowledged", e)
            err = e
        for _, cb in batch:
            cb(err)

    def _roll(self) -> None:
        self._disk.fsync(self._fd)
        # Open the next file before closing this one: if the open fails, the journal keeps
        # a valid descriptor (and retries the roll) instead of one closed behind its back.
        fd = self._open(self._id + 1)
        self._disk.close(self._fd)
        self._id += 1
        self._fd = fd
        self._size = 0
        with self._mark_lock:
            self._mark = LogMark(self._id, 0)
