# Sourced by dev.sh and test.sh: create (or reuse) .venv and install memq with the given extras.
# Reinstalls only when pyproject.toml changed since the last install of those extras.

# Python keeps compiled modules (and pytest its rewritten test modules) only where it may write
# them: an environment with PYTHONDONTWRITEBYTECODE set made every broker, `memq` command and Spark
# worker compile memq from source again (about a third of a CLI-heavy test's CPU).
unset PYTHONDONTWRITEBYTECODE

ensure_venv() {
    local extras="$1"
    if ! command -v python3 >/dev/null; then
        echo "memq needs python3 (>= 3.11) on PATH" >&2
        exit 1
    fi
    if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
        echo "memq needs Python >= 3.11, found $(python3 --version)" >&2
        exit 1
    fi
    if [[ ! -x .venv/bin/python ]]; then
        echo "==> creating .venv"
        python3 -m venv .venv || {
            echo "python3 -m venv failed; on Debian/Ubuntu: apt-get install python3-venv" >&2
            exit 1
        }
    fi
    local stamp=".venv/.memq-installed-${extras}"
    local want
    want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
    if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
        echo "==> installing memq[${extras}] into .venv"
        .venv/bin/python -m pip install --quiet --upgrade pip
        .venv/bin/python -m pip install --quiet -e ".[${extras}]"
        echo "$want" > "$stamp"
    fi
}
