"""Throwaway security for a dev cluster (`memq dev --tls`): a CA, the brokers' certificate, a
token, and the settings that turn them on.

The CA and certificates come from `trustme` (made for exactly this: short-lived local PKI).
One principal gets a token and every operation on every topic, so the demo and the CLI work as
without security while every request still goes through TLS, authentication and the ACLs.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

from memq.config import MemqConfig, SecurityConfig
from memq.security.acl import Operation
from memq.security.tokens import new_token

DEV_PRINCIPAL = "dev"
BROKER_HOSTS = ("127.0.0.1", "localhost")


@dataclass(frozen=True)
class DevSecurity:
    """The brokers' `[security]` and what a client presents (`producer.token`, the CA)."""

    security: SecurityConfig
    ca_file: str
    principal: str
    token: str = field(repr=False)

    def brokers(self, config: MemqConfig) -> MemqConfig:
        """`config` for a broker process: security on, and the CA to verify its peers by
        (the token stays with clients)."""
        return dataclasses.replace(config, security=self.security,
                                   producer=dataclasses.replace(config.producer, tls_ca_file=self.ca_file))

    def client(self, config: MemqConfig) -> MemqConfig:
        """`config` for a client: trusts the CA and presents the token."""
        return dataclasses.replace(config, producer=dataclasses.replace(config.producer, tls_ca_file=self.ca_file,
                                                                        token=self.token))


def make_dev_security(directory: str | Path, principal: str = DEV_PRINCIPAL) -> DevSecurity:
    """A fresh CA and broker certificate under `directory` (key readable by the owner only),
    and a token for `principal` allowed every operation on every topic."""
    import trustme

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA(organization_name="memq dev")
    cert = ca.issue_cert(*BROKER_HOSTS, common_name="memq-dev-broker")
    ca_file, cert_file, key_file = out / "ca.pem", out / "broker.pem", out / "broker-key.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    cert.private_key_pem.write_to_path(str(key_file))
    os.chmod(key_file, 0o600)
    with open(cert_file, "wb") as f:
        for blob in cert.cert_chain_pems:
            f.write(blob.bytes())
    token, entry = new_token(principal)
    acls = tuple(f"allow {principal} {op} prefix:" for op in Operation)
    security = SecurityConfig(enabled=True, tls_cert_file=str(cert_file), tls_key_file=str(key_file),
                              tokens=(str(entry),), acls=acls)
    return DevSecurity(security, str(ca_file), principal, token)
