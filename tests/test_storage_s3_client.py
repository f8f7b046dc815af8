"""The S3 handler's client setup against the real moto server: HTTPS behind a private CA, and
credentials from each link of the AWS chain (config keys, environment, named profile, web
identity through STS), seen in the SigV4 headers a TLS front relays."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme
from tests.support.tlsproxy import TlsProxy

from memq.config import MemqConfig, S3Config
from memq.errors import ConfigError, RetryBudgetExhaustedError
from memq.storage import S3StorageHandler

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def tls(memq_config: MemqConfig, ca: trustme.CA) -> Iterator[TlsProxy]:
    with TlsProxy(memq_config.s3.endpoint_url or "", ca) as proxy:
        yield proxy


@pytest.fixture
def ca_file(ca: trustme.CA, tmp_path: Path) -> str:
    path = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return str(path)


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """No AWS settings from the machine: empty config files, no keys, no instance metadata."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                 "AWS_CA_BUNDLE", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return monkeypatch


def over_tls(config: MemqConfig, tls: TlsProxy, **s3: object) -> S3Config:
    return dataclasses.replace(config.s3, endpoint_url=tls.url, max_attempts=2, base_backoff_s=0.01,
                               max_backoff_s=0.02, **s3)  # type: ignore[arg-type]


async def round_trip(s3: S3Config) -> None:
    handler = S3StorageHandler(s3, cluster="tls")
    try:
        loc = await handler.put_batch("t", [b"over ", b"tls"], first_request_id=1, timestamp_ms=5, broker_id="b")
        assert await handler.get(loc) == b"over tls"
        assert await handler.get_range(loc, 5, 3) == b"tls"
        assert loc in [i.location for i in await handler.list_topic("t", 0, 10)]
        await handler.delete(loc)
        assert loc not in [i.location for i in await handler.list_topic("t", 0, 10)]
    finally:
        await handler.close()


async def test_https_endpoint_with_a_private_ca(memq_config: MemqConfig, tls: TlsProxy, ca_file: str,
                                               aws_env: pytest.MonkeyPatch) -> None:
    await round_trip(over_tls(memq_config, tls, ca_bundle=ca_file))
    assert tls.key_ids and set(tls.key_ids) == {memq_config.s3.access_key_id}

    untrusted = S3StorageHandler(over_tls(memq_config, tls), cluster="tls")
    try:
        with pytest.raises(RetryBudgetExhaustedError, match="connection"):
            await untrusted.put_batch("t", b"x", first_request_id=1, timestamp_ms=5, broker_id="b")
    finally:
        await untrusted.close()

    aws_env.setenv("AWS_CA_BUNDLE", ca_file)  # as boto3 honours it
    await round_trip(over_tls(memq_config, tls))
    with pytest.raises(ConfigError, match="s3.ca_bundle"):
        S3StorageHandler(over_tls(memq_config, tls, ca_bundle=ca_file + ".missing"), cluster="tls")


async def test_credentials_from_environment_profile_and_web_identity(
        memq_config: MemqConfig, tls: TlsProxy, ca_file: str, aws_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    no_keys = over_tls(memq_config, tls, ca_bundle=ca_file, access_key_id=None, secret_access_key=None)

    aws_env.setenv("AWS_ACCESS_KEY_ID", "ENVKEY")
    aws_env.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    await round_trip(no_keys)
    assert set(tls.key_ids) == {"ENVKEY"}
    aws_env.delenv("AWS_ACCESS_KEY_ID")
    aws_env.delenv("AWS_SECRET_ACCESS_KEY")

    (tmp_path / "aws-credentials").write_text("[reader]\naws_access_key_id = PROFILEKEY\n"
                                              "aws_secret_access_key = profile-secret\n")
    tls.key_ids.clear()
    await round_trip(dataclasses.replace(no_keys, profile="reader"))
    assert set(tls.key_ids) == {"PROFILEKEY"}
    with pytest.raises(ConfigError, match="s3.profile"):
        S3StorageHandler(dataclasses.replace(no_keys, profile="nobody"), cluster="tls")

    # Web identity (EKS/IRSA): a token file and a role, exchanged at STS (moto's) for temporary keys.
    token = tmp_path / "token"
    token.write_text("a-web-identity-token")
    aws_env.setenv("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/memq")
    aws_env.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(token))
    aws_env.setenv("AWS_ENDPOINT_URL_STS", memq_config.s3.endpoint_url or "")
    tls.key_ids.clear()
    await round_trip(no_keys)
    assert tls.key_ids and all(k.startswith("ASIA") for k in tls.key_ids)  # STS's temporary keys
