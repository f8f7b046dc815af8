"""A local SparkSession that can run the memq source, however Python was started.

Spark's Python workers must run the interpreter that has memq installed, so the worker
Python is pinned to `sys.executable` (the venv need not be activated), and Spark binds
to loopback so a laptop's or CI box's network setup does not matter.
"""

from __future__ import annotations

import os
import sys
from typing import Mapping

from pyspark.sql import SparkSession

from spark_source.datasource import MemqDataSource


def register(spark: SparkSession) -> None:
    """Register the "memq" format, with the filter pushdown its batch reader uses."""
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    spark.dataSource.register(MemqDataSource)


def local_session(app_name: str = "memq", master: str = "local[2]",
                  conf: Mapping[str, str] | None = None) -> SparkSession:
    """A local SparkSession on 127.0.0.1 with "memq" registered; `conf` adds Spark settings."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.pyspark.python", sys.executable)
               .config("spark.pyspark.driver.python", sys.executable)
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "4")
               .config("spark.sql.session.timeZone", "UTC"))
    for k, v in (conf or {}).items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    register(spark)
    return spark
