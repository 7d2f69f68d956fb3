#!/usr/bin/env bash
# Checks the Dockerfile and, where a container tool can run, builds the image and starts corral
# in it. CI runs it (.ci/run) with the static binary it built.
#
#   packaging/image-test.sh STATIC_CORRAL_BINARY
#
# 1. Lint (always): the stages, the static (musl) build command, the Rust version against
#    Cargo.toml, HEALTHCHECK running `corral health`, ENTRYPOINT/CMD, a non-root user with its
#    XDG_RUNTIME_DIR, a .dockerignore that keeps target/ out of the build context, and that the
#    binary given is statically linked.
# 2. Build (as root, with buildah and debootstrap; otherwise skipped, saying why): a Debian base
#    made with debootstrap from the Debian mirror (no image registry is needed; cached in
#    ~/.cache/corral-ci), then the Dockerfile's stages as written, except that the `build`
#    stage is replaced by the binary given — the same `cargo build --locked --target
#    ...-musl`, in the debug profile: a release build takes too long for CI. Images live in a
#    private temporary store, removed at the end.
# 3. Run the image: its entrypoint, command and healthcheck are the expected ones; as root,
#    with the capabilities of packaging/systemd/corral.service and no seccomp filter (what the
#    Kubernetes manifests grant), `corral serve` starts, the image's HEALTHCHECK command exactly
#    as declared reports SERVING, and a command runs confined (a read-only /etc). As the image's
#    non-root user, the daemon starts on $XDG_RUNTIME_DIR/corral/corral.sock and the
#    HEALTHCHECK command gets an answer (sandboxing there needs unprivileged user namespaces,
#    which buildah's chroot isolation does not allow, so it may say NOT_SERVING).
set -euo pipefail
cd "$(dirname "$0")/.."

bin="${1:-}"
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
  echo "image-test: usage: packaging/image-test.sh STATIC_CORRAL_BINARY" >&2
  exit 2
fi
bin="$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")"

# 1. Lint.
python3 - "$bin" <<'PY'
import json, re, shlex, sys

errors = []
def need(ok, what):
    if not ok:
        errors.append(what)

text = open("Dockerfile").read()
# Instructions, with continuation lines joined and comments dropped.
instructions, current = [], ""
for line in text.splitlines():
    if not current and (not line.strip() or line.lstrip().startswith("#")):
        continue
    if current and line.lstrip().startswith("#"):
        continue
    current += line.rstrip("\\").strip() + " "
    if not line.rstrip().endswith("\\"):
        keyword, _, rest = current.strip().partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
        current = ""

stages, global_args = [], {}
for keyword, rest in instructions:
    if keyword == "FROM":
        m = re.match(r"(\S+)(?:\s+AS\s+(\S+))?$", rest, re.I)
        stages.append({"from": m.group(1), "name": (m.group(2) or "").lower(), "body": []})
    elif not stages and keyword == "ARG":
        name, _, value = rest.partition("=")
        global_args[name] = value
    else:
        stages[-1]["body"].append((keyword, rest))
by_name = {s["name"]: s for s in stages if s["name"]}

def lineage(stage):
    """The stage and the stages it is built FROM, nearest first."""
    chain = [stage]
    while stage["from"].lower() in by_name:
        stage = by_name[stage["from"].lower()]
        chain.append(stage)
    return chain

def last(chain, keyword):
    for stage in chain:
        for k, rest in reversed(stage["body"]):
            if k == keyword:
                return rest
    return None

need(len(stages) >= 2, "a multi-stage build (at least two FROM)")
build = by_name.get("build")
need(build is not None, "a stage named `build`")
final = stages[-1]
chain = lineage(final)
if build:
    runs = " ".join(rest for k, rest in build["body"] if k == "RUN")
    need(re.search(r"cargo build --release --locked --target \S*", runs) is not None,
         "the build stage runs `cargo build --release --locked --target ...`")
    need("unknown-linux-musl" in runs, "the build stage targets musl (a static binary)")
    need(build["from"].startswith("rust:${RUST_VERSION}"), "the build stage is FROM rust:${RUST_VERSION}-...")
copies = [rest for k, rest in final["body"] if k == "COPY"]
need(any(re.match(r"--from=build\s+\S+\s+/usr/local/bin/corral$", c) for c in copies),
     "the final stage copies the binary from `build` to /usr/local/bin/corral")
cargo = open("Cargo.toml").read()
msrv = re.search(r'^rust-version\s*=\s*"([^"]+)"', cargo, re.M).group(1)
need(global_args.get("RUST_VERSION") == msrv,
     f"ARG RUST_VERSION ({global_args.get('RUST_VERSION')}) equals Cargo.toml's rust-version ({msrv})")

health = last(chain, "HEALTHCHECK")
need(health is not None, "a HEALTHCHECK in the final image")
if health:
    m = re.search(r"CMD\s+(\[.*\])\s*$", health)
    argv = json.loads(m.group(1)) if m else []
    need(len(argv) >= 2 and argv[0].endswith("/corral") and argv[1] == "health",
         f"HEALTHCHECK runs `corral health` in exec form (got: {health})")
entry, cmd = last(chain, "ENTRYPOINT"), last(chain, "CMD")
need(entry is not None and json.loads(entry) == ["/usr/local/bin/corral"],
     f'ENTRYPOINT ["/usr/local/bin/corral"] (got: {entry})')
need(cmd is not None and json.loads(cmd) == ["serve"], f'CMD ["serve"] (got: {cmd})')
# Non-root friendly: a user with a fixed uid, its runtime directory made and owned by it, and
# XDG_RUNTIME_DIR pointing there (where a non-root daemon and its health check put the socket).
runs = " ".join(rest for s in chain for k, rest in s["body"] if k == "RUN")
user = re.search(r"useradd\s+(?:\S+\s+)*?--uid\s+(\d+)\s+(?:\S+\s+)*?(\w+)\s*(?:&&|$)", runs)
need(user is not None and user.group(1) != "0", "a non-root user made with useradd --uid N")
if user:
    uid, name = user.group(1), user.group(2)
    need(re.search(rf"install -d -m 0700 -o {name} -g {name} /run/user/{uid}\b", runs) is not None,
         f"/run/user/{uid} made, owned by {name}, mode 0700")
    envs = " ".join(rest for s in chain for k, rest in s["body"] if k == "ENV")
    need(f"XDG_RUNTIME_DIR=/run/user/{uid}" in envs, f"ENV XDG_RUNTIME_DIR=/run/user/{uid}")
need(last(chain, "USER") in (None, "root", "0"),
     "no USER switch: the multi-user sandbox needs root; `--user` is the operator's choice")

ignore = [l.strip() for l in open(".dockerignore") if l.strip() and not l.startswith("#")]
need(ignore[:1] == ["*"] and not any("target" in l for l in ignore if l.startswith("!")),
     ".dockerignore starts with `*` and never re-includes target/")

# The binary given is static: no program interpreter (PT_INTERP) in its ELF header.
import struct
with open(sys.argv[1], "rb") as f:
    head = f.read(64)
    need(head[:4] == b"\x7fELF" and head[4] == 2, "the binary is a 64-bit ELF")
    phoff, = struct.unpack_from("<Q", head, 32)
    phentsize, phnum = struct.unpack_from("<HH", head, 54)
    f.seek(phoff)
    types = [struct.unpack_from("<I", f.read(phentsize))[0] for _ in range(phnum)]
    need(3 not in types, "the binary is statically linked (no PT_INTERP)")

if errors:
    for e in errors:
        print(f"image-test: FAIL: Dockerfile: expected {e}", file=sys.stderr)
    sys.exit(1)
print(f"image-test: Dockerfile OK ({len(stages)} stages: "
      + ", ".join(s['name'] or s['from'] for s in stages) + f"; Rust {msrv}; static binary)")
PY

# 2. Build.
skip() { echo "image-test: skipped the image build: $*"; exit 0; }
[ "$(id -u)" = 0 ] || skip "needs root (buildah with chroot isolation)"
command -v buildah >/dev/null || skip "buildah is not installed (apt-get install buildah)"
command -v debootstrap >/dev/null || skip "debootstrap is not installed (apt-get install debootstrap)"

release="$(sed -n 's/^ARG DEBIAN_RELEASE=//p' Dockerfile)"
cache="${HOME}/.cache/corral-ci"
base_tar="$cache/debian-$release-minbase.tar"
# The build's layers need about 1 GiB (vfs copies each one whole); below 3 GiB free the build
# would fail half-way with ENOSPC, which says nothing about the image.
free_kib="$(df -Pk /var/tmp | awk 'NR==2 {print $4}')"
[ "$free_kib" -ge $((3 * 1024 * 1024)) ] \
  || skip "only $((free_kib / 1024)) MiB free in /var/tmp (the build needs 3 GiB)"
work="$(mktemp -d /var/tmp/corral-image.XXXXXX)"
# overlay is fast; vfs (a full copy per layer) works on any filesystem.
B=(buildah --root "$work/storage" --runroot "$work/run" --storage-driver overlay)
cleanup() {
  "${B[@]}" rm --all >/dev/null 2>&1 || true
  # overlay leaves its mounts behind otherwise.
  "${B[@]}" rmi --all --force >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
export BUILDAH_ISOLATION=chroot
if ! ctr="$("${B[@]}" from -q scratch 2>"$work/overlay.err")"; then
  echo "image-test: overlay storage unavailable ($(head -1 "$work/overlay.err")); using vfs"
  B=(buildah --root "$work/storage-vfs" --runroot "$work/run-vfs" --storage-driver vfs)
else
  "${B[@]}" rm "$ctr" >/dev/null
fi

# A base older than a week is made again (the userland stage updates its package lists anyway).
if [ ! -s "$base_tar" ] || [ -n "$(find "$base_tar" -mtime +7 2>/dev/null)" ]; then
  mkdir -p "$cache"
  echo "image-test: debootstrap --variant=minbase $release (cached in $base_tar)"
  if ! debootstrap --variant=minbase "$release" "$work/rootfs" http://deb.debian.org/debian \
      >"$work/debootstrap.log" 2>&1; then
    tail -20 "$work/debootstrap.log" >&2
    skip "debootstrap could not fetch Debian $release (see above)"
  fi
  tar -C "$work/rootfs" -cf "$base_tar.new" . && mv "$base_tar.new" "$base_tar"
  rm -rf "$work/rootfs"
fi
ctr="$("${B[@]}" from -q scratch)"
"${B[@]}" add -q "$ctr" "$base_tar" / >/dev/null
"${B[@]}" commit -q "$ctr" "docker.io/library/debian:$release-slim" >/dev/null
"${B[@]}" rm "$ctr" >/dev/null

# The Dockerfile with its `build` stage replaced by the binary given; every other line as is.
mkdir "$work/context"
cp "$bin" "$work/context/corral"
python3 - Dockerfile "$work/context/Dockerfile" <<'PY'
import re, sys
out, skipping = [], False
for line in open(sys.argv[1]).read().splitlines(keepends=True):
    if re.match(r"FROM\s", line, re.I):
        skipping = re.search(r"\sAS\s+build\s*$", line, re.I) is not None
        if skipping:
            out.append("FROM scratch AS build\nCOPY corral /corral\n")
            continue
    if not skipping:
        out.append(line)
open(sys.argv[2], "w").write("".join(out))
PY
echo "image-test: building the image (buildah $(buildah --version | awk '{print $3}'), build stage = $bin)"
start=$(date +%s)
if ! "${B[@]}" bud --isolation chroot --format docker --pull=never --layers=false \
    -t localhost/corral:test "$work/context" >"$work/build.log" 2>&1; then
  tail -30 "$work/build.log" >&2
  echo "image-test: FAIL: the image did not build" >&2
  exit 1
fi
echo "image-test: image built in $(( $(date +%s) - start )) s"

# 3. Run it.
config="$("${B[@]}" inspect --type image localhost/corral:test)"
read -r -a healthcheck < <(python3 -c '
import json, shlex, sys
c = json.load(sys.stdin)["Docker"]["config"]
assert c["Entrypoint"] == ["/usr/local/bin/corral"], c["Entrypoint"]
assert c["Cmd"] == ["serve"], c["Cmd"]
test = c["Healthcheck"]["Test"]
assert test[0] == "CMD" and test[1:3] == ["/usr/local/bin/corral", "health"], test
print(" ".join(shlex.quote(a) for a in test[1:]))' <<<"$config")
echo "image-test: image config OK (ENTRYPOINT corral, CMD serve, HEALTHCHECK ${healthcheck[*]})"

# The daemon in the background, the healthcheck until it answers, then a sandboxed command.
# The sandbox's layers are real ones: the worker's mount namespace, Landlock and seccomp.
cat >"$work/context/run.sh" <<'SH'
set -u
log=$(mktemp)
answer=$(mktemp)
/usr/local/bin/corral serve >"$log" 2>&1 &
daemon=$!
code=2
for _ in $(seq 100); do
  "$@" >"$answer" 2>&1; code=$?
  [ "$code" != 2 ] && break
  sleep 0.1
done
echo "healthcheck exit $code: $(head -1 "$answer")"
if [ "$(id -u)" = 0 ]; then
  cd /tmp && /usr/local/bin/corral invoke shell \
    '{"command":["bash","-c","git --version && python3 -V && touch /etc/corral-escape; echo touch=$?"]}'
else
  grep -q "serving on unix:$XDG_RUNTIME_DIR/corral/corral.sock" "$log" && echo "socket in XDG_RUNTIME_DIR"
fi
kill "$daemon"; wait "$daemon"
echo "daemon exit $?"
SH
ctr="$("${B[@]}" from -q --pull=never --security-opt seccomp=unconfined \
  --cap-add CAP_SYS_ADMIN,CAP_NET_ADMIN,CAP_SETUID,CAP_SETGID,CAP_SETPCAP,CAP_DAC_READ_SEARCH,CAP_KILL \
  localhost/corral:test)"
"${B[@]}" copy -q "$ctr" "$work/context/run.sh" /run.sh >/dev/null
failed=0
out="$("${B[@]}" run --isolation chroot "$ctr" -- sh /run.sh "${healthcheck[@]}" 2>&1)" || true
if grep -q "^healthcheck exit 0: SERVING" <<<"$out" && grep -q "git version" <<<"$out" \
    && grep -q "Python 3" <<<"$out" && grep -q "Read-only file system" <<<"$out" \
    && grep -q "^daemon exit 0" <<<"$out"; then
  echo "image-test: as root: SERVING, sandboxed command confined (read-only /etc), clean stop"
else
  echo "image-test: FAIL: as root in the image:" >&2; printf '%s\n' "$out" >&2; failed=1
fi
out="$("${B[@]}" run --isolation chroot --user agent "$ctr" -- sh /run.sh "${healthcheck[@]}" 2>&1)" || true
if grep -qE "^healthcheck exit [01]: (NOT_)?SERVING" <<<"$out" \
    && grep -q "^socket in XDG_RUNTIME_DIR" <<<"$out" && grep -q "^daemon exit 0" <<<"$out"; then
  echo "image-test: as user agent: the daemon serves on \$XDG_RUNTIME_DIR and the healthcheck gets $(sed -n 's/^healthcheck exit [01]: //p' <<<"$out")"
else
  echo "image-test: FAIL: as user agent in the image:" >&2; printf '%s\n' "$out" >&2; failed=1
fi
exit "$failed"
