"""The schema registry door: Confluent's Schema Registry REST API on the broker's HTTP port.

Every broker serves it, and any broker takes writes: the answers come from the core's
`SchemaRegistry` (memq.schema.service) over the cluster's store, so a client pointed at any
broker (confluent-kafka's `SchemaRegistryClient`, its serializers and deserializers) sees the
same registry. Bodies go out as `application/vnd.schemaregistry.v1+json`; a refusal is
Confluent's `{"error_code": n, "message": "..."}` with the code's HTTP status (40401 -> 404,
409, 42201 -> 422, 50001 -> 500 when the store cannot answer). Each call runs in a thread
(the store blocks on ZooKeeper). Behind the broker's Guard: with security on, every call needs
an authenticated principal, and a change (register, delete, config, mode) `admin` on the subject
(`subject:NAME` or `subject-prefix:P` rules) or, for the global config and mode, on the cluster:
else Confluent's 403 `{"error_code": 40301}`, counted in the denials metric.

  GET    /schemas/types | /schemas | /schemas/ids/{id}[/schema|/subjects|/versions]
  GET    /subjects[?subjectPrefix&deleted] | /subjects/{s}/versions[/{v}[/schema|/referencedby]]
  POST   /subjects/{s}/versions[?normalize]  register      POST /subjects/{s}  look up
  DELETE /subjects/{s}[?permanent] | /subjects/{s}/versions/{v}[?permanent]
  POST   /compatibility/subjects/{s}/versions[/{v}][?verbose]
  GET|PUT|DELETE /config[/{s}][?defaultToGlobal]   GET|PUT|DELETE /mode[/{s}][?force]
  GET    /  /contexts
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import Counter

from memq.errors import MemqError, SchemaError
from memq.schema.model import STORE_ERROR, parse_version
from memq.schema.service import SchemaRegistry

from memq.security.acl import CLUSTER_RESOURCE, Operation

from ..guard import PRINCIPAL_KEY
from ..seam import BrokerCore

log = logging.getLogger(__name__)
CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
MAX_BODY_BYTES = 2 * 1024 * 1024
ID = "{id:-?[0-9]+}"

Call = Callable[[SchemaRegistry, web.Request, Any], Any]


def _flag(request: web.Request, name: str) -> bool:
    return request.query.get(name, "false").lower() == "true"


def _id(request: web.Request) -> int:
    return int(request.match_info["id"])


def _raw(registry: SchemaRegistry, schema_id: int) -> Any:
    """A schema's text as Confluent's `/schema` calls answer it: JSON formats as JSON, Protobuf as text."""
    s = registry.schema(schema_id)
    return s.text if s.schema_type == "PROTOBUF" else json.loads(s.text)


def _subject(request: web.Request) -> str:
    return request.match_info["subject"]


def _version(request: web.Request) -> int:
    return parse_version(request.match_info["version"])


# Who may call a route, with security on: any authenticated principal (READ), `admin` on the
# route's subject (SUBJECT: `subject:NAME` / `subject-prefix:P` rules), `admin` on the cluster (CLUSTER)
READ, SUBJECT, CLUSTER = "read", "subject", "cluster"

# (method, path, call, reads a body, who may call it) -- the table the door serves
ROUTES: list[tuple[str, str, Call, bool, str]] = [
    ("GET", "/", lambda r, q, b: {}, False, READ),
    ("GET", "/contexts", lambda r, q, b: ["."], False, READ),
    ("GET", "/schemas/types", lambda r, q, b: r.types(), False, READ),
    ("GET", "/schemas", lambda r, q, b: r.schemas(q.query.get("subjectPrefix", ""), _flag(q, "deleted"),
                                                  _flag(q, "latestOnly")), False, READ),
    ("GET", f"/schemas/ids/{ID}", lambda r, q, b: r.schema_by_id(_id(q), q.query.get("format")), False, READ),
    ("GET", "/schemas/guids/{guid}", lambda r, q, b: r.schema_by_guid(q.match_info["guid"], q.query.get("format")),
     False, READ),
    ("GET", f"/schemas/ids/{ID}/schema", lambda r, q, b: _raw(r, _id(q)), False, READ),
    ("GET", f"/schemas/ids/{ID}/subjects",
     lambda r, q, b: r.subjects_of_id(_id(q), _flag(q, "deleted")), False, READ),
    ("GET", f"/schemas/ids/{ID}/versions",
     lambda r, q, b: r.versions_of_id(_id(q), _flag(q, "deleted")), False, READ),
    ("GET", "/subjects",
     lambda r, q, b: r.subjects(q.query.get("subjectPrefix", ""), _flag(q, "deleted")), False, READ),
    ("POST", "/subjects/{subject}", lambda r, q, b: r.lookup(_subject(q), b, _flag(q, "normalize"),
                                                             _flag(q, "deleted")), True, READ),
    ("DELETE", "/subjects/{subject}",
     lambda r, q, b: r.delete_subject(_subject(q), _flag(q, "permanent")), False, SUBJECT),
    ("GET", "/subjects/{subject}/versions", lambda r, q, b: r.versions(_subject(q), _flag(q, "deleted")), False, READ),
    ("POST", "/subjects/{subject}/versions",
     lambda r, q, b: r.register(_subject(q), b, _flag(q, "normalize")), True, SUBJECT),
    ("GET", "/subjects/{subject}/versions/{version}", lambda r, q, b: r.version(
        _subject(q), _version(q), _flag(q, "deleted"), q.query.get("format")), False, READ),
    ("GET", "/subjects/{subject}/versions/{version}/schema",
     lambda r, q, b: _raw(r, r.version(_subject(q), _version(q), _flag(q, "deleted"))["id"]), False, READ),
    ("GET", "/subjects/{subject}/versions/{version}/referencedby",
     lambda r, q, b: r.referenced_by(_subject(q), _version(q)), False, READ),
    ("DELETE", "/subjects/{subject}/versions/{version}",
     lambda r, q, b: r.delete_version(_subject(q), _version(q), _flag(q, "permanent")), False, SUBJECT),
    ("POST", "/compatibility/subjects/{subject}/versions",
     lambda r, q, b: r.check(_subject(q), None, b, _flag(q, "verbose"), _flag(q, "normalize")), True, READ),
    ("POST", "/compatibility/subjects/{subject}/versions/{version}",
     lambda r, q, b: r.check(_subject(q), _version(q), b, _flag(q, "verbose"), _flag(q, "normalize")), True, READ),
    ("GET", "/config", lambda r, q, b: r.get_config(None), False, READ),
    ("PUT", "/config", lambda r, q, b: r.set_config(None, b), True, CLUSTER),
    ("DELETE", "/config", lambda r, q, b: r.delete_config(None), False, CLUSTER),
    ("GET", "/config/{subject}",
     lambda r, q, b: r.get_config(_subject(q), _flag(q, "defaultToGlobal")), False, READ),
    ("PUT", "/config/{subject}", lambda r, q, b: r.set_config(_subject(q), b), True, SUBJECT),
    ("DELETE", "/config/{subject}", lambda r, q, b: r.delete_config(_subject(q)), False, SUBJECT),
    ("GET", "/mode", lambda r, q, b: r.get_mode(None), False, READ),
    ("PUT", "/mode", lambda r, q, b: r.set_mode(None, b, _flag(q, "force")), True, CLUSTER),
    ("DELETE", "/mode", lambda r, q, b: r.delete_mode(None), False, CLUSTER),
    ("GET", "/mode/{subject}", lambda r, q, b: r.get_mode(_subject(q), _flag(q, "defaultToGlobal")), False, READ),
    ("PUT", "/mode/{subject}", lambda r, q, b: r.set_mode(_subject(q), b, _flag(q, "force")), True, SUBJECT),
    ("DELETE", "/mode/{subject}", lambda r, q, b: r.delete_mode(_subject(q)), False, SUBJECT),
]


class SchemaRegistryDoor:
    def __init__(self, core: BrokerCore, app: web.Application) -> None:
        self._core = core
        self._calls = Counter("memq_schema_requests", "Schema registry calls by route and answer",
                              ["method", "route", "status"], registry=core.metrics.registry)
        app.add_routes([web.route(method, path, self._handler(method, path, call, body, needs))
                        for method, path, call, body, needs in ROUTES])

    def _handler(self, method: str, path: str, call: Call, reads_body: bool, needs: str
                 ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            denied = self._denied(request, needs)
            status, answer = denied if denied is not None else await self._answer(request, call, reads_body)
            self._calls.labels(method, path, str(status)).inc()
            return web.Response(body=json.dumps(answer).encode(), status=status, headers={"Content-Type": CONTENT_TYPE})
        return handle

    def _denied(self, request: web.Request, needs: str) -> tuple[int, Any] | None:
        """Confluent's 403 (40301) when the principal may not make this change (security on)."""
        if needs == READ:
            return None
        guard, principal = self._core.guard, request.get(PRINCIPAL_KEY)
        if needs == SUBJECT:
            subject = request.match_info["subject"]
            if guard.may_subject(principal, Operation.ADMIN, subject):
                return None
            what = f"subject {subject}"
        else:
            if guard.may(principal, Operation.ADMIN, CLUSTER_RESOURCE):
                return None
            what = f"the cluster ({CLUSTER_RESOURCE}: the registry's global config and mode)"
        guard.count_denial(str(Operation.ADMIN))
        return 403, {"error_code": 40301, "message": f"principal {principal} may not {Operation.ADMIN} {what}"}

    async def _answer(self, request: web.Request, call: Call, reads_body: bool) -> tuple[int, Any]:
        try:
            body = await _body(request) if reads_body else None
            registry = self._core.schemas
            return 200, await asyncio.to_thread(call, registry, request, body)
        except SchemaError as e:
            return e.status, {"error_code": e.code, "message": str(e)}
        except MemqError as e:   # the store cannot answer (ZooKeeper away): Confluent's backend error
            log.warning("schema registry %s %s: %s", request.method, request.path, e)
            return 500, {"error_code": STORE_ERROR, "message": f"Error in the backend data store: {e}"}


async def _body(request: web.Request) -> Any:
    if (request.content_length or 0) > MAX_BODY_BYTES:
        raise SchemaError(413, f"request body over {MAX_BODY_BYTES} bytes")
    raw = await request.content.read(MAX_BODY_BYTES + 1)
    if len(raw) > MAX_BODY_BYTES:
        raise SchemaError(413, f"request body over {MAX_BODY_BYTES} bytes")
    try:
        return json.loads(raw) if raw else {}
    except ValueError as e:
        raise SchemaError(400, f"Unexpected character: the body is not JSON ({e})") from None
