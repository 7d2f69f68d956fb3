#!/usr/bin/env bash
# Lints the packaging files. Each check runs if its tool is on this machine and is skipped with
# a message otherwise; any check that runs and fails makes the script fail.
#
#   packaging/verify.sh [CORRAL_BINARY]
#
# CORRAL_BINARY (or $CORRAL_BIN) defaults to target/release/corral, then target/debug/corral.
#
# 1. systemd-analyze verify of corral.service and corral.socket. verify refuses an ExecStart=
#    whose binary does not exist, so the units are copied to a temporary directory with
#    /usr/local/bin/corral replaced by the built binary.
# 2. The Kubernetes manifest parses as YAML (python3 with PyYAML).
# 3. The logrotate file parses (logrotate --debug, which changes nothing).
# 4. The daemon accepts packaging/corral.toml and the ConfigMap's copy: it starts with each on a
#    temporary socket and answers a health check, then is stopped.
set -euo pipefail
cd "$(dirname "$0")/.."

bin="${1:-${CORRAL_BIN:-}}"
if [ -z "$bin" ]; then
  for b in target/release/corral target/debug/corral; do
    if [ -x "$b" ]; then bin="$b"; break; fi
  done
fi
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
  echo "verify: no corral binary (build with 'cargo build' or pass its path)" >&2
  exit 2
fi
bin="$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")"

tmp="$(mktemp -d)"
daemon_pid=""
cleanup() {
  if [ -n "$daemon_pid" ]; then kill "$daemon_pid" 2>/dev/null || true; wait "$daemon_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
failed=0
fail() { echo "verify: FAIL: $*" >&2; failed=1; }

# 1. systemd units.
if command -v systemd-analyze >/dev/null; then
  mkdir -p "$tmp/units"
  for u in corral.service corral.socket; do
    sed "s#/usr/local/bin/corral#$bin#g" "packaging/systemd/$u" >"$tmp/units/$u"
  done
  # verify prints problems (unknown keys, bad values, missing binaries) on stderr; some versions
  # exit 0 anyway, so any output counts as a failure.
  if out="$(cd "$tmp/units" && systemd-analyze verify --man=no ./corral.socket ./corral.service 2>&1)" && [ -z "$out" ]; then
    echo "verify: systemd units OK ($(systemd-analyze --version | head -1))"
  else
    fail "systemd-analyze verify:"; printf '%s\n' "$out" >&2
  fi
  # The security exposure score needs a running systemd; show it when possible.
  if [ -d /run/systemd/system ]; then
    echo "verify: (exposure of the installed unit, if installed: systemd-analyze security corral.service)"
  fi
else
  echo "verify: skipped systemd-analyze verify (systemd-analyze not installed)"
fi

# 2. Kubernetes YAML.
if command -v python3 >/dev/null && python3 -c 'import yaml' 2>/dev/null; then
  if python3 - packaging/kubernetes/daemonset.yaml <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d is not None]
kinds = [d.get("kind") for d in docs]
assert "DaemonSet" in kinds, kinds
for d in docs:
    assert d.get("apiVersion") and d.get("metadata", {}).get("name"), d
print("verify: Kubernetes manifest parses:", ", ".join(kinds))
PY
  then :; else fail "packaging/kubernetes/daemonset.yaml does not parse"; fi
else
  echo "verify: skipped the YAML check (python3 with PyYAML not available)"
fi

# 3. logrotate.
if command -v logrotate >/dev/null; then
  if out="$(logrotate --debug --state "$tmp/logrotate.state" packaging/logrotate/corral 2>&1)" \
      && ! grep -qiE '^error' <<<"$out"; then
    echo "verify: logrotate config OK"
  else
    fail "logrotate --debug:"; printf '%s\n' "$out" >&2
  fi
else
  echo "verify: skipped the logrotate check (logrotate not installed)"
fi

# 4. The example config, as the daemon reads it (and the Kubernetes ConfigMap's copy, when
# PyYAML can extract it). The socket and audit log go to a temporary directory (flags win over
# the file); every other key comes from the file.
configs=(packaging/corral.toml)
if command -v python3 >/dev/null && python3 -c 'import yaml' 2>/dev/null; then
  python3 - packaging/kubernetes/daemonset.yaml "$tmp/configmap.toml" <<'PY'
import sys, yaml
for d in yaml.safe_load_all(open(sys.argv[1])):
    if d and d.get("kind") == "ConfigMap" and "corral.toml" in d.get("data", {}):
        open(sys.argv[2], "w").write(d["data"]["corral.toml"])
PY
  [ -f "$tmp/configmap.toml" ] && configs+=("$tmp/configmap.toml")
fi
mkdir -p "$tmp/run"
sock="$tmp/run/c.sock"
for config in "${configs[@]}"; do
  rm -f "$sock"
  "$bin" serve --config "$config" --listen "unix:$sock" --audit-log "$tmp/audit.log" \
    >"$tmp/daemon.log" 2>&1 &
  daemon_pid=$!
  for _ in $(seq 100); do
    [ -S "$sock" ] && break
    kill -0 "$daemon_pid" 2>/dev/null || break
    sleep 0.1
  done
  name="$config"; [ "$config" = "$tmp/configmap.toml" ] && name="the ConfigMap in daemonset.yaml"
  if [ -S "$sock" ] && status="$("$bin" health --socket "unix:$sock" 2>&1 || true)" && [ -n "$status" ]; then
    echo "verify: the daemon starts with $name (health: $status)"
  else
    fail "the daemon did not start with $name:"; cat "$tmp/daemon.log" >&2
  fi
  kill "$daemon_pid" 2>/dev/null || true
  wait "$daemon_pid" 2>/dev/null || true
  daemon_pid=""
done

exit "$failed"
