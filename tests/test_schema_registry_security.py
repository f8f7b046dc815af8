"""The registry door behind memq's security: reading needs an authenticated principal; a change
needs `admin` on its subject (`subject:` / `subject-prefix:` rules) or, for the global config and
mode, on the cluster; a refusal is Confluent's 403 (40301). Subject rules stay out of Kafka's ACL
calls. One in-process broker (its registry in memory: no ZooKeeper)."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import aiohttp
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient

from memq.config import AuditConfig, SecurityConfig
from memq.devcluster import DevCluster
from memq.security.acl import parse_rule
from memq.security.kafka_acl import bindings_of
from memq.security.tokens import new_token
from tests.support.cluster import running_broker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ALICE, ALICE_ENTRY = new_token("alice")
ADMIN, ADMIN_ENTRY = new_token("root")
SCHEMA = {"schema": json.dumps({"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]})}


def test_subject_rules_parse_and_are_no_kafka_binding() -> None:
    rule = parse_rule("allow alice admin subject-prefix:orders-")
    assert str(rule) == "allow alice admin subject-prefix:orders-" and bindings_of(rule) == ()


async def test_reads_need_a_principal_changes_need_admin_on_the_subject(devcluster: DevCluster) -> None:
    config = dataclasses.replace(
        devcluster.config(), audit=AuditConfig(enabled=False),
        security=SecurityConfig(enabled=True, tokens=(str(ALICE_ENTRY), str(ADMIN_ENTRY)),
                                acls=("allow alice admin subject-prefix:orders-", "allow root admin prefix:")))
    async with running_broker(config) as broker, aiohttp.ClientSession() as http:
        async def call(method: str, path: str, token: str | None, body: object = None) -> tuple[int, object]:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            async with http.request(method, broker.url + path, json=body, headers=headers) as r:
                return r.status, (await r.json() if r.status != 401 else None)

        assert (await call("GET", "/subjects", None))[0] == 401
        assert await call("GET", "/subjects", ALICE) == (200, [])
        status, body = await call("POST", "/subjects/orders-value/versions", ALICE, SCHEMA)
        assert status == 200 and isinstance(body, dict) and body["id"] >= 1
        status, body = await call("POST", "/subjects/payments-value/versions", ALICE, SCHEMA)
        assert (status, body) == (403, {"error_code": 40301,
                                        "message": "principal alice may not admin subject payments-value"})
        assert (await call("PUT", "/config", ALICE, {"compatibility": "NONE"}))[0] == 403
        assert (await call("PUT", "/config/orders-value", ALICE, {"compatibility": "NONE"}))[0] == 200
        assert (await call("PUT", "/config", ADMIN, {"compatibility": "FULL"}))[0] == 200   # prefix:"" covers the cluster
        assert (await call("GET", "/subjects/orders-value/versions/latest", ALICE))[0] == 200
        client = SchemaRegistryClient({"url": broker.url, "bearer.auth.credentials.source": "STATIC_TOKEN",
                                       "bearer.auth.token": ALICE, "bearer.auth.logical.cluster": "memq"})
        assert await asyncio.to_thread(client.get_subjects) == ["orders-value"]
