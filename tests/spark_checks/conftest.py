"""One Spark session for all the Spark tests (starting one costs ~15 s).

``local[2]`` with few shuffle partitions: the histories here are small, and
CI machines have two cores.

A test that uses the session and runs out of time ends its whole worker process
(pytest-timeout's ``thread`` method) instead of raising in the test (the default
``signal`` method). The exception of the signal method lands inside a Py4J call: the
call's answer then arrives later and is read by the next call on the session's
connection, so every later Spark test of the worker failed with another call's answer
(one timeout gave 18 failures and 57 errors at load average 14). With the thread method
the timed-out test fails alone: pytest-xdist starts a new worker
(tests/xdist_scheduling.py), whose tests start a new session, and the old JVM exits
when its driver's pipe closes. Without xdist the run ends there, with every thread's
stack printed. Tests that do not use the session (the standalone cluster's, whose
fixture must stop its JVMs) keep the signal method.

The limit is 900 s, not the suite's 300: the slowest of these tests (a durability
verdict on three paths, with the session's start in its setup) took 220 s at a normal
verify's load and 300 s at load average 14. A limit here catches a hang; it does not
time the job (``make bench`` does).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Final

import pytest

from bkref.spark_checks.session import session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SPARK_TIMEOUT: Final = 900
HERE: Final = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The thread method for every test of this directory that uses the session, at
    the limit the test or its module sets, else SPARK_TIMEOUT. The new marker goes
    first, so it is the one pytest-timeout reads."""
    for item in items:
        if not item.path.is_relative_to(HERE) or "spark" not in getattr(item, "fixturenames", ()):
            continue
        own = item.get_closest_marker("timeout")
        limit = SPARK_TIMEOUT
        if own is not None:
            limit = own.args[0] if own.args else own.kwargs.get("timeout", SPARK_TIMEOUT)
        item.add_marker(pytest.mark.timeout(limit, method="thread"), append=False)


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    s = session("local[2]", app="bkref tests", shuffle_partitions=2)
    yield s
    s.stop()
