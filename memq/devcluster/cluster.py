"""`DevCluster`: real moto S3, tansu Kafka and ZooKeeper on free loopback ports.

Used by the pytest session fixture, by `python -m memq.devcluster` and by `memq dev`.
Servers start in parallel, each on a fresh port; a server that loses its port to another
process (the port was free when chosen) is restarted on a new one. Logs go to
`run_dir/logs/<server>.log`. Data lives in memory (moto, tansu) or under `run_dir`
(ZooKeeper, wiped at start), so every start is a fresh, empty cluster.
"""

from __future__ import annotations

import atexit
import logging
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

from memq.config import ClusterConfig, KafkaConfig, MemqConfig, S3Config, TopicConfig, ZooKeeperConfig
from memq.devcluster.process import ManagedProcess, free_port, spawn, wait_ready
from memq.devcluster.servers import KAFKA, S3, ZOOKEEPER, ServerSpec
from memq.errors import DevClusterError

log = logging.getLogger("memq.devcluster")

S3_REGION = "us-east-1"
S3_ACCESS_KEY = "testing"   # moto accepts any credentials
S3_SECRET_KEY = "testing"
PORT_ATTEMPTS = 3


class DevCluster:
    """Start with `start()` or `with DevCluster(...) as dc:`; `stop()` leaves no process behind.

    Attributes of servers not asked for stay None.
    """

    def __init__(self, run_dir: str | Path | None = None, *, s3: bool = True, kafka: bool = True,
                 zookeeper: bool = True, bucket: str = "memq") -> None:
        self.run_dir = Path(run_dir) if run_dir is not None else Path(tempfile.mkdtemp(prefix="memq-dev-"))
        self.bucket = bucket
        self._specs = [spec for spec, on in ((S3, s3), (KAFKA, kafka), (ZOOKEEPER, zookeeper)) if on]
        self._procs: dict[str, ManagedProcess] = {}
        self._addresses: dict[str, str] = {}
        self._buckets: set[str] = set()

    # --- addresses ---------------------------------------------------------------------------

    @property
    def s3_endpoint(self) -> str | None:
        return self._addresses.get(S3.name)

    @property
    def kafka_bootstrap(self) -> str | None:
        return self._addresses.get(KAFKA.name)

    @property
    def zk_hosts(self) -> str | None:
        return self._addresses.get(ZOOKEEPER.name)

    @property
    def pids(self) -> dict[str, int]:
        """Server name -> pid of the running process."""
        return {name: p.pid for name, p in self._procs.items()}

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> DevCluster:
        """Start the servers, wait until each serves, create the bucket. Idempotent."""
        if self._procs:
            return self
        atexit.register(self.stop)
        t0 = time.monotonic()
        try:
            ports = {spec.name: self._spawn(spec) for spec in self._specs}
            for spec in self._specs:
                self._await(spec, ports[spec.name])
            if self.s3_endpoint:
                self.ensure_bucket(self.bucket)
        except BaseException:
            self.stop()
            raise
        log.info("dev cluster ready in %.1f s (run dir %s)", time.monotonic() - t0, self.run_dir)
        return self

    def _spawn(self, spec: ServerSpec) -> int:
        port = free_port()
        work = self.run_dir / spec.name
        work.mkdir(parents=True, exist_ok=True)
        log.info("starting %s on 127.0.0.1:%d", spec.name, port)
        self._procs[spec.name] = spawn(spec.name, spec.argv(port, work),
                                       log_path=self.run_dir / "logs" / f"{spec.name}.log", cwd=work)
        return port

    def _await(self, spec: ServerSpec, port: int) -> None:
        t0 = time.monotonic()
        for attempt in range(1, PORT_ATTEMPTS + 1):
            proc = self._procs[spec.name]
            if wait_ready(proc, lambda: spec.probe(port), spec.startup_timeout_s):
                self._addresses[spec.name] = spec.address(port)
                log.info("%s ready at %s in %.1f s", spec.name, self._addresses[spec.name],
                         time.monotonic() - t0)
                return
            proc.stop()
            if attempt == PORT_ATTEMPTS:
                raise DevClusterError(
                    f"{spec.name} exited with code {proc.popen.returncode} "
                    f"{PORT_ATTEMPTS} times; log {proc.log_path}:\n{proc.log_tail()}")
            log.warning("%s exited with code %s on port %d, retrying on another port",
                        spec.name, proc.popen.returncode, port)
            port = self._spawn(spec)

    def stop(self) -> None:
        """Terminate every server (SIGTERM, then SIGKILL after its grace time). Idempotent."""
        atexit.unregister(self.stop)
        grace = {spec.name: spec.stop_timeout_s for spec in self._specs}
        errors = []
        for name, proc in reversed(list(self._procs.items())):
            try:
                proc.stop(grace[name])
            except DevClusterError as e:
                errors.append(str(e))
        if self._procs:
            log.info("dev cluster stopped")
        self._procs.clear()
        self._addresses.clear()
        self._buckets.clear()
        if errors:
            raise DevClusterError("; ".join(errors))

    def __enter__(self) -> DevCluster:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # --- clients -----------------------------------------------------------------------------

    def ensure_bucket(self, name: str) -> None:
        """Create bucket `name` on the dev S3 server unless this cluster already did."""
        if name in self._buckets:
            return
        if not self.s3_endpoint:
            raise DevClusterError("this dev cluster has no S3 server")
        import boto3
        from botocore.config import Config

        s3 = boto3.client("s3", endpoint_url=self.s3_endpoint, region_name=S3_REGION,
                          aws_access_key_id=S3_ACCESS_KEY, aws_secret_access_key=S3_SECRET_KEY,
                          config=Config(connect_timeout=5, read_timeout=30, retries={"max_attempts": 3}))
        s3.create_bucket(Bucket=name)
        self._buckets.add(name)

    def config(self, cluster: str = "dev", bucket: str = "memq",
               topics: Iterable[TopicConfig] = ()) -> MemqConfig:
        """A MemqConfig pointing at this cluster's servers; creates `bucket` if needed."""
        s3 = S3Config()
        if self.s3_endpoint:
            self.ensure_bucket(bucket)
            # No hedged requests: this S3 is a process on the same CPUs, whose slow answers are
            # CPU contention that a second request makes worse, not a remote store's tail.
            s3 = S3Config(endpoint_url=self.s3_endpoint, bucket=bucket, region=S3_REGION,
                          access_key_id=S3_ACCESS_KEY, secret_access_key=S3_SECRET_KEY, hedge_max_share=0.0)
        return MemqConfig(
            cluster=ClusterConfig(name=cluster),
            s3=s3,
            kafka=KafkaConfig(bootstrap_servers=self.kafka_bootstrap) if self.kafka_bootstrap else KafkaConfig(),
            zookeeper=ZooKeeperConfig(hosts=self.zk_hosts) if self.zk_hosts else ZooKeeperConfig(),
            topics=tuple(topics),
        )
