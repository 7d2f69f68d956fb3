//! Paths hidden from every sandboxed worker besides the serving daemon's own state:
//! - container-runtime sockets, because a reachable runtime socket is root on the host
//!   (spec/sandbox.md §2.7);
//! - the default socket directories of every corral daemon (system and per-user), because with
//!   the network on a sandbox could otherwise ask another corral daemon for a less confined
//!   session (spec/sandbox.md §8.6 H7);
//! - the owner's corral client credentials (`~/.config/corral`: a token, a client key), which
//!   would let a network-on sandbox call a daemon over TCP as its user (H19).

use std::path::PathBuf;

/// System-wide runtime sockets.
const SYSTEM_RUNTIME_SOCKETS: &[&str] = &[
    "/var/run/docker.sock",
    "/run/docker.sock",
    "/run/containerd/containerd.sock",
    "/run/podman/podman.sock",
];

/// The system corral daemon's socket directory (see `socket::SYSTEM_SOCKET`).
pub const SYSTEM_CORRAL_DIR: &str = "/run/corral";

/// The sockets and socket directories to mask for a session owned by `uid`: the system runtime
/// sockets, the owner's rootless ones, and every default corral socket directory.
pub fn runtime_sockets(uid: u32) -> Vec<PathBuf> {
    SYSTEM_RUNTIME_SOCKETS
        .iter()
        .map(PathBuf::from)
        .chain([
            PathBuf::from(format!("/run/user/{uid}/docker.sock")),
            PathBuf::from(format!("/run/user/{uid}/podman/podman.sock")),
            PathBuf::from(SYSTEM_CORRAL_DIR),
            // A per-user daemon's default: $XDG_RUNTIME_DIR/corral, which is this on systemd
            // hosts (the daemon cannot know another process's XDG_RUNTIME_DIR).
            PathBuf::from(format!("/run/user/{uid}/corral")),
        ])
        .chain(client_credentials(uid))
        .collect()
}

/// Where the owner keeps corral client credentials: `~/.config/corral` of its passwd entry.
fn client_credentials(uid: u32) -> Option<PathBuf> {
    let user = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)).ok()??;
    Some(user.dir.join(".config/corral"))
}

/// Everything a sandbox of `uid` must not see: the serving daemon's own `state` paths and
/// `runtime_sockets(uid)`. A path inside another one of the list is left out: the outer mask
/// already hides it, and once the outer directory is masked the inner path no longer exists to
/// mount on (e.g. a daemon whose state is `/run/user/0` and the mask `/run/user/0/corral`).
pub fn masked_paths(state: &[PathBuf], uid: u32) -> Vec<PathBuf> {
    let mut all: Vec<PathBuf> = state.iter().cloned().chain(runtime_sockets(uid)).collect();
    all.dedup();
    let outer = all.clone();
    all.retain(|p| !outer.iter().any(|q| q != p && p.starts_with(q)));
    let mut seen = std::collections::HashSet::new();
    all.retain(|p| seen.insert(p.clone()));
    all
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn nested_masks_are_left_to_the_outer_one() {
        let state = vec![
            PathBuf::from("/run/user/0"),
            PathBuf::from("/etc/corral.toml"),
        ];
        let masks = masked_paths(&state, 0);
        assert!(masks.contains(&PathBuf::from("/run/user/0")));
        assert!(masks.contains(&PathBuf::from("/etc/corral.toml")));
        assert!(masks.contains(&PathBuf::from("/run/corral")));
        assert!(
            !masks
                .iter()
                .any(|m| m != Path::new("/run/user/0") && m.starts_with("/run/user/0")),
            "{masks:?}"
        );
        // The same directory as state and as a default socket directory: masked once.
        let masks = masked_paths(&[PathBuf::from("/run/corral")], 7);
        assert_eq!(
            masks
                .iter()
                .filter(|m| m.as_path() == Path::new("/run/corral"))
                .count(),
            1
        );
        assert!(masks.contains(&PathBuf::from("/run/user/7/corral")));
    }

    #[test]
    fn every_default_corral_socket_directory_is_masked() {
        let masks = runtime_sockets(1004);
        for want in [
            "/run/corral",
            "/run/user/1004/corral",
            "/run/docker.sock",
            "/run/user/1004/docker.sock",
        ] {
            assert!(
                masks.contains(&PathBuf::from(want)),
                "{want} missing: {masks:?}"
            );
        }
        // The default socket paths of both the daemon and the clients lie under a masked
        // directory (root's system socket; a user's per-user socket under /run/user/UID).
        let system = PathBuf::from(crate::socket::SYSTEM_SOCKET);
        assert!(masks.iter().any(|m| system.starts_with(m)), "{system:?}");
    }
}
