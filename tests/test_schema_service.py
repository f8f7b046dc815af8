"""memq.schema.service over both stores (memory, and ZooKeeper of the dev cluster): Confluent's
answers and error codes for subjects, versions, deletes, references, config and modes, and ids
that stay unique and stable when brokers register at once."""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from memq.devcluster import DevCluster
from memq.errors import SchemaError
from memq.governor.registry import Registry
from memq.schema.model import guid_of, id_of_guid
from memq.schema.service import SchemaRegistry
from memq.schema.store import MemorySchemaStore, SchemaStore, ZooKeeperSchemaStore


def rec(*fields: str, name: str = "User") -> dict:
    return {"schema": json.dumps({"type": "record", "name": name, "fields": [
        {"name": f.rstrip("?"), "type": "string", **({"default": ""} if f.endswith("?") else {})} for f in fields]})}


def code(call, *args, **kw) -> int:   # type: ignore[no-untyped-def]
    with pytest.raises(SchemaError) as e:
        call(*args, **kw)
    return e.value.code


@pytest.fixture(scope="module")
def zk_registry(devcluster: DevCluster) -> Iterator[Registry]:
    config = devcluster.config(cluster=f"schemazk{uuid.uuid4().hex[:6]}")
    with Registry(dataclasses.replace(config.zookeeper, enabled=True), config.cluster.name) as r:
        yield r


@pytest.fixture(params=["memory", "zookeeper"])
def store(request: pytest.FixtureRequest) -> SchemaStore:
    if request.param == "memory":
        return MemorySchemaStore()
    zk: Registry = request.getfixturevalue("zk_registry")
    s = ZooKeeperSchemaStore(zk)
    for name in s.subjects():   # a fresh registry per test: forget the previous test's subjects
        s.write_subject(name, None, s.subject(name)[1])
    for kind in ("config", "mode"):
        s.set_setting(kind, None, None)
    return s


def test_register_lookup_and_versions(store: SchemaStore) -> None:
    reg = SchemaRegistry(store)
    s = f"orders-{uuid.uuid4().hex[:6]}"
    first = reg.register(s, rec("a"))["id"]
    assert reg.register(s, {"schema": json.dumps(json.loads(rec("a")["schema"]), indent=2)})["id"] == first
    assert reg.register(f"{s}-copy", rec("a"))["id"] == first       # one schema, one id, any subject
    assert reg.versions(s) == [1]
    e = pytest.raises(SchemaError, reg.register, s, rec("a", "b")).value   # BACKWARD: b has no default
    assert e.code == 409 and "READER_FIELD_MISSING_DEFAULT_VALUE" in str(e) and "{oldSchemaVersion: 1}" in str(e)
    second = reg.register(s, rec("a", "b?"))["id"]
    assert second > first and reg.versions(s) == [1, 2]
    latest = reg.version(s, -1)
    assert (latest["version"], latest["id"], latest["subject"]) == (2, second, s) and "schemaType" not in latest
    assert reg.lookup(s, rec("a"))["version"] == 1
    assert code(reg.lookup, s, rec("zzz")) == 40403
    assert code(reg.lookup, "nosuch", rec("a")) == 40401
    assert code(reg.version, s, 9) == 40402 and code(reg.version, "nosuch", 1) == 40401
    assert reg.schema_by_id(first) == {"schema": json.dumps(json.loads(rec("a")["schema"]), separators=(",", ":"))}
    assert code(reg.schema_by_id, 10**6) == 40403
    assert sorted(reg.subjects_of_id(first)) == sorted([s, f"{s}-copy"])
    assert {"subject": s, "version": 1} in reg.versions_of_id(first)
    assert s in reg.subjects(prefix="orders-") and reg.subjects(prefix="nope") == []
    assert reg.check(s, None, rec("a", "b", "c"), verbose=True)["is_compatible"] is False
    assert reg.check(s, 1, rec("a", "b?"), verbose=True) == {"is_compatible": True, "messages": []}
    assert code(reg.register, s, {"schema": "{not json"}) == 42201
    assert code(reg.register, s, {"schema": "{}", "schemaType": "XML"}) == 422


def test_a_guid_names_its_id_in_its_cluster_only(store: SchemaStore) -> None:
    reg, other = SchemaRegistry(store, cluster="east"), SchemaRegistry(store, cluster="west")
    answer = reg.register(f"g-{uuid.uuid4().hex[:6]}", rec("a"))
    guid = answer["guid"]
    assert uuid.UUID(guid).version == 8 and guid == guid_of("east", answer["id"])
    assert reg.schema_by_guid(guid) == {"id": answer["id"], "guid": guid, **reg.schema_by_id(answer["id"])}
    assert code(other.schema_by_guid, guid) == 40403            # another cluster's GUID
    assert code(reg.schema_by_guid, str(uuid.uuid4())) == 40403 and code(reg.schema_by_guid, "not-a-guid") == 40403
    assert {id_of_guid("east", guid_of("east", i)) for i in (1, 2**40, 2**62 - 1)} == {1, 2**40, 2**62 - 1}


def test_deletes_soft_then_permanent(store: SchemaStore) -> None:
    reg = SchemaRegistry(store)
    s = f"del-{uuid.uuid4().hex[:6]}"
    one = reg.register(s, rec("a"))["id"]
    reg.register(s, rec("a", "b?"))
    assert code(reg.delete_version, s, 1, permanent=True) == 40407   # soft first
    assert reg.delete_version(s, 1) == 1
    assert code(reg.delete_version, s, 1) == 40406
    assert reg.versions(s) == [2] and reg.versions(s, deleted=True) == [1, 2]
    assert reg.delete_version(s, 1, permanent=True) == 1
    assert reg.versions(s, deleted=True) == [2]
    assert code(reg.delete_subject, s, permanent=True) == 40405
    assert reg.delete_subject(s) == [2]
    assert code(reg.delete_subject, s) == 40404
    assert s not in reg.subjects() and s in reg.subjects(deleted=True)
    assert reg.delete_subject(s, permanent=True) == [2]
    assert code(reg.versions, s) == 40401
    assert reg.schema_by_id(one)["schema"]                               # an id names its schema for good
    assert reg.register(s, rec("a"))["id"] == one and reg.versions(s) == [1]


def test_references_and_referenced_by(store: SchemaStore) -> None:
    reg = SchemaRegistry(store)
    addr, user = f"addr-{uuid.uuid4().hex[:6]}", f"user-{uuid.uuid4().hex[:6]}"
    reg.register(addr, {"schema": json.dumps({"type": "record", "name": "Address", "namespace": "ex",
                                              "fields": [{"name": "city", "type": "string"}]})})
    body = {"schema": json.dumps({"type": "record", "name": "User", "namespace": "ex",
                                  "fields": [{"name": "home", "type": "Address"}]}),
            "references": [{"name": "ex.Address", "subject": addr, "version": 1}]}
    uid = reg.register(user, body)["id"]
    assert reg.schema_by_id(uid)["references"] == body["references"]
    assert reg.referenced_by(addr, 1) == [uid]
    assert code(reg.delete_subject, addr) == 42206
    assert code(reg.register, user, {**body, "references": []}) == 42201   # Address undefined without it


def test_config_modes_and_import(store: SchemaStore) -> None:
    reg = SchemaRegistry(store)
    s = f"cfg-{uuid.uuid4().hex[:6]}"
    assert reg.get_config(None) == {"compatibilityLevel": "BACKWARD"}
    assert code(reg.get_config, s) == 40408
    assert reg.get_config(s, default_to_global=True) == {"compatibilityLevel": "BACKWARD"}
    assert reg.set_config(s, {"compatibility": "none"}) == {"compatibility": "NONE"}
    assert code(reg.set_config, s, {"compatibility": "SIDEWAYS"}) == 42203
    reg.register(s, rec("a"))
    reg.register(s, rec("x", "y"))                                          # NONE: anything goes
    assert reg.get_config(s) == {"compatibilityLevel": "NONE"}
    assert code(reg.get_mode, s) == 40409 and reg.get_mode(None) == {"mode": "READWRITE"}
    assert reg.set_mode(s, {"mode": "READONLY"}) == {"mode": "READONLY"}
    assert code(reg.register, s, rec("q")) == 42205
    assert code(reg.set_mode, s, {"mode": "IMPORT"}) == 42205              # it has versions: force it
    reg.set_mode(s, {"mode": "IMPORT"}, force=True)
    imported = reg.register(s, {**rec("imported"), "id": 5000, "version": 10})["id"]
    assert imported == 5000 and reg.version(s, -1)["version"] == 10
    assert code(reg.register, s, {**rec("other"), "id": 5000}) == 42207   # the id names another schema
    reg.delete_mode(s)
    assert code(reg.register, s, {**rec("again"), "id": 6000}) == 42205   # ids only in IMPORT mode
    assert reg.register(f"{s}-next", rec("fresh"))["id"] > 5000             # the counter went past it


def test_brokers_registering_at_once_never_share_an_id(store: SchemaStore, request: pytest.FixtureRequest) -> None:
    """Two brokers (two services; with ZooKeeper two sessions) register 40 schemas at once, half of
    them the same schemas under other subjects: every distinct schema one id, no id twice."""
    stores = [store]
    if isinstance(store, ZooKeeperSchemaStore):
        zk = request.getfixturevalue("zk_registry")
        other = Registry(zk.zk, zk.base.rpartition("/")[2]).start()
        request.addfinalizer(other.close)
        stores.append(ZooKeeperSchemaStore(other))
    else:
        stores.append(store)
    regs = [SchemaRegistry(s) for s in stores]
    tag = uuid.uuid4().hex[:6]

    def one(i: int) -> tuple[str, int]:
        schema = rec(f"f{i % 20}", name=f"R{tag}")
        return schema["schema"], regs[i % 2].register(f"race-{tag}-{i}", schema)["id"]

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(one, range(40)))
    by_text: dict[str, set[int]] = {}
    for text, i in got:
        by_text.setdefault(text, set()).add(i)
    assert all(len(ids) == 1 for ids in by_text.values()), by_text
    assert len({i for ids in by_text.values() for i in ids}) == 20


def test_protobuf_registered_as_text_is_served_as_a_descriptor_too(store: SchemaStore) -> None:
    reg = SchemaRegistry(store)
    s = f"pb-{uuid.uuid4().hex[:6]}"
    text = 'syntax = "proto3";\npackage shop;\nmessage Order { int64 id = 1; string item = 2; }\n'
    sid = reg.register(s, {"schema": text, "schemaType": "PROTOBUF"})["id"]
    assert reg.schema_by_id(sid) == {"schemaType": "PROTOBUF", "schema": text.strip()}
    serialized = reg.version(s, 1, fmt="serialized")["schema"]
    assert reg.register(f"{s}-b", {"schema": serialized, "schemaType": "PROTOBUF"})["id"] != sid   # another text
    changed = text.replace("string item = 2", "double item = 2")
    e = pytest.raises(SchemaError, reg.register, s, {"schema": changed, "schemaType": "PROTOBUF"}).value
    assert e.code == 409 and "FIELD_SCALAR_KIND_CHANGED" in str(e)
