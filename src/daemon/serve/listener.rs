//! Binding the listening socket: a Unix socket (in a directory only root or the daemon's user
//! can write, refusing a live one, replacing a stale one, with the configured permissions) or
//! a loopback TCP port.

use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::path::Path;

/// Binds a Unix socket at `path`. A socket file nobody answers on is stale and replaced; a live
/// one means another daemon is serving there, and we refuse to start.
pub fn bind_unix(path: &Path, mode: u32) -> Result<tokio::net::UnixListener, String> {
    let me = nix::unistd::geteuid();
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
        && !dir.exists()
    {
        // As root, local users must reach the socket; otherwise the directory is private.
        let mode = if me.is_root() { 0o755 } else { 0o700 };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(mode)
            .create(dir)
            .map_err(|e| format!("cannot create socket directory {}: {e}", dir.display()))?;
    }
    // Before touching anything in it: clients refuse sockets in such directories, and a stale
    // "socket" there may be someone else's.
    crate::socket::check_dir(path, me.as_raw())?;
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            match std::os::unix::net::UnixStream::connect(path) {
                Ok(_) => {
                    return Err(format!(
                        "another daemon is already listening on {}; stop it or choose another \
                         --listen path",
                        path.display()
                    ));
                }
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                    tracing::info!(path = %path.display(), "replacing stale socket");
                    std::fs::remove_file(path).map_err(|e| {
                        format!("cannot remove stale socket {}: {e}", path.display())
                    })?;
                }
                Err(e) => {
                    return Err(format!(
                        "cannot tell whether {} is in use: {e}",
                        path.display()
                    ));
                }
            }
        }
        Ok(_) => {
            return Err(format!(
                "{} exists and is not a socket; refusing to replace it",
                path.display()
            ));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("cannot inspect {}: {e}", path.display())),
    }
    let listener = tokio::net::UnixListener::bind(path)
        .map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("cannot set permissions of {}: {e}", path.display()))?;
    Ok(listener)
}

/// A listening Unix socket passed by systemd socket activation (`LISTEN_PID`/`LISTEN_FDS`, the
/// first descriptor is 3), if this process was started that way. The variables are removed so
/// nothing started later mistakes them for its own.
/// Call it before any thread starts (it edits the environment).
pub fn from_socket_activation() -> Result<Option<std::os::unix::net::UnixListener>, String> {
    const SD_LISTEN_FDS_START: i32 = 3;
    let pid = std::env::var("LISTEN_PID").ok();
    let fds = std::env::var("LISTEN_FDS").ok();
    let (Some(pid), Some(fds)) = (pid, fds) else {
        return Ok(None);
    };
    if pid.parse::<u32>().ok() != Some(std::process::id()) {
        return Ok(None);
    }
    // SAFETY: called from `main` before the runtime starts any thread.
    unsafe {
        std::env::remove_var("LISTEN_PID");
        std::env::remove_var("LISTEN_FDS");
        std::env::remove_var("LISTEN_FDNAMES");
    }
    if fds.parse::<u32>().unwrap_or(0) < 1 {
        return Err("socket activation passed no descriptor (LISTEN_FDS=0)".into());
    }
    let fd = SD_LISTEN_FDS_START;
    // SAFETY: systemd hands us this descriptor; we take ownership of it exactly once.
    let std_listener = unsafe {
        use std::os::fd::FromRawFd;
        // Not inherited by anything we start (workers get their own descriptor 3).
        if libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) == -1 {
            return Err(format!(
                "socket activation: descriptor 3 is not usable: {}",
                io::Error::last_os_error()
            ));
        }
        std::os::unix::net::UnixListener::from_raw_fd(fd)
    };
    std_listener
        .set_nonblocking(true)
        .map_err(|e| format!("socket activation: {e}"))?;
    Ok(Some(std_listener))
}
