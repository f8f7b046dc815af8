"""Values framed as Confluent's serializers frame them, with schemas from the brokers' registry:
for memq's Producer (`Serde.serializer(subject, schema)` gives `value -> bytes`) and Consumer
(`Serde.decode(record.value)` gives the value back), interchangeable with confluent-kafka's
serializers on the same topics.

Framing: magic byte 0, the schema id (4 bytes, big-endian), for Protobuf the message indexes
(`0`: the file's first message), then the payload: Avro's binary encoding (fastavro), JSON text,
or the Protobuf message. Ids and schemas are cached (an id never changes meaning).
"""

from __future__ import annotations

import base64
import io
import json
import threading
from collections.abc import Callable
from typing import Any

import fastavro
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory

from memq.config import ProducerConfig
from memq.errors import InvalidInputError

from .schemas import SchemaClient, subject_path

MAGIC = b"\0"


class Serde:
    def __init__(self, pc: ProducerConfig, *, client: SchemaClient | None = None) -> None:
        self._client = client or SchemaClient(pc)
        self._lock = threading.Lock()
        self._readers: dict[int, Callable[[memoryview], Any]] = {}

    def serializer(self, subject: str, schema: str, schema_type: str = "AVRO", *,
                   register: bool = True) -> Callable[[Any], bytes]:
        """`value -> framed bytes` with `schema` (registered under `subject` if `register`, else
        looked up there). AVRO and JSON take plain values; PROTOBUF takes a message of the schema's
        first message type (its `schema` a base64 FileDescriptorProto or a .proto text)."""
        body = {"schema": schema, "schemaType": schema_type}
        path = f"/subjects/{subject_path(subject)}" + ("/versions" if register else "")
        head = MAGIC + int(self._client.call("POST", path, body)["id"]).to_bytes(4, "big")
        if schema_type == "AVRO":
            parsed = fastavro.parse_schema(json.loads(schema))

            def avro(value: Any) -> bytes:
                buf = io.BytesIO()
                buf.write(head)
                fastavro.schemaless_writer(buf, parsed, value)
                return buf.getvalue()
            return avro
        if schema_type == "JSON":
            return lambda value: head + json.dumps(value, separators=(",", ":")).encode()
        if schema_type == "PROTOBUF":
            return lambda message: head + b"\0" + message.SerializeToString()
        raise InvalidInputError(f"schema type {schema_type!r}: AVRO, JSON or PROTOBUF")

    def decode(self, data: bytes | memoryview) -> Any:
        """The value a framed key or value holds: Avro and JSON as Python values, Protobuf as a
        dict (protobuf's JSON mapping); InvalidInputError when it is not framed."""
        view = memoryview(data)
        if len(view) < 5 or view[0] != 0:
            raise InvalidInputError("not a framed value: no magic byte 0 and schema id")
        return self._reader(int.from_bytes(view[1:5], "big"))(view[5:])

    def _reader(self, schema_id: int) -> Callable[[memoryview], Any]:
        with self._lock:
            reader = self._readers.get(schema_id)
        if reader is None:
            reader = self._make_reader(schema_id)
            with self._lock:
                self._readers[schema_id] = reader
        return reader

    def _make_reader(self, schema_id: int) -> Callable[[memoryview], Any]:
        answer = self._client.call("GET", f"/schemas/ids/{schema_id}", format="serialized")
        kind = answer.get("schemaType", "AVRO")
        if kind == "AVRO":
            named: dict[str, Any] = {}
            for ref in answer.get("references", []):
                ref_schema = self._client.call("GET", f"/subjects/{subject_path(ref['subject'])}/versions/"
                                                      f"{ref['version']}")["schema"]
                fastavro.parse_schema(json.loads(ref_schema), named_schemas=named)
            parsed = fastavro.parse_schema(json.loads(answer["schema"]), named_schemas=named)
            return lambda payload: fastavro.schemaless_reader(io.BytesIO(payload), parsed, None)
        if kind == "JSON":
            return lambda payload: json.loads(payload.tobytes())
        fdp = descriptor_pb2.FileDescriptorProto()
        fdp.ParseFromString(base64.standard_b64decode(answer["schema"]))
        pool = descriptor_pool.DescriptorPool()
        pool.Add(fdp)
        top = list(pool.FindFileByName(fdp.name).message_types_by_name.values())

        def protobuf(payload: memoryview) -> Any:
            count, rest = payload[0], payload[1:]
            if count != 0:   # message indexes other than the first message: zig-zag count, then each
                raise InvalidInputError("only a schema's first message is decoded here")
            cls = message_factory.GetMessageClass(top[0])
            return json_format.MessageToDict(cls.FromString(rest.tobytes()), preserving_proto_field_name=True)
        return protobuf
