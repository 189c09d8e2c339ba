"""A local cluster gives each bookie a port of its own, even when the OS offers one twice."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bkref.impl.cluster import local
from bkref.impl.cluster.local import BookieProcess, ClusterError, LocalCluster, distinct_port


def _draws(*ports: int) -> Iterator[int]:
    yield from ports


def test_a_port_already_given_is_drawn_again() -> None:
    draws = _draws(5000, 5001, 5000, 5002)
    assert distinct_port({5000, 5001}, lambda: next(draws)) == 5002


def test_no_free_port_outside_the_taken_ones_is_an_error_that_says_so() -> None:
    with pytest.raises(ClusterError, match="no free port outside 1 taken ones after 100 draws"):
        distinct_port({5000}, lambda: 5000)


def test_a_clusters_new_port_avoids_every_bookie_and_http_port_it_gave(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[set[int]] = []

    def record(taken: set[int]) -> int:
        seen.append(set(taken))
        return 7000

    monkeypatch.setattr(local, "distinct_port", record)
    cluster = LocalCluster(tmp_path)
    cluster.bookies = [
        BookieProcess(0, 6000, str(tmp_path / "b0")),
        BookieProcess(1, 6001, str(tmp_path / "b1"), http_port=6101),
    ]
    assert cluster._new_port() == 7000
    assert seen == [{6000, 6001, 6101}]
