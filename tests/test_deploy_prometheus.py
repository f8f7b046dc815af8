"""deploy/prometheus and deploy/grafana: the rules pass `promtool test rules`, every name they and
the dashboard use is one memq's /metrics really exposes, and a real Prometheus scraping a real
broker fires MemqBrokerDown when the broker is SIGKILLed."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from memq.audit.dashboard import BooksCollector
from memq.broker.metrics import BrokerMetrics
from memq.broker.share.metrics import register as register_share_metrics
from memq.broker.share.partition import SharePartition
from memq.broker.share.service import Shares
from memq.broker.share.store import MemoryStateStore
from memq.clock import SystemClock
from memq.config import ShareConfig
from memq.devcluster import DevCluster
from memq.devcluster.broker_process import BrokerProcess
from memq.devcluster.process import free_port, spawn, wait_ready
from memq.governor.governor import GovernorMetrics
from memq.governor.janitor import JanitorMetrics
from memq.storage.metrics import StorageMetrics
from tests.support.share_fakes import FakeShareBroker

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
RULES = DEPLOY / "prometheus" / "memq-rules.yml"
DASHBOARD = DEPLOY / "grafana" / "memq-dashboard.json"
#: Labels Prometheus adds to every scraped series, and names from outside memq the rules use.
TARGET_LABELS = {"job", "instance"}
OUTSIDE = {"up": TARGET_LABELS, "kube_pod_status_ready": {"namespace", "pod", "condition"}}
_NAME = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{[^}]*\})?")
_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
_GROUPING = re.compile(r"\b(?:by|without|ignoring|on)\s*\(([^)]*)\)")


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool not found: install Debian's prometheus package (scripts/test.sh does, as root)")
    return path


def exposed() -> dict[str, set[str]]:
    """Sample name -> label names, from the metric classes a broker, its janitor and governor
    and the audit service register (one child each, so every family renders its samples)."""
    registry = CollectorRegistry(auto_describe=True)
    metrics = BrokerMetrics("b1", registry)
    JanitorMetrics(registry, StorageMetrics(registry))
    GovernorMetrics(registry)
    row = SimpleNamespace(topic="t", group="g", produced=1, aborted=0, consumed=1, duplicates=0, mismatches=0, lost=0,
                          expired=0, p50_ms=1, p99_ms=2, max_ms=3, lag_messages=0, lag_s=0, status=0)
    auditor = SimpleNamespace(read=lambda _fn: [row], stats=lambda: SimpleNamespace(records=1, bad_payloads=0))
    registry.register(BooksCollector(auditor))   # type: ignore[arg-type]
    shares = Shares(ShareConfig(), MemoryStateStore(), SystemClock(), "b1", FakeShareBroker({}))   # one share group's partition
    shares.partitions[("g", "t", 0)] = SharePartition(SystemClock())
    shares.dead_letters["g"] = 0
    register_share_metrics(shares, registry)
    for collector in list(registry._collector_to_names):   # each family, to learn its label names
        names = getattr(collector, "_labelnames", ())
        if names:
            collector.labels(*("x" for _ in names))
    assert metrics.registry is registry
    out: dict[str, set[str]] = {}
    for family in registry.collect():
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    return out


def recorded() -> set[str]:
    return set(re.findall(r"^\s*- record: (\S+)", RULES.read_text(), re.M))


def exprs() -> Iterator[tuple[str, str]]:
    """(where, PromQL) of every rule and dashboard target."""
    text = RULES.read_text()
    for m in re.finditer(r"^\s*- (?:record|alert): (\S+)\n\s*(?:#.*\n\s*)*expr: (\|\n(?:\s{10}.*\n)+|.*)", text, re.M):
        yield f"rule {m[1]}", m[2].removeprefix("|")
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel["targets"]:
            yield f"panel {panel['title']!r}", target["expr"]


def unknown_references(where: str, expr: str, samples: dict[str, set[str]], records: set[str]) -> list[str]:
    bad = []
    used_labels: set[str] = set()
    for name, selector in _NAME.findall(re.sub(r'"[^"]*"', '""', expr)):
        if name.startswith("memq"):
            labels = samples.get(name) if not name.startswith("memq:") else (set() if name in records else None)
        else:
            labels = OUTSIDE.get(name)
            if labels is None:
                continue   # a PromQL function, keyword or grouping label
        if labels is None:
            bad.append(f"{where}: {name} is no metric memq exposes")
            continue
        known = labels | TARGET_LABELS | {"le", "quantile"}
        used_labels |= known
        if not name.startswith("memq:"):
            bad += [f"{where}: {name} has no label {lbl}" for lbl in _MATCHER.findall(selector) if lbl not in known]
    if not any(name.startswith("memq:") for name, _ in _NAME.findall(expr)):
        for group in _GROUPING.findall(expr):
            bad += [f"{where}: no series of it has label {lbl}"
                    for lbl in (g.strip() for g in group.split(",")) if lbl and lbl not in used_labels]
    return bad


def test_rules_pass_promtool_check_and_unit_tests() -> None:
    tool = promtool()
    for args in (["check", "rules", RULES.name], ["test", "rules", "memq-rules.test.yml"]):
        r = subprocess.run([tool, *args], cwd=RULES.parent, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr


def test_rules_and_dashboard_use_only_metrics_and_labels_memq_exposes() -> None:
    samples, records = exposed(), recorded()
    assert "memq_broker_batches_total" in samples and "memq_audit_lag_seconds" in samples
    found = list(exprs())
    assert len([w for w, _ in found if w.startswith("rule")]) == RULES.read_text().count("expr:")
    assert len([w for w, _ in found if w.startswith("panel")]) >= 20
    bad = [b for where, expr in found for b in unknown_references(where, expr, samples, records)]
    assert bad == []


def test_the_reference_check_catches_a_wrong_name_and_label() -> None:
    samples, records = exposed(), recorded()
    assert unknown_references("x", "rate(memq_broker_batch_total[5m])", samples, records)
    assert unknown_references("x", 'rate(memq_broker_batches_total{outcome="ok"}[5m])', samples, records)
    assert unknown_references("x", "sum by (zone) (rate(memq_broker_batches_total[5m]))", samples, records)
    assert unknown_references("x", "memq:no_such_record > 1", samples, records)
    assert not unknown_references("x", 'sum by (topic) (rate(memq_broker_batches_total{result="ok"}[5m]))',
                                  samples, records)


def _prometheus_config(tmp: Path, target: str, rules: Path) -> Path:
    config = tmp / "prometheus.yml"
    config.write_text(f"""global: {{scrape_interval: 1s, evaluation_interval: 1s}}
rule_files: [{rules}]
scrape_configs:
  - job_name: memq-broker
    static_configs: [{{targets: ["{target}"]}}]
""")
    return config


def _api(base: str, path: str) -> object:
    with urllib.request.urlopen(base + path, timeout=5) as resp:
        return json.load(resp)["data"]


def _poll(what: str, check: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:.0f} s: {what}")
        time.sleep(0.5)


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_a_real_prometheus_fires_broker_down_when_a_broker_is_sigkilled(
        devcluster: DevCluster, tmp_path: Path) -> None:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus not found: install Debian's prometheus package (scripts/test.sh does, as root)")
    broker = BrokerProcess(devcluster.config(), tmp_path / "broker").start()
    # The rules as shipped, with every `for:` at 0 s: the wait is promtool-tested above.
    rules = tmp_path / "rules.yml"
    rules.write_text(re.sub(r"(?m)^(\s+for:) \S+$", r"\1 0s", RULES.read_text()))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    target = broker.url.removeprefix("http://")
    proc = spawn("prometheus", [binary, f"--config.file={_prometheus_config(tmp_path, target, rules)}",
                                f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                 log_path=tmp_path / "prometheus.log")
    try:
        assert wait_ready(proc, lambda: _ready(base), 60), proc.log_tail()

        def broker_scraped() -> bool:
            data = _api(base, "/api/v1/query?query=memq_broker_start_time_seconds")
            return bool(data["result"])   # type: ignore[index]
        _poll("the broker's memq metrics scraped", broker_scraped, 30)
        assert _firing(base, "MemqBrokerDown") == []
        broker.kill()
        _poll("MemqBrokerDown firing", lambda: _firing(base, "MemqBrokerDown") != [], 30)
        assert _firing(base, "MemqBrokerDown")[0]["labels"]["instance"] == target
    finally:
        proc.stop()
        broker.stop()


def _ready(base: str) -> bool:
    try:
        with urllib.request.urlopen(base + "/-/ready", timeout=1) as resp:
            return resp.status == 200
    except OSError:
        return False


def _firing(base: str, name: str) -> list[dict[str, dict[str, str]]]:
    alerts = _api(base, "/api/v1/alerts")["alerts"]   # type: ignore[index]
    return [a for a in alerts if a["labels"]["alertname"] == name and a["state"] == "firing"]


def test_the_example_scrape_config_names_the_jobs_the_rules_select() -> None:
    import yaml

    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    assert set(re.findall(r'job="([^"]+)"', RULES.read_text())) == jobs == {"memq-broker", "memq-audit"}
    assert config["rule_files"] == [RULES.name]
