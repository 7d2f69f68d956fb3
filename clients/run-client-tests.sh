#!/usr/bin/env bash
# Runs the thin clients' tests (clients/python, clients/node) against real corral daemons started
# from target/debug/corral. Each client owns its section below, between its markers. Every suite
# runs, whatever became of the ones before it (each stops at its own first failing step); the
# script exits non-zero at the end if any failed, naming them.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# The daemon under test: $CORRAL_BIN if given, else a fresh debug build (a no-op when up to date).
if [ -z "${CORRAL_BIN:-}" ]; then
  cargo build --quiet
  export CORRAL_BIN="$ROOT/target/debug/corral"
fi

SUITES=()
FAILED=()
# run_suite NAME COMMAND...: runs COMMAND in a subshell that stops at its first failing step,
# and records the outcome; never stops this script.
run_suite() {
  local name=$1 rc
  shift
  SUITES+=("$name")
  echo "run-client-tests: --- $name ---"
  set +e
  (
    set -e
    "$@"
  )
  rc=$?
  set -e
  if [ "$rc" -ne 0 ]; then
    FAILED+=("$name")
    echo "run-client-tests: $name FAILED (exit $rc)" >&2
  fi
}

# --- node ---
# @corral/client: install the locked dependencies, then `node --test` (starts its own daemons).
node_tools() {
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm
    else
      echo "run-client-tests: node and npm are required for clients/node" >&2
      return 1
    fi
  fi
}
node_suite() {
  node_tools
  cd "$ROOT/clients/node"
  npm ci --no-audit --no-fund --loglevel=error
  npm test
}
# Again with the oldest dependencies package.json allows (the floor of each range), so the ranges
# it declares stay true; then back to the lock file, whatever the result.
node_lower_suite() {
  node_tools
  cd "$ROOT/clients/node"
  local floors rc=0
  floors=$(node -e 'const d = require("./package.json").dependencies;
    console.log(Object.entries(d).map(([n, r]) => `${n}@${r.match(/[0-9][0-9.]*/)[0]}`).join(" "))')
  echo "run-client-tests: node at the lower bounds: $floors"
  # shellcheck disable=SC2086
  npm install --no-save --no-audit --no-fund --loglevel=error $floors && npm test || rc=$?
  npm ci --no-audit --no-fund --loglevel=error
  return "$rc"
}
run_suite node node_suite
run_suite "node (lower bounds)" node_lower_suite
# --- end node ---

# --- python ---
# corral-client: a venv under target/pyvenv, the client installed from clients/python (building it
# generates the gRPC stubs from proto/ with grpcio-tools, fetched from PyPI), pytest, the standard
# grpcio health and reflection clients (tests/test_stock_grpcio.py calls the daemon as any grpcio
# user would), the official MCP SDK through the package's `mcp` extra (tests/test_mcp_front.py
# drives `corral mcp` with it, tests/test_codex_mcp.py drives corral-codex-mcp; it needs Python
# 3.10+), the OpenAI Agents SDK through the `agents` extra at the exact version pinned here
# (tests/test_agents_sdk.py runs agents on `corral mcp` and on corral_client.agents; 3.10+ too),
# then its tests (they start their own daemons from $CORRAL_BIN).
PYVENV="${CARGO_TARGET_DIR:-$ROOT/target}/pyvenv"
PYTHON="${PYTHON:-python3}"
python_venv_ok() { [ -x "$PYVENV/bin/python" ] && "$PYVENV/bin/python" -m pip --version >/dev/null 2>&1; }
python_suite() {
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
        return 1
      fi
    fi
  fi
  "$PYVENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
  "$PYVENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade \
    "$ROOT/clients/python[mcp,agents]" "openai-agents==0.24.0; python_version >= '3.10'" \
    "pytest>=7" grpcio-health-checking grpcio-reflection
  cd "$ROOT/clients/python"
  "$PYVENV/bin/python" -m pytest -q -p no:cacheprovider
}
# Again in a second venv with the oldest versions pyproject.toml allows (the floor of each
# dependency range and of the `mcp` and `agents` extras; the test-only grpcio packages at grpcio's
# floor), so the ranges it declares stay true.
PYVENV_LOW="${CARGO_TARGET_DIR:-$ROOT/target}/pyvenv-lower"
python_lower_suite() {
  local floors
  floors=$("$PYVENV/bin/python" - "$ROOT/clients/python/pyproject.toml" <<'PY'
import re, sys
text = open(sys.argv[1], encoding="utf-8").read()
deps = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M).group(1)
pins = {m.group(1): m.group(2) for m in re.finditer(r'"([A-Za-z0-9_.-]+)>=([0-9][0-9.]*)', deps)}
pins["grpcio-health-checking"] = pins["grpcio-reflection"] = pins["grpcio"]
if sys.version_info >= (3, 10):  # the MCP SDK and the Agents SDK need 3.10+
    for extra, package in (("mcp", "mcp"), ("agents", "openai-agents")):
        floor = re.search(rf'^{extra} = \["{package}>=([0-9][0-9.]*)', text, re.M)
        if floor:
            pins[package] = floor.group(1)
print(" ".join(f"{name}=={version}" for name, version in pins.items()))
PY
  )
  echo "run-client-tests: python at the lower bounds: $floors"
  [ -x "$PYVENV_LOW/bin/pip" ] || { rm -rf "$PYVENV_LOW"; "$PYVENV/bin/python" -m venv "$PYVENV_LOW"; }
  # Old grpcio releases have no wheels for Pythons newer than they are: there, say so and go on.
  # shellcheck disable=SC2086
  if ! "$PYVENV_LOW/bin/python" -m pip install --quiet --disable-pip-version-check --only-binary=:all: \
    $floors "pytest>=7"; then
    echo "run-client-tests: the lower bounds have no wheels for $("$PYVENV_LOW/bin/python" -V);" \
      "not checked on this machine" >&2
    return 0
  fi
  "$PYVENV_LOW/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --force-reinstall \
    "$ROOT/clients/python"
  cd "$ROOT/clients/python"
  "$PYVENV_LOW/bin/python" -m pytest -q -p no:cacheprovider
}
run_suite python python_suite
run_suite "python (lower bounds)" python_lower_suite
# --- end python ---

if ((${#FAILED[@]})); then
  echo "run-client-tests: FAILED: ${#FAILED[@]} of ${#SUITES[@]} suites: $(printf '%s; ' "${FAILED[@]}" | sed 's/; $//')" >&2
  exit 1
fi
echo "run-client-tests: all ${#SUITES[@]} suites passed (${SUITES[*]})"
