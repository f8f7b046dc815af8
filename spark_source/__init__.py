"""Spark DataSource "memq": read a memq topic as a table, batch or streaming.

    from spark_source import local_session
    spark = local_session()                      # or: register(existing_session)
    df = spark.read.format("memq").option("topic", "events").option("memq.broker", url).load()
"""

from spark_source.datasource import MemqDataSource
from spark_source.schema import MESSAGE_ID_COLUMNS, SCHEMA
from spark_source.session import local_session, register

__all__ = ["MESSAGE_ID_COLUMNS", "MemqDataSource", "SCHEMA", "local_session", "register"]
