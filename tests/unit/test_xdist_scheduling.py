"""A worker that crashes fails the one test it crashed on (tests/xdist_scheduling.py).

Each test runs pytest-xdist in a subprocess over a small suite in which one test ends
its process mid-module, as a Spark test that runs out of time does on purpose.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SUITE = {
    "test_a": "def test_1(): pass\ndef test_2(): pass\ndef test_3(): pass\n",
    "test_b": (
        "import os\ndef test_1(): pass\ndef test_crash(): os._exit(1)\ndef test_after(): pass\n"
    ),
    "test_c": "def test_1(): pass\ndef test_2(): pass\n",
}
SCHEDULER = """
def pytest_xdist_make_scheduler(config, log):
    from tests.xdist_scheduling import CrashSafeLoadFile
    return CrashSafeLoadFile(config, log)
"""


def _run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, workers: int, *, ours: bool
) -> pytest.RunResult:
    pytester.makepyfile(**SUITE)
    if ours:
        pytester.makeconftest(SCHEDULER)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    return pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "no:randomly", "-rA",
        "-n", str(workers), "--dist", "loadfile", "--max-worker-restart", "2",
        timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize("workers", [1, 2])
def test_a_crash_fails_its_test_once_and_the_rest_of_its_module_runs(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    # With one worker, its finished module comes back as an empty unit and the
    # replacement is sent test_after alone: xdist 3.8.0 alone waits forever there.
    result = _run(pytester, monkeypatch, workers, ours=True)
    result.assert_outcomes(passed=7, failed=1)
    result.stdout.fnmatch_lines(["PASSED test_b.py::test_after", "FAILED test_b.py::test_crash*"])


def test_xdist_alone_runs_the_crashed_test_again_and_never_the_rest(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Why CrashSafeLoadFile exists. If this fails, pytest-xdist has fixed it (PR 1371):
    check that the test above passes without CrashSafeLoadFile.remove_node."""
    result = _run(pytester, monkeypatch, 2, ours=False)
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) > 1, result.stdout.str()
    assert "PASSED test_b.py::test_after" not in result.stdout.str()
