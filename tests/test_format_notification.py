"""Notification: JSON round trip, version gate, and typed errors on malformed payloads."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memq.errors import CorruptDataError, UnsupportedVersionError
from memq.format import NOTIFICATION_VERSION, Notification

U63 = st.integers(0, 2**63 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)
notifications = st.builds(
    Notification, v=st.just(NOTIFICATION_VERSION), topic=st.text(), bucket=st.text(),
    key=st.text(), size=U63, header_size=U63, message_count=U63, logmessage_count=U63,
    min_timestamp_ms=I64, max_timestamp_ms=I64, crc32c=st.integers(0, 2**32 - 1),
    broker_id=st.text(), attempt=U63, created_ms=I64, offset=U63)


def sample() -> Notification:
    return Notification(v=NOTIFICATION_VERSION, topic="t", bucket="b", key="ab/dev/topics/t/x",
                        size=1000, header_size=90, message_count=3, logmessage_count=30,
                        min_timestamp_ms=5, max_timestamp_ms=9, crc32c=123, broker_id="b1",
                        attempt=0, created_ms=11, offset=4096)


def payload(**changes) -> bytes:
    obj = dataclasses.asdict(sample())
    obj.update(changes)
    return json.dumps(obj).encode()


@settings(max_examples=100, deadline=None)
@given(n=notifications)
def test_round_trip(n):
    data = n.to_bytes()
    assert json.loads(data)["v"] == NOTIFICATION_VERSION
    assert Notification.from_bytes(data) == n
    assert Notification.from_bytes(memoryview(data)) == n


def test_newer_version_is_unsupported():
    with pytest.raises(UnsupportedVersionError, match=f"version {NOTIFICATION_VERSION + 1}"):
        Notification.from_bytes(payload(v=NOTIFICATION_VERSION + 1, topic=None))


def test_version_1_names_a_whole_object_at_offset_0():
    """v1 notifications (before storage groups) have no offset: their part starts the object."""
    obj = dataclasses.asdict(sample())
    del obj["offset"]
    obj["v"] = 1
    assert Notification.from_bytes(json.dumps(obj).encode()) == dataclasses.replace(sample(), v=1, offset=0)


def test_offset_is_written_and_checked():
    assert json.loads(sample().to_bytes())["offset"] == 4096
    with pytest.raises(CorruptDataError, match="'offset'"):
        Notification.from_bytes(payload(offset=-1))


def test_unknown_extra_fields_are_ignored():
    assert Notification.from_bytes(payload(future_field=[1, 2])) == sample()


@pytest.mark.parametrize("data, match", [
    (b"", "not JSON"),
    (b"{\"v\": 1", "not JSON"),
    (b"\xff\xfe", "not JSON"),
    (b"[1, 2]", "not an object"),
    (b"null", "not an object"),
    (b"{}", "'v'"),
    (payload(v="1"), "'v'"),
    (payload(v=True), "'v'"),
    (payload(v=0), "'v'"),
    (payload(v=1.0), "'v'"),
    (payload(size="10"), "'size'"),
    (payload(size=True), "'size'"),
    (payload(size=-1), "'size'"),
    (payload(size=1.5), "'size'"),
    (payload(attempt=-1), "'attempt'"),
    (payload(created_ms="now"), "'created_ms'"),
    (payload(topic=7), "'topic'"),
    (payload(broker_id=None), "'broker_id'"),
])
def test_malformed_payloads_are_corrupt(data, match):
    with pytest.raises(CorruptDataError, match=match):
        Notification.from_bytes(data)


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(Notification)
                                   if f.name != "v"])
def test_every_missing_field_is_named(field):
    obj = dataclasses.asdict(sample())
    del obj[field]
    with pytest.raises(CorruptDataError, match=f"lacks field '{field}'"):
        Notification.from_bytes(json.dumps(obj).encode())


@settings(max_examples=200, deadline=None)
@given(junk=st.binary(max_size=300))
def test_arbitrary_bytes_raise_typed_errors(junk):
    try:
        Notification.from_bytes(junk)
    except (CorruptDataError, UnsupportedVersionError):
        pass
