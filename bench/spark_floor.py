"""The ceiling of any Python DataSource for `bench spark`: no I/O, no decoding.

Its tasks yield rows shaped like `bench.spark`'s (12-byte keys, 100-byte values, timestamps)
from one Arrow batch built once per Python worker, so a query on it costs only what Spark
spends around a Python source: planning through a Python worker, task launch, Arrow batches
handed to the JVM and turned into rows. Imported only where Spark runs (it needs pyspark).
"""

from __future__ import annotations

import random
from array import array
from functools import lru_cache
from typing import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from bench.spark import READ_COLUMNS, READ_SCHEMA

FLOOR_BATCH_ROWS = 20_000


@lru_cache(maxsize=1)
def _floor_batch() -> pa.RecordBatch:
    """A batch shaped like `bench.spark._records`' rows (12-byte keys, 100-byte values), built once per worker."""
    n = FLOOR_BATCH_ROWS
    values = pa.py_buffer(random.Random(1).randbytes(100 * n))
    keys = pa.py_buffer(b"".join(b"key-%08d" % i for i in range(n)))
    offsets = [pa.py_buffer(array("i", range(0, (n + 1) * width, width))) for width in (12, 100)]
    return pa.RecordBatch.from_arrays(
        [pa.Array.from_buffers(pa.binary(), n, [None, offsets[0], keys]),
         pa.Array.from_buffers(pa.binary(), n, [None, offsets[1], values]),
         pa.array(range(1_700_000_000_000_000, 1_700_000_000_000_000 + n * 1000, 1000), pa.timestamp("us", "UTC"))],
        names=list(READ_COLUMNS))


class _FloorPartition(InputPartition):
    def __init__(self, batches: int) -> None:
        super().__init__(batches)
        self.batches = batches


class _FloorReader(DataSourceReader):
    def __init__(self, rows: int, tasks: int) -> None:
        self.rows, self.tasks = rows, tasks

    def partitions(self) -> list[InputPartition]:
        n = self.rows // FLOOR_BATCH_ROWS
        return [_FloorPartition(n // self.tasks + (t < n % self.tasks)) for t in range(self.tasks)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _FloorPartition)
        batch = _floor_batch()
        for _ in range(partition.batches):
            yield batch


class FloorDataSource(DataSource):
    """`spark.read.format("memq-bench-floor")`: the no-work Python DataSource (see the module doc)."""

    @classmethod
    def name(cls) -> str:
        return "memq-bench-floor"

    def schema(self) -> str:
        return READ_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return _FloorReader(int(self.options["rows"]), int(self.options["tasks"]))
