"""A Faust worker for tests/test_faust.py (run as a process, so a test can SIGKILL it): an agent
counts each key of a 2-partition source topic into a Table (in memory, so a restarted worker has
only its changelog to recover from; DATADIR holds what else Faust keeps). Every 0.2 s it writes
its table and how many records of each key it has counted since it started, as JSON, to STATE.
aiokafka runs as faust-streaming installs it, without cramjam (its one codec library): a batch
served in a codec its producer did not choose (zstd) would crash the worker.

Usage: python faust_counter.py BOOTSTRAP APP_ID SOURCE STATE GUARANTEE DATADIR
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path

sys.modules["cramjam"] = None  # type: ignore[assignment]  # Faust as installed: aiokafka reads no zstd, lz4, snappy
import faust  # noqa: E402


def main() -> None:
    bootstrap, app_id, source_name, state_path, guarantee, datadir = sys.argv[1:7]
    app = faust.App(app_id, broker=f"kafka://{bootstrap}", store="memory://", processing_guarantee=guarantee,
                    topic_partitions=2, web_enabled=False, broker_commit_every=50, broker_commit_interval=0.5,
                    stream_wait_empty=False, consumer_auto_offset_reset="earliest", datadir=datadir,
                    broker_session_timeout=6.0, broker_heartbeat_interval=1.0)
    source = app.topic(source_name, key_type=str, value_type=str, partitions=2)
    counts = app.Table("counts", default=int, partitions=2)
    seen: Counter[str] = Counter()

    @app.agent(source)
    async def count(stream: faust.Stream) -> None:
        async for key, _ in stream.items():
            counts[key] += 1
            seen[key] += 1

    @app.timer(0.2)
    async def export() -> None:
        tmp = Path(state_path + ".tmp")
        tmp.write_text(json.dumps({"seen": seen, "table": dict(counts.items()), "pid": os.getpid()}))
        tmp.replace(state_path)

    sys.argv = [sys.argv[0], "worker", "--loglevel", "info", "--without-web"]
    app.main()


if __name__ == "__main__":
    main()
