"""Every Python example of docs/api.md runs and its assertions hold."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

API = Path(__file__).resolve().parents[2] / "docs" / "api.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```$", API.read_text(), flags=re.M | re.S)


def test_the_page_has_examples_for_each_area() -> None:
    text = "\n".join(BLOCKS)
    for module in (
        "bkref.linearizability.history",
        "bkref.linearizability.ledger_checker",
        "bkref.linearizability.wgl",
        "bkref.linearizability.unique",
        "bkref.linearizability.durability",
        "bkref.linearizability.generate",
        "bkref.spec.checker",
        "bkref.refine.machine",
        "bkref.tracecheck.cli",
    ):
        assert f"from {module} import" in text, f"docs/api.md has no example of {module}"


@pytest.mark.parametrize("n", range(len(BLOCKS)))
def test_example_runs(n: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # examples write their files here
    code = compile(BLOCKS[n], f"docs/api.md example {n + 1}", "exec")
    exec(code, {"__name__": f"api_example_{n + 1}"})  # noqa: S102 - our own documentation
