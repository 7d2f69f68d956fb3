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
# 2. The Kubernetes manifests parse as YAML (python3 with PyYAML), and each corral container's
#    grpc readiness probe dials the health_listen port of its ConfigMap, which it declares.
# 3. The logrotate file parses (logrotate --debug, which changes nothing).
# 4. The daemon accepts packaging/corral.toml and each manifest's ConfigMap: it starts with each
#    (on a temporary socket, or for the TLS one on loopback TCP with test certificates) and
#    answers a health check — for the manifests also on the health-only port the probe uses —
#    then is stopped.
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
have_yaml=0
if command -v python3 >/dev/null && python3 -c 'import yaml' 2>/dev/null; then have_yaml=1; fi
if [ "$have_yaml" = 1 ]; then
  if python3 - packaging/kubernetes/*.yaml <<'PY'
import sys, tomllib, yaml
expected = {"daemonset.yaml": "DaemonSet", "sandbox.yaml": "Sandbox"}
for path in sys.argv[1:]:
    docs = [d for d in yaml.safe_load_all(open(path)) if d is not None]
    kinds = [d.get("kind") for d in docs]
    name = path.rsplit("/", 1)[-1]
    assert expected.get(name, kinds[0]) in kinds, (path, kinds)
    configs = {}
    for d in docs:
        assert d.get("apiVersion") and d.get("metadata", {}).get("name"), d
        if d["kind"] == "ConfigMap" and "corral.toml" in d.get("data", {}):
            configs[d["metadata"]["name"]] = tomllib.loads(d["data"]["corral.toml"])
    for d in docs:
        if d["kind"] == "Sandbox":
            assert d["apiVersion"].startswith("agents.x-k8s.io/"), d["apiVersion"]
            pod = d["spec"]["podTemplate"]["spec"]
            claims = {c["metadata"]["name"] for c in d["spec"].get("volumeClaimTemplates", [])}
        elif d["kind"] == "DaemonSet":
            pod = d["spec"]["template"]["spec"]
            claims = set()
        else:
            continue
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for c in pod["containers"]:
            for m in c.get("volumeMounts", []):
                assert m["name"] in volumes or m["name"] in claims, (path, m["name"])
            config = next(
                (configs[volumes[m["name"]]["configMap"]["name"]] for m in c.get("volumeMounts", [])
                 if "configMap" in volumes.get(m["name"], {})), None)
            assert config is not None, f"{path}: container {c['name']} mounts no corral.toml ConfigMap"
            port = int(config["health_listen"].rsplit(":", 1)[1])
            probe = c["readinessProbe"]["grpc"]["port"]
            assert probe == port, f"{path}: readiness probe on {probe}, health_listen on {port}"
            assert port in [p["containerPort"] for p in c.get("ports", [])], (path, port)
    print(f"verify: Kubernetes manifest {name} parses ({', '.join(kinds)}); grpc probe on health_listen :{port}")
PY
  then :; else fail "packaging/kubernetes/*.yaml"; fi
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

# 4. The example config and each manifest's ConfigMap, as the daemon reads them. The listen
# address, the health port and the audit log go to temporary places (flags win over the file);
# every other key comes from the file. A config with [tls] gets test certificates.
configs=(packaging/corral.toml)
if [ "$have_yaml" = 1 ]; then
  for manifest in packaging/kubernetes/*.yaml; do
    out="$tmp/$(basename "$manifest" .yaml).toml"
    python3 - "$manifest" "$out" <<'PY'
import sys, yaml
for d in yaml.safe_load_all(open(sys.argv[1])):
    if d and d.get("kind") == "ConfigMap" and "corral.toml" in d.get("data", {}):
        open(sys.argv[2], "w").write(d["data"]["corral.toml"])
PY
    [ -f "$out" ] && configs+=("$out")
  done
fi
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
make_certs() {
  # A CA, a server certificate for 127.0.0.1 and a client certificate named agent-runner.
  local d="$tmp/pki"
  mkdir -p "$d"
  openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=verify-ca \
    -keyout "$d/ca.key" -out "$d/ca.pem" 2>/dev/null
  for who in server agent-runner; do
    if [ "$who" = server ]; then ext="subjectAltName=IP:127.0.0.1"; else ext="extendedKeyUsage=clientAuth"; fi
    openssl req -newkey rsa:2048 -nodes -subj "/CN=$who" -keyout "$d/$who.key" -out "$d/$who.csr" 2>/dev/null
    printf 'basicConstraints=CA:FALSE\n%s\n' "$ext" >"$d/$who.ext"
    openssl x509 -req -in "$d/$who.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial \
      -days 1 -extfile "$d/$who.ext" -out "$d/$who.pem" 2>/dev/null
  done
}
mkdir -p "$tmp/run"
sock="$tmp/run/c.sock"
for config in "${configs[@]}"; do
  name="$config"
  case "$config" in "$tmp"/*) name="the ConfigMap in packaging/kubernetes/$(basename "$config" .toml).yaml" ;; esac
  args=(serve --config "$config" --audit-log "$tmp/audit.log")
  checks=()
  hport=""
  if grep -q '^health_listen' "$config"; then
    hport="$(free_port)"
    args+=(--health-listen "127.0.0.1:$hport")
    checks+=("--socket tcp:127.0.0.1:$hport")
  fi
  if grep -q '^\[tls\]' "$config"; then
    if ! command -v openssl >/dev/null; then
      echo "verify: skipped $name (it needs TLS certificates; openssl not installed)"
      continue
    fi
    [ -f "$tmp/pki/ca.pem" ] || make_certs
    port="$(free_port)"
    args+=(--listen "tcp:127.0.0.1:$port" --tls-cert "$tmp/pki/server.pem"
      --tls-key "$tmp/pki/server.key" --tls-client-ca "$tmp/pki/ca.pem")
    checks+=("--socket tcp:127.0.0.1:$port --tls-ca $tmp/pki/ca.pem --tls-cert $tmp/pki/agent-runner.pem --tls-key $tmp/pki/agent-runner.key")
  else
    rm -f "$sock"
    args+=(--listen "unix:$sock")
    checks+=("--socket unix:$sock")
  fi
  if ! "$bin" "${args[@]}" --check-config >"$tmp/check.log" 2>&1; then
    fail "corral serve --check-config refuses $name:"; cat "$tmp/check.log" >&2
    continue
  fi
  "$bin" "${args[@]}" >"$tmp/daemon.log" 2>&1 &
  daemon_pid=$!
  # The start-up block is printed once every listener is up.
  for _ in $(seq 100); do
    grep -q 'try:' "$tmp/daemon.log" && break
    kill -0 "$daemon_pid" 2>/dev/null || break
    sleep 0.1
  done
  for check in "${checks[@]}"; do
    # Exit 0 (SERVING) or 1 (NOT_SERVING: this machine cannot apply a layer) both mean the
    # daemon answered; 2 means it did not.
    code=0
    # shellcheck disable=SC2086 # $check is a list of flags
    status="$("$bin" health $check 2>"$tmp/health.err")" || code=$?
    if [ "$code" -le 1 ]; then
      echo "verify: the daemon starts with $name (health ${check%% --tls-ca*}: ${status%%$'\n'*})"
    else
      fail "the daemon did not answer with $name ($check): $(cat "$tmp/health.err")"
      cat "$tmp/daemon.log" >&2
    fi
  done
  kill "$daemon_pid" 2>/dev/null || true
  wait "$daemon_pid" 2>/dev/null || true
  daemon_pid=""
done

exit "$failed"
