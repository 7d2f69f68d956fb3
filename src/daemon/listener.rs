//! Binding the listening socket: a Unix socket (refusing a live one, replacing a stale one,
//! with the configured permissions) or a loopback TCP port.

use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::path::Path;

/// Binds a Unix socket at `path`. A socket file nobody answers on is stale and replaced; a live
/// one means another daemon is serving there, and we refuse to start.
pub fn bind_unix(path: &Path, mode: u32) -> Result<tokio::net::UnixListener, String> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
        && !dir.exists()
    {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .map_err(|e| format!("cannot create socket directory {}: {e}", dir.display()))?;
    }
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
