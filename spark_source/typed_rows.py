"""A typed read's rows: an object's RecordBatch of raw columns with its values decoded into the
read schema's struct (`typed_values.decode_values`), and `onError` applied: `fail` raises
UndecodableRecordError naming the record, `null` keeps the row (value null, the reason in
`valueError`), `skip` drops it and logs how many were skipped (logger `memq.spark`)."""

from __future__ import annotations

import logging

import pyarrow as pa
import pyarrow.compute as pc

from memq.errors import UndecodableRecordError
from spark_source.options import SourceOptions
from spark_source.schema import ARROW_SCHEMA
from spark_source.typed_values import ReadSchema, decode_values

log = logging.getLogger("memq.spark")


def raw_columns(out: pa.Schema) -> pa.Schema:
    """The source columns a typed batch is built from: those `out` asks for, the raw value, the
    row's place (for naming a failing record)."""
    names = [n for n in out.names if n in ARROW_SCHEMA.names and n != "value"]
    names += [n for n in ("value", "partition", "offset", "index") if n not in names]
    return pa.schema([ARROW_SCHEMA.field(n) for n in names])


def typed_batch(opts: SourceOptions, read: ReadSchema, raw: pa.RecordBatch, out: pa.Schema) -> pa.RecordBatch:
    """`raw` (raw_columns(out)) as the typed columns of `out`."""
    decoded = decode_values(read, raw.column("value"))
    failed = pc.is_valid(decoded.error)
    bad = pc.sum(failed).as_py() or 0
    if bad and opts.on_error == "fail":
        i = pc.index(failed, True).as_py()
        row = {n: raw.column(n)[i].as_py() for n in ("partition", "offset", "index")}
        raise UndecodableRecordError(
            f"topic {opts.topic} partition {row['partition']} offset {row['offset']} index {row['index']}: "
            f"{decoded.error[i].as_py()} ({bad} such in this object; option onError=null or skip reads on)",
            topic=opts.topic, partition=row["partition"], offset=row["offset"], index=row["index"])
    built = {"value": decoded.value, "valueSchemaId": decoded.schema_id, "valueError": decoded.error,
             "rawValue": raw.column("value")}
    columns = [built[f.name] if f.name in built else raw.column(f.name) for f in out]
    batch = pa.RecordBatch.from_arrays([c if c.type == f.type else c.cast(f.type) for c, f in zip(columns, out)],
                                       schema=out)
    if bad and opts.on_error == "skip":
        log.warning("topic %s: skipped %d records whose values do not decode (onError=skip); first: %s",
                    opts.topic, bad, decoded.error[pc.index(failed, True).as_py()].as_py())
        return batch.filter(pc.invert(failed))
    return batch
