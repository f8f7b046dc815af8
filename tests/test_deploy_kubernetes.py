"""deploy/kubernetes renders (tests/support/kustomize_lite.py, kustomize's subset it uses) to manifests
that pass Kubernetes' schemas, whose pieces fit together (probes, drain within the grace period,
selectors, ports), and whose config loads in a pod's environment, service links included."""

from __future__ import annotations

import copy
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_validate import validate
from kubernetes_validate.utils import ValidationError

from tests.support.kustomize_lite import Doc, render
from memq.config import MemqConfig, load_config

KUBE = Path(__file__).resolve().parent.parent / "deploy" / "kubernetes"
OVERLAYS = [KUBE / "base", KUBE / "overlays" / "example"]
K8S_VERSION = "1.33.0"
#: What the downward API and the Secrets give a pod here.
POD = {"metadata.name": "memq-broker-7d9f8-x2k4q", "status.podIP": "10.1.2.3",
       "metadata.labels['topology.kubernetes.io/zone']": "us-east-1a"}
SECRETS = {("memq-tokens", "tokens"): "ingest:" + "ab" * 32,
           ("memq-kafka", "properties"): "security.protocol=SASL_SSL,sasl.mechanism=SCRAM-SHA-512"}


def one(docs: list[Doc], kind: str, name: str | None = None) -> Doc:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, (kind, name, len(found))
    return found[0]


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_every_rendered_manifest_passes_the_kubernetes_schemas_strictly(overlay: Path) -> None:
    docs = render(overlay)
    assert {d["kind"] for d in docs} == {"ServiceAccount", "Deployment", "Service", "PodDisruptionBudget", "ConfigMap"}
    for doc in docs:
        validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_the_renderer_agrees_with_kubectl_kustomize(overlay: Path) -> None:
    """Where kubectl is installed, its kustomize renders exactly what the suite checks."""
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl not found: the manifests are checked as tests/support/kustomize_lite.py renders them")
    out = subprocess.run(["kubectl", "kustomize", str(overlay)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    real = [d for d in yaml.safe_load_all(out.stdout) if d]

    def key(d: Doc) -> tuple[str, str]:
        return d["kind"], d["metadata"]["name"]
    assert sorted(real, key=key) == sorted(render(overlay), key=key)


def test_the_schema_check_rejects_a_misspelled_field() -> None:
    deployment = copy.deepcopy(one(render(KUBE / "base"), "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessprobe"] = {}
    with pytest.raises(ValidationError):
        validate(deployment, K8S_VERSION, strict=True)


def _config(docs: list[Doc]) -> dict[str, Any]:
    return tomllib.loads(one(docs, "ConfigMap", "memq-config")["data"]["memq.toml"])


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_brokers_drain_within_the_grace_period_and_probe_what_they_mean(overlay: Path) -> None:
    docs = render(overlay)
    deployment = one(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    config = _config(docs)
    # preStop moves the topics away (bounded by its --timeout), then SIGTERM stores what is in flight.
    drain = shlex.split(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert drain[:4] == ["exec", "memq", "broker", "drain"]
    drain_s = float(drain[drain.index("--timeout") + 1])
    stop_s = config["broker"]["shutdown_timeout_ms"] / 1000
    assert pod["terminationGracePeriodSeconds"] >= drain_s + stop_s + 10
    assert config["governor"]["drain_timeout_s"] <= drain_s   # the SIGTERM path's own drain fits too
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert "tcpSocket" in container["livenessProbe"]   # a Kafka outage must not restart every broker
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert pod["enableServiceLinks"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    zones = [c for c in pod["topologySpreadConstraints"] if c["topologyKey"] == "topology.kubernetes.io/zone"]
    assert zones and zones[0]["whenUnsatisfiable"] == "DoNotSchedule"
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == ports["http"] == config["broker"]["port"]
    assert ports["kafka"] == config["broker"]["kafka_port"]


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_services_and_the_disruption_budget_select_the_broker_pods(overlay: Path) -> None:
    docs = render(overlay)
    deployment = one(docs, "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    port_names = {p["name"] for p in deployment["spec"]["template"]["spec"]["containers"][0]["ports"]}
    services = [d for d in docs if d["kind"] == "Service"]
    assert {p["targetPort"] for s in services for p in s["spec"]["ports"]} == port_names
    for selector in [s["spec"]["selector"] for s in services] + [
            one(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"], deployment["spec"]["selector"]["matchLabels"]]:
        assert selector.items() <= labels.items()
    assert one(docs, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == one(docs, "ServiceAccount")["metadata"]["name"]


def service_links(services: list[Doc]) -> dict[str, str]:
    """The variables Kubernetes injects for `services` when service links are on (the default)."""
    env: dict[str, str] = {}
    for i, svc in enumerate(services):
        name, ip = svc["metadata"]["name"].upper().replace("-", "_"), f"10.96.0.{10 + i}"
        ports = svc["spec"]["ports"]
        env[f"{name}_SERVICE_HOST"], env[f"{name}_SERVICE_PORT"] = ip, str(ports[0]["port"])
        env[f"{name}_PORT"] = f"tcp://{ip}:{ports[0]['port']}"
        for p in ports:
            base = f"{name}_PORT_{p['port']}_TCP"
            env[f"{name}_SERVICE_PORT_{p['name'].upper()}"] = str(p["port"])
            env.update({base: f"tcp://{ip}:{p['port']}", f"{base}_PROTO": "tcp", f"{base}_PORT": str(p["port"]),
                        f"{base}_ADDR": ip})
    return env


def pod_env(container: Doc) -> dict[str, str]:
    """The container's environment as the kubelet makes it: downward API, Secrets, $(VAR) expanded."""
    env: dict[str, str] = {}
    for var in container["env"]:
        if "value" in var:
            env[var["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m[1]], var["value"])
        elif "fieldRef" in var["valueFrom"]:
            env[var["name"]] = POD[var["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            ref = var["valueFrom"]["secretKeyRef"]
            if (ref["name"], ref["key"]) in SECRETS:
                env[var["name"]] = SECRETS[ref["name"], ref["key"]]
            else:
                assert ref.get("optional"), f"no sample for required Secret {ref}"
    return env


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_the_config_loads_in_a_pods_environment_with_service_links(overlay: Path, tmp_path: Path) -> None:
    docs = render(overlay)
    container = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    env = pod_env(container)
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert env["MEMQ_CONFIG"] == mounts["config"] + "/memq.toml"
    toml = one(docs, "ConfigMap", "memq-config")["data"]["memq.toml"]
    if "tls" in mounts:   # the TLS Secret's files, mounted where the config looks for them
        for name in ("tls.crt", "tls.key"):
            (tmp_path / name).write_text("")
        toml = toml.replace(mounts["tls"] + "/", f"{tmp_path}/")
    (tmp_path / "memq.toml").write_text(toml)
    links = service_links([d for d in docs if d["kind"] == "Service"])
    assert "MEMQ_PORT_8080_TCP_ADDR" in links and "MEMQ_KAFKA_SERVICE_HOST" in links
    config = load_config(tmp_path / "memq.toml", env={**links, **env})
    scheme = "https" if config.security.tls_cert_file else "http"
    assert isinstance(config, MemqConfig) and config.zookeeper.enabled and config.security.enabled
    assert config.broker.broker_id == POD["metadata.name"]
    assert config.broker.advertised_url == f"{scheme}://10.1.2.3:8080"
    assert config.broker.kafka_advertised_host == "10.1.2.3"
    assert config.broker.rack == "us-east-1a"
    assert config.security.tokens == (SECRETS["memq-tokens", "tokens"],)
