"""tidelog's PySpark data source and sink: `spark.dataSource.register(TidelogDataSource)`, then
`spark.read.format("tidelog")` / `writeStream.format("tidelog")` (tidelog/spark/source.py and
sink.py). PySpark is an optional dependency (`pip install 'tidelog[spark]'`): it is imported only
when TidelogDataSource is asked for."""

from __future__ import annotations

from typing import Any

__all__ = ["TidelogDataSource"]


def __getattr__(name: str) -> Any:
    if name == "TidelogDataSource":
        from tidelog.spark.source import TidelogDataSource

        return TidelogDataSource
    raise AttributeError(name)
