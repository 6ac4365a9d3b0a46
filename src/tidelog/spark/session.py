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
) -> Any:
    """Start (or return) this process's SparkSession with the tidelog source registered."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    warnings.filterwarnings("ignore", category=FutureWarning)
    from pyspark.sql import SparkSession

    from tidelog.spark.source import TidelogDataSource

    log4j = Path(tempfile.gettempdir()) / "tidelog-spark-log4j2.properties"
    log4j.write_text(LOG4J)
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{log4j}",
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
