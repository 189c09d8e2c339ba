"""tests/conftest.py runs ``async def`` tests without a plugin: checked on a small
suite of its own (pytester), run in-process with that conftest's hooks."""

from __future__ import annotations

import pytest

CONFTEST = "from tests.conftest import pytest_fixture_setup, pytest_pyfunc_call\n"

SUITE = """
import asyncio

import pytest


@pytest.fixture
def three() -> int:
    return 3


@pytest.fixture
async def later() -> int:
    return 4


async def test_awaits_with_a_fixture(three: int) -> None:
    await asyncio.sleep(0)
    assert three == 3


async def test_a_failed_assertion_fails() -> None:
    await asyncio.sleep(0)
    assert 1 + 1 == 3


async def test_an_async_fixture_is_refused(later: int) -> None:
    pass


def test_a_plain_test_runs_as_before() -> None:
    pass
"""


def test_async_tests_run_fail_and_refuse_async_fixtures(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=1, errors=1)
    result.stdout.fnmatch_lines(["*assert (1 + 1) == 3*"])
    result.stdout.fnmatch_lines(["*async fixture 'later'*runs no async fixture*"])
