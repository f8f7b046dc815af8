"""Administration through a broker's admin API, as the principal of the client's credentials.

`memq topic create|alter`, `memq governor topic delete`, `memq token` and `memq acl` go this
way when the config holds credentials (`producer.token` or a client certificate): the broker
checks `admin` on the topic (or on the cluster, for tokens and ACLs) and does the work on
ZooKeeper and Kafka. Without credentials they work on ZooKeeper or the config file directly,
as an operator with access to those.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from memq.config import ProducerConfig, TopicConfig, build
from memq.errors import (AuthorizationError, BrokerUnavailableError, ConfigError, CoordinationError,
                         InvalidInputError, MemqError, UnknownTopicError)

from ._auth import BrokerAuth
from .cluster import broker_urls

ADMIN_TIMEOUT_S = 90.0     # topic creation waits for the governor to place the topic
ERRORS: dict[str, type[MemqError]] = {e.__name__: e for e in (AuthorizationError, ConfigError, InvalidInputError,
                                                              UnknownTopicError, CoordinationError)}


def through_brokers(pc: ProducerConfig) -> bool:
    """Whether admin commands go through the brokers: when the client has credentials to show."""
    return bool(pc.brokers and (pc.token or pc.tls_cert_file))


def call_brokers(urls: list[str], auth: BrokerAuth, timeout_s: float, method: str, path: str, body: Any,
                 refusal: Callable[[str, urllib.error.HTTPError], MemqError]) -> Any:
    """One JSON call to the first of `urls` that answers, with the client's credentials; an HTTP
    error answer is `refusal(url, error)`, raised; BrokerUnavailableError if none answers."""
    unavailable: list[str] = []
    for url in urls:
        request = urllib.request.Request(url + path, method=method, headers={
            **auth.headers(), "Content-Type": "application/json"},
            data=json.dumps(body).encode() if body is not None else None)
        try:
            with urllib.request.urlopen(request, timeout=timeout_s, context=auth.ssl_context) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            raise refusal(url, e) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
            failure = auth.failure(url, e)
            if not isinstance(failure, BrokerUnavailableError):
                raise failure from None
            unavailable.append(str(failure))
    raise BrokerUnavailableError(f"no broker answered {method} {path}: {'; '.join(unavailable) or 'none named'}")


class BrokerAdmin:
    """Topic, token and ACL administration; each call goes to the first broker that answers."""

    def __init__(self, pc: ProducerConfig, timeout_s: float = ADMIN_TIMEOUT_S) -> None:
        self._urls = broker_urls(pc.brokers)
        self._auth = BrokerAuth.of(pc)
        self._timeout_s = timeout_s
        self.where = f"the brokers' admin API ({', '.join(self._urls)})"

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        return call_brokers(self._urls, self._auth, self._timeout_s, method, path, body, self._refusal)

    def _refusal(self, url: str, e: urllib.error.HTTPError) -> MemqError:
        if e.code == 401:
            return self._auth.failure(url, e)
        try:
            answer = json.loads(e.read())
            return ERRORS.get(answer["type"], MemqError)(answer["error"])
        except (ValueError, KeyError, TypeError):
            if e.code == 404:
                return ConfigError(f"broker {url} has no admin API for this (is it governed, zookeeper.enabled?)")
            return BrokerUnavailableError(f"broker {url} answered {e.code} {e.reason}")

    # --- topics ----------------------------------------------------------------------------

    def create_topic(self, cfg: TopicConfig) -> tuple[str, ...]:
        """Create (or find, with the same settings) topic `cfg`; the brokers serving it."""
        body = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "name" and v is not None}
        return tuple(self._call("PUT", _topic_path(cfg.name), body)["brokers"])

    def alter_topic(self, name: str, changes: dict[str, str]) -> TopicConfig:
        answer = self._call("PATCH", _topic_path(name), changes)
        cfg: TopicConfig = build(TopicConfig, answer["topic"], f"topic {name}")
        return cfg

    def delete_topic(self, name: str, *, delete_notifications: bool) -> None:
        self._call("DELETE", _topic_path(name) + f"?notifications={'true' if delete_notifications else 'false'}")

    # --- tokens and ACLs (memq.security.stored.SecurityLists' operations) ---------------------

    def add_token(self, entry: str) -> None:
        self._call("POST", "/v1/security/tokens", {"entry": entry})

    def revoke(self, principal: str) -> int:
        return int(self._call("DELETE", "/v1/security/tokens/" + urllib.parse.quote(principal, safe=""))["removed"])

    def add_rule(self, rule: str) -> bool:
        return bool(self._call("POST", "/v1/security/acls", {"rule": rule})["added"])

    def remove_rule(self, rule: str) -> int:
        return int(self._call("DELETE", "/v1/security/acls?" + urllib.parse.urlencode({"rule": rule}))["removed"])

    def rules(self) -> list[str]:
        """The rules in force on the broker: stored, then its config file's."""
        answer = self._call("GET", "/v1/security/acls")
        return [str(r) for r in (*answer["stored"], *answer["config"])]


def _topic_path(name: str) -> str:
    return "/v1/topics/" + urllib.parse.quote(name, safe="")
