"""Shared fixtures: real ZooKeeper servers come from the package's pytest plugin.

Hypothesis runs without per-example deadlines: a deadline is a timing
assertion, and this suite runs on shared, noisy machines. Performance is
measured by the benchmarks, never asserted by tests.

``async def`` tests run here, each in an event loop of its own (``asyncio.run``),
with no plugin: write ``async def test_...`` and await in it. Fixtures stay
plain functions; they run before the loop starts and after it ends.
"""

from __future__ import annotations

import asyncio
import inspect
import os

import pytest
from hypothesis import settings

# The spec's tests run its source: their monkeypatches and tracers need Python functions.
# tests/spec/test_build.py holds a compiled build (bkref.spec.build) equal to it.
os.environ.setdefault("BKREF_SPEC", "pure")

settings.register_profile("bkref", deadline=None)
settings.load_profile("bkref")

pytest_plugins = ["bkref.impl.cluster.pytest_plugin", "pytester"]


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run an ``async def`` test to completion with ``asyncio.run``; leave others to pytest."""
    test = pyfuncitem.obj
    if inspect.isasyncgenfunction(test):
        pytest.fail(f"{pyfuncitem.nodeid}: a test cannot be an async generator", pytrace=False)
    if not inspect.iscoroutinefunction(test):
        return None
    args = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    asyncio.run(test(**args))
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_fixture_setup(
    fixturedef: pytest.FixtureDef[object], request: pytest.FixtureRequest
) -> None:
    """Refuse async fixtures with a reason: they would run outside the test's loop."""
    func = fixturedef.func
    if inspect.iscoroutinefunction(func) or inspect.isasyncgenfunction(func):
        pytest.fail(
            f"async fixture {fixturedef.argname!r} (requested by {request.node.nodeid}): "
            "tests/conftest.py runs each async test in an event loop of its own, which "
            "starts after the fixtures are set up, so it runs no async fixture. Make it a "
            "plain fixture (with asyncio.run inside for one-off async setup) or do the "
            "async part in the test.",
            pytrace=False,
        )


# The modules that take longest in `make verify` (a loaded run's durations, 2026-11-30),
# longest first. `make verify` runs pytest-xdist by module (--dist loadfile) in collection
# order (--no-loadscope-reorder): the long modules start first and the short ones fill in
# after them, instead of one long module starting last and running alone at the end.
LONGEST = [
    "tests/refine/test_bkref_planted.py",
    "tests/refine/test_bkref.py",
    "tests/refine/test_bkref_autorecovery.py",
    "tests/nemesis/test_planted.py",
    "tests/spec/test_mutants.py",
    "tests/refine/test_bkref_autorecovery_mutant_configs.py",
    "tests/spark_checks/test_durability_paths.py",
    "tests/spec/test_coverage.py",
    "tests/spec/test_open_ledgers.py",
    "tests/nemesis/test_campaign.py",
    "tests/spark_checks/test_cluster.py",
    "tests/spec/test_build.py",
    "tests/spark_checks/test_cli.py",
    "tests/spec/test_failed_repair.py",
    "tests/spec/test_session_loss.py",
    "tests/spec/test_checker.py",
    "tests/unit/test_mutation.py",
    "tests/unit/test_mutation_verdicts.py",
    "tests/spark_checks/test_equivalence.py",
    "tests/impl/test_autorecovery.py",
]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {module: i for i, module in enumerate(LONGEST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(LONGEST)))


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``--dist loadfile`` as tests/xdist_scheduling.py changes it."""
    if config.getoption("dist", None) != "loadfile":
        return None
    from tests.xdist_scheduling import SparkTogether

    return SparkTogether(config, log)
