"""`python -m memq.devcluster.moto_main --port P`: moto's S3 server on 127.0.0.1, quietly.

moto's own entry point logs one line per request; under benchmarks that is a large log and
measurable CPU, so this wrapper keeps werkzeug's request log at WARNING. It also keeps objects
of up to `KEY_BUFFER_BYTES` in memory, as the dev Kafka (tansu, memory storage) keeps its log:
moto's default spills each object over ~5 MB to a temporary file on disk, so every full batch
PUT (8 MiB by default) cost the dev S3 a file write on the broker's machine.
"""

from __future__ import annotations

import argparse
import logging
import os

from moto.server import main as moto_main

KEY_BUFFER_BYTES = 64 * 1024 * 1024   # above TopicConfig's largest batch_bytes default


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m memq.devcluster.moto_main")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    os.environ.setdefault("MOTO_S3_DEFAULT_KEY_BUFFER_SIZE", str(KEY_BUFFER_BYTES))
    moto_main(["-H", "127.0.0.1", "-p", str(args.port)])


if __name__ == "__main__":
    main()
