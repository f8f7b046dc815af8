"""`python -m memq.devcluster.moto_main --port P`: moto's S3 server on 127.0.0.1, quietly.

moto's own entry point logs one line per request; under benchmarks that is a large log and
measurable CPU, so this wrapper keeps werkzeug's request log at WARNING.
"""

from __future__ import annotations

import argparse
import logging

from moto.server import main as moto_main


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m memq.devcluster.moto_main")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    moto_main(["-H", "127.0.0.1", "-p", str(args.port)])


if __name__ == "__main__":
    main()
