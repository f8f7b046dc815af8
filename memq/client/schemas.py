"""The schema registry through the brokers (`memq schema ...`): Confluent's REST calls, as the
principal of the client's credentials, to the first broker in `producer.brokers` that answers.
A refusal is the registry's own: SchemaError with Confluent's error code and message."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
from typing import Any

from memq.config import ProducerConfig
from memq.errors import ConfigError, MemqError, SchemaError

from ._auth import BrokerAuth
from .admin import call_brokers
from .cluster import broker_urls

TIMEOUT_S = 30.0


class SchemaClient:
    def __init__(self, pc: ProducerConfig, timeout_s: float = TIMEOUT_S) -> None:
        self._urls = broker_urls(pc.brokers)
        if not self._urls:
            raise ConfigError("producer.brokers: name a broker, whose registry to use")
        self._auth = BrokerAuth.of(pc)
        self._timeout_s = timeout_s

    def call(self, method: str, path: str, body: Any = None, **query: Any) -> Any:
        """`method` `path` (query values: True/False as Confluent's flags); the JSON answer."""
        flags = {k: (str(v).lower() if isinstance(v, bool) else v) for k, v in query.items() if v not in (None, False)}
        full = path + (f"?{urllib.parse.urlencode(flags)}" if flags else "")
        return call_brokers(self._urls, self._auth, self._timeout_s, method, full, body, self._refusal)

    def _refusal(self, url: str, e: urllib.error.HTTPError) -> MemqError:
        if e.code == 401:
            return self._auth.failure(url, e)
        try:
            answer = json.loads(e.read())
            return SchemaError(int(answer["error_code"]), str(answer["message"]))
        except (ValueError, KeyError, TypeError):
            return SchemaError(e.code * 100 if e.code < 1000 else e.code, f"broker {url} answered {e.code} {e.reason}")


def subject_path(subject: str) -> str:
    return urllib.parse.quote(subject, safe="")
