"""The suite's scheduling hint (tests/conftest.py) names modules that exist."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import LONGEST

ROOT = Path(__file__).resolve().parents[2]


def test_every_module_named_longest_exists_once() -> None:
    missing = [m for m in LONGEST if not (ROOT / m).is_file()]
    assert not missing, f"renamed or removed: {missing}; update tests/conftest.py"
    assert len(set(LONGEST)) == len(LONGEST)
