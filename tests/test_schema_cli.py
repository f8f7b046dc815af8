"""`memq schema ...` against a broker's registry: register, list, show, check, config, delete,
and the registry's refusals as clean exits."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from memq.cli import main
from memq.config import AuditConfig
from memq.devcluster import DevCluster
from tests.support.inproc import broker_in_thread

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_memq_schema_commands(devcluster: DevCluster, tmp_path: Path) -> None:
    v1 = tmp_path / "v1.avsc"
    v1.write_text(json.dumps({"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"}]}))
    v2 = tmp_path / "v2.avsc"
    v2.write_text(json.dumps({"type": "record", "name": "Order", "fields": [
        {"name": "id", "type": "long"}, {"name": "item", "type": "string"}]}))
    config = dataclasses.replace(devcluster.config(), audit=AuditConfig(enabled=False))
    with broker_in_thread(config) as url:
        runner = CliRunner()

        def memq(*args: str) -> tuple[int, str]:
            r = runner.invoke(main, ["schema", *args], env={"MEMQ_PRODUCER_BROKERS": url})
            return r.exit_code, r.output

        assert memq("register", "orders-value", str(v1)) == (0, "orders-value: id 1\n")
        assert memq("list") == (0, "orders-value  versions 1\n")
        code, out = memq("show", "orders-value")
        assert code == 0 and json.loads(out)["version"] == 1
        assert json.loads(memq("show", "--id", "1")[1])["schema"] == v1.read_text().replace(" ", "")
        code, out = memq("check", "orders-value", str(v2))
        assert code == 1 and "READER_FIELD_MISSING_DEFAULT_VALUE" in out
        assert json.loads(memq("config", "orders-value", "--set", "none")[1]) == {"compatibility": "NONE"}
        assert memq("check", "orders-value", str(v2)) == (0, "orders-value: compatible\n")
        code, out = memq("show", "nosuch")
        assert code == 1 and "SchemaError: Subject 'nosuch' not found." in out
        assert memq("delete", "orders-value") == (0, "orders-value: deleted version(s) [1]\n")
        assert memq("delete", "orders-value", "--permanent")[0] == 0
        assert memq("list") == (0, "")
