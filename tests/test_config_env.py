"""MEMQ_* variables that cannot be settings (Kubernetes service links, a shell's MEMQ_SRC) are
ignored; a misspelled setting still stops the process, naming the closest valid one."""

from __future__ import annotations

import dataclasses
import logging
import typing

import pytest

from memq.config import MemqConfig, env_var, load_config
from memq.errors import ConfigError

#: What Kubernetes injects into every pod of a namespace with Services `memq`, `memq-broker`
#: (a section's name) and `memq-kafka`, each on a named port.
SERVICE_LINKS = {
    "MEMQ_SERVICE_HOST": "10.96.0.10", "MEMQ_SERVICE_PORT": "8080", "MEMQ_SERVICE_PORT_PRODUCE": "8080",
    "MEMQ_PORT": "tcp://10.96.0.10:8080", "MEMQ_PORT_8080_TCP": "tcp://10.96.0.10:8080",
    "MEMQ_PORT_8080_TCP_ADDR": "10.96.0.10", "MEMQ_PORT_8080_TCP_PORT": "8080",
    "MEMQ_PORT_8080_TCP_PROTO": "tcp",
    "MEMQ_BROKER_SERVICE_HOST": "10.96.0.11", "MEMQ_BROKER_SERVICE_PORT": "8080",
    "MEMQ_BROKER_PORT": "tcp://10.96.0.11:8080", "MEMQ_BROKER_PORT_8080_TCP": "tcp://10.96.0.11:8080",
    "MEMQ_BROKER_PORT_8080_TCP_ADDR": "10.96.0.11", "MEMQ_BROKER_PORT_8080_TCP_PORT": "8080",
    "MEMQ_BROKER_PORT_8080_TCP_PROTO": "tcp",
    "MEMQ_KAFKA_SERVICE_HOST": "10.96.0.12", "MEMQ_KAFKA_SERVICE_PORT_KAFKA": "9092",
    "MEMQ_KAFKA_PORT": "tcp://10.96.0.12:9092", "MEMQ_KAFKA_PORT_9092_TCP_PORT": "9092",
}


def test_service_links_and_names_of_no_section_are_ignored_and_logged_at_debug(
        caplog: pytest.LogCaptureFixture) -> None:
    env = {**SERVICE_LINKS, "MEMQ_SRC": "/home/me/memq", "MEMQ_HOME": "/opt/memq",
           "MEMQ_BROKER_BUSY_WAIT_MS": "123"}
    with caplog.at_level(logging.DEBUG, logger="memq.config"):
        config = load_config(env=env)
    assert config.broker.busy_wait_ms == 123           # a real setting beside them still applies
    assert config.broker.port == MemqConfig().broker.port   # MEMQ_BROKER_PORT=tcp://... is a link
    ignored = {r.args[0] for r in caplog.records if r.levelno == logging.DEBUG}   # type: ignore[index]
    assert ignored == set(env) - {"MEMQ_BROKER_BUSY_WAIT_MS"}


def test_the_process_environment_is_filtered_too(monkeypatch: pytest.MonkeyPatch) -> None:
    for var, value in {**SERVICE_LINKS, "MEMQ_SRC": "x", "MEMQ_PRODUCER_LINGER_MS": "7"}.items():
        monkeypatch.setenv(var, value)
    assert load_config().producer.linger_ms == 7


@pytest.mark.parametrize(("var", "closest"), [
    ("MEMQ_PRODUCER_LINGERMS", "MEMQ_PRODUCER_LINGER_MS"),       # a section, a misspelled setting
    ("MEMQ_BROKER_HTTP_PORT", "MEMQ_BROKER_PORT"),               # ends in _PORT but is no link's value
    ("MEMQ_PRODUCR_LINGER_MS", "MEMQ_PRODUCER_LINGER_MS"),       # a section misspelled, nearly a setting
])
def test_a_misspelled_setting_still_fails_naming_the_closest(var: str, closest: str) -> None:
    with pytest.raises(ConfigError, match=rf"{var} \(did you mean {closest}\?\)"):
        load_config(env={**SERVICE_LINKS, var: "8081"})


def test_a_real_port_setting_is_still_read() -> None:
    assert load_config(env={"MEMQ_BROKER_PORT": "8080"}).broker.port == 8080
    assert load_config(env={"MEMQ_BROKER_KAFKA_PORT": "9092"}).broker.kafka_port == 9092


def test_no_setting_looks_like_a_service_link() -> None:
    """Else a real setting would be dropped as a link whatever its value."""
    from memq.config import _SERVICE_LINK   # the shape under test

    sections = {n: t for n, t in typing.get_type_hints(MemqConfig).items() if n != "topics"}
    names = [env_var(n, f.name) for n, cls in sections.items() for f in dataclasses.fields(cls)]
    assert [v for v in names if _SERVICE_LINK.fullmatch(v.removeprefix("MEMQ_"))] == []
