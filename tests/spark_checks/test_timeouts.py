"""A Spark test that runs out of time ends its worker (tests/spark_checks/conftest.py).

That it then fails alone, and the next test of its module still runs, is
tests/unit/test_xdist_scheduling.py's.
"""

from __future__ import annotations

import pytest

from tests.spark_checks.conftest import SPARK_TIMEOUT


def test_a_spark_test_times_out_by_the_thread_method_at_the_spark_limit(
    request: pytest.FixtureRequest,
) -> None:
    marker = request.node.get_closest_marker("timeout")
    assert marker is not None
    assert (marker.args, marker.kwargs) == ((SPARK_TIMEOUT,), {"method": "thread"})


@pytest.mark.timeout(30)
def test_a_limit_a_spark_test_sets_itself_is_kept_with_the_thread_method(
    request: pytest.FixtureRequest,
) -> None:
    marker = request.node.get_closest_marker("timeout")
    assert marker is not None
    assert (marker.args, marker.kwargs) == ((30,), {"method": "thread"})
