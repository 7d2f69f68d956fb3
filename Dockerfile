# corral's container image: a static (musl) corral on a Debian userland with the tools coding
# agents expect. Tools run in this container's filesystem, so this image *is* the agents'
# machine: add what your agents need to the `userland` stage (docs/DEPLOY.md, "Container image").
#
#   docker build -t corral .          (or: podman build -t corral . / buildah bud -t corral .)
#   docker run --privileged -v /srv/work:/workspace corral
#
# packaging/image-test.sh checks this file and, where buildah runs, builds and starts the image
# (CI runs it).

ARG RUST_VERSION=1.88
ARG DEBIAN_RELEASE=bookworm

# The userland: what sandboxed commands can run. bash for the shell tools, git and python3 for
# typical agent work, procps for ps/pkill, ca-certificates for sessions with network access.
FROM debian:${DEBIAN_RELEASE}-slim AS userland
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      bash ca-certificates coreutils diffutils file findutils git grep gzip less patch \
      procps python3 ripgrep sed tar unzip xz-utils \
 && rm -rf /var/lib/apt/lists/*
# The agents' user (tokens and client certificates map callers to local users, who must exist
# here), its workspace, and what a non-root daemon needs: `docker run --user agent` runs a
# single-user daemon whose socket goes to $XDG_RUNTIME_DIR/corral (root ignores that variable
# and uses /run/corral).
RUN groupadd --gid 1000 agent \
 && useradd --uid 1000 --gid 1000 --home-dir /workspace --no-create-home --shell /bin/bash agent \
 && install -d -m 0755 -o agent -g agent /workspace \
 && install -d -m 0700 -o agent -g agent /run/user/1000 \
 && install -d -m 0755 /run/corral /etc/corral
ENV XDG_RUNTIME_DIR=/run/user/1000
WORKDIR /workspace
# Exit 0 only for SERVING: NOT_SERVING means a sandbox layer cannot be applied in this
# container (e.g. it is not privileged), which `corral health` names on stderr.
HEALTHCHECK --interval=30s --timeout=5s --start-period=5s --retries=3 \
  CMD ["/usr/local/bin/corral", "health"]
ENTRYPOINT ["/usr/local/bin/corral"]
CMD ["serve"]

# The build: a static binary (musl), so the same file also runs when copied into any other
# image (`COPY --from=corral /usr/local/bin/corral /usr/local/bin/corral`).
FROM rust:${RUST_VERSION}-${DEBIAN_RELEASE} AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/* \
 && rustup target add "$(uname -m)-unknown-linux-musl"
WORKDIR /src
COPY . .
RUN target="$(uname -m)-unknown-linux-musl" \
 && cargo build --release --locked --target "$target" \
 && install -m 0755 "target/$target/release/corral" /corral

# The image: the userland plus the binary.
FROM userland
COPY --from=build /corral /usr/local/bin/corral
