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

    async def request(self, make: Callable[[int], Request]) -> Response:
        """Send ``make(request_id)``; the response, or BookieUnavailableError."""
        writer = await self._ensure()
        rid = next(self._ids)
        fut: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        try:
            writer.write(encode(make(rid)))
            if writer.transport.get_write_buffer_size() > 1024 * 1024:
                await writer.drain()
            resp = await asyncio.wait_for(fut, self.timeout)
        except TimeoutError:
            self._pending.pop(rid, None)
            raise BookieUnavailableError(
                f"bookie {self.bookie_id}: no response in {self.timeout} s"
            ) from None
        except OSError as e:
            self._pending.pop(rid, None)
            raise BookieUnavailableError(f"bookie {self.bookie_id}: {e}") from e
        if isinstance(resp, ErrorResponse):
            log.warning("bookie %s answered %s: %s", self.bookie_id, resp.status.name, resp.message)
        return resp

    async def close(self) -> None:
        if self._reader_task is not None:
            self._reader_task.cancel()
        self._fail_all("client closed the connection")
