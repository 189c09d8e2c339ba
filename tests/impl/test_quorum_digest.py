"""Write sets, quorum coverage, digests and placement."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bkref.impl.core.checksum import crc32c
from bkref.impl.core.digest import (
    Digest,
    DigestMismatchError,
    DigestType,
    content_fingerprint,
    master_key,
)
from bkref.impl.core.placement import NotEnoughBookiesError, choose_ensemble, replace_bookie
from bkref.impl.core.quorum import Quorum

quorums = st.integers(1, 6).flatmap(
    lambda e: st.integers(1, e).flatmap(lambda w: st.integers(1, w).map(lambda a: Quorum(e, w, a)))
)


@settings(deadline=None)  # timing belongs to benchmarks, not tests
@given(quorums, st.integers(0, 10_000))
def test_write_set_is_wq_consecutive_bookies_striped_round_robin(q: Quorum, entry: int) -> None:
    ws = q.write_set(entry)
    assert len(set(ws)) == q.write_quorum
    assert ws[0] == entry % q.ensemble_size
    assert ws == tuple((entry + i) % q.ensemble_size for i in range(q.write_quorum))


@settings(deadline=None)  # timing belongs to benchmarks, not tests
@given(quorums, st.data())
def test_coverage_means_no_write_set_can_reach_ack_quorum_without_a_responder(
    q: Quorum, data: st.DataObject
) -> None:
    responded = data.draw(st.sets(st.integers(0, q.ensemble_size - 1)))
    unresponsive = set(range(q.ensemble_size)) - responded
    # Covered iff every write set has fewer than Aq bookies that have not responded (fenced).
    expected = all(len(set(ws) & unresponsive) < q.ack_quorum for ws in q.write_sets())
    assert q.is_covered(responded) == expected


@settings(deadline=None)  # timing belongs to benchmarks, not tests
@given(quorums, st.integers(0, 100), st.data())
def test_absence_needs_wq_minus_aq_plus_one_negatives(
    q: Quorum, entry: int, data: st.DataObject
) -> None:
    ws = q.write_set(entry)
    negatives = data.draw(st.sets(st.sampled_from(ws)))
    # Proven absent iff no Aq-subset of the write set could have acked it.
    could_be_acked = any(not (set(c) & negatives) for c in itertools.combinations(ws, q.ack_quorum))
    assert q.is_entry_absent(negatives, entry) == (not could_be_acked)


def test_quorum_rejects_inconsistent_sizes() -> None:
    with pytest.raises(ValueError, match="E >= Wq >= Aq"):
        Quorum(2, 3, 1)


@settings(deadline=None)  # timing belongs to benchmarks, not tests
@given(
    st.sampled_from(list(DigestType)),
    st.binary(max_size=200),
    st.binary(max_size=16),
    st.integers(0, 2**40),
    st.integers(0, 2**40),
)
def test_digest_round_trip_and_any_flipped_byte_is_a_mismatch(
    kind: DigestType, data: bytes, pw: bytes, ledger: int, entry: int
) -> None:
    d = Digest(kind, pw)
    body = d.sign(ledger, entry, entry - 1, 1000 + len(data), data)
    e = d.verify(body, ledger, entry)
    assert (e.data, e.lac, e.length) == (data, entry - 1, 1000 + len(data))
    for pos in range(0, len(body), 7):
        bad = bytearray(body)
        bad[pos] ^= 0x40
        with pytest.raises(DigestMismatchError):
            d.verify(bytes(bad), ledger, entry)


def test_hmac_digest_with_a_wrong_password_is_a_mismatch() -> None:
    body = Digest(DigestType.HMAC, b"right").sign(1, 0, -1, 3, b"abc")
    with pytest.raises(DigestMismatchError, match="digest mismatch"):
        Digest(DigestType.HMAC, b"wrong").verify(body, 1, 0)
    assert master_key(b"right") != master_key(b"wrong")


def test_crc32c_replicas_differing_only_in_their_piggybacked_lac_share_a_fingerprint() -> None:
    """A recovery's write-back carries its own LAC; a verifying CRC32C body is fingerprinted
    by its ids, length and data (the LAC and digest left out), so both copies agree. An
    HMAC body, or a CRC32C body that fails to verify, is fingerprinted whole."""
    crc = Digest(DigestType.CRC32C, b"pw")
    writer, writeback = crc.sign(7, 3, 1, 120, b"payload"), crc.sign(7, 3, 2, 120, b"payload")
    ids = struct.pack(">QQQ", 7, 3, 120)
    want = f"{crc32c(b'payload', crc32c(ids)):08x}"
    assert content_fingerprint(writer) == content_fingerprint(writeback) == want
    bad = bytearray(writer)
    bad[-1] ^= 1  # fails verification: the whole body counts
    assert content_fingerprint(bytes(bad)) == f"{crc32c(bytes(bad)):08x}"
    mac = Digest(DigestType.HMAC, b"pw")
    a, b = mac.sign(7, 3, 1, 120, b"payload"), mac.sign(7, 3, 2, 120, b"payload")
    assert (content_fingerprint(a), content_fingerprint(b)) == (
        f"{crc32c(a):08x}",
        f"{crc32c(b):08x}",
    )


def test_placement_never_puts_two_bookies_of_one_domain_in_an_ensemble() -> None:
    cands = {"a1": "r1", "a2": "r1", "b1": "r2", "c1": "r3", "d1": "r4"}
    for _ in range(50):
        ens = choose_ensemble(cands, 3)
        assert len({cands[b] for b in ens}) == 3
        new = replace_bookie(ens, ens[0], cands)
        assert len({cands[b] for b in new}) == 3
        assert ens[0] not in new
    with pytest.raises(NotEnoughBookiesError, match="distinct failure domains"):
        choose_ensemble(cands, 5)
