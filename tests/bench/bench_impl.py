"""Bookies and client: add latency/throughput, read throughput, and raw baselines."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

from bkref.impl import eventloop
from bkref.impl.client.client import BookKeeper
from bkref.impl.cluster.local import LocalCluster
from bkref.impl.cluster.zookeeper import free_port
from tests.bench import fanout

TITLE = "Bookies and client (impl): adds, reads, and raw baselines"

ENTRY = 1024
ROUNDS = 3  # per event loop, taken in turns (full run)

_ECHO_SERVER = textwrap.dedent("""
    import asyncio, struct, sys
    async def handle(r, w):
        try:
            while True:
                n = struct.unpack(">I", await r.readexactly(4))[0]
                await r.readexactly(n)
                w.write(struct.pack(">I", 16) + bytes(16))
        except (asyncio.IncompleteReadError, ConnectionError):
            w.close()
    async def main():
        s = await asyncio.start_server(handle, "127.0.0.1", int(sys.argv[1]))
        print("ready", flush=True)
        await s.serve_forever()
    asyncio.run(main())
""")


def _cpu_split(pid: int) -> tuple[float, float]:
    """A process's user and system CPU seconds so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def _cpu_seconds(pid: int) -> float:
    return sum(_cpu_split(pid))


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def _closed_loop(
    n: int, inflight: int, op: Callable[[], Awaitable[None]]
) -> tuple[float, list[float]]:
    """``n`` calls of ``op`` by ``inflight`` concurrent callers, each waiting for its
    previous call (an application with a fixed window); the rate and each latency.

    Not one task per call queued on a semaphore: that bookkeeping costs more CPU than
    a request, and would be measured as the client's."""
    lat: list[float] = []

    async def caller(count: int) -> None:
        for _ in range(count):
            t = time.perf_counter()
            await op()
            lat.append(time.perf_counter() - t)

    share, extra = divmod(n, inflight)
    t0 = time.perf_counter()
    await asyncio.gather(*(caller(share + (i < extra)) for i in range(inflight)))
    return n / (time.perf_counter() - t0), lat


async def _adds(bk: BookKeeper, n: int, inflight: int) -> tuple[float, list[float], int]:
    h = await bk.create_ledger(3, 3, 2, b"bench")
    payload = os.urandom(ENTRY)

    async def add() -> None:
        await h.add(payload)

    rate, lat = await _closed_loop(n, inflight, add)
    await h.close()
    return rate, lat, h.ledger_id


async def _reads(bk: BookKeeper, ledger: int, n: int) -> float:
    r = await bk.open_ledger(ledger, b"bench", recovery=False)
    t0 = time.perf_counter()
    data = await r.read(0, n - 1, concurrency=64)
    assert len(data) == n
    return n / (time.perf_counter() - t0)


async def _loopback(
    port: int, n: int, inflight: int, size: int = ENTRY
) -> tuple[float, list[float]]:
    """Raw asyncio request/response over one loopback connection, ``size``-byte requests."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    waiting: asyncio.Queue[asyncio.Future[None]] = asyncio.Queue()

    async def recv() -> None:
        while True:
            await reader.readexactly(20)
            (await waiting.get()).set_result(None)

    rt = asyncio.get_running_loop().create_task(recv())
    msg = size.to_bytes(4, "big") + os.urandom(size)

    async def one() -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiting.put_nowait(fut)
        writer.write(msg)
        await fut

    result = await _closed_loop(n, inflight, one)
    rt.cancel()
    writer.close()
    return result


@contextlib.contextmanager
def echo_server() -> Iterator[tuple[int, int]]:
    """A raw asyncio request/response server in its own process; yields its port and pid."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-c", _ECHO_SERVER, str(port)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        server.stdout.readline()
        yield port, server.pid
    finally:
        server.terminate()
        server.wait()
        if server.stdout is not None:
            server.stdout.close()


def loopback_throughput(n: int, inflight: int, size: int) -> float:
    """Bytes per second of ``size``-byte requests over raw asyncio loopback."""
    with echo_server() as (port, _):
        rate, _ = asyncio.run(_loopback(port, n, inflight, size))
    return rate * size


def _fsync_rate(directory: Path, n: int) -> float:
    path = directory / "fsync-baseline"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    block = os.urandom(4096)
    t0 = time.perf_counter()
    for _ in range(n):
        os.write(fd, block)
        os.fdatasync(fd)
    secs = time.perf_counter() - t0
    os.close(fd)
    path.unlink()
    return n / secs


@contextlib.contextmanager
def _loop(name: str) -> Iterator[None]:
    """``BKREF_LOOP=name`` for this process's loop and the bookies started meanwhile."""
    old = os.environ.get(eventloop.ENV)
    os.environ[eventloop.ENV] = name
    try:
        yield
    finally:
        if old is None:
            del os.environ[eventloop.ENV]
        else:
            os.environ[eventloop.ENV] = old


@dataclasses.dataclass
class Adds:
    """One cluster's adds at 32 in flight (and, if asked, at 1 and its reads)."""

    rate: float
    lat: list[float]
    client_us: float  # CPU per add, the client process
    bookie_us: float  # CPU per add, per bookie
    client_sys_us: float  # of which in the kernel (system time)
    bookie_sys_us: float
    more: dict[str, tuple[float, list[float] | None]]


def _per_add(
    rate: float, lat: list[float], n: int, pids: list[int], before: list[tuple[float, float]]
) -> Adds:
    """``n`` adds' figures: CPU per add of the client (``pids[0]``, this process) and of
    the average server, from each process's user and system time since ``before``."""
    used = [
        (u1 - u0, s1 - s0) for (u0, s0), (u1, s1) in zip(before, map(_cpu_split, pids), strict=True)
    ]
    us = 1e6 / n
    (cu, cs), servers = used[0], used[1:]
    su, ss = (sum(x[i] for x in servers) / len(servers) for i in (0, 1))
    return Adds(rate, lat, (cu + cs) * us, (su + ss) * us, cs * us, ss * us, {})


def measure_adds(
    d: Path,
    name: str,
    n: int,
    *,
    loop: str = "asyncio",
    config: dict[str, object] | None = None,
    n1: int = 0,
) -> Adds:
    """A fresh 3-bookie cluster on ``loop`` (client and bookies), ``n`` adds at 32 in
    flight; with ``n1``, first that many at 1 in flight, then the 32's entries read back."""
    with _loop(loop):
        cluster = LocalCluster(d / name, config or {})
        try:
            cluster.up(3)

            async def go() -> Adds:
                async with BookKeeper(cluster.zk_hosts) as bk:
                    first = await _adds(bk, n1, 1) if n1 else None
                    pids = [os.getpid()] + [b.pid for b in cluster.bookies if b.pid is not None]
                    before = [_cpu_split(p) for p in pids]
                    rate, lat, ledger = await _adds(bk, n, 32)
                    adds = _per_add(rate, lat, n, pids, before)
                    if first is not None:
                        adds.more["add1"] = first[:2]
                        adds.more["read"] = (await _reads(bk, ledger, n), None)
                return adds

            return eventloop.run(go())
        finally:
            cluster.down()


def measure_fanout(d: Path, n: int, *, loop: str = "asyncio") -> Adds:
    """``n`` adds at 32 in flight over the no-protocol fan-out (tests/bench/fanout.py),
    client and servers on ``loop``; CPU per add as for the cluster's adds."""
    with _loop(loop), fanout.servers(d, loop) as procs:

        async def go() -> tuple[float, list[float]]:
            add, close = await fanout.connect([port for port, _ in procs], ENTRY)
            try:
                return await _closed_loop(n, 32, add)
            finally:
                close()

        pids = [os.getpid()] + [pid for _, pid in procs]
        before = [_cpu_split(p) for p in pids]
        rate, lat = eventloop.run(go())
        return _per_add(rate, lat, n, pids, before)


def _median(runs: list[Adds]) -> Adds:
    return sorted(runs, key=lambda a: a.rate)[len(runs) // 2]


def run(quick: bool) -> str:
    n1, n32, nraw = (200, 2000, 5000) if quick else (2000, 20000, 50000)
    rows = ["| what | ops | rate (ops/s) | p50 (ms) | p99 (ms) |", "|---|---:|---:|---:|---:|"]

    def row(label: str, n: int, rate: float, lat: list[float] | None) -> None:
        p50 = f"{_pct(lat, 0.5) * 1e3:.2f}" if lat else "-"
        p99 = f"{_pct(lat, 0.99) * 1e3:.2f}" if lat else "-"
        rows.append(f"| {label} | {n:,} | {rate:,.0f} | {p50} | {p99} |")

    cpu: dict[str, float] = {}
    res: dict[str, tuple[float, list[float] | None]] = {}
    with tempfile.TemporaryDirectory(prefix="bkref-bench-") as d:
        plain = measure_adds(Path(d), "cluster", n32, n1=n1)
        res.update(plain.more)
        res["add32"] = (plain.rate, plain.lat)
        cpu["client"], cpu["bookie"] = plain.client_us / 1e6, plain.bookie_us / 1e6
        # The same adds on each loop (client and bookies), in turns: the loops' rows are
        # each one's median round (by rate) of ROUNDS, taken alternately.
        rounds: dict[str, list[Adds]] = {"asyncio": [], "uvloop": []}
        bare: dict[str, list[Adds]] = {"asyncio": [], "uvloop": []}
        for i in range(1 if quick else ROUNDS):
            for loop, runs in rounds.items():
                runs.append(measure_adds(Path(d), f"{loop}-{i}", n32, loop=loop))
                bare[loop].append(measure_fanout(Path(d), n32, loop=loop))
        asy, uv = (_median(r) for r in rounds.values())
        res["add32uv"] = (uv.rate, uv.lat)
        # The same adds without the group-commit wait: how much of the cycle it is.
        eager = measure_adds(Path(d), "eager", n32, config={"journalFlushWhenQueueEmpty": True})
        res["add32eager"] = (eager.rate, eager.lat)
        with echo_server() as (port, pid):
            lb1 = asyncio.run(_loopback(port, nraw // 5, 1))
            before, t = _cpu_seconds(pid), time.process_time()
            lb32 = asyncio.run(_loopback(port, nraw, 32))
            cpu["echo"] = (time.process_time() - t + _cpu_seconds(pid) - before) / nraw
        fsync = _fsync_rate(Path(d), 200 if quick else 2000)

    row("add 1 KiB, E=Wq=3 Aq=2, fsync, 1 in flight", n1, *res["add1"])
    row("add 1 KiB, E=Wq=3 Aq=2, fsync, 32 in flight", n32, *res["add32"])
    row("same, journalFlushWhenQueueEmpty = true (no group wait)", n32, *res["add32eager"])
    row("same, on uvloop (client and bookies: BKREF_LOOP=uvloop)", n32, *res["add32uv"])
    row("read 1 KiB entries, 64 in flight", n32, *res["read"])
    row("baseline: asyncio loopback req/resp 1 KiB, 1 in flight", nraw // 5, *lb1)
    row("baseline: asyncio loopback req/resp 1 KiB, 32 in flight", nraw, *lb32)
    row("baseline: 4 KiB append + fdatasync", 200 if quick else 2000, fsync, None)
    ratio = res["add32"][0] / lb32[0]
    total = cpu["client"] + 3 * cpu["bookie"]
    cores = os.cpu_count() or 1
    load = os.getloadavg()[0]
    loops = [
        f"| loop (client and bookies), median of {1 if quick else ROUNDS} | adds/s at 32 in flight "
        "| % of loopback | client CPU us/add "
        "| bookie CPU us/add (each) | CPU us/add, all | of which system |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    ceiling = {loop: _median(r) for loop, r in bare.items()}
    for name, a in (
        ("asyncio", asy),
        ("uvloop", uv),
        ("asyncio, no protocol (tests/bench/fanout.py)", ceiling["asyncio"]),
        ("uvloop, no protocol", ceiling["uvloop"]),
    ):
        loops.append(
            f"| {name} | {a.rate:,.0f} | {a.rate / lb32[0]:.1%} | {a.client_us:.0f} | "
            f"{a.bookie_us:.0f} | {a.client_us + 3 * a.bookie_us:.0f} | "
            f"{a.client_sys_us + 3 * a.bookie_sys_us:.0f} |"
        )
    return (
        "\n".join(rows)
        + "\n\n"
        + "\n".join(loops)
        + (
            f"\n\nAdds at 32 in flight reach {ratio:.0%} of the raw loopback baseline "
            f"(goal: 25%). What limits them: CPU per add at 32 in flight is client "
            f"{cpu['client'] * 1e6:.0f} us + 3 bookies x {cpu['bookie'] * 1e6:.0f} us = "
            f"{total * 1e6:.0f} us, against {cpu['echo'] * 1e6:.0f} us per loopback request "
            f"(both ends) in the same run: {total / cpu['echo']:.1f} requests' worth, where an add "
            f"sends Wq = 3 (so CPU alone holds adds to {cpu['echo'] / total:.0%} of the baseline). "
            f"That caps {cores} idle cores near {cores / total:,.0f} adds/s, and the client's "
            f"event loop alone (one thread) near {1 / cpu['client']:,.0f} adds/s "
            f"({1 / cpu['client'] / lb32[0]:.0%} of the baseline): 25% needs at most "
            f"{4e6 / lb32[0]:.0f} us of client CPU per add and {4e6 * cores / lb32[0]:.0f} us "
            "for the client and the three bookies together, with every core busy. The machine is "
            f"shared (load average {load:.1f} at the end of the run), so the single-threaded "
            "Python event loops of the client, three bookies and ZooKeeper also queue for CPU. "
            "A closed loop of 32 adds moves as one convoy: each bookie journals the window in "
            "one group commit, so a cycle of 32 adds costs the group commit "
            "(journalMaxGroupWaitMSec "
            f"= 2 ms, BookKeeper's default, plus a fdatasync: {1000 / fsync:.1f} ms in this run's "
            "baseline, three bookies syncing one disk) plus the client's and bookies' CPU for the "
            f"window, in series: {32000 / res['add32'][0]:.1f} ms per cycle here; without the "
            f"group wait, {32000 / res['add32eager'][0]:.1f} ms. Even with no CPU at all a cycle "
            f"cannot be shorter than one fdatasync, so 32 in flight cap adds at "
            f"{32 * fsync:,.0f}/s ({32 * fsync / lb32[0]:.0%} of the baseline) on this disk; "
            f"25% would need a cycle of {32000 / (0.25 * lb32[0]):.1f} ms for the fsync and the "
            "CPU of 32 adds together.\n"
        )
        + _ceiling_text(ceiling, uv, lb32[0])
    )


def _ceiling_text(ceiling: dict[str, Adds], bkref_uv: Adds, baseline: float) -> str:
    """What the no-protocol fan-out says about the goal, from the same run's figures."""
    a, u = ceiling["asyncio"], ceiling["uvloop"]

    def total(x: Adds) -> float:
        return x.client_us + 3 * x.bookie_us

    return (
        f"\nThe ceiling: the same fan-out with no protocol at all (tests/bench/fanout.py: "
        "three servers, each its own process, append what they read to a file, fdatasync "
        "it and answer; an add is done at two answers) reaches "
        f"{a.rate / baseline:.0%} of the baseline on asyncio and {u.rate / baseline:.0%} on "
        f"uvloop, at {total(a):.0f} and {total(u):.0f} us of CPU per add (client "
        f"{a.client_us:.0f} and {u.client_us:.0f} us): about as far as a Python "
        "implementation of this shape goes on this machine. "
        + (
            f"25% of the baseline is {0.25 * baseline / u.rate:.0%} of the fan-out's own rate "
            "on uvloop, so the protocol (digests, entry ids and the LAC, the client's and the "
            "bookies' decisions, the journal thread and its group wait, ledger storage) may "
            f"cost at most {u.rate / (0.25 * baseline) - 1:.0%} on top of the bare fan-out"
            if u.rate > 0.25 * baseline
            else "25% of the baseline is beyond even the bare fan-out in this run"
        )
        + f"; bkref's adds run at {bkref_uv.rate / u.rate:.0%} of its rate on uvloop, with "
        f"{total(bkref_uv):.0f} us of CPU per add against its {total(u):.0f}.\n"
    )
