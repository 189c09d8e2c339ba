"""One TCP connection to a bookie, multiplexing requests by request id."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable

from impl.core.frames import (
    ErrorResponse,
    FrameDecoder,
    FrameError,
    Request,
    Response,
    encode,
)

log = logging.getLogger(__name__)


class BookieUnavailableError(ConnectionError):
    pass


class BookieConnection:
    def __init__(self, bookie_id: str, timeout: float = 10.0) -> None:
        self.bookie_id = bookie_id
        host, port = bookie_id.rsplit(":", 1)
        self.host, self.port = host, int(port)
        self.timeout = timeout
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Response]] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._connecting: asyncio.Lock = asyncio.Lock()
        # Frames queued in one event-loop turn go out in one write: a send per request
        # costs more on loopback than the rest of the request path together.
        self._out: list[bytes] = []
        self._connect_tasks: set[asyncio.Task[None]] = set()
        self._deadlines: dict[int, float] = {}
        self._sweeper: asyncio.TimerHandle | None = None

    async def _ensure(self) -> asyncio.StreamWriter:
        async with self._connecting:
            if self._writer is not None and not self._writer.is_closing():
                return self._writer
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(self.host, self.port), self.timeout
                )
            except (OSError, TimeoutError) as e:
                raise BookieUnavailableError(f"bookie {self.bookie_id} unreachable: {e}") from e
            self._writer = writer
            self._reader_task = asyncio.get_running_loop().create_task(self._read(reader))
            return writer

    async def _read(self, reader: asyncio.StreamReader) -> None:
        dec = FrameDecoder()
        err: str = "connection closed by the bookie"
        try:
            while data := await reader.read(256 * 1024):
                for item in dec.feed(data):
                    if isinstance(item, FrameError):
                        log.warning("bad frame from bookie %s: %s", self.bookie_id, item.reason)
                        if item.fatal:
                            err = f"stream from bookie broken: {item.reason}"
                            return
                        continue
                    fut = self._pending.pop(item.request_id, None)
                    if fut is not None and not fut.done():
                        fut.set_result(item)  # type: ignore[arg-type]
        except OSError as e:
            err = f"connection lost: {e}"
        finally:
            self._fail_all(err)

    def _fail_all(self, reason: str) -> None:
        if self._writer is not None:
            self._writer.close()
        self._writer = None
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(BookieUnavailableError(f"bookie {self.bookie_id}: {reason}"))

    def _flush(self, writer: asyncio.StreamWriter) -> None:
        data, self._out = b"".join(self._out), []
        if not writer.is_closing():
            writer.write(data)

    def _expire(self, rid: int) -> None:
        fut = self._pending.pop(rid, None)
        if fut is not None and not fut.done():
            fut.set_exception(
                BookieUnavailableError(f"bookie {self.bookie_id}: no response in {self.timeout} s")
            )

    def submit(self, make: Callable[[int], Request]) -> asyncio.Future[Response]:
        """Send ``make(request_id)`` without a task per request; the future gets the response
        or BookieUnavailableError."""
        loop = asyncio.get_running_loop()
        writer = self._writer
        if writer is None or writer.is_closing():
            out: asyncio.Future[Response] = loop.create_future()

            async def connect_then_send() -> None:
                try:
                    await self._ensure()
                    resp = await self.submit(make)
                except BookieUnavailableError as e:
                    if not out.done():
                        out.set_exception(e)
                else:
                    if not out.done():
                        out.set_result(resp)

            task = loop.create_task(connect_then_send())
            self._connect_tasks.add(task)
            task.add_done_callback(self._connect_tasks.discard)
            return out
        rid = next(self._ids)
        fut: asyncio.Future[Response] = loop.create_future()
        self._pending[rid] = fut
        if not self._out:
            loop.call_soon(self._flush, writer)
        self._out.append(encode(make(rid)))
        self._deadlines[rid] = loop.time() + self.timeout
        if self._sweeper is None:
            self._sweeper = loop.call_later(1.0, self._sweep)
        return fut

    def _sweep(self) -> None:
        """Expire requests past their deadline: one timer per connection, not per request."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        for rid, deadline in list(self._deadlines.items()):
            if rid not in self._pending:
                del self._deadlines[rid]
            elif deadline <= now:
                del self._deadlines[rid]
                self._expire(rid)
        self._sweeper = loop.call_later(1.0, self._sweep) if self._deadlines else None

    async def request(self, make: Callable[[int], Request]) -> Response:
        """Send ``make(request_id)``; the response, or BookieUnavailableError."""
        resp = await self.submit(make)
        if isinstance(resp, ErrorResponse):
            log.warning("bookie %s answered %s: %s", self.bookie_id, resp.status.name, resp.message)
        return resp

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self._reader_task is not None:
            self._reader_task.cancel()
        self._fail_all("client closed the connection")
