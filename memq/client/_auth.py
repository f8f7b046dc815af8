"""What a client presents to brokers (bearer token, TLS trust) and its failures in words.

One place for every client (Producer, Consumer and Spark metadata, CLI): built from the
`producer` settings, applied to an aiohttp session or a urllib request alike.
"""

from __future__ import annotations

import http.client
import ssl
import urllib.error
from dataclasses import dataclass, field

import aiohttp

from memq.config import ProducerConfig
from memq.errors import AuthenticationError, BrokerUnavailableError
from memq.security.tls import client_context

from ._reasons import reason


@dataclass(frozen=True)
class BrokerAuth:
    token: str = field(default="", repr=False)
    ssl_context: ssl.SSLContext | None = None   # None: the system's CAs for https:// brokers

    @classmethod
    def of(cls, pc: ProducerConfig) -> BrokerAuth:
        tls = pc.tls_ca_file or pc.tls_cert_file
        return cls(pc.token, client_context(pc.tls_ca_file, pc.tls_cert_file, pc.tls_key_file) if tls else None)

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def session(self, timeout: aiohttp.ClientTimeout, read_bufsize: int = 2 ** 16) -> aiohttp.ClientSession:
        """An aiohttp session sending the token on every request and trusting the configured CA."""
        return aiohttp.ClientSession(timeout=timeout, headers=self.headers(), read_bufsize=read_bufsize,
                                     connector=aiohttp.TCPConnector(ssl=self.ssl_context or True))

    def failure(self, url: str, e: BaseException) -> AuthenticationError | BrokerUnavailableError:
        """The error a failed call to broker `url` amounts to, in words a user can act on."""
        auth = self._rejected(url, e)
        if auth is not None:
            return auth
        cause = e.reason if isinstance(e, urllib.error.URLError) and isinstance(e.reason, BaseException) else e
        if url.startswith("http://") and isinstance(cause, (aiohttp.ServerDisconnectedError, ConnectionResetError,
                                                             http.client.RemoteDisconnected)):
            return BrokerUnavailableError(f"broker {url} {PLAINTEXT_HINT}")
        return BrokerUnavailableError(f"cannot connect to broker {url}: {reason(e)}")

    def _rejected(self, url: str, e: BaseException) -> AuthenticationError | None:
        """The AuthenticationError a failed call to broker `url` amounts to, None if another failure."""
        if isinstance(e, urllib.error.URLError) and isinstance(e.reason, BaseException):
            e = e.reason
        status = e.code if isinstance(e, urllib.error.HTTPError) else \
            e.status if isinstance(e, aiohttp.ClientResponseError) else 0
        if status == 401:
            said = "rejected the token (wrong or revoked?)" if self.token else \
                "requires a token and none is set (producer.token, MEMQ_PRODUCER_TOKEN)"
            return AuthenticationError(f"broker {url} {said}")
        cert = e.certificate_error if isinstance(e, aiohttp.ClientConnectorCertificateError) else e
        if isinstance(cert, ssl.SSLCertVerificationError):
            return AuthenticationError(f"certificate verify failed for broker {url}: {cert.verify_message}; "
                                       "producer.tls_ca_file must name the CA that signed the broker's certificate")
        if isinstance(e, aiohttp.ClientSSLError):
            e = e.os_error
        if isinstance(e, ssl.SSLError) and ("WRONG_VERSION_NUMBER" in str(e) or "record layer" in str(e)):
            return AuthenticationError(f"broker {url} does not speak TLS: it is a plaintext broker, "
                                       "name it with an http:// URL")
        return None


NO_AUTH = BrokerAuth()
PLAINTEXT_HINT = ("closed the connection without an HTTP answer, as a TLS broker does to a plaintext "
                  "client: if it serves TLS, name it with an https:// URL and set producer.tls_ca_file")
