"""A governed broker's admin API: topics, tokens and ACLs, behind the broker's `Guard`.

With `zookeeper.enabled` the broker process opens its own ZooKeeper session before it listens
and serves:

  PUT    /v1/topics/{name}            create (settings as JSON; same settings: a no-op), waits
                                      until placed: {"brokers": [...]}          admin on topic
  PATCH  /v1/topics/{name}            alter settings: {"topic": {...}}          admin on topic
  DELETE /v1/topics/{name}?notifications=true|false                             admin on topic
  GET    /v1/security/acls            {"stored": [...], "config": [...]}        admin on cluster
  POST   /v1/security/acls {"rule"}   {"added": bool}                           admin on cluster
  DELETE /v1/security/acls?rule=...   {"removed": n}                            admin on cluster
  POST   /v1/security/tokens {"entry"}  (a hashed entry: the token never travels) admin on cluster
  DELETE /v1/security/tokens/{principal}  {"removed": n}                       admin on cluster

A refusal is 403 with {"type": "AuthorizationError", "error": "principal P may not admin
topic T"} before anything is read or changed, counted in the denials metric; other failures
carry their memq error type the same way. With security on it also keeps the Guard in step
with the stored tokens and ACLs (read before the listener opens, then by watch).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from memq.config import MemqConfig, TopicConfig, build
from memq.errors import (AuthorizationError, ConfigError, CoordinationError, InvalidInputError, MemqError,
                         UnknownTopicError)
from memq.governor.registry import Registry
from memq.governor.security_store import SecurityStore
from memq.security.acl import CLUSTER_RESOURCE, Operation, parse_rule
from memq.security.tokens import parse_entry

from ..cluster_admin import ClusterAdmin
from ..guard import PRINCIPAL_KEY, Guard

MAX_BODY_BYTES = 64 * 1024
STATUS = {AuthorizationError: 403, ConfigError: 400, InvalidInputError: 400, UnknownTopicError: 404,
          CoordinationError: 503}

Handler = Callable[[web.Request], Awaitable[Any]]


class AdminApi:
    def __init__(self, guard: Guard, admin: ClusterAdmin) -> None:
        self._guard = guard
        self._config = admin.config
        self._admin = admin

    def routes(self) -> list[web.RouteDef]:
        topic, acls, tokens = "/v1/topics/{name}", "/v1/security/acls", "/v1/security/tokens"
        return [web.put(topic, self._wrap(self._create)), web.patch(topic, self._wrap(self._alter)),
                web.delete(topic, self._wrap(self._delete)),
                web.get(acls, self._wrap(self._acls)), web.post(acls, self._wrap(self._add_rule)),
                web.delete(acls, self._wrap(self._remove_rule)), web.post(tokens, self._wrap(self._add_token)),
                web.delete(tokens + "/{principal}", self._wrap(self._revoke))]

    def _wrap(self, handler: Handler) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def answer(request: web.Request) -> web.Response:
            try:
                return web.json_response(await handler(request))
            except MemqError as e:
                status = next((s for cls, s in STATUS.items() if isinstance(e, cls)), 500)
                return web.json_response({"type": type(e).__name__, "error": str(e)}, status=status)
        return answer

    def _authorize(self, request: web.Request, topic: str | None) -> None:
        """AuthorizationError unless the principal may `admin` `topic` (None: the cluster)."""
        principal = request.get(PRINCIPAL_KEY)
        if not self._guard.allowed(principal, Operation.ADMIN, topic or CLUSTER_RESOURCE):
            what = f"topic {topic}" if topic else f"the cluster ({CLUSTER_RESOURCE}: tokens and ACLs)"
            raise AuthorizationError(f"principal {principal} may not {Operation.ADMIN} {what}")

    @staticmethod
    async def _body(request: web.Request) -> dict[str, Any]:
        if (request.content_length or 0) > MAX_BODY_BYTES:
            raise InvalidInputError(f"request body over {MAX_BODY_BYTES} bytes")
        try:
            body = json.loads(await request.content.read(MAX_BODY_BYTES))
        except ValueError as e:
            raise InvalidInputError(f"request body is not JSON: {e}") from None
        if not isinstance(body, dict):
            raise InvalidInputError("request body must be a JSON object")
        return body

    # --- topics --------------------------------------------------------------------------------

    async def _create(self, request: web.Request) -> dict[str, Any]:
        name = request.match_info["name"]
        self._authorize(request, name)
        cfg: TopicConfig = build(TopicConfig, {**await self._body(request), "name": name}, f"topic {name}")
        return {"brokers": list(await self._admin.create_topic(cfg))}

    async def _alter(self, request: web.Request) -> dict[str, Any]:
        name = request.match_info["name"]
        self._authorize(request, name)
        changes = await self._body(request)
        cfg = await self._admin.alter_topic(name, **changes)
        return {"topic": {k: v for k, v in vars(cfg).items() if v is not None}}

    async def _delete(self, request: web.Request) -> dict[str, Any]:
        name = request.match_info["name"]
        self._authorize(request, name)
        notifications = request.query.get("notifications", "false") == "true"
        await self._admin.delete_topic(name, notifications=notifications)
        return {"deleted": name}

    # --- tokens and ACLs -----------------------------------------------------------------------

    async def _acls(self, request: web.Request) -> dict[str, Any]:
        self._authorize(request, None)
        return {"stored": await self._admin.rules(), "config": list(self._config.security.acls)}

    async def _add_rule(self, request: web.Request) -> dict[str, Any]:
        self._authorize(request, None)
        rule = str(parse_rule(str((await self._body(request)).get("rule", "")), "rule"))
        return {"added": await self._admin.add_rule(rule)}

    async def _remove_rule(self, request: web.Request) -> dict[str, Any]:
        self._authorize(request, None)
        rule = str(parse_rule(request.query.get("rule", ""), "rule"))
        return {"removed": await self._admin.remove_rule(rule)}

    async def _add_token(self, request: web.Request) -> dict[str, Any]:
        self._authorize(request, None)
        entry = str(parse_entry(str((await self._body(request)).get("entry", "")), "entry"))
        await self._admin.add_token(entry)
        return {"added": entry.rpartition(":")[0]}

    async def _revoke(self, request: web.Request) -> dict[str, Any]:
        self._authorize(request, None)
        return {"removed": await self._admin.revoke(request.match_info["principal"])}


def attach_cluster_admin(guard: Guard, app: web.Application, config: MemqConfig) -> ClusterAdmin | None:
    """Before the broker listens: with ZooKeeper, open a session, keep `guard` in step with the
    stored tokens and ACLs (security on) and add the admin API to `app`; the cluster admin (the
    same one Kafka's admin calls use; close its `registry` at the end), None without ZooKeeper."""
    if not config.zookeeper.enabled:
        return None
    registry = Registry(config.zookeeper, config.cluster.name).start()
    try:
        if config.security.enabled:
            SecurityStore(registry).watch(guard.use_stored)
        admin = ClusterAdmin(registry, config)
        app.add_routes(AdminApi(guard, admin).routes())
    except BaseException:
        registry.close()
        raise
    return admin
