#!/usr/bin/env bash
# Install memq with its dev cluster into .venv, then run the main job.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/_venv.sh
ensure_venv dev
exec .venv/bin/memq dev "$@"
