"""The read schema of a typed read, built once on the driver from the brokers' schema registry:
every version of the subject (`<topic>-value` by default), each as columns, merged by field
identity (`typed_schema.merge`)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from memq.client.schemas import SchemaClient, subject_path
from memq.config import MemqConfig
from memq.errors import ConfigError, SchemaError
from memq.schema.protobuf_rules import parse as parse_protobuf
from spark_source.typed_schema import Struct, avro_columns, json_columns, merge, protobuf_columns, renames
from spark_source.typed_values import ReadSchema, Writer


def read_schema(config: MemqConfig, brokers: str, subject: str) -> ReadSchema:
    """The merge of `subject`'s registered versions, asked of `brokers` (else producer.brokers)."""
    urls = brokers or config.producer.brokers
    if not urls:
        raise ConfigError("memq source: valueFormat=registry needs the registry's brokers: "
                          "option memq.broker, or producer.brokers in memq.config")
    client = SchemaClient(dataclasses.replace(config.producer, brokers=urls))
    path = f"/subjects/{subject_path(subject)}/versions"
    versions: list[tuple[int, str, str, tuple[str, ...]]] = []   # id, kind, text, named
    version_of: dict[int, int] = {}
    for v in client.call("GET", path):
        answer = client.call("GET", f"{path}/{v}")
        kind = answer.get("schemaType", "AVRO")
        text = answer["schema"]
        if kind == "PROTOBUF":
            text = client.call("GET", f"/schemas/ids/{answer['id']}", format="serialized")["schema"]
        versions.append((int(answer["id"]), kind, text, _named(client, answer) if kind == "AVRO" else ()))
        version_of[int(answer["id"])] = int(v)
    structs: dict[int, Struct] = {}
    unusable: dict[int, str] = {}        # a version with no column types: left out, as an incompatible one
    for sid, kind, text, named in versions:
        try:
            structs[sid] = _columns(kind, text, named)
        except SchemaError as e:
            unusable[sid] = str(e)
    merged = merge(list(structs.items()))
    writers = {sid: Writer(sid, kind, text, renames(merged.root, structs[sid]), named)
               for sid, kind, text, named in versions if sid in structs and sid not in merged.rejected}
    return ReadSchema(subject, merged.root, writers, {**unusable, **merged.rejected}, version_of)


def _named(client: SchemaClient, answer: dict[str, Any]) -> tuple[str, ...]:
    """An Avro schema's references' texts, each one's own references first."""
    out: list[str] = []
    for ref in answer.get("references", []):
        found = client.call("GET", f"/subjects/{subject_path(ref['subject'])}/versions/{ref['version']}")
        out += [t for t in _named(client, found) if t not in out]
        out.append(found["schema"])
    return tuple(out)


def _columns(kind: str, text: str, named: tuple[str, ...]) -> Struct:
    if kind == "AVRO":
        known: dict[str, Any] = {}
        for t in named:
            raw = json.loads(t)
            known[f"{raw.get('namespace', '')}.{raw['name']}".strip(".")] = raw
        return avro_columns(text, known)
    if kind == "JSON":
        return json_columns(text)
    schema = parse_protobuf(text)
    first = next(iter(schema.pool().FindFileByName(schema.name).message_types_by_name.values()))
    return protobuf_columns(first)
