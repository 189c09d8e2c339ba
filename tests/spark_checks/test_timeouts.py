"""A test that uses the Spark session and runs out of time ends its worker
(tests/spark_checks/conftest.py); one that does not keeps the signal method.

That a crashed worker's test then fails alone, and the next test of its module still
runs, is tests/unit/test_xdist_scheduling.py's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.spark_checks.conftest import SPARK_TIMEOUT

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def _limit(request: pytest.FixtureRequest) -> tuple[object, object]:
    marker = request.node.get_closest_marker("timeout")
    assert marker is not None
    return marker.args, marker.kwargs


def test_a_test_of_the_session_times_out_by_the_thread_method_at_the_spark_limit(
    spark: SparkSession, request: pytest.FixtureRequest
) -> None:
    del spark  # the session decides the method
    assert _limit(request) == ((SPARK_TIMEOUT,), {"method": "thread"})


@pytest.mark.timeout(30)
def test_a_limit_a_test_of_the_session_sets_itself_is_kept_with_the_thread_method(
    spark: SparkSession, request: pytest.FixtureRequest
) -> None:
    del spark
    assert _limit(request) == ((30,), {"method": "thread"})


@pytest.mark.timeout(30)
def test_a_test_without_the_session_keeps_its_limit_and_the_signal_method(
    request: pytest.FixtureRequest,
) -> None:
    assert _limit(request) == ((30,), {})
