"""A real bookie process on its TCP port, with a real ZooKeeper: wrong passwords,
malformed, oversized, idle and half-sent frames, and the order of requests that
arrive in one chunk. The bookie answers each as the protocol says and keeps serving.
"""

from __future__ import annotations

import json
import random
import socket
import struct

import pytest

from bkref.impl.client.client import BookKeeper
from bkref.impl.client.connection import BookieConnection
from bkref.impl.client.errors import WrongPasswordError
from bkref.impl.cluster.process import pid_alive
from bkref.impl.core.digest import Digest, DigestType, master_key
from bkref.impl.core.frames import (
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
from bkref.impl.testing import assert_bookie_holds, shell
from tests.impl.conftest import MakeCluster

pytestmark = pytest.mark.zookeeper

PW = b"integration"


async def test_wrong_password_rejects_add_and_fence(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(3)
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
    out = shell(cluster, "simpletest", "-n", "50", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["matched"] is True


async def test_many_idle_and_half_sent_connections_do_not_stop_a_bookie_serving(
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

        async with BookKeeper(cluster.zk_hosts) as bk:
            h = await bk.create_ledger(3, 3, 3, PW)
            assert victim.bookie_id in h.writer.ensemble
            payload = [b"after the idle ones %d" % i for i in range(20)]
            await h.add_many(payload)
        await assert_bookie_holds(victim.bookie_id, h.ledger_id, payload, PW)
    finally:
        for s in stalled:
            s.close()
    assert victim.pid is not None
    assert pid_alive(victim.pid)


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


def test_a_fencing_read_answers_from_what_the_bookie_held_when_it_decided_it(
    make_cluster: MakeCluster,
) -> None:
    """Found by a soak run's trace check (netns seed 56): a recovery's fencing read of an
    entry and its write-back of that entry reached a bookie in one event-loop turn while
    the ledger's fence was still on its way to the journal. The read waited for the fence
    and looked the entry up only then, after the write-back had been applied: it answered
    "found" for an entry the bookie did not hold when it decided the read. BookKeeper's
    ReadEntryProcessor reads the entry right after fenceLedger, before the fence is
    durable; so does bkref's bookie now. Here the three requests arrive in one chunk."""
    cluster = make_cluster(3)
    host, port = cluster.bookies[0].bookie_id.split(":")
    key = master_key(PW)
    body = Digest(DigestType.CRC32C, PW).sign(902, 0, -1, 1, b"x")
    chunk = encode(ReadLacRequest(1, 902, fence=True, master_key=key))
    chunk += encode(ReadRequest(2, 902, 0, fence=True, master_key=key))
    chunk += encode(AddRequest(3, 902, 0, key, body, recovery=True))
    replies: dict[int, object] = {}
    decoder = FrameDecoder()
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(chunk)
        while len(replies) < 3:
            data = s.recv(65536)
            assert data, f"connection closed after {replies}"
            replies.update((r.request_id, r) for r in decoder.feed(data))
    fence, read, add = replies[1], replies[2], replies[3]
    assert getattr(fence, "status", None) is Status.OK, fence
    assert getattr(add, "status", None) is Status.OK, add  # a recovery add passes the fence
    assert isinstance(read, ReadResponse), read
    assert read.status is Status.NO_SUCH_ENTRY, read
