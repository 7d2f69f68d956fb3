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
