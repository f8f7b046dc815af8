"""Schema helpers the registry's tests share."""

from __future__ import annotations

import uuid
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory


def order_message_class() -> Any:
    """A Protobuf message class built at run time (no protoc here): shop.Order {int64 id, string item},
    in a file of a unique name (so several can live in one process)."""
    fdp = descriptor_pb2.FileDescriptorProto(name=f"order_{uuid.uuid4().hex[:6]}.proto", package="shop",
                                             syntax="proto3")
    m = fdp.message_type.add(name="Order")
    F = descriptor_pb2.FieldDescriptorProto
    m.field.add(name="id", number=1, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    m.field.add(name="item", number=2, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Order"))
