"""The ceiling for adds: the same fan-out with no protocol at all.

An add here is a 1 KiB frame written to three servers (each its own process, as a
bookie is), each appending every frame it has read to a file, one ``fdatasync`` per
read, and only then answering each frame with 16 bytes; the add is done when two of
three answered (E = Wq = 3, Aq = 2, fsync on, as the cluster's adds). No digest, no
ledger, no entry ids, no journal thread, no metadata: asyncio ``Protocol`` callbacks,
the cheapest way the event loop offers. Whatever bkref's client and bookies do beyond
this is the protocol's cost; what this reaches, in the same run as the loopback
baseline, is about as far as a Python implementation of this shape goes on the machine.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import subprocess
import sys
import textwrap
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

from bkref.impl.cluster.zookeeper import free_port

REPLY = 16

_SERVER = textwrap.dedent("""
    import asyncio, os, struct, sys
    port, path, loop = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    REPLY = struct.pack(">I", 12) + bytes(12)

    class Server(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport, self.buf = transport, bytearray()

        def data_received(self, data):
            buf = self.buf
            buf += data
            pos, frames = 0, []
            while len(buf) - pos >= 4:
                n = struct.unpack_from(">I", buf, pos)[0]
                if len(buf) - pos - 4 < n:
                    break
                frames.append(buf[pos + 4 : pos + 4 + n])
                pos += 4 + n
            del buf[:pos]
            if frames:
                os.write(fd, b"".join(frames))
                os.fdatasync(fd)  # durable before any answer, as a bookie's journal
                self.transport.write(REPLY * len(frames))

    async def main():
        server = await asyncio.get_running_loop().create_server(Server, "127.0.0.1", port)
        print("ready", flush=True)
        await server.serve_forever()

    if loop == "uvloop":
        import uvloop
        uvloop.run(main())
    else:
        asyncio.run(main())
""")


@contextlib.contextmanager
def servers(directory: Path, loop: str, count: int = 3) -> Iterator[list[tuple[int, int]]]:
    """``count`` skeleton servers on ``loop``, each its own process and file; yields
    their (port, pid)."""
    procs: list[subprocess.Popen[str]] = []
    out: list[tuple[int, int]] = []
    try:
        for i in range(count):
            port = free_port()
            p = subprocess.Popen(
                [sys.executable, "-c", _SERVER, str(port), str(directory / f"fanout-{i}"), loop],
                stdout=subprocess.PIPE,
                text=True,
            )
            procs.append(p)
            assert p.stdout is not None
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError(f"fan-out server {i} exited during start (rc {p.wait()})")
            out.append((port, p.pid))
        yield out
    finally:
        for p in procs:
            p.kill()  # nothing to flush; and SIGTERM would wait on a server left stopped
        for p in procs:
            p.wait()
            if p.stdout is not None:
                p.stdout.close()


class _Add:
    __slots__ = ("acks", "done")

    def __init__(self, done: asyncio.Future[None]) -> None:
        self.acks = 0
        self.done = done


class _Client(asyncio.Protocol):
    """One server's connection: its answers come in the order of the frames, so each
    answer is the oldest add this server has not answered."""

    def __init__(self, quorum: int) -> None:
        self.quorum = quorum
        self.waiting: collections.deque[_Add] = collections.deque()
        self.partial = 0  # bytes of an answer read but not yet whole

    def data_received(self, data: bytes) -> None:
        whole, self.partial = divmod(self.partial + len(data), REPLY)
        for _ in range(whole):
            add = self.waiting.popleft()
            add.acks += 1
            if add.acks == self.quorum:
                add.done.set_result(None)


async def connect(
    ports: list[int], size: int, quorum: int = 2
) -> tuple[Callable[[], Awaitable[None]], Callable[[], None]]:
    """An ``add`` coroutine function over connections to ``ports``, and their closer."""
    loop = asyncio.get_running_loop()
    conns: list[tuple[asyncio.Transport, _Client]] = []
    for port in ports:
        transport, client = await loop.create_connection(lambda: _Client(quorum), "127.0.0.1", port)
        conns.append((transport, client))
    frame = size.to_bytes(4, "big") + os.urandom(size)

    async def add() -> None:
        add = _Add(loop.create_future())
        for transport, client in conns:
            client.waiting.append(add)
            transport.write(frame)
        await add.done

    def close() -> None:
        for transport, _ in conns:
            transport.close()

    return add, close
