"""The governed memq cluster spread over namespace hosts: S3, Kafka, ZooKeeper and N brokers.

Server command lines come from memq.devcluster.servers (moto through its own entry point, which
binds where asked): the loopback address there is replaced by the host's address, since a
server in a namespace must listen on that namespace's interface. Every process is spawned with
memq.devcluster.process (own process group, dies with the harness) through `ip netns exec`.
Ports are fixed: each host has its own port space.
"""

from __future__ import annotations

import dataclasses
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from memq.config import (AuditConfig, BrokerConfig, ClusterConfig, GovernorConfig, KafkaConfig, MemqConfig,
                         S3Config, TopicConfig, ZooKeeperConfig)
from memq.chaos.topology import Topology
from memq.devcluster.broker_process import _healthy, config_toml
from memq.devcluster.process import ManagedProcess, spawn, wait_ready
from memq.devcluster.servers import KAFKA, ZOOKEEPER
from memq.errors import DevClusterError

LOOPBACK = "127.0.0.1"
PORTS = {"s3": 9000, "kafka": 9092, "zookeeper": 2181}
BROKER_PORT = 8080
RACKS = ("rack-a", "rack-b", "rack-c")
READY_TIMEOUT_S = 60.0
GOVERNOR = GovernorConfig(interval_s=1.0, reconcile_interval_s=0.5, drain_timeout_s=10.0)


def host_names(brokers: int) -> list[str]:
    return ["s3", "kafka", "zookeeper", *(f"b{i}" for i in range(1, brokers + 1)), "producer", "consumer"]


def _serving(ip: str, port: int) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=1.0):
            return True
    except OSError:
        return False


class ChaosCluster:
    """Servers and brokers in `topo`'s hosts; `config` is what clients use (producer: all brokers)."""

    def __init__(self, topo: Topology, run_dir: Path, brokers: int = 3, *, zk_session_s: float = 4.0) -> None:
        self.topo = topo
        self.run_dir = run_dir
        self.broker_ids = [f"b{i}" for i in range(1, brokers + 1)]
        h = topo.hosts
        self.config = MemqConfig(
            cluster=ClusterConfig(name="chaos"),
            s3=S3Config(endpoint_url=f"http://{h['s3'].ip}:{PORTS['s3']}", bucket="memq", region="us-east-1",
                        access_key_id="testing", secret_access_key="testing"),
            kafka=KafkaConfig(bootstrap_servers=f"{h['kafka'].ip}:{PORTS['kafka']}"),
            zookeeper=ZooKeeperConfig(enabled=True, hosts=f"{h['zookeeper'].ip}:{PORTS['zookeeper']}",
                                      session_timeout_s=zk_session_s),
            governor=GOVERNOR,
            audit=AuditConfig(enabled=False),
        )
        self.config = dataclasses.replace(self.config, producer=dataclasses.replace(
            self.config.producer, brokers=",".join(self.broker_url(b) for b in self.broker_ids)))
        self.procs: dict[str, ManagedProcess] = {}

    def broker_url(self, broker_id: str) -> str:
        return f"http://{self.topo.hosts[broker_id].ip}:{BROKER_PORT}"

    # --- servers --------------------------------------------------------------------------

    def _server_argv(self, name: str, work: Path) -> list[str]:
        ip = self.topo.hosts[name].ip
        if name == "s3":
            return [sys.executable, "-m", "moto.server", "-H", ip, "-p", str(PORTS["s3"])]
        spec = KAFKA if name == "kafka" else ZOOKEEPER
        argv = [a.replace(LOOPBACK, ip) for a in spec.argv(PORTS[name], work)]
        cfg = work / "zoo.cfg"
        if name == "zookeeper":
            cfg.write_text(cfg.read_text().replace(LOOPBACK, ip))
        return argv

    def start(self) -> ChaosCluster:
        try:
            for name in PORTS:
                work = self.run_dir / name
                work.mkdir(parents=True, exist_ok=True)
                self._spawn(name, self._server_argv(name, work), cwd=work)
            for name, port in PORTS.items():
                ip = self.topo.hosts[name].ip
                if not wait_ready(self.procs[name], lambda: _serving(ip, port), READY_TIMEOUT_S):
                    raise DevClusterError(f"{name} exited; log:\n{self.procs[name].log_tail()}")
            self._create_bucket()
            for b in self.broker_ids:
                self.start_broker(b)
            self._create_topics_when_governed()
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, name: str, argv: Sequence[str], cwd: Path | None = None) -> ManagedProcess:
        proc = spawn(name, self.topo.exec_argv(name, argv), log_path=self.run_dir / "logs" / f"{name}.log", cwd=cwd)
        self.procs[name] = proc
        return proc

    def _create_bucket(self) -> None:
        import boto3
        from botocore.config import Config

        s3 = boto3.client("s3", endpoint_url=self.config.s3.endpoint_url, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing",
                          config=Config(connect_timeout=5, read_timeout=30, retries={"max_attempts": 10}))
        s3.create_bucket(Bucket=self.config.s3.bucket)

    # --- brokers --------------------------------------------------------------------------

    def start_broker(self, broker_id: str) -> None:
        """Start (or restart after a kill) one broker in its host; waits for /healthz."""
        i = self.broker_ids.index(broker_id)
        config = dataclasses.replace(self.config, broker=BrokerConfig(
            broker_id=broker_id, host=self.topo.hosts[broker_id].ip, port=BROKER_PORT, rack=RACKS[i % len(RACKS)]))
        path = self.run_dir / f"{broker_id}.toml"
        path.write_text(config_toml(config))
        proc = self._spawn(broker_id, [sys.executable, "-m", "memq.broker", "--config", str(path)])
        url = self.broker_url(broker_id)
        if not wait_ready(proc, lambda: _healthy(url), READY_TIMEOUT_S):
            raise DevClusterError(f"broker {broker_id} exited; log:\n{proc.log_tail()}")

    def _create_topics_when_governed(self) -> None:
        """Wait for a governor before any topic exists, so the governor places them."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while self.governor() not in self.broker_ids:
            if time.monotonic() > deadline:
                raise DevClusterError("no governor elected; see the broker logs")
            time.sleep(0.2)

    def governor(self) -> str | None:
        from memq.governor.registry import Registry

        with Registry(self.config.zookeeper, self.config.cluster.name) as reg:
            return reg.governor()

    def create_topic(self, topic: TopicConfig) -> tuple[str, ...]:
        """Create through the governor's topic admin; wait until placed brokers host it."""
        from memq.cli.dev import _hosted
        from memq.governor.registry import Registry
        from memq.governor.topics import TopicManager
        from memq.notify import TopicAdmin

        with Registry(self.config.zookeeper, self.config.cluster.name) as reg:
            TopicManager(reg, TopicAdmin(self.config.kafka), self.config.cluster.name).create(topic)
            deadline = time.monotonic() + READY_TIMEOUT_S
            while True:
                placed = reg.assignments().get(topic.name, ())
                if placed and all(topic.name in _hosted(self.broker_url(b)) for b in placed):
                    return placed
                if time.monotonic() > deadline:
                    raise DevClusterError(f"topic {topic.name} not placed (assigned: {list(placed)})")
                time.sleep(0.2)

    def stop(self) -> None:
        """Brokers first, then servers; SIGKILL after a short grace (the data is throwaway)."""
        for name in [*reversed(self.broker_ids), *reversed(list(PORTS))]:
            proc = self.procs.pop(name, None)
            if proc is not None:
                try:
                    proc.stop(5.0)
                except DevClusterError:
                    pass

    def __enter__(self) -> ChaosCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
