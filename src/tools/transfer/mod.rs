//! Byte-exact file transfer: small files as raw bytes (`small`), and files or directory trees of
//! any size as a stream of entries and data — `receive` writes such a stream to disk, `send`
//! reads a tree into one. `destination` decides where a write may go (the session's writable
//! roots and protected names, exactly as apply_patch checks them). `ops` holds the Files
//! service's other operations (Stat, ListDirectory, MakeDirectory, Remove, Copy), built on the
//! same pieces.
//!
//! Plain Rust, like every tool: the worker feeds it the Files service's messages, and the CLI's
//! `corral cp` uses the same code for its local side (a download is received exactly like an
//! upload). What it guarantees on its own, whatever the sandbox around it:
//!
//! - a write is atomic: a file or a whole tree is built under a hidden staging name beside the
//!   destination and renamed into place; on any error, cancel or drop the staging is removed and
//!   the destination is untouched;
//! - no write follows a symlink: every entry is created with `*at` calls relative to a directory
//!   descriptor opened with `O_NOFOLLOW`, so neither a symlink entry nor a concurrent swap of a
//!   staged directory for a symlink can redirect one;
//! - modes are permission bits only (`& 0777`): a set-user-ID, set-group-ID or sticky bit is
//!   refused, never set;
//! - reading never blocks on a FIFO or an endless device: only regular files are read, exactly
//!   as many bytes as their size said.

pub mod destination;
// Shared with apply_patch: the staging lock and the removal of what a dead writer left.
pub(crate) mod fsx;
pub mod ops;
pub mod receive;
pub mod send;
pub mod small;

use crate::tools::{ErrorKind, ToolError};
use std::io;
use std::path::{Path, PathBuf};

pub use destination::Destination;
pub use receive::Receiver;

/// Removes the stagings beside `dest` that a transfer left behind when its process died (their
/// lock is free); a transfer still running keeps its own. Returns how many were removed.
pub fn remove_stale_stagings(dest: &Destination) -> usize {
    fsx::remove_stale_stagings(std::os::fd::AsFd::as_fd(&dest.parent), &dest.name)
}

/// Most bytes ReadBytes and WriteBytes move: their message then fits every gRPC client's
/// default 4 MiB limit.
pub const SMALL_FILE_LIMIT: u64 = 3 * 1024 * 1024;

/// Largest data message an upload may send (the contract's chunk limit).
pub const MAX_DATA_CHUNK: usize = 1024 * 1024;

/// Data chunk size of a download.
pub const SEND_CHUNK: usize = 256 * 1024;

/// Deepest directory nesting a transfer walks (each level holds a descriptor).
pub const MAX_DEPTH: usize = 256;

/// The kind of a transferred node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Directory,
    Symlink,
}

impl Kind {
    fn noun(self) -> &'static str {
        match self {
            Kind::File => "a file",
            Kind::Directory => "a directory",
            Kind::Symlink => "a symlink",
        }
    }
}

/// One node of a transferred tree (see `TransferEntry` in the proto).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Relative to the transfer's root, '/'-separated; the root itself is "".
    pub path: String,
    pub kind: Kind,
    /// Permission bits; `None`: 0644 for files, 0755 for directories.
    pub mode: Option<u32>,
    /// A file's exact data length.
    pub size: u64,
    /// A symlink's target, as stored.
    pub link_target: String,
}

/// One item of a transfer stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    Entry(Entry),
    Data(Vec<u8>),
}

/// What a transfer moved.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// The destination (receive) or the source (send).
    pub path: PathBuf,
    pub files: u64,
    pub directories: u64,
    pub symlinks: u64,
    /// File bytes moved.
    pub bytes: u64,
    /// Entries not sent (FIFOs, sockets, devices, names that are not UTF-8), relative paths.
    pub skipped: Vec<String>,
}

impl Summary {
    fn count(&mut self, kind: Kind) {
        match kind {
            Kind::File => self.files += 1,
            Kind::Directory => self.directories += 1,
            Kind::Symlink => self.symlinks += 1,
        }
    }
}

/// The default permission bits of a kind.
fn default_mode(kind: Kind) -> u32 {
    match kind {
        Kind::Directory => 0o755,
        _ => 0o644,
    }
}

/// Checks a mode from the wire: permission bits only.
pub fn check_mode(mode: Option<u32>, what: &str) -> Result<(), ToolError> {
    match mode {
        Some(m) if m & !0o777 != 0 => Err(ToolError::invalid(format!(
            "mode {m:#o} of {what} has bits above 0777 (set-user-ID, set-group-ID, sticky or \
             file type); corral sets permission bits only"
        ))),
        _ => Ok(()),
    }
}

/// The class of an I/O failure during a transfer.
fn kind_of(err: &io::Error) -> ErrorKind {
    match err.raw_os_error() {
        Some(libc::ENOENT) => ErrorKind::NotFound,
        Some(libc::EACCES | libc::EPERM | libc::EROFS) => ErrorKind::PermissionDenied,
        Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG | libc::EMFILE | libc::ENFILE) => {
            ErrorKind::ResourceExhausted
        }
        Some(libc::EEXIST) => ErrorKind::AlreadyExists,
        Some(libc::EBUSY | libc::ENOTEMPTY | libc::EISDIR | libc::ENOTDIR | libc::ELOOP) => {
            ErrorKind::FailedPrecondition
        }
        Some(libc::ENAMETOOLONG) => ErrorKind::InvalidArgument,
        _ => ErrorKind::Internal,
    }
}

/// `{op} {path}: {error}`, classed by the error.
fn io_error(op: &str, path: &Path, err: io::Error) -> ToolError {
    ToolError::new(kind_of(&err), format!("{op} {}: {err}", path.display()))
}

/// The same for a nix call.
fn sys_error(op: &str, path: &Path, err: nix::Error) -> ToolError {
    io_error(op, path, io::Error::from(err))
}

/// Joins a relative transfer path to a base for messages.
fn shown(base: &Path, rel: &str) -> PathBuf {
    if rel.is_empty() {
        base.to_path_buf()
    } else {
        base.join(rel)
    }
}

#[cfg(test)]
mod tests;
