"""The obstore `S3Store` (and the boto3 session for credentials) every memq S3 handler uses.

boto3 stays for one job obstore cannot do: resolving credentials from the AWS config files
(named profiles, SSO, `role_arn` + `source_profile`), on top of the chain both share
(environment, web identity, container and instance roles). Keys given in the config go to
obstore directly; otherwise obstore asks a boto3 session, lazily, so building a handler never
reaches for the instance metadata service.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit
from typing import TYPE_CHECKING, Any

import boto3
import botocore.credentials
import botocore.exceptions as bce
from obstore.store import S3Store

from memq.config import S3Config
from memq.errors import ConfigError, StorageError

if TYPE_CHECKING:
    from obstore.store import ClientConfig, S3Credential
    from obstore.store import S3Config as StoreConfig

CREDENTIAL_TTL = timedelta(minutes=5)
"""How long obstore keeps credentials from boto3 before asking again (boto3 refreshes
temporary ones itself when they near their expiry)."""


def s3_session(s3: S3Config) -> boto3.session.Session:
    """The boto3 session of every S3 client memq creates: keys (and session token) from the
    config, else its named profile (which may assume a role), else the AWS default chain."""
    try:
        return boto3.session.Session(aws_access_key_id=s3.access_key_id, aws_secret_access_key=s3.secret_access_key,
                                     aws_session_token=s3.session_token, profile_name=s3.profile,
                                     region_name=s3.region)
    except bce.ProfileNotFound:
        raise ConfigError(f"s3.profile = {s3.profile!r}: no such profile in the AWS config files") from None


class SessionCredentials:
    """obstore credential provider backed by a boto3 session (profile or default chain)."""

    def __init__(self, session: boto3.session.Session) -> None:
        self._session = session
        self._credentials: botocore.credentials.Credentials | None = None

    def __call__(self) -> S3Credential:
        if self._credentials is None:
            self._credentials = self._session.get_credentials()
            if self._credentials is None:
                raise StorageError("no AWS credentials: set s3.access_key_id/secret_access_key or s3.profile, "
                                   "or provide them by environment, web identity or instance role")
        frozen = self._credentials.get_frozen_credentials()
        return {"access_key_id": frozen.access_key, "secret_access_key": frozen.secret_key,
                "token": frozen.token, "expires_at": datetime.now(UTC) + CREDENTIAL_TTL}


def ca_pem(s3: S3Config) -> str | None:
    """The PEM text of `s3.ca_bundle`, else of $AWS_CA_BUNDLE (as boto3 honours it), else None."""
    path = s3.ca_bundle or os.environ.get("AWS_CA_BUNDLE")
    if not path:
        return None
    try:
        return Path(path).read_text()
    except OSError as e:
        raise ConfigError(f"s3.ca_bundle = {path!r}: {e.strerror or e}") from None


def make_store(s3: S3Config, *, bucket: str | None = None, request_timeout_s: float) -> S3Store:
    """An S3Store for `bucket` (default `s3.bucket`) with obstore's own retries off: memq retries.

    `request_timeout_s` bounds one request end to end (connect, body, answer); `s3.read_timeout_s`
    bounds each wait for bytes of the answer, as boto3's read timeout did.
    """
    endpoint = s3.endpoint_url
    https = endpoint is None or endpoint.startswith("https://")
    loopback = endpoint is not None and urlsplit(endpoint).hostname in ("127.0.0.1", "localhost", "::1")
    path_style = s3.path_style if s3.path_style is not None else endpoint is not None
    client: ClientConfig = {"allow_http": not https, "connect_timeout": timedelta(seconds=s3.connect_timeout_s),
                              "read_timeout": timedelta(seconds=s3.read_timeout_s),
                              "timeout": timedelta(seconds=max(request_timeout_s, s3.read_timeout_s))}
    pem = ca_pem(s3)
    if pem:
        client["root_certificate"] = pem
    config: StoreConfig = {"region": s3.region, "virtual_hosted_style_request": not path_style,
                              # Over HTTPS, TLS protects the body and S3 needs no SHA-256 of it (boto3's
                              # choice too), nor on loopback (no wire); over plain HTTP across a network
                              # the signed SHA-256 (~7 ms of CPU per 8 MiB) is its integrity check.
                              "unsigned_payload": https or loopback}
    if endpoint is not None:
        config["endpoint"] = endpoint
    kwargs: dict[str, Any] = {}
    if s3.access_key_id and s3.secret_access_key:   # keys given win over the profile, as in boto3
        if s3.profile:
            s3_session(s3)     # a named profile must exist, whatever else is set
        config["access_key_id"] = s3.access_key_id
        config["secret_access_key"] = s3.secret_access_key
        if s3.session_token:
            config["session_token"] = s3.session_token
    else:
        # A boto3 session costs ~10-20 ms of CPU (its data files): only built when it is the
        # source of credentials (a Spark task opens a store per task).
        kwargs["credential_provider"] = SessionCredentials(s3_session(s3))
    return S3Store(bucket or s3.bucket, config=config, client_options=client,
                   retry_config={"max_retries": 0}, **kwargs)
