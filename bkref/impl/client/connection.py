"""One TCP connection to a bookie, multiplexing requests by request id."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable

from bkref.impl.core.frames import (
    ErrorResponse,
    FrameDecoder,
    FrameError,
    Request,
    Response,
    encode,
)
from bkref.impl.trace import CONNECTED, Tracer

log = logging.getLogger(__name__)


class BookieUnavailableError(ConnectionError):
    pass


ResponseCallback = Callable[[Response | None, BookieUnavailableError | None], None]
# Makes the request with the id it is given: a request, or its frame already encoded.
MakeRequest = Callable[[int], Request | bytes]


class BookieConnection:
    def __init__(
        self, bookie_id: str, timeout: float = 10.0, *, tracer: Tracer | None = None
    ) -> None:
        self.bookie_id = bookie_id
        # Traces name a request by (this end's address, request id): the bookie logs the
        # peer it answered, so each connection logs its own end once it is open.
        self.tracer = tracer
        host, port = bookie_id.rsplit(":", 1)
        self.host, self.port = host, int(port)
        self.timeout = timeout
        self._ids = itertools.count(1)
        self._pending: dict[int, ResponseCallback] = {}
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
            if self.tracer is not None:
                local = writer.get_extra_info("sockname")
                self.tracer.step(CONNECTED, bookie=self.bookie_id, local=f"{local[0]}:{local[1]}")
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
                    cb = self._pending.pop(item.request_id, None)
                    if cb is not None:
                        cb(item, None)  # type: ignore[arg-type]
        except OSError as e:
            err = f"connection lost: {e}"
        finally:
            self._fail_all(err)

    def _fail_all(self, reason: str) -> None:
        if self._writer is not None:
            self._writer.close()
        self._writer = None
        pending, self._pending = self._pending, {}
        self._deadlines.clear()
        for cb in pending.values():
            cb(None, BookieUnavailableError(f"bookie {self.bookie_id}: {reason}"))

    def _flush(self, writer: asyncio.StreamWriter) -> None:
        data, self._out = b"".join(self._out), []
        if not writer.is_closing():
            writer.write(data)

    def _expire(self, rid: int) -> None:
        cb = self._pending.pop(rid, None)
        if cb is not None:
            cb(
                None,
                BookieUnavailableError(f"bookie {self.bookie_id}: no response in {self.timeout} s"),
            )

    def send(self, make: MakeRequest, callback: ResponseCallback) -> int:
        """Send ``make(request_id)`` (a request, or its frame); ``callback(response, None)``
        or ``(None, error)`` runs on the event loop. Returns the request id, assigned now
        even if the connection opens later (a trace names the request by it). No task,
        future or timer per request: adds take this path."""
        rid = next(self._ids)
        self._send(rid, make, callback)
        return rid

    def _send(self, rid: int, make: MakeRequest, callback: ResponseCallback) -> None:
        loop = asyncio.get_running_loop()
        writer = self._writer
        if writer is None or writer.is_closing():

            async def connect_then_send() -> None:
                try:
                    await self._ensure()
                except BookieUnavailableError as e:
                    callback(None, e)
                else:
                    self._send(rid, make, callback)

            task = loop.create_task(connect_then_send())
            self._connect_tasks.add(task)
            task.add_done_callback(self._connect_tasks.discard)
            return
        self._pending[rid] = callback
        if not self._out:
            loop.call_soon(self._flush, writer)
        frame = make(rid)
        self._out.append(frame if isinstance(frame, bytes) else encode(frame))
        self._deadlines[rid] = loop.time() + self.timeout
        if self._sweeper is None:
            self._sweeper = loop.call_later(1.0, self._sweep)

    def submit(self, make: Callable[[int], Request]) -> asyncio.Future[Response]:
        """:meth:`send`, with a future for the response (or BookieUnavailableError)."""
        return self.start(make)[1]

    def start(self, make: Callable[[int], Request]) -> tuple[int, asyncio.Future[Response]]:
        """:meth:`submit`, and the request's id."""
        fut: asyncio.Future[Response] = asyncio.get_running_loop().create_future()

        def done(resp: Response | None, err: BookieUnavailableError | None) -> None:
            if fut.done():
                return
            if resp is not None:
                fut.set_result(resp)
            else:
                fut.set_exception(err or BookieUnavailableError(self.bookie_id))

        return self.send(make, done), fut

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
