#!/usr/bin/env bash
# Install memq with test dependencies into .venv, then run the test suite (extra args go to pytest).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/_venv.sh
ensure_venv test

# System packages the suite needs: Java for ZooKeeper, chromium for the dashboard browser tests,
# kcat for the Kafka-listener test with a stock Kafka CLI producer, prometheus (and its promtool)
# for the alert-rule tests of deploy/prometheus.
missing=()
command -v java >/dev/null || missing+=(default-jre-headless)
command -v iptables >/dev/null || missing+=(iptables)
command -v chromium >/dev/null || command -v chromium-browser >/dev/null || missing+=(chromium)
command -v kcat >/dev/null || missing+=(kcat)
command -v promtool >/dev/null || missing+=(prometheus)
if (( ${#missing[@]} )); then
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
        echo "==> apt-get install ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
    else
        echo "!! missing system packages: ${missing[*]} (not root or no apt-get: install them yourself;" \
             "without chromium the browser tests are skipped, without Java ZooKeeper cannot start)" >&2
    fi
fi

rc=0
.venv/bin/python -m pytest "$@" || rc=$?
if (( rc == 5 )); then
    echo "!! pytest collected no tests: that is a failure to fix, not a pass" >&2
fi
exit "$rc"
