"""`ssl.SSLContext`s from config: the broker's (optionally verifying client certificates) and
a client's (verifying the broker against a CA file, optionally presenting a certificate)."""

from __future__ import annotations

import ssl
from typing import Any

from memq.errors import ConfigError


def server_context(cert_file: str, key_file: str, client_ca_file: str = "") -> ssl.SSLContext:
    """TLS for a broker listener. With `client_ca_file`, clients must present a certificate
    signed by it (its subject CN becomes their principal)."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"security.tls_cert_file={cert_file!r} / security.tls_key_file={key_file!r}: {e}") from None
    if client_ca_file:
        try:
            ctx.load_verify_locations(cafile=client_ca_file)
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(f"security.tls_client_ca_file={client_ca_file!r}: {e}") from None
        ctx.verify_mode = ssl.CERT_OPTIONAL   # a token is the other way in; the middleware decides
    return ctx


def client_context(ca_file: str = "", cert_file: str = "", key_file: str = "") -> ssl.SSLContext:
    """TLS for talking to brokers: verify them against `ca_file` (system CAs when empty)."""
    try:
        ctx = ssl.create_default_context(cafile=ca_file or None)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"producer.tls_ca_file={ca_file!r}: {e}") from None
    if cert_file:
        try:
            ctx.load_cert_chain(cert_file, key_file or None)
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(f"producer.tls_cert_file={cert_file!r}: {e}") from None
    return ctx


def subject_cn(peercert: dict[str, Any] | None) -> str | None:
    """The commonName of a verified peer certificate (`SSLSocket.getpeercert()`), if any."""
    for rdn in (peercert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None
