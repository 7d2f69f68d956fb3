//! Which Unix socket the daemon listens on and clients connect to, and when such a socket may be
//! trusted (spec/sandbox.md §8.6 H17). One rule for `corral serve` and the CLI; the Python and Node
//! clients mirror it.
//!
//! The rule: an explicit address (flag, argument, config key) > `CORRAL_SOCKET` >
//! `$XDG_RUNTIME_DIR/corral/corral.sock` when not root (for clients: only when it exists) >
//! `/run/corral/corral.sock`. There is no fallback to a `/tmp` location another user could
//! create first; a daemon that is not root and has no `XDG_RUNTIME_DIR` refuses to start.
//!
//! The trust check: the socket's directory must be owned by root or the checking process's uid
//! and not writable by group or others (else another user could put an impostor there); a client
//! also wants the socket file itself owned by root or itself.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The system daemon's socket.
/// Where a client takes its bearer token from when `--token` is not given (TCP only); the
/// daemon's start-up block names it in the command it prints.
pub const TOKEN_ENV: &str = "CORRAL_TOKEN";

pub const SYSTEM_SOCKET: &str = "/run/corral/corral.sock";
/// The environment variable naming the socket (any address form clients accept).
pub const SOCKET_ENV: &str = "CORRAL_SOCKET";

/// Who applies the rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// `corral serve`: creates its per-user socket, so it need not exist yet.
    Daemon,
    /// A client: uses the per-user socket only if a daemon is there.
    Client,
}

/// The address to use: `explicit` if given, else `CORRAL_SOCKET`, else the default socket for
/// `side`. Errors only for a daemon that is not root and has no `XDG_RUNTIME_DIR`.
pub fn choose(explicit: Option<&str>, side: Side) -> Result<String, String> {
    choose_with(
        explicit,
        side,
        std::env::var(SOCKET_ENV).ok().as_deref(),
        std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from),
        nix::unistd::geteuid().is_root(),
    )
}

/// `choose` with its inputs spelled out (testable without touching the environment).
pub fn choose_with(
    explicit: Option<&str>,
    side: Side,
    env_socket: Option<&str>,
    runtime_dir: Option<PathBuf>,
    root: bool,
) -> Result<String, String> {
    if let Some(address) = explicit.or(env_socket).filter(|a| !a.is_empty()) {
        return Ok(address.to_string());
    }
    if !root {
        match runtime_dir.filter(|d| !d.as_os_str().is_empty()) {
            Some(dir) => {
                let own = dir.join("corral/corral.sock");
                if side == Side::Daemon || own.exists() {
                    return Ok(own.to_string_lossy().into_owned());
                }
            }
            None if side == Side::Daemon => {
                return Err(format!(
                    "no socket path: XDG_RUNTIME_DIR is not set, and a daemon that is not root \
                     does not fall back to a shared directory such as /tmp (another user could \
                     create it first). Set --listen unix:PATH (or `listen` in the config file, \
                     or {SOCKET_ENV}) to a socket in a directory only you can write, or set \
                     XDG_RUNTIME_DIR"
                ));
            }
            None => {}
        }
    }
    Ok(SYSTEM_SOCKET.to_string())
}

/// Checks that the directory holding `socket` may be trusted by a process of uid `me`: owned by
/// root or `me`, not writable by group or others. The error names the directory, its owner and
/// its mode.
pub fn check_dir(socket: &Path, me: u32) -> Result<(), String> {
    let dir = match socket.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    // The directory the socket really lives in (a symlinked directory is judged by its target).
    let meta = std::fs::metadata(&dir)
        .map_err(|e| format!("cannot inspect socket directory {}: {e}", dir.display()))?;
    let trusted_owner = meta.uid() == 0 || meta.uid() == me;
    let writable_by_others = meta.mode() & 0o022 != 0;
    if trusted_owner && !writable_by_others {
        return Ok(());
    }
    Err(format!(
        "refusing socket {}: its directory {} is owned by {} with mode {:04o}; a corral socket's \
         directory must be owned by root or {} and not writable by group or others, or another \
         user could put an impostor daemon there. Use a private directory (e.g. \
         $XDG_RUNTIME_DIR/corral or /run/corral)",
        socket.display(),
        dir.display(),
        describe_uid(meta.uid()),
        meta.mode() & 0o7777,
        describe_uid(me),
    ))
}

/// Checks, for a client of uid `me`, the socket's directory and the socket file's owner (root or
/// `me`). A socket that does not exist passes: connecting reports it.
pub fn check_client(socket: &Path, me: u32) -> Result<(), String> {
    let meta = match std::fs::metadata(socket) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("cannot inspect socket {}: {e}", socket.display())),
    };
    // Judge the directory the socket really lives in: a symlink (or `..`) in a private
    // directory may lead to a socket in a shared one, where another user can replace it.
    let real = std::fs::canonicalize(socket)
        .map_err(|e| format!("cannot inspect socket {}: {e}", socket.display()))?;
    check_dir(socket, me)?;
    check_dir(&real, me).map_err(|e| format!("{} is {}: {e}", socket.display(), real.display()))?;
    if meta.uid() != 0 && meta.uid() != me {
        return Err(format!(
            "refusing socket {}: it is owned by {}, not by root or {}; it may be an impostor",
            socket.display(),
            describe_uid(meta.uid()),
            describe_uid(me),
        ));
    }
    Ok(())
}

/// `uid 1000 (alice)`, or `uid 1000` when it has no name.
fn describe_uid(uid: u32) -> String {
    match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
        Ok(Some(user)) => format!("uid {uid} ({})", user.name),
        _ => format!("uid {uid}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn runtime() -> Option<PathBuf> {
        Some(PathBuf::from("/run/user/1000"))
    }

    #[test]
    fn explicit_beats_the_environment_beats_the_defaults() {
        let c = |explicit, env| choose_with(explicit, Side::Client, env, runtime(), false);
        assert_eq!(c(Some("/a.sock"), Some("/b.sock")).unwrap(), "/a.sock");
        assert_eq!(c(None, Some("tcp:127.0.0.1:9")).unwrap(), "tcp:127.0.0.1:9");
        // An empty CORRAL_SOCKET is unset.
        assert_eq!(c(None, Some("")).unwrap(), SYSTEM_SOCKET);
    }

    #[test]
    fn clients_use_the_per_user_socket_only_when_it_exists() {
        let dir = tempfile::tempdir().unwrap();
        let rt = Some(dir.path().to_path_buf());
        let own = dir.path().join("corral/corral.sock");
        let c = |root| choose_with(None, Side::Client, None, rt.clone(), root).unwrap();
        assert_eq!(c(false), SYSTEM_SOCKET);
        std::fs::create_dir(dir.path().join("corral")).unwrap();
        std::fs::write(&own, "").unwrap();
        assert_eq!(c(false), own.to_str().unwrap());
        // Root always means the system daemon.
        assert_eq!(c(true), SYSTEM_SOCKET);
        // Without XDG_RUNTIME_DIR a client tries the system daemon, never /tmp.
        assert_eq!(
            choose_with(None, Side::Client, None, None, false).unwrap(),
            SYSTEM_SOCKET
        );
    }

    #[test]
    fn a_daemon_without_runtime_dir_refuses_instead_of_using_tmp() {
        let d = |rt, root| choose_with(None, Side::Daemon, None, rt, root);
        assert_eq!(
            d(runtime(), false).unwrap(),
            "/run/user/1000/corral/corral.sock"
        );
        assert_eq!(d(None, true).unwrap(), SYSTEM_SOCKET);
        let err = d(None, false).unwrap_err();
        assert!(
            err.contains("XDG_RUNTIME_DIR") && err.contains("--listen"),
            "{err}"
        );
        let err = d(Some(PathBuf::new()), false).unwrap_err();
        assert!(err.contains("XDG_RUNTIME_DIR"), "{err}");
    }

    fn dir_with(mode: u32, owner: Option<u32>) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(mode)).unwrap();
        if let Some(uid) = owner {
            std::os::unix::fs::chown(dir.path(), Some(uid), None).unwrap();
        }
        dir
    }

    #[test]
    fn directory_check_owner_and_mode() {
        let me = nix::unistd::geteuid().as_raw();
        let own = dir_with(0o700, None);
        check_dir(&own.path().join("s.sock"), me).unwrap();
        let open = dir_with(0o777, None);
        let err = check_dir(&open.path().join("s.sock"), me).unwrap_err();
        assert!(
            err.contains("0777") && err.contains(&open.path().display().to_string()),
            "{err}"
        );
        let group = dir_with(0o770, None);
        assert!(check_dir(&group.path().join("s.sock"), me).is_err());
        let sticky = dir_with(0o1777, None);
        assert!(check_dir(&sticky.path().join("s.sock"), me).is_err());
        if me == 0 {
            // Root-owned 0755 is fine for any user; another user's directory is not.
            let shared = dir_with(0o755, None);
            check_dir(&shared.path().join("s.sock"), 1000).unwrap();
            let theirs = dir_with(0o700, Some(65534));
            let err = check_dir(&theirs.path().join("s.sock"), 0).unwrap_err();
            assert!(err.contains("uid 65534"), "{err}");
            // ...unless it is the checking user's own.
            check_dir(&theirs.path().join("s.sock"), 65534).unwrap();
        } else {
            eprintln!("skipped the chown cases: they need root (CI runs as root)");
        }
    }

    #[test]
    fn client_check_wants_the_socket_owned_by_root_or_the_caller() {
        let me = nix::unistd::geteuid().as_raw();
        let dir = dir_with(0o700, None);
        let socket = dir.path().join("s.sock");
        // Missing: left for connect to report.
        check_client(&socket, me).unwrap();
        let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        check_client(&socket, me).unwrap();
        if me == 0 {
            std::os::unix::fs::chown(&socket, Some(65534), None).unwrap();
            let err = check_client(&socket, 0).unwrap_err();
            assert!(err.contains("impostor"), "{err}");
        }
    }
}
