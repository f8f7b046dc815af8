"""The governed memq cluster spread over namespace hosts: S3, Kafka, ZooKeeper and N brokers.

Server command lines come from memq.devcluster.servers (moto through its own entry point, which
binds where asked): the loopback address there is replaced by the host's address, since a
server in a namespace must listen on that namespace's interface. Every server is spawned with
memq.devcluster.process (own process group, dies with the harness) through `ip netns exec`; the
brokers are memq.devcluster's GovernedCluster, each placed in its host the same way.
Ports are fixed: each host has its own port space. A server named in `shaped` gets a
memq.chaos.linkproxy in its host, in the path of every connection to it (iptables REDIRECT),
so the nemesis can delay its links with `shape_link`; the others are reached directly. With
`s3_faults`, a memq.chaos.s3faults HTTP proxy goes in front of S3 (and of its link proxy),
so the nemesis can make S3 answer SlowDown or slowly with `set_s3_faults`, and counts the
requests S3 gets (`s3_request_counts`).
"""

from __future__ import annotations

import dataclasses
import socket
import sys
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from memq.config import (AuditConfig, BrokerConfig, ClusterConfig, GovernorConfig, KafkaConfig, MemqConfig, S3Config,
                         TopicConfig, ZooKeeperConfig)
from memq.chaos.linkproxy import LinkShape
from memq.chaos.s3faults import RequestCount, S3Faults
from memq.chaos.topology import Topology
from memq.devcluster import BrokerHost, GovernedCluster
from memq.devcluster.process import ManagedProcess, spawn, wait_ready
from memq.devcluster.servers import KAFKA, ZOOKEEPER
from memq.errors import DevClusterError

LOOPBACK = "127.0.0.1"
PORTS = {"s3": 9000, "kafka": 9092, "zookeeper": 2181}
PROXY_PORT_OFFSET = 10000   # a shaped server's link proxy listens on its port + this
FAULT_PORT_OFFSET = 20000   # the S3 fault proxy listens on S3's port + this
BROKER_PORT = 8080
KAFKA_LISTENER_PORT = 9093   # each broker's own host: the same port on every one, kept across restarts
READY_TIMEOUT_S = 60.0
GOVERNOR = GovernorConfig(interval_s=1.0, reconcile_interval_s=0.5, drain_timeout_s=10.0, compaction_interval_s=2.0)


def host_names(brokers: int) -> list[str]:
    return ["s3", "kafka", "zookeeper", *(f"b{i}" for i in range(1, brokers + 1)), "producer", "consumer"]


def _serving(ip: str, port: int) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=1.0):
            return True
    except OSError:
        return False


@dataclass(frozen=True)
class _Endpoints:
    """The namespace servers as `memq.devcluster.governed.Servers`: a config pointing at them."""

    base: MemqConfig

    def config(self, cluster: str = "dev") -> MemqConfig:
        return dataclasses.replace(self.base, cluster=ClusterConfig(name=cluster))


class ChaosCluster:
    """Servers in `topo`'s hosts and a GovernedCluster of brokers in theirs; `config` is what
    clients use (producer: all brokers)."""

    def __init__(self, topo: Topology, run_dir: Path, brokers: int = 3, *, zk_session_s: float = 4.0,
                 shaped: Collection[str] = (), s3_faults: bool = False, kafka_listener: bool = False) -> None:
        """`kafka_listener`: brokers serve Kafka's protocol too (`kafka_bootstrap`)."""
        unknown = set(shaped) - set(PORTS)
        if unknown:
            raise DevClusterError(f"no server {sorted(unknown)} to shape (servers: {', '.join(PORTS)})")
        self.topo = topo
        self.shaped = tuple(shaped)
        self.s3_faults = s3_faults
        self.run_dir = run_dir
        self.broker_ids = [f"b{i}" for i in range(1, brokers + 1)]
        h = topo.hosts
        servers = MemqConfig(
            s3=S3Config(endpoint_url=f"http://{h['s3'].ip}:{PORTS['s3']}", bucket="memq", region="us-east-1",
                        access_key_id="testing", secret_access_key="testing"),
            kafka=KafkaConfig(bootstrap_servers=f"{h['kafka'].ip}:{PORTS['kafka']}"),
            zookeeper=ZooKeeperConfig(hosts=f"{h['zookeeper'].ip}:{PORTS['zookeeper']}"),
            audit=AuditConfig(enabled=False),
        )
        self.servers = servers
        self.brokers = GovernedCluster(run_dir, brokers, servers=_Endpoints(servers), cluster="chaos",
                                       governor=GOVERNOR, session_timeout_s=zk_session_s,
                                       placement=self._place, ready_timeout_s=READY_TIMEOUT_S,
                                       broker=BrokerConfig(kafka_port=KAFKA_LISTENER_PORT if kafka_listener else -1))
        self.procs: dict[str, ManagedProcess] = {}   # the servers

    def _place(self, broker_id: str) -> BrokerHost:
        return BrokerHost(self.topo.hosts[broker_id].ip, BROKER_PORT, tuple(self.topo.exec_argv(broker_id, [])))

    @property
    def config(self) -> MemqConfig:
        return self.brokers.config()

    @property
    def kafka_bootstrap(self) -> str:
        """Every broker's Kafka listener (`kafka_listener`), as a Kafka client's bootstrap.servers."""
        return ",".join(f"{self.topo.hosts[b].ip}:{KAFKA_LISTENER_PORT}" for b in self.broker_ids)

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
                self.procs[name] = spawn(name, self.topo.exec_argv(name, self._server_argv(name, work)),
                                         log_path=self.run_dir / "logs" / f"{name}.log", cwd=work)
            for name, port in PORTS.items():
                ip = self.topo.hosts[name].ip
                if not wait_ready(self.procs[name], lambda: _serving(ip, port), READY_TIMEOUT_S):
                    raise DevClusterError(f"{name} exited; log:\n{self.procs[name].log_tail()}")
            for name in self.shaped:
                self._start_link_proxy(name)
            if self.s3_faults:
                self._start_s3_fault_proxy()
            self._create_bucket()
            self.brokers.start()
        except BaseException:
            self.stop()
            raise
        return self

    def _control(self, name: str) -> Path:
        return self.run_dir / name / "link.json"

    def _start_link_proxy(self, name: str) -> None:
        """The proxy in `name`'s host, then the REDIRECT that puts it in every client's path
        (its own connection to the server is local, so it is not redirected)."""
        ip, port = self.topo.hosts[name].ip, PORTS[name]
        proxy_port = port + PROXY_PORT_OFFSET
        LinkShape().write(self._control(name))
        argv = [sys.executable, "-m", "memq.chaos.linkproxy", "--listen", f"{ip}:{proxy_port}",
                "--upstream", f"{ip}:{port}", "--control", str(self._control(name))]
        proc = self.procs[f"{name}-link"] = spawn(f"{name}-link", self.topo.exec_argv(name, argv),
                                                  log_path=self.run_dir / "logs" / f"{name}-link.log")
        if not wait_ready(proc, lambda: _serving(ip, proxy_port), READY_TIMEOUT_S):
            raise DevClusterError(f"link proxy of {name} exited; log:\n{proc.log_tail()}")
        self.topo.run(name, "iptables", "-t", "nat", "-A", "PREROUTING", "-p", "tcp", "-d", ip,
                      "--dport", str(port), "-j", "REDIRECT", "--to-ports", str(proxy_port))

    def _start_s3_fault_proxy(self) -> None:
        """The HTTP fault proxy in the S3 host, ahead of S3's link proxy if it has one: its
        REDIRECT goes first, and its own connection onwards is local, so not redirected again."""
        ip, port = self.topo.hosts["s3"].ip, PORTS["s3"]
        onward = port + PROXY_PORT_OFFSET if "s3" in self.shaped else port
        listen = port + FAULT_PORT_OFFSET
        S3Faults().write(self._faults_control())
        argv = [sys.executable, "-m", "memq.chaos.s3faults", "--listen", f"{ip}:{listen}",
                "--upstream", f"{ip}:{onward}", "--control", str(self._faults_control()),
                "--counts", str(self._counts())]
        proc = self.procs["s3-faults"] = spawn("s3-faults", self.topo.exec_argv("s3", argv),
                                               log_path=self.run_dir / "logs" / "s3-faults.log")
        if not wait_ready(proc, lambda: _serving(ip, listen), READY_TIMEOUT_S):
            raise DevClusterError(f"S3 fault proxy exited; log:\n{proc.log_tail()}")
        self.topo.run("s3", "iptables", "-t", "nat", "-I", "PREROUTING", "1", "-p", "tcp", "-d", ip,
                      "--dport", str(port), "-j", "REDIRECT", "--to-ports", str(listen))

    def _faults_control(self) -> Path:
        return self.run_dir / "s3" / "faults.json"

    def _counts(self) -> Path:
        return self.run_dir / "s3" / "counts.jsonl"

    def s3_request_counts(self) -> list[RequestCount]:
        """The S3 fault proxy's running request totals so far, about one a second (none without it)."""
        return RequestCount.load(self._counts()) if self.s3_faults else []

    def set_s3_faults(self, faults: S3Faults) -> None:
        """Set the share of S3 requests answered SlowDown or delayed (needs `s3_faults`)."""
        if not self.s3_faults:
            raise DevClusterError("this chaos cluster was started without its S3 fault proxy")
        faults.write(self._faults_control())

    def shape_link(self, name: str, shape: LinkShape) -> None:
        """Set the delay of connections to server `name` (one started with it in `shaped`)."""
        if name not in self.shaped:
            raise DevClusterError(f"server {name} has no link proxy (shaped: {list(self.shaped) or 'none'})")
        shape.write(self._control(name))

    def _create_bucket(self) -> None:
        import boto3
        from botocore.config import Config

        s3 = boto3.client("s3", endpoint_url=self.servers.s3.endpoint_url, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing",
                          config=Config(connect_timeout=5, read_timeout=30, retries={"max_attempts": 10}))
        s3.create_bucket(Bucket=self.servers.s3.bucket)

    # --- brokers and topics (the GovernedCluster's) -----------------------------------------

    def governor(self) -> str | None:
        return self.brokers.registry.governor()

    def create_topic(self, topic: TopicConfig) -> tuple[str, ...]:
        """Create through the governor's topic admin; wait until placed brokers host it."""
        return self.brokers.create_topic(topic)

    def stop(self) -> None:
        """Brokers first, then servers (link proxies first); SIGKILL after a short grace (the data is throwaway)."""
        try:
            self.brokers.stop()
        except DevClusterError:
            pass
        for name in reversed(list(self.procs)):
            try:
                self.procs.pop(name).stop(5.0)
            except DevClusterError:
                pass

    def __enter__(self) -> ChaosCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
