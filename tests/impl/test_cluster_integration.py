"""Issue 4's "Done when": real ZooKeeper, real bookie processes, real TCP and files."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from impl.client.client import (
    BKError,
    BookKeeper,
    FencedError,
    NoSuchEntryError,
    WrongPasswordError,
)
from impl.client.connection import BookieConnection
from impl.cluster.process import pid_alive
from impl.core.digest import Digest, DigestType, master_key
from impl.core.frames import (
    AddRequest,
    ErrorResponse,
    FrameDecoder,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    Status,
    encode,
)
from impl.meta.store import ZkMetadataStore, connect
from tests.impl.conftest import MakeCluster

pytestmark = pytest.mark.zookeeper

PW = b"integration"


@pytest.mark.slow
def test_10000_entries_e3_wq2_aq2_on_4_bookies_read_back_close_reopen_lac(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(4)

    async def go() -> None:
        async with BookKeeper(cluster.zk_hosts) as bk:
            h = await bk.create_ledger(3, 2, 2, PW)
            payload = [b"entry %d " % i + bytes(random.randbytes(i % 50)) for i in range(10_000)]
            for start in range(0, 10_000, 1000):
                ids = await h.add_many(payload[start : start + 1000])
                assert ids == list(range(start, start + 1000))
            assert h.last_entry == 9_999
            # Bookies know the LAC piggybacked on the adds: it lags by the adds in flight.
            lac = await h.read_lac()
            if len(h.writer.metadata.segments) == 1:
                assert lac == 8_999
            else:  # an add outlived its 5 s timeout (a loaded machine): an ensemble change,
                # and a new segment's start proves the entries before it
                assert 8_999 <= lac < 9_999
            assert await h.read(0, 9_999) == payload
            await h.close()
            r = await bk.open_ledger(h.ledger_id, PW, recovery=False)
            assert r.metadata.is_closed
            assert r.last_entry == 9_999
            assert await r.read_lac() == 9_999
            assert await r.read(0, 9_999) == payload
            r2 = await bk.open_ledger(h.ledger_id, PW)  # recovery open of a closed ledger
            assert r2.last_entry == 9_999

    asyncio.run(go())


def test_sigkill_of_a_bookie_during_writes_changes_the_ensemble_and_loses_nothing(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(4)

    async def go() -> None:
        async with BookKeeper(cluster.zk_hosts) as bk:
            h = await bk.create_ledger(3, 2, 2, PW)
            victim = h.writer.ensemble[1]
            index = next(b.index for b in cluster.bookies if b.bookie_id == victim)
            acked: list[int] = []
            sem = asyncio.Semaphore(32)

            async def one(i: int) -> None:
                async with sem:
                    acked.append(await h.add(b"v%d" % i))
                    if len(acked) == 500:
                        await asyncio.to_thread(cluster.kill_bookie, index)

            await asyncio.gather(*(one(i) for i in range(3000)))
            assert sorted(acked) == list(range(3000))
            segments = h.writer.metadata.segments
            # At least the victim's replacement (on a loaded machine an add to a live
            # bookie may also outlive its 5 s timeout and change the ensemble again).
            assert len(segments) >= 2
            assert victim in segments[0].ensemble
            assert victim not in segments[-1].ensemble
            await h.close()
            r = await bk.open_ledger(h.ledger_id, PW, recovery=False)
            assert await r.read(0, 2999) == [b"v%d" % i for i in range(3000)]

    asyncio.run(go())


def test_sigkill_of_the_writer_then_recovery_keeps_every_acknowledged_entry(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(3)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.impl.writer_proc", cluster.zk_hosts, PW.decode(), "5000"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[2],
    )
    assert proc.stdout is not None
    acked: list[int] = []
    ledger = -1
    try:
        for line in proc.stdout:
            kind, value = line.split()
            if kind == "created":
                ledger = int(value)
            else:
                acked.append(int(value))
            if len(acked) >= 1500:
                break
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    assert ledger >= 0
    assert acked

    async def go() -> None:
        async with BookKeeper(cluster.zk_hosts) as bk:
            r = await bk.open_ledger(ledger, PW)  # fences, recovers, closes
            assert r.metadata.is_closed
            assert r.last_entry >= max(acked)
            data = await r.read(0, r.last_entry)
            assert data == [b"entry-%d" % i for i in range(r.last_entry + 1)]

    asyncio.run(go())


def test_a_paused_bookie_is_replaced_after_the_add_timeout(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(4)

    async def go() -> None:
        async with BookKeeper(cluster.zk_hosts, add_entry_timeout=1.0) as bk:
            h = await bk.create_ledger(3, 3, 3, PW)
            await h.add_many([b"p%d" % i for i in range(10)])
            victim = h.writer.ensemble[1]
            index = next(b.index for b in cluster.bookies if b.bookie_id == victim)
            cluster.signal_bookie(index, signal.SIGSTOP)  # alive, connected, silent
            try:
                ids = await asyncio.wait_for(h.add_many([b"p%d" % i for i in range(10, 20)]), 30)
            finally:
                cluster.signal_bookie(index, signal.SIGCONT)
            assert ids == list(range(10, 20))
            assert victim not in h.writer.ensemble
            await h.close()

    asyncio.run(go())


def test_an_old_writer_is_fenced_by_a_recovery_open(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(3)

    async def go() -> None:
        async with (
            BookKeeper(cluster.zk_hosts) as writer_bk,
            BookKeeper(cluster.zk_hosts) as reader_bk,
        ):
            h = await writer_bk.create_ledger(3, 3, 2, PW)
            await h.add_many([b"a", b"b", b"c"])
            r = await reader_bk.open_ledger(h.ledger_id, PW)
            assert r.last_entry == 2
            with pytest.raises(FencedError, match="fenced"):
                await h.add(b"late")
            with pytest.raises(FencedError):
                await h.close()

    asyncio.run(go())


def test_recovery_replaces_a_dead_bookie_when_write_back_needs_it(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(4)

    async def go() -> None:
        async with (
            BookKeeper(cluster.zk_hosts) as writer_bk,
            BookKeeper(cluster.zk_hosts) as reader_bk,
        ):
            h = await writer_bk.create_ledger(3, 3, 3, PW)
            await h.add_many([b"w%d" % i for i in range(100)])
            victim = h.writer.ensemble[2]
            index = next(b.index for b in cluster.bookies if b.bookie_id == victim)
            await asyncio.to_thread(cluster.kill_bookie, index)
            r = await reader_bk.open_ledger(h.ledger_id, PW)  # Wq = Aq: needs a new bookie
            assert r.last_entry == 99
            assert victim not in r.metadata.last_segment.ensemble
            assert await r.read(0, 99) == [b"w%d" % i for i in range(100)]

    asyncio.run(go())


@pytest.mark.slow
def test_a_fenced_ledger_stays_fenced_across_bookie_restarts(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(3, zkTimeout=3000, flushInterval=3_600_000)

    async def go() -> None:
        async with (
            BookKeeper(cluster.zk_hosts) as writer_bk,
            BookKeeper(cluster.zk_hosts) as reader_bk,
        ):
            h = await writer_bk.create_ledger(3, 3, 2, PW)
            await h.add_many([b"a", b"b"])
            await reader_bk.open_ledger(h.ledger_id, PW)  # fences every bookie
            for b in cluster.bookies:  # the fence is only in the journal: replay restores it
                await asyncio.to_thread(cluster.kill_bookie, b.index)
                await asyncio.to_thread(cluster.start_bookie, b.index)
            with pytest.raises(FencedError):
                await h.add(b"after restart")

    asyncio.run(go())


def test_sigkill_of_a_bookie_after_acks_then_restart_replays_the_journal(
    make_cluster: MakeCluster,
) -> None:
    # No checkpoint in the test's lifetime: everything is in the journal only.
    cluster = make_cluster(3, flushInterval=3_600_000, zkTimeout=3000)

    async def write() -> tuple[int, list[bytes]]:
        async with BookKeeper(cluster.zk_hosts) as bk:
            h = await bk.create_ledger(3, 3, 3, PW)
            payload = [b"durable %d" % i for i in range(1000)]
            await h.add_many(payload)
            return h.ledger_id, payload

    ledger, payload = asyncio.run(write())
    victim = cluster.bookies[0]
    cluster.kill_bookie(0)
    cluster.start_bookie(0)
    assert "replayed" in victim.log_path.read_text()

    async def read_back() -> None:
        conn = BookieConnection(victim.bookie_id)
        digest = Digest(DigestType.CRC32C, PW)
        for e, want in enumerate(payload):
            resp = await conn.request(functools.partial(_read_req, ledger, e))
            assert isinstance(resp, ReadResponse)
            assert resp.status is Status.OK, e
            assert digest.verify(resp.body, ledger, e).data == want
        await conn.close()

    asyncio.run(read_back())


def test_flipped_byte_in_an_entry_log_is_a_digest_mismatch_and_another_replica_serves(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(2, flushInterval=200)

    async def write() -> int:
        async with BookKeeper(cluster.zk_hosts) as bk:
            h = await bk.create_ledger(2, 2, 2, PW)
            await h.add_many([b"payload-%04d" % i for i in range(100)])
            await h.close()
            return h.ledger_id

    ledger = asyncio.run(write())
    zk = connect(cluster.zk_hosts)
    try:
        md = ZkMetadataStore(zk).read_ledger(ledger)[0]
    finally:
        zk.stop()
        zk.close()
    target = 42
    first = md.ensemble_for(target)[target % 2]  # the replica a reader asks first
    index = next(b.index for b in cluster.bookies if b.bookie_id == first)
    cluster.stop_bookie(index)  # clean stop: the entry log is flushed
    logs = sorted((Path(cluster.bookies[index].directory) / "ledgers").glob("*.log"))
    needle = b"payload-%04d" % target
    for path in logs:
        raw = bytearray(path.read_bytes())
        at = raw.find(needle)
        if at >= 0:
            raw[at + 3] ^= 0x01
            path.write_bytes(bytes(raw))
            break
    else:
        pytest.fail("entry not found in any entry log")
    cluster.start_bookie(index)

    async def read() -> None:
        async with BookKeeper(cluster.zk_hosts) as bk:
            r = await bk.open_ledger(ledger, PW, recovery=False)
            assert await r.read_entry(target) == needle
            assert r.stats.digest_mismatches == [(first, target)]

    asyncio.run(read())


def _read_req(ledger: int, entry: int, rid: int) -> ReadRequest:
    return ReadRequest(rid, ledger, entry)


def test_wrong_password_rejects_add_and_fence(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(3)

    async def go() -> None:
        async with BookKeeper(cluster.zk_hosts) as bk:
            h = await bk.create_ledger(3, 3, 3, PW)
            await h.add(b"x")
            bookie = h.writer.ensemble[0]
            with pytest.raises(WrongPasswordError):
                await bk.open_ledger(h.ledger_id, b"wrong")
            conn = BookieConnection(bookie)
            body = Digest(DigestType.CRC32C, b"wrong").sign(h.ledger_id, 1, 0, 2, b"y")
            add = await conn.request(
                lambda rid: AddRequest(rid, h.ledger_id, 1, master_key(b"wrong"), body)
            )
            assert add.status is Status.UNAUTHORIZED
            fence = await conn.request(
                lambda rid: ReadLacRequest(
                    rid, h.ledger_id, fence=True, master_key=master_key(b"wrong")
                )
            )
            assert fence.status is Status.UNAUTHORIZED
            # Not fenced: the rightful writer continues.
            assert await h.add(b"z") == 1
            await conn.close()

    asyncio.run(go())


def test_malformed_and_oversized_frames_get_errors_and_the_bookie_still_serves(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(3)
    addr = cluster.bookies[0].bookie_id
    host, port = addr.split(":")
    rng = random.Random(4)

    def exchange(data: bytes) -> bytes:
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
            return b"".join(chunks)

    # Corrupted copies of a valid frame: a checksum error comes back, with the request id.
    good = bytearray(encode(ReadLacRequest(77, 1)))
    bad = bytearray(good)
    bad[-2] ^= 0xFF
    reply = exchange(bytes(bad))
    assert b"checksum mismatch" in reply
    # An oversized frame: a TOO_LARGE error, then the connection closes.
    reply = exchange(struct.pack(">I", 1 << 30) + b"x" * 100)
    assert b"exceeds the maximum" in reply
    # Random junk of many shapes.
    for _ in range(300):
        exchange(rng.randbytes(rng.randint(0, 200)))
    # A bad frame followed by a good one on the same connection: both answered.
    reply = exchange(bytes(bad) + bytes(good))
    items = FrameDecoder().feed(reply)
    assert isinstance(items[0], ErrorResponse)
    assert isinstance(items[1], ReadLacResponse)
    assert items[1].request_id == 77
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "impl.cli.main",
            "shell",
            "simpletest",
            "--zk",
            cluster.zk_hosts,
            "-n",
            "50",
            "--json",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["matched"] is True


def test_many_idle_and_half_sent_connections_do_not_stop_a_bookie_serving(
    make_cluster: MakeCluster,
) -> None:
    """Hundreds of connections that never send a frame, or stop in the middle of
    one (a length prefix cut short, a length with no body), plus garbage on
    others: the bookie still takes an add and serves a read meanwhile, on a
    ledger whose every add needs it (E = Wq = Aq = 3 on 3 bookies)."""
    cluster = make_cluster(3)
    victim = cluster.bookies[0]
    host, port = victim.bookie_id.split(":")
    rng = random.Random(5)
    stalled: list[socket.socket] = []
    try:
        for i in range(300):
            s = socket.create_connection((host, int(port)), timeout=10)
            if i % 3 == 1:
                s.sendall(b"\x00\x00")  # half a length prefix
            elif i % 3 == 2:
                s.sendall(struct.pack(">I", 64) + rng.randbytes(10))  # a frame cut short
            stalled.append(s)
        for _ in range(50):  # garbage, on connections closed at once
            with socket.create_connection((host, int(port)), timeout=10) as s:
                s.sendall(rng.randbytes(rng.randint(1, 300)))

        async def go() -> None:
            async with BookKeeper(cluster.zk_hosts) as bk:
                h = await bk.create_ledger(3, 3, 3, PW)
                assert victim.bookie_id in h.writer.ensemble
                payload = [b"after the idle ones %d" % i for i in range(20)]
                await h.add_many(payload)
            conn = BookieConnection(victim.bookie_id)
            digest = Digest(DigestType.CRC32C, PW)
            for e, want in enumerate(payload):
                resp = await conn.request(functools.partial(_read_req, h.ledger_id, e))
                assert isinstance(resp, ReadResponse)
                assert resp.status is Status.OK, e
                assert digest.verify(resp.body, h.ledger_id, e).data == want
            await conn.close()

        asyncio.run(go())
    finally:
        for s in stalled:
            s.close()
    assert victim.pid is not None
    assert pid_alive(victim.pid)


def test_a_wiped_data_dir_makes_the_bookie_refuse_to_start(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(3)
    b = cluster.bookies[1]
    cluster.stop_bookie(1)
    import shutil

    shutil.rmtree(Path(b.directory) / "ledgers")
    out = subprocess.run(
        [sys.executable, "-m", "impl.bookie", "--config", str(b.config_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 3
    assert "cookie mismatch" in out.stderr
    assert "wiped or swapped" in out.stderr


def test_disk_over_threshold_goes_read_only_and_the_client_moves_away(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(4, diskCheckInterval=200)

    async def go() -> None:
        async with BookKeeper(cluster.zk_hosts) as bk:
            h = await bk.create_ledger(3, 3, 2, PW)
            await h.add_many([b"before-%d" % i for i in range(50)])
            victim = h.writer.ensemble[0]
            index = next(b.index for b in cluster.bookies if b.bookie_id == victim)
            cluster.write_config(
                index, diskUsageThreshold=0.000001, diskUsageLwmThreshold=0.0000005
            )
            cluster.signal_bookie(index, signal.SIGHUP)
            deadline = time.monotonic() + 30
            while not any(
                i.bookie_id == victim and i.readonly
                for i in await asyncio.to_thread(bk.meta.bookies)
            ):
                assert time.monotonic() < deadline, "bookie never went read-only"
                await asyncio.sleep(0.1)
            await h.add_many([b"after-%d" % i for i in range(50)])
            assert victim not in h.writer.ensemble
            h2 = await bk.create_ledger(3, 3, 2, PW)
            assert victim not in h2.writer.ensemble
            await h.close()
            r = await bk.open_ledger(h.ledger_id, PW, recovery=False)
            assert len(await r.read(0, 99)) == 100
            # Usage back under the low-water mark: writable again.
            cluster.write_config(index, diskUsageThreshold=0.9999, diskUsageLwmThreshold=0.9998)
            cluster.signal_bookie(index, signal.SIGHUP)
            while not any(
                i.bookie_id == victim and not i.readonly
                for i in await asyncio.to_thread(bk.meta.bookies)
            ):
                assert time.monotonic() < deadline + 30, "bookie never became writable"
                await asyncio.sleep(0.1)

    asyncio.run(go())


def test_deleted_ledgers_are_garbage_collected_and_compacted(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(
        3,
        flushInterval=200,
        gcWaitTime=300,
        logSizeLimit=256 * 1024,
        minorCompactionInterval=1,
        majorCompactionInterval=2,
    )

    async def go() -> None:
        async with BookKeeper(cluster.zk_hosts) as bk:
            doomed = await bk.create_ledger(3, 3, 3, PW)
            kept = await bk.create_ledger(3, 3, 3, PW)
            for i in range(40):
                await doomed.add_many([b"d" * 4000] * 20)
                await kept.add(b"kept-%d" % i)
            await doomed.close()
            await kept.close()
            await asyncio.sleep(1)
            ledgers = Path(cluster.bookies[0].directory) / "ledgers"
            before = sum(p.stat().st_size for p in ledgers.glob("*.log"))
            await bk.delete_ledger(doomed.ledger_id)
            deadline = time.monotonic() + 30
            while sum(p.stat().st_size for p in ledgers.glob("*.log")) > before / 4:
                assert time.monotonic() < deadline, "space was never reclaimed"
                await asyncio.sleep(0.2)
            r = await bk.open_ledger(kept.ledger_id, PW, recovery=False)
            assert await r.read(0, 39) == [b"kept-%d" % i for i in range(40)]

    asyncio.run(go())


def test_cluster_cli_up_status_down(tmp_path: Path) -> None:
    d = tmp_path / "c"
    bkref = [sys.executable, "-m", "impl.cli.main"]
    up = subprocess.run(
        [*bkref, "cluster", "up", "--bookies", "2", "--dir", str(d)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    try:
        assert up.returncode == 0, up.stderr
        zk = up.stdout.strip()
        st = subprocess.run(
            [*bkref, "cluster", "status", "--dir", str(d), "--json"],
            capture_output=True,
            text=True,
            check=True,
        )
        status = json.loads(st.stdout)
        roles = sorted(p["role"] for p in status["processes"])
        assert roles == ["bookie", "bookie", "zookeeper"]
        assert all(p["alive"] for p in status["processes"])
        ls = subprocess.run(
            [*bkref, "shell", "listbookies", "--zk", zk, "--json"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert len(json.loads(ls.stdout)) == 2
    finally:
        down = subprocess.run(
            [*bkref, "cluster", "down", "--dir", str(d)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert down.returncode == 0, down.stderr
    assert not any(pid_alive(p["pid"]) for p in status["processes"])


def test_read_tells_an_absent_entry_from_unreachable_replicas(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(3)

    async def go() -> None:
        async with BookKeeper(cluster.zk_hosts) as bk:
            h = await bk.create_ledger(3, 2, 2, PW)
            await h.add_many([b"e%d" % i for i in range(10)])
            with pytest.raises(NoSuchEntryError, match="every replica"):
                await h.read_entry(15)  # asked past the end: both replicas say "no such entry"
            ws = h.writer.metadata.quorum.write_set(3)
            for idx in ws:
                bookie = h.writer.ensemble[idx]
                await asyncio.to_thread(
                    cluster.kill_bookie,
                    next(b.index for b in cluster.bookies if b.bookie_id == bookie),
                )
            with pytest.raises(BKError) as err:
                await h.read_entry(3)
            assert not isinstance(err.value, NoSuchEntryError)
            assert err.value.status is Status.IO_ERROR

    asyncio.run(go())


def test_bookie_dump_lists_every_stored_entry_with_equal_digests_across_replicas(
    make_cluster: MakeCluster, tmp_path: Path
) -> None:
    cluster = make_cluster(4)

    async def go() -> tuple[int, tuple[str, ...]]:
        async with BookKeeper(cluster.zk_hosts) as bk:
            h = await bk.create_ledger(3, 2, 2, PW)
            await h.add_many([b"d%d" % i for i in range(30)])
            await h.close()
            return h.ledger_id, h.metadata.segments[0].ensemble

    ledger, ensemble = asyncio.run(go())
    out = tmp_path / "entries.jsonl"
    for b in cluster.bookies:
        cluster.stop_bookie(b.index)
        argv = ["--config", str(b.config_path), "--dump", str(out)]
        done = subprocess.run(
            [sys.executable, "-m", "impl.bookie", *argv],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    holders: dict[int, dict[str, str]] = {}
    for r in rows:
        assert r["ledger"] == ledger
        holders.setdefault(r["entry"], {})[r["bookie"]] = r["digest"]
    assert sorted(holders) == list(range(30))
    for entry, copies in holders.items():
        assert set(copies) == {ensemble[entry % 3], ensemble[(entry + 1) % 3]}
        assert len(set(copies.values())) == 1  # the replicas hold the same bytes


def test_a_read_sees_every_add_the_bookie_accepted_before_it(make_cluster: MakeCluster) -> None:
    """Found by a lose-unsynced campaign (seed 3) on the correct code: a racing recovery
    closed a ledger before three acknowledged entries. A bookie decoded a writer's add and
    the recovery's fencing read of that entry in one event-loop turn; the add was accepted
    (the fence came after it) but not yet applied to storage, so the read answered "no
    such entry", and with Wq = Aq one negative ended the recovery; then the add's journal
    write completed and it was acknowledged. Here the three requests arrive in one chunk."""
    cluster = make_cluster(3)
    host, port = cluster.bookies[0].bookie_id.split(":")
    key = master_key(PW)
    digest = Digest(DigestType.CRC32C, PW)
    for ledger, fence in ((900, True), (901, False)):
        body = digest.sign(ledger, 0, -1, 1, b"x")
        chunk = encode(AddRequest(1, ledger, 0, key, body))
        if fence:  # as a recovery: fence by a LAC read, then a fencing read of the entry
            chunk += encode(ReadLacRequest(2, ledger, fence=True, master_key=key))
        chunk += encode(ReadRequest(3, ledger, 0, fence=fence, master_key=key if fence else b""))
        replies: dict[int, object] = {}
        decoder = FrameDecoder()
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(chunk)
            while len(replies) < (3 if fence else 2):
                data = s.recv(65536)
                assert data, f"connection closed after {replies}"
                replies.update((r.request_id, r) for r in decoder.feed(data))
        add, read = replies[1], replies[3]
        assert getattr(add, "status", None) is Status.OK, add
        # The add was accepted before the read, so the read must see its entry.
        assert isinstance(read, ReadResponse), read
        assert read.status is Status.OK, (fence, read)
        assert read.body == body
