"""Every numeric setting has a range checked at load; misspelled MEMQ_* settings are errors."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from memq.config import MemqConfig, TopicConfig, build, load_config
from memq.errors import ConfigError

MEMQ = str(Path(sys.executable).with_name("memq"))

SECTIONS = {name: tp for name, tp in typing.get_type_hints(MemqConfig).items() if name != "topics"}


def _numeric_fields() -> list[tuple[str, dataclasses.Field[typing.Any]]]:
    out = []
    for name, cls in [*SECTIONS.items(), ("topics", TopicConfig)]:
        hints = typing.get_type_hints(cls)
        out += [(name, f) for f in dataclasses.fields(cls) if hints[f.name] in (int, float)]
    return out


@pytest.mark.parametrize(("section", "fld"), _numeric_fields(), ids=lambda x: getattr(x, "name", x))
def test_every_numeric_setting_has_a_range_enforced_at_load(section: str, fld: dataclasses.Field[typing.Any]) -> None:
    meta = fld.metadata
    assert any(meta.get(k) is not None for k in ("ge", "gt")), f"{section}.{fld.name} has no lower bound"
    low = meta["ge"] - 1 if meta.get("ge") is not None else meta["gt"]
    if section == "topics":
        with pytest.raises(ConfigError, match=rf"{fld.name} = .* out of range"):
            build(TopicConfig, {"name": "t", fld.name: low}, "topics[0]")
    else:
        with pytest.raises(ConfigError, match=rf"{section}\.{fld.name} = .* out of range: must be"):
            load_config(env={f"MEMQ_{section}_{fld.name}".upper(): str(low)})
    if meta.get("le") is not None:
        with pytest.raises(ConfigError, match=rf"{fld.name} = .* must be between"):
            load_config(env={f"MEMQ_{section}_{fld.name}".upper(): str(meta["le"] + 1)})


def test_the_issue_examples_are_rejected_naming_setting_and_range() -> None:
    cases = {"MEMQ_PRODUCER_LINGER_MS": ("-5", "producer.linger_ms = -5 is out of range: must be >= 0"),
             "MEMQ_PRODUCER_RETRIES": ("-1", "producer.retries = -1 is out of range: must be >= 0"),
             "MEMQ_PRODUCER_REQUEST_TIMEOUT_MS": ("0", "producer.request_timeout_ms = 0 is out of range: must be >= 1"),
             "MEMQ_BROKER_PORT": ("70000", "broker.port = 70000 is out of range: must be between 0 and 65535")}
    for var, (value, message) in cases.items():
        with pytest.raises(ConfigError) as e:
            load_config(env={var: value})
        assert str(e.value) == message
    assert load_config(env={"MEMQ_PRODUCER_LINGER_MS": "0", "MEMQ_PRODUCER_RETRIES": "0"}).producer.retries == 0


def test_range_checks_apply_to_the_toml_file_too(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[producer]\nlinger_ms = -5\n")
    with pytest.raises(ConfigError, match=r"producer\.linger_ms = -5"):
        load_config(path, env={})
    path.write_text("[[topics]]\nname = 'x'\nring_slots = 1\n")
    with pytest.raises(ConfigError, match=r"ring_slots = 1 is out of range: must be >= 2"):
        load_config(path, env={})


def test_unknown_memq_variable_names_the_closest_valid_one() -> None:
    with pytest.raises(ConfigError, match=r"MEMQ_PRODUCER_LINGERMS \(did you mean MEMQ_PRODUCER_LINGER_MS\?\)"):
        load_config(env={"MEMQ_PRODUCER_LINGERMS": "5"})
    with pytest.raises(ConfigError, match=r"MEMQ_PRODUCER_QQQQQQQQQQQQQQQQQQQQQQQ$"):
        load_config(env={"MEMQ_PRODUCER_QQQQQQQQQQQQQQQQQQQQQQQ": "1"})
    load_config(env={"MEMQ_CONFIG": "ignored-here.toml", "OTHER_LINGERMS": "x"})   # not settings: fine


def test_unknown_toml_key_names_the_closest_valid_one(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[producer]\nlinger = 5\n")
    with pytest.raises(ConfigError, match=r"producer: unknown setting\(s\) linger \(did you mean linger_ms\?\)"):
        load_config(path, env={})


def _memq(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
    return subprocess.run([MEMQ, *args], capture_output=True, timeout=60, env={**clean, **env})


@pytest.mark.timeout(120)
def test_cli_rejects_out_of_range_and_misspelled_settings_before_any_network_call() -> None:
    r = _memq("produce", "t", "--brokers", "http://127.0.0.1:9", "-n", "1",
              env={"MEMQ_PRODUCER_REQUEST_TIMEOUT_MS": "0"})
    assert r.returncode == 2, r.stderr
    assert b"producer.request_timeout_ms = 0 is out of range: must be >= 1" in r.stderr
    r = _memq("consume", "t", env={"MEMQ_PRODUCER_LINGERMS": "5"})
    assert r.returncode == 2, r.stderr
    assert b"MEMQ_PRODUCER_LINGERMS (did you mean MEMQ_PRODUCER_LINGER_MS?)" in r.stderr
