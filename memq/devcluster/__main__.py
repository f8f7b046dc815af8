"""`python -m memq.devcluster`: start S3, Kafka and ZooKeeper, print endpoints, wait for Ctrl-C."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

from memq.devcluster import DevCluster
from memq.errors import MemqError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m memq.devcluster", description=__doc__)
    parser.add_argument("--run-dir", type=Path, default=Path(".memq-run/devcluster"),
                        help="logs and ZooKeeper data (default: %(default)s)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    # SIGTERM ends the wait like Ctrl-C, so that `finally` stops the servers.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    cluster = DevCluster(args.run_dir)
    try:
        cluster.start()
        print(f"S3 endpoint:      {cluster.s3_endpoint}  (bucket {cluster.bucket})")
        print(f"Kafka bootstrap:  {cluster.kafka_bootstrap}")
        print(f"ZooKeeper hosts:  {cluster.zk_hosts}")
        print(f"logs:             {cluster.run_dir / 'logs'}")
        print("environment for memq processes:")
        print(f"  export MEMQ_S3_ENDPOINT_URL={cluster.s3_endpoint} MEMQ_S3_BUCKET={cluster.bucket}"
              " MEMQ_S3_ACCESS_KEY_ID=testing MEMQ_S3_SECRET_ACCESS_KEY=testing")
        print(f"  export MEMQ_KAFKA_BOOTSTRAP_SERVERS={cluster.kafka_bootstrap}"
              f" MEMQ_ZOOKEEPER_HOSTS={cluster.zk_hosts}")
        print("Ctrl-C stops the cluster.", flush=True)
        signal.pause()
    except KeyboardInterrupt:
        pass
    except MemqError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
