"""The Spark guide's first snippet and `examples/spark_read.py`, run as written against `memq dev`."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MEMQ = str(Path(sys.executable).with_name("memq"))


def _guide_spark_snippet() -> str:
    spark = (ROOT / "docs" / "guides" / "spark.md").read_text()
    return spark.split("```python\n", 1)[1].split("```", 1)[0]


def test_guide_snippet_and_example_read_rows_from_memq_dev(tmp_path: Path) -> None:
    """From the directory where `memq dev` runs, with no credentials anywhere but the client
    config file it writes, both return the demo topic's rows."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MEMQ_"))}
    env |= {"AWS_CONFIG_FILE": str(tmp_path / "none"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}
    dev = subprocess.Popen([MEMQ, "dev", "--duration", "240", "--rate", "200"], cwd=tmp_path, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        assert dev.stdout is not None
        deadline = time.monotonic() + 90
        while not (line := dev.stdout.readline().decode()).startswith("config:"):
            assert time.monotonic() < deadline and dev.poll() is None, f"memq dev did not start: {line}"
        time.sleep(3)   # a few demo batches land
        snippet = _guide_spark_snippet() + "\nprint('ROWS', df.count())\n"
        run = subprocess.run([sys.executable, "-c", snippet], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=180)
        assert run.returncode == 0, run.stderr[-3000:]
        assert int(re.search(r"ROWS (\d+)", run.stdout).group(1)) > 0  # type: ignore[union-attr]
        example = subprocess.run([sys.executable, str(ROOT / "examples" / "spark_read.py"),
                                  ".memq-run/dev/memq.toml", "demo"], cwd=tmp_path, env=env,
                                 capture_output=True, text=True, timeout=180)
        assert example.returncode == 0, example.stderr[-3000:]
        assert "demo message" in example.stdout
    finally:
        if dev.poll() is None:
            dev.send_signal(signal.SIGTERM)
        try:
            dev.wait(60)
        finally:
            if dev.poll() is None:
                os.killpg(dev.pid, signal.SIGKILL)
                dev.wait(10)
