"""A local SparkSession set up the way tidelog's jobs and tests need it: workers run this
virtualenv's interpreter, everything binds to 127.0.0.1, logs are quiet, and the "tidelog"
data source is registered (registration is per session)."""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

LOG4J = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


def local_spark(
    app_name: str = "tidelog",
    master: str = "local[2]",
    config: dict[str, str] | None = None,
    local_dir: Path | None = None,
) -> Any:
    """Start (or return) this process's SparkSession with the tidelog source registered.
    Spark's scratch files (block manager, shuffle, the driver JVM's temp files) go under
    local_dir, by default the temp directory ($TMPDIR or /tmp): a driver that is killed leaves
    them there, so a job (or a test) that may be killed gives each run a directory of its own."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    warnings.filterwarnings("ignore", category=FutureWarning)
    from pyspark.sql import SparkSession

    from tidelog.spark.source import TidelogDataSource

    scratch = Path(local_dir) if local_dir is not None else Path(tempfile.gettempdir())
    scratch.mkdir(parents=True, exist_ok=True)
    log4j = scratch / "tidelog-spark-log4j2.properties"
    log4j.write_text(LOG4J)
    settings = {
        "spark.local.dir": str(scratch),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.extraJavaOptions": (
            f"-Dlog4j2.configurationFile=file:{log4j} -Djava.io.tmpdir={scratch}"
        ),
        "spark.sql.shuffle.partitions": "4",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
        **(config or {}),
    }
    builder = SparkSession.builder.appName(app_name).master(master)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.dataSource.register(TidelogDataSource)
    return spark


def spark_session(
    app_name: str = "tidelog",
    master: str = "local[2]",
    config: dict[str, str] | None = None,
    local_dir: Path | None = None,
) -> Any:
    """local_spark, or a session on a Spark cluster (`spark://HOST:PORT`: executors in their
    own JVMs and Python workers on the cluster's machines, running this interpreter), or over
    Spark Connect (`sc://HOST:PORT`: the tidelog source is registered with the server, and its
    Python workers run the server's interpreter)."""
    if master.startswith("sc://"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        warnings.filterwarnings("ignore", category=FutureWarning)
        from pyspark.sql import SparkSession

        from tidelog.spark.source import TidelogDataSource

        spark = SparkSession.builder.remote(master).getOrCreate()
        for key, value in {"spark.sql.session.timeZone": "UTC", **(config or {})}.items():
            spark.conf.set(key, value)
        spark.dataSource.register(TidelogDataSource)
        return spark
    settings = dict(config or {})
    if not master.startswith("local"):
        settings.setdefault("spark.pyspark.python", sys.executable)
        settings.setdefault("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
    return local_spark(app_name, master, settings, local_dir)
