"""One Spark session for all the Spark tests (starting one costs ~15 s).

``local[2]`` with few shuffle partitions: the histories here are small, and
CI machines have two cores.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from bkref.spark_checks.session import session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    s = session("local[2]", app="bkref tests", shuffle_partitions=2)
    yield s
    s.stop()
