"""The Spark session of the jobs: local[*] by default, any master by URL.

Workers must run the same Python as the driver (they import pandas, pyarrow
and, for the generic checker, ``linearizability``), so ``PYSPARK_PYTHON`` and
``PYSPARK_DRIVER_PYTHON`` default to this interpreter. Spark's logs are quiet
(errors only) unless ``verbose``; the jobs print their own progress lines.
Under ``spark-submit`` the master comes from spark-submit, not from here.
"""

from __future__ import annotations

import os
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_MASTER: Final = "local[*]"

_LOG4J: Final = """\
rootLogger.level = {level}
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{HH:mm:ss}} %p %c{{1}}: %m%n
logger.netty.name = org.apache.spark.network
logger.netty.level = error
"""


def python_env() -> None:
    """Point Spark's Python workers at this interpreter unless already set."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def _log_config(verbose: bool) -> Path:
    level = "warn" if verbose else "error"
    path = Path(tempfile.gettempdir()) / f"bkref-spark-log4j2-{level}.properties"
    text = _LOG4J.format(level=level)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


def under_spark_submit() -> bool:
    """spark-submit starts the JVM first and hands Python its gateway."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def _project_zip() -> Path:
    """linearizability and spec as one zip for the executors of a real cluster."""
    root = Path(__file__).resolve().parents[1]
    out = Path(tempfile.gettempdir()) / f"bkref-pyfiles-{os.getpid()}.zip"
    with zipfile.ZipFile(out, "w") as z:
        for package in ("linearizability", "spec"):
            for f in sorted((root / package).rglob("*.py")):
                z.write(f, f.relative_to(root))
    return out


def session(
    master: str | None = None,
    *,
    app: str = "bkref spark-check",
    verbose: bool = False,
    shuffle_partitions: int | None = None,
    progress_bar: bool = False,
) -> SparkSession:
    """A SparkSession: ``master`` (default local[*]; spark-submit's own when under it)."""
    python_env()
    from pyspark.sql import SparkSession

    log = _log_config(verbose)
    b = SparkSession.builder.appName(app)
    if master is not None or not under_spark_submit():
        b = b.master(master or DEFAULT_MASTER)
    java = f"-Dlog4j2.configurationFile=file:{log}"
    is_local = (master or DEFAULT_MASTER).startswith("local")
    partitions = shuffle_partitions or (max(4, 2 * (os.cpu_count() or 1)) if is_local else 200)
    b = (
        b.config("spark.driver.extraJavaOptions", java)
        .config("spark.executor.extraJavaOptions", java)
        .config("spark.ui.showConsoleProgress", "true" if progress_bar else "false")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(partitions))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.driver.memory", os.environ.get("BKREF_SPARK_DRIVER_MEMORY", "2g"))
    )
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("WARN" if verbose else "ERROR")
    if not is_local and not under_spark_submit():
        spark.sparkContext.addPyFile(str(_project_zip()))
    return spark
