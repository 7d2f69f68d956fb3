#!/usr/bin/env bash
# Runs the thin clients' tests (clients/python, clients/node) against real corral daemons started
# from target/debug/corral. Each client owns its section below, between its markers.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# The daemon under test: $CORRAL_BIN if given, else a fresh debug build (a no-op when up to date).
if [ -z "${CORRAL_BIN:-}" ]; then
  cargo build --quiet
  export CORRAL_BIN="$ROOT/target/debug/corral"
fi

# --- node ---
# @corral/client: install the locked dependencies, then `node --test` (starts its own daemons).
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm
  else
    echo "run-client-tests: node and npm are required for clients/node" >&2
    exit 1
  fi
fi
(
  cd "$ROOT/clients/node"
  npm ci --no-audit --no-fund --loglevel=error
  npm test
)
# --- end node ---

# --- python ---
# corral-client: a venv under target/pyvenv, the client installed from clients/python (building it
# generates the gRPC stubs from proto/ with grpcio-tools, fetched from PyPI), pytest, the standard
# grpcio health and reflection clients (tests/test_stock_grpcio.py calls the daemon as any grpcio
# user would), the official MCP SDK (tests/test_mcp_front.py drives `corral mcp` with it; it needs
# Python 3.10+), then its tests (they start their own daemons from $CORRAL_BIN).
PYVENV="${CARGO_TARGET_DIR:-$ROOT/target}/pyvenv"
PYTHON="${PYTHON:-python3}"
python_venv_ok() { [ -x "$PYVENV/bin/python" ] && "$PYVENV/bin/python" -m pip --version >/dev/null 2>&1; }
if ! python_venv_ok; then
  rm -rf "$PYVENV"
  if ! command -v "$PYTHON" >/dev/null || ! "$PYTHON" -m venv "$PYVENV" >/dev/null 2>&1; then
    rm -rf "$PYVENV"
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv
      PYTHON=python3
      "$PYTHON" -m venv "$PYVENV"
    else
      echo "run-client-tests: clients/python needs python3 (3.9+) with its venv module;" \
        "on Debian/Ubuntu: sudo apt-get install -y python3 python3-venv" >&2
      exit 1
    fi
  fi
fi
"$PYVENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
"$PYVENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade \
  "$ROOT/clients/python" "pytest>=7" grpcio-health-checking grpcio-reflection \
  "mcp>=2,<3; python_version >= '3.10'"
(
  cd "$ROOT/clients/python"
  "$PYVENV/bin/python" -m pytest -q -p no:cacheprovider
)
# --- end python ---
