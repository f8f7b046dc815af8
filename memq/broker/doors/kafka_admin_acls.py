"""The Kafka door's ACL family: DescribeAcls, CreateAcls and DeleteAcls over memq's ACL store.

Kafka's bindings are memq's rules through `memq.security.kafka_acl`. Rules change in the store
`memq acl` edits (`ClusterAdmin`: ZooKeeper), so every broker applies them by its watch and
`memq acl list` lists them; Describe lists the stored rules and the broker config file's.
Delete removes the stored rules a filter matches, and answers a config-file rule it matches
POLICY_VIOLATION (only the file and a restart change it): per binding, and for the whole filter
when nothing else matched (clients that drop per-binding errors still see it). A binding memq cannot hold is
refused INVALID_REQUEST naming why. Every call needs `admin` on the cluster
(CLUSTER_AUTHORIZATION_FAILED); with security off they answer SECURITY_DISABLED, as Kafka
without an authorizer does. A frame that does not parse closes the connection, logged.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kafka.protocol.admin import (
    CreateAclsRequest, CreateAclsResponse, DeleteAclsRequest, DeleteAclsResponse, DescribeAclsRequest,
    DescribeAclsResponse)

from memq.errors import InvalidInputError, MemqError, ProtocolError
from memq.kafka_api.messages import decode_request, encode_response
from memq.kafka_api.protocol import ApiKey, ErrorCode, Reader, RequestHeader
from memq.security.acl import CLUSTER_RESOURCE, AclRule, Operation, parse_rules
from memq.security.kafka_acl import (Binding, binding, binding_filter, bindings_of, described,
                                     matching, rules_of)

from .kafka_family import Conn, Family, Response

log = logging.getLogger(__name__)

VERSIONS = (1, 3)    # v0 (no pattern type) is gone from Kafka 4 and kafka-python's schemas
_Describe = DescribeAclsResponse.DescribeAclsResource
_Matching = DeleteAclsResponse.DeleteAclsFilterResult.DeleteAclsMatchingAcl


@dataclass(frozen=True)
class Refusal:
    """Why a whole call is refused (security off, not allowed)."""

    error: ErrorCode
    message: str


class AclsDoor:
    """Answers one ACL request of `conn`."""

    def __init__(self, conn: Conn) -> None:
        self._core = conn.core
        self._principal = conn.principal
        self._peer = conn.peer

    def refusal(self) -> Refusal | None:
        """SECURITY_DISABLED with security off; CLUSTER_AUTHORIZATION_FAILED without admin on the cluster."""
        guard = self._core.guard
        if not guard.enabled:
            return Refusal(ErrorCode.SECURITY_DISABLED, "security is off on this memq cluster: there are no ACLs")
        if not guard.allowed(self._principal, Operation.ADMIN, CLUSTER_RESOURCE):
            return Refusal(ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                           f"principal {self._principal} may not {Operation.ADMIN} the cluster ({CLUSTER_RESOURCE})")
        return None

    def _refused(self, call: str, refusal: Refusal) -> None:
        log.info("%s from %s (principal %s) refused: %s", call, self._peer, self._principal, refusal.message)

    async def _stored(self) -> list[AclRule]:
        admin = self._core.cluster_admin
        return list(parse_rules(await admin.rules(), "stored acls")) if admin is not None else []

    # --- DescribeAcls --------------------------------------------------------------------------

    async def describe(self, h: RequestHeader, req: Any) -> bytes:
        def answer(error: ErrorCode, message: str | None, found: Sequence[Binding] = ()) -> bytes:
            resources: dict[tuple[int, str, int], list[Any]] = {}
            for b in found:
                resources.setdefault((b.resource, b.name, b.pattern), []).append(
                    _Describe.AclDescription(principal=b.principal, host=b.host, operation=b.operation,
                                             permission_type=b.permission))
            return encode_response(h, DescribeAclsResponse(
                throttle_time_ms=0, error_code=error, error_message=message,
                resources=[_Describe(resource_type=t, resource_name=n, pattern_type=p, acls=acls)
                           for (t, n, p), acls in resources.items()]))

        refusal = self.refusal()
        if refusal is not None:
            self._refused("DescribeAcls", refusal)
            return answer(refusal.error, refusal.message)
        try:
            f = binding_filter(req.resource_type_filter, req.resource_name_filter, req.pattern_type_filter,
                               req.principal_filter, req.host_filter, req.operation, req.permission_type)
        except InvalidInputError as e:
            log.info("DescribeAcls from %s refused: %s", self._peer, e)
            return answer(ErrorCode.INVALID_REQUEST, str(e))
        try:
            rules = [*await self._stored(), *parse_rules(self._core.config.security.acls)]
        except MemqError as e:
            log.warning("DescribeAcls: the stored ACLs could not be read: %s", e)
            return answer(ErrorCode.KAFKA_STORAGE_ERROR, f"the stored ACLs could not be read: {e}")
        return answer(ErrorCode.NONE, None, described(rules, f))

    # --- CreateAcls ----------------------------------------------------------------------------

    async def create(self, h: RequestHeader, req: Any) -> bytes:
        refusal = self.refusal()
        if refusal is not None:
            self._refused("CreateAcls", refusal)
        results = [await self._create_one(c, refusal) for c in req.creations]
        return encode_response(h, CreateAclsResponse(throttle_time_ms=0, results=[
            CreateAclsResponse.AclCreationResult(error_code=e, error_message=m) for e, m in results]))

    async def _create_one(self, c: Any, refusal: Refusal | None) -> tuple[ErrorCode, str | None]:
        if refusal is not None:
            return refusal.error, refusal.message
        try:
            rules = rules_of(binding(c.resource_type, c.resource_name, c.resource_pattern_type, c.principal,
                                     c.host, c.operation, c.permission_type))
        except InvalidInputError as e:
            log.info("CreateAcls by %s: binding refused: %s", self._principal, e)
            return ErrorCode.INVALID_REQUEST, str(e)
        admin = self._core.cluster_admin
        if admin is None:
            return ErrorCode.POLICY_VIOLATION, ("this cluster keeps no ACLs but the brokers' config files "
                                                "(no ZooKeeper): add the rule there and restart")
        for rule in rules:
            try:
                added = await admin.add_rule(str(rule))
            except MemqError as e:
                log.warning("CreateAcls: rule %r not stored: %s", str(rule), e)
                return ErrorCode.KAFKA_STORAGE_ERROR, f"rule {str(rule)!r} not stored: {e}"
            log.info("CreateAcls by %s: rule %r %s", self._principal, str(rule), "added" if added else "already there")
        return ErrorCode.NONE, None

    # --- DeleteAcls ----------------------------------------------------------------------------

    async def delete(self, h: RequestHeader, req: Any) -> bytes:
        refusal = self.refusal()
        if refusal is not None:
            self._refused("DeleteAcls", refusal)
        results = [await self._delete_one(f, refusal) for f in req.filters]
        return encode_response(h, DeleteAclsResponse(throttle_time_ms=0, filter_results=[
            DeleteAclsResponse.DeleteAclsFilterResult(error_code=e, error_message=m, matching_acls=acls)
            for e, m, acls in results]))

    async def _delete_one(self, raw: Any, refusal: Refusal | None) -> tuple[ErrorCode, str | None, list[Any]]:
        if refusal is not None:
            return refusal.error, refusal.message, []
        try:
            f = binding_filter(raw.resource_type_filter, raw.resource_name_filter, raw.pattern_type_filter,
                               raw.principal_filter, raw.host_filter, raw.operation, raw.permission_type)
        except InvalidInputError as e:
            log.info("DeleteAcls by %s: filter refused: %s", self._principal, e)
            return ErrorCode.INVALID_REQUEST, str(e), []
        admin = self._core.cluster_admin
        removed: list[Any] = []
        try:
            for rule in matching(await self._stored(), f):
                if admin is not None and await admin.remove_rule(str(rule)):
                    log.info("DeleteAcls by %s: rule %r removed", self._principal, str(rule))
                    removed += _matched(rule, ErrorCode.NONE, None)
        except MemqError as e:
            log.warning("DeleteAcls: stored rules not removed: %s", e)
            return ErrorCode.KAFKA_STORAGE_ERROR, f"the stored ACLs could not be changed: {e}", removed
        fixed = matching(parse_rules(self._core.config.security.acls), f)
        why = "in the brokers' config file ([security] acls): only editing the file and a restart remove it"
        kept = [acl for rule in fixed for acl in _matched(rule, ErrorCode.POLICY_VIOLATION, f"rule {str(rule)!r} is {why}")]
        if fixed and not removed:
            log.info("DeleteAcls by %s: only config-file rules matched: %s", self._principal, [str(r) for r in fixed])
            return ErrorCode.POLICY_VIOLATION, f"the rules matching are {why}: {', '.join(map(str, fixed))}", kept
        return ErrorCode.NONE, None, removed + kept


def _matched(rule: AclRule, error: ErrorCode, message: str | None) -> list[Any]:
    return [_Matching(error_code=error, error_message=message, resource_type=b.resource, resource_name=b.name,
                      pattern_type=b.pattern, principal=b.principal, host=b.host, operation=b.operation,
                      permission_type=b.permission) for b in bindings_of(rule)]


_CALLS: dict[int, tuple[Any, Callable[[AclsDoor], Callable[[RequestHeader, Any], Awaitable[bytes]]]]] = {
    ApiKey.DESCRIBE_ACLS: (DescribeAclsRequest, lambda d: d.describe),
    ApiKey.CREATE_ACLS: (CreateAclsRequest, lambda d: d.create),
    ApiKey.DELETE_ACLS: (DeleteAclsRequest, lambda d: d.delete),
}


async def serve(conn: Conn, h: RequestHeader, body: Reader) -> Response:
    cls, handler = _CALLS[h.api_key]
    try:
        req = decode_request(cls, h, body)
    except ProtocolError as e:
        return f"bad {cls.name} request: {e}"
    return asyncio.ensure_future(handler(AclsDoor(conn))(h, req))


FAMILY = Family("acls", dict.fromkeys(_CALLS, VERSIONS), "admin on the cluster", serve)
