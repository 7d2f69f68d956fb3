//! Paths hidden from every sandboxed worker besides corral's own state: container-runtime
//! sockets, because a reachable runtime socket is root on the host (spec/sandbox.md §2.7).

use std::path::PathBuf;

/// System-wide runtime sockets.
const SYSTEM_RUNTIME_SOCKETS: &[&str] = &[
    "/var/run/docker.sock",
    "/run/docker.sock",
    "/run/containerd/containerd.sock",
    "/run/podman/podman.sock",
];

/// The runtime sockets to mask for a session owned by `uid`: the system ones and the owner's
/// rootless ones.
pub fn runtime_sockets(uid: u32) -> Vec<PathBuf> {
    SYSTEM_RUNTIME_SOCKETS
        .iter()
        .map(PathBuf::from)
        .chain([
            PathBuf::from(format!("/run/user/{uid}/docker.sock")),
            PathBuf::from(format!("/run/user/{uid}/podman/podman.sock")),
        ])
        .collect()
}
