"""Frames: round trips, incremental decoding, and a fuzz test of the parser."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bkref.impl.bookie.config import BookieConfig
from bkref.impl.core.checksum import crc32c
from bkref.impl.core.frames import (
    DEFAULT_MAX_FRAME,
    AddRequest,
    AddResponse,
    ErrorResponse,
    FrameDecoder,
    FrameError,
    Message,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    Status,
    _encode_any,
    decode_frame,
    encode,
)

u64 = st.integers(0, 2**64 - 1)
i64 = st.integers(-1, 2**63 - 1)
key = st.binary(max_size=64)
statuses = st.sampled_from(list(Status))

messages: st.SearchStrategy[Message] = st.one_of(
    st.builds(AddRequest, u64, u64, u64, key, st.binary(max_size=2000), st.booleans()),
    st.builds(ReadRequest, u64, u64, u64, st.booleans(), key),
    st.builds(ReadLacRequest, u64, u64, st.booleans(), key),
    st.builds(AddResponse, u64, statuses, u64, u64),
    st.builds(ReadResponse, u64, statuses, u64, u64, st.binary(max_size=2000)),
    st.builds(ReadLacResponse, u64, statuses, u64, i64, i64),
    st.builds(ErrorResponse, u64, statuses, st.text(max_size=100)),
)


@settings(deadline=None)  # timing belongs to benchmarks, not tests
@given(st.lists(messages, max_size=8), st.data())
def test_messages_round_trip_through_arbitrary_chunking(
    msgs: list[Message], data: st.DataObject
) -> None:
    stream = b"".join(encode(m) for m in msgs)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    dec = FrameDecoder()
    got: list[Message | FrameError] = []
    prev = 0
    for c in [*cuts, len(stream)]:
        got += dec.feed(stream[prev:c])
        prev = c
    assert got == msgs
    assert dec.buffered == 0


@settings(deadline=None)
@given(messages)
def test_the_fast_encodings_of_adds_and_their_responses_are_the_generic_bytes(
    msg: Message,
) -> None:
    """Adds and add responses are packed in one struct each (the hot path); any other
    message by its body codec. Either way the bytes are the same."""
    assert encode(msg) == _encode_any(msg)


@settings(max_examples=3000, deadline=None)
@given(st.binary(max_size=300))
def test_fuzz_random_bytes_never_crash_the_parser(junk: bytes) -> None:
    """Thousands of random inputs: each yields messages or FrameError items, nothing else."""
    dec = FrameDecoder(max_frame=4096)
    items = dec.feed(junk)
    for it in items:
        if isinstance(it, FrameError):
            assert it.reason
    # A fatal error is the last item and the decoder stays broken.
    if dec.broken is not None:
        assert items[-1] is dec.broken
        assert dec.feed(b"more") == [dec.broken]


@settings(max_examples=3000, deadline=None)
@given(messages, st.integers(0, 10_000), st.integers(1, 255))
def test_fuzz_flipped_byte_is_detected_or_harmless(msg: Message, pos: int, xor: int) -> None:
    frame = bytearray(encode(msg))
    pos %= len(frame)
    frame[pos] ^= xor
    items = FrameDecoder().feed(bytes(frame))
    # The checksum catches every change inside the frame; a changed length is either
    # a fatal error or leaves the decoder waiting for more bytes.
    assert all(isinstance(i, FrameError) for i in items)
    if pos >= 4:
        assert len(items) == 1


def test_bad_frame_is_skipped_and_the_next_one_decodes() -> None:
    good = encode(ReadLacRequest(7, 1))
    bad = bytearray(encode(ReadLacRequest(8, 1)))
    bad[-1] ^= 1
    items = FrameDecoder().feed(bytes(bad) + good)
    assert isinstance(items[0], FrameError)
    assert "checksum mismatch" in items[0].reason
    assert items[0].request_id == 8
    assert not items[0].fatal
    assert items[1] == ReadLacRequest(7, 1)


def test_oversized_frame_is_fatal_and_says_so() -> None:
    items = FrameDecoder().feed(struct.pack(">I", DEFAULT_MAX_FRAME + 1) + b"x" * 10)
    assert len(items) == 1
    err = items[0]
    assert isinstance(err, FrameError)
    assert err.fatal
    assert err.status is Status.TOO_LARGE
    assert "exceeds the maximum" in err.reason


def test_unknown_version_names_both_versions() -> None:
    inner = struct.pack(">2sBBQ", b"BK", 9, 3, 5) + struct.pack(">QBH", 1, 0, 0)
    frame = struct.pack(">I", len(inner) + 4) + inner + struct.pack(">I", crc32c(inner))
    (err,) = FrameDecoder().feed(frame)
    assert isinstance(err, FrameError)
    assert err.status is Status.UNSUPPORTED_VERSION
    assert "version 9" in err.reason


def test_declared_body_longer_than_frame_is_an_error_not_a_crash() -> None:
    inner = struct.pack(">2sBBQ", b"BK", 1, 1, 5) + struct.pack(">QQBH", 1, 2, 0, 0)
    inner += struct.pack(">I", 10_000) + b"abc"
    frame = struct.pack(">I", len(inner) + 4) + inner + struct.pack(">I", crc32c(inner))
    (err,) = FrameDecoder().feed(frame)
    assert isinstance(err, FrameError)
    assert "declares 10000 bytes" in err.reason


def test_every_status_has_its_own_wire_code_and_comes_back_by_name() -> None:
    """A status is told apart on the wire by its number alone: two names sharing a code
    (an IntEnum alias) would turn, say, an I/O error into READ_ONLY at the peer."""
    codes = {name: int(s) for name, s in Status.__members__.items()}
    assert len(set(codes.values())) == len(codes), codes
    for name, s in Status.__members__.items():
        (got,) = FrameDecoder().feed(encode(ErrorResponse(1, s, name)))
        assert isinstance(got, ErrorResponse)
        assert got.status.name == name


def test_a_five_mib_entry_fits_in_one_frame_each_way() -> None:
    """BookKeeper's default nettyMaxFrameSizeBytes is 5 MiB: an entry of that size, with
    the frame's own header, key and checksum on top, is accepted by the default decoder
    (the client's, for the read response; the bookie allows the same headroom)."""
    body = bytes(5 * 1024 * 1024)
    for msg in (
        AddRequest(1, 2, 3, b"k" * 32, body),
        ReadResponse(4, Status.OK, 2, 3, body),
    ):
        assert FrameDecoder().feed(encode(msg)) == [msg]


def test_the_client_takes_every_frame_a_default_bookie_takes_and_no_longer_one() -> None:
    """The client's default limit is the bookie's (nettyMaxFrameSizeBytes plus 1 KiB of
    headroom for the frame's own fields, bkref.impl.bookie.server): a frame of exactly
    that length is read, one byte longer is refused, on either side."""
    limit = BookieConfig().nettyMaxFrameSizeBytes + 1024
    assert limit == DEFAULT_MAX_FRAME
    head = 12 + 19 + 1 + 4  # version header, ADD header, a 1-byte key, the body length
    msg = AddRequest(1, 2, 3, b"k", bytes(limit - head - 4))  # 4: the frame's checksum
    frame = encode(msg)
    assert len(frame) == 4 + limit
    assert FrameDecoder().feed(frame) == [msg]
    (err,) = FrameDecoder().feed(encode(AddRequest(1, 2, 3, b"k", bytes(limit - head - 3))))
    assert isinstance(err, FrameError)
    assert err.status is Status.TOO_LARGE


def test_a_master_key_of_up_to_256_bytes_is_carried_and_a_longer_one_refused() -> None:
    for size in (0, 20, 256):  # none, BookKeeper's SHA-1 master key, the most a frame takes
        msg = ReadRequest(1, 2, 3, True, bytes(range(256))[:size])
        assert FrameDecoder().feed(encode(msg)) == [msg]
    (err,) = FrameDecoder().feed(encode(ReadRequest(1, 2, 3, True, b"k" * 257)))
    assert isinstance(err, FrameError)
    assert err.reason == "master key of 257 bytes exceeds 256"
    assert (err.request_id, err.status) == (1, Status.BAD_REQUEST)


def test_trailing_bytes_after_a_body_are_counted_and_the_stream_stays_in_sync() -> None:
    inner = struct.pack(">2sBBQ", b"BK", 1, 3, 5) + struct.pack(">QBH", 1, 0, 0) + b"xyz"
    frame = struct.pack(">I", len(inner) + 4) + inner + struct.pack(">I", crc32c(inner))
    err, ok = FrameDecoder().feed(frame + encode(ReadLacRequest(6, 1)))
    assert isinstance(err, FrameError)
    assert err.reason == "READ_LAC: 3 unexpected trailing bytes"
    assert (err.request_id, err.fatal, err.status) == (5, False, Status.BAD_REQUEST)
    assert ok == ReadLacRequest(6, 1)


def test_crc32c_is_the_castagnoli_checksum_of_the_standard_check_value() -> None:
    # The catalogue's check value of CRC-32C (iSCSI, RFC 3720): frames, journal records
    # and CRC32C digests must interoperate with any other implementation of it.
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(b"56789", crc32c(b"1234")) == 0xE3069283  # continued from a prefix


def test_the_wire_bytes_of_a_recovery_add_and_a_fencing_read_are_the_documented_layout() -> None:
    """Pinned bytes, field by field (frames.py's layout): a change of any field, flag or
    checksum breaks every peer built against this format."""
    add = AddRequest(1, 2, 3, b"k", b"xy", recovery=True)
    assert encode(add) == bytes.fromhex(
        "0000002a"  # length of what follows: 42
        "424b 01 01"  # magic "BK", version 1, op ADD
        "0000000000000001"  # request id
        "0000000000000002 0000000000000003"  # ledger, entry
        "01"  # flags: a recovery add (the bookie takes it on a fenced ledger)
        "0001 6b"  # master key length, key
        "00000002 7879"  # body length, body
        "eb71c730"  # crc32c of everything after the length
    )
    read = ReadRequest(1, 2, 3, fence=True, master_key=b"k")
    assert encode(read) == bytes.fromhex(
        "00000024 424b 01 02 0000000000000001 0000000000000002 0000000000000003"
        "01"  # flags: fence
        "0001 6b 45a8b746"
    )
    assert FrameDecoder().feed(encode(add)) == [add]


def test_a_frame_shorter_than_header_and_checksum_is_refused_by_name() -> None:
    for size in range(16):  # MIN_FRAME is 16: a 12-byte header and the 4-byte checksum
        with pytest.raises(FrameError, match=f"frame of {size} bytes is shorter"):
            decode_frame((b"BK" + bytes(14))[:size])


def test_any_other_magic_is_fatal_whichever_side_of_bk_it_sorts() -> None:
    for magic in (b"AA", b"BJ", b"BL", b"ZZ"):
        inner = struct.pack(">2sBBQ", magic, 1, 3, 5) + struct.pack(">QBH", 1, 0, 0)
        inner += struct.pack(">I", crc32c(inner))
        with pytest.raises(FrameError, match="bad magic") as err:
            decode_frame(inner)
        assert err.value.fatal


def test_a_length_below_the_minimum_is_refused_as_soon_as_its_four_bytes_arrive() -> None:
    (err,) = FrameDecoder().feed(struct.pack(">I", 0))
    assert isinstance(err, FrameError)
    assert err.fatal
    assert "below the 16-byte minimum" in err.reason
