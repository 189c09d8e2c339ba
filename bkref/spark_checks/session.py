"""The Spark session of the jobs: local[*] by default, any master by URL.

Workers must run the same Python as the driver (they import pandas, pyarrow
and, for the generic checker, ``linearizability``), so ``PYSPARK_PYTHON`` and
``PYSPARK_DRIVER_PYTHON`` default to this interpreter. Spark's logs are quiet
(errors only) unless ``verbose``; the jobs print their own progress lines.
Under ``spark-submit`` the master comes from spark-submit, not from here.
"""

from __future__ import annotations

import atexit
import os
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_MASTER: Final = "local[*]"
LOCAL_JAVA_OPTS: Final = "-XX:TieredStopAtLevel=1"
BIG_JAVA_OPTS: Final = "-XX:+UseParallelGC"
BIG_INPUT: Final = 32 << 20  # bytes of history from which a local session is sized up

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
    """bkref's spark_checks, linearizability and spec as one zip for the executors
    of a real cluster. spark_checks is in it because the generic checker's
    applyInPandas function is pickled by reference to
    ``bkref.spark_checks.generic``: without it executors fail to unpickle it."""
    root = Path(__file__).resolve().parents[2]
    out = Path(tempfile.gettempdir()) / f"bkref-pyfiles-{os.getpid()}.zip"
    # The driver serves it to executors while the application runs; removed at exit.
    atexit.register(out.unlink, missing_ok=True)
    with zipfile.ZipFile(out, "w") as z:
        z.write(root / "bkref" / "__init__.py", "bkref/__init__.py")
        for package in ("spark_checks", "linearizability", "spec"):
            for f in sorted((root / "bkref" / package).rglob("*.py")):
                z.write(f, f.relative_to(root))
    return out


def jvm_log() -> Path:
    """Where a quiet session's JVM writes its stderr (launcher and log4j output)."""
    return Path(tempfile.gettempdir()) / f"bkref-spark-{os.getpid()}.log"


def _start(builder: SparkSession.Builder, verbose: bool) -> SparkSession:
    """getOrCreate; unless verbose, the JVM it launches gets a log file as its
    stderr (its start-up notices would otherwise precede every run)."""
    from pyspark import SparkContext

    if verbose or under_spark_submit() or SparkContext._active_spark_context is not None:
        spark: SparkSession = builder.getOrCreate()
        return spark
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(jvm_log(), "ab") as log:
            os.dup2(log.fileno(), 2)
            spark = builder.getOrCreate()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    return spark


def input_bytes(path: Path) -> int:
    """The size of a history on disk (a file, or the files of a directory)."""
    if path.is_file():
        return path.stat().st_size
    if path.is_dir():
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    return 0


def session(
    master: str | None = None,
    *,
    app: str = "bkref spark-check",
    verbose: bool = False,
    shuffle_partitions: int | None = None,
    progress_bar: bool = False,
    input_bytes: int = 0,
) -> SparkSession:
    """A SparkSession: ``master`` (default local[*]; spark-submit's own when under it).
    ``input_bytes``, the size of the history, sizes a local session's JVM, memory
    and shuffle partitions (it must be known before the JVM starts)."""
    python_env()
    from pyspark.sql import SparkSession

    log = _log_config(verbose)
    b = SparkSession.builder.appName(app)
    if master is not None or not under_spark_submit():
        b = b.master(master or DEFAULT_MASTER)
    is_local = (master or DEFAULT_MASTER).startswith("local")
    big = input_bytes >= BIG_INPUT
    # Local runs on small histories are short-lived JVMs on few cores: the
    # client JIT alone (C1) starts the jobs about twice as fast. On big ones
    # the optimising JIT (C2) pays back: the checks run about twice as fast,
    # and the parallel collector suits a batch job. BKREF_SPARK_JAVA_OPTS overrides.
    local_opts = BIG_JAVA_OPTS if big else LOCAL_JAVA_OPTS
    jvm = os.environ.get("BKREF_SPARK_JAVA_OPTS", local_opts if is_local else "")
    java = f"-Dlog4j2.configurationFile=file:{log} {jvm}".strip()
    cores = os.cpu_count() or 1
    # Shuffle partitions: about 16 MB of compressed history each, so that a
    # task's sort fits in memory (adaptive execution merges small ones).
    by_size = input_bytes // (16 << 20)
    partitions = shuffle_partitions or (
        max(4, 2 * cores, min(by_size, 1000)) if is_local else max(200, min(by_size, 10_000))
    )
    memory = os.environ.get("BKREF_SPARK_DRIVER_MEMORY", "6g" if big else "2g")
    b = (
        b.config("spark.driver.extraJavaOptions", java)
        .config("spark.executor.extraJavaOptions", java)
        .config("spark.ui.showConsoleProgress", "true" if progress_bar else "false")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(partitions))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.driver.memory", memory)
        # a ledger's entries are one window partition: keep up to 2^20 rows
        # in memory before the buffer turns to a spilling sorter (default 4096)
        .config("spark.sql.windowExec.buffer.in.memory.threshold", str(1 << 20))
        # Sort-based aggregation for collect_list: the per-entry rows are
        # sorted once by (ledger, entry), for the aggregation and the window
        # that follows it (the object-hash aggregate falls back to sorting
        # beyond 128 keys anyway, and the window then sorts again).
        .config("spark.sql.execution.useObjectHashAggregateExec", "false")
    )
    spark = _start(b, verbose)
    spark.sparkContext.setLogLevel("WARN" if verbose else "ERROR")
    if not is_local and not under_spark_submit():
        spark.sparkContext.addPyFile(str(_project_zip()))
    return spark
