"""A Quix Streams application for tests/test_quix.py, run by the python of the Quix venv
(tests/support/quix_venv.py) as a process, so a test can SIGKILL it; it imports no memq.

Exactly-once: it counts each key of a 2-partition source topic in its State (RocksDB, under
STATE_DIR, with the changelog topic Quix creates through the admin API) and produces, for every
input, the key's running count with the input's value to SINK, in the same transaction as its
consumer offsets and changelog writes. DELAY_S, a pause per record, spreads the input over
several commits so that a SIGKILL lands between them.

Usage: python quix_counter.py BOOTSTRAP GROUP SOURCE SINK STATE_DIR DELAY_S
"""

from __future__ import annotations

import sys
import time
from typing import Any

from quixstreams import Application, State


def main() -> None:
    bootstrap, group, source_name, sink_name, state_dir, delay = sys.argv[1:7]
    pause = float(delay)
    app = Application(
        broker_address=bootstrap, consumer_group=group, auto_offset_reset="earliest",
        processing_guarantee="exactly-once", state_dir=state_dir, commit_interval=0.5,
        # The transactional.id is Quix's own (random per start): a killed process's open
        # transaction is aborted by the broker once this timeout passes (librdkafka's default: 60 s)
        producer_extra_config={"transaction.timeout.ms": 10_000},
        consumer_extra_config={"session.timeout.ms": 6_000, "heartbeat.interval.ms": 1_000},
    )
    source = app.topic(source_name, key_deserializer="str", value_deserializer="json")
    sink = app.topic(sink_name, key_serializer="str", value_serializer="json")

    def count(value: Any, key: str, _timestamp: int, _headers: Any, state: State) -> dict[str, Any]:
        n = state.get("count", 0) + 1
        state.set("count", n)
        if pause:
            time.sleep(pause)
        return {"key": key, "count": n, "input": value}

    app.dataframe(source).apply(count, stateful=True, metadata=True).to_topic(sink)
    app.run()


if __name__ == "__main__":
    main()
