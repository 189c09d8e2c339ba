"""Ledger metadata as stored in ZooKeeper: canonical JSON that round-trips, and stored
bytes that cannot be parsed refused with an error naming what was wrong."""

from __future__ import annotations

import json

import pytest

from bkref.impl.core.metadata import FORMAT_VERSION, LedgerMetadata, MetadataFormatError, Segment
from tests.impl.core_helpers import A, B, C, D, ledger_md

MD = ledger_md((Segment(0, (A, B, C)), Segment(4, (D, B, C))), closed_at=9, password=b"pw")


def _stored(**changes: object) -> bytes:
    d = json.loads(MD.serialize())
    d.update(changes)
    return json.dumps(d).encode()


def test_metadata_round_trips_through_its_stored_bytes() -> None:
    assert LedgerMetadata.deserialize(MD.serialize()) == MD


def test_the_stored_bytes_are_canonical_json_with_sorted_keys() -> None:
    data = MD.serialize()
    assert data == json.dumps(json.loads(data), sort_keys=True).encode()
    assert list(json.loads(data)) == sorted(json.loads(data))
    assert LedgerMetadata.deserialize(data).serialize() == data


@pytest.mark.parametrize("version", [FORMAT_VERSION - 1, FORMAT_VERSION + 1, None, "1"])
def test_another_format_version_is_refused_by_name(version: object) -> None:
    with pytest.raises(MetadataFormatError, match=f"metadata format {version!r} is not"):
        LedgerMetadata.deserialize(_stored(format=version))


def test_metadata_without_a_format_is_refused_by_name() -> None:
    d = json.loads(MD.serialize())
    del d["format"]
    with pytest.raises(MetadataFormatError, match="metadata format None is not"):
        LedgerMetadata.deserialize(json.dumps(d).encode())


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("segments", 5),  # not a list: TypeError inside the parser
        ("segments", [{"firstEntryId": 0}]),  # no ensemble: KeyError
        ("ensembleSize", "three"),  # ValueError
        ("state", "HALF_OPEN"),  # not a LedgerState: ValueError
        ("password", "not base64!"),  # binascii.Error
    ],
)
def test_a_malformed_field_is_a_metadata_format_error_not_a_crash(
    field: str, value: object
) -> None:
    with pytest.raises(MetadataFormatError, match="cannot parse ledger metadata"):
        LedgerMetadata.deserialize(_stored(**{field: value}))


def test_bytes_that_are_not_json_are_a_metadata_format_error() -> None:
    with pytest.raises(MetadataFormatError, match="cannot parse ledger metadata"):
        LedgerMetadata.deserialize(b"\x00not json")
