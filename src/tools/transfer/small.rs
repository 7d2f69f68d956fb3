//! ReadBytes and WriteBytes: a whole small file (at most [`SMALL_FILE_LIMIT`]) as raw bytes.
//! Larger files go through the streaming transfer (Upload and Download).

use super::destination::{self, Destination};
use super::fsx::{self, Node};
use super::receive::Receiver;
use super::{Entry, Kind, SMALL_FILE_LIMIT, check_mode, sys_error};
use crate::tools::apply_patch::PatchContext;
use crate::tools::{ErrorKind, ToolError};
use nix::fcntl::OFlag;
use nix::sys::stat::{Mode, fstat, stat};
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

/// A file read whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadBytes {
    pub path: PathBuf,
    pub data: Vec<u8>,
    /// Its permission bits.
    pub mode: u32,
}

/// Reads the regular file at `path` (absolute or relative to `cwd`; symlinks followed, as any
/// reader would). Anything else — a FIFO, a device, a directory — is refused before it is
/// opened, so nothing blocks and nothing endless is read.
pub fn read_bytes(cwd: &Path, path: &str) -> Result<ReadBytes, ToolError> {
    if path.is_empty() {
        return Err(ToolError::invalid("path is required"));
    }
    let full = cwd.join(path);
    // Read from the pinned working directory when it lies there (H24); named as given.
    let at = crate::tools::shell::pinned_cwd::fs_path(&full);
    let seen = stat(&*at).map_err(|e| sys_error("cannot read", &full, e))?;
    let not_regular = |st: &nix::sys::stat::FileStat| match fsx::node_of(st) {
        Node::File => None,
        Node::Directory => Some("a directory"),
        Node::Symlink => Some("a symlink"),
        Node::Other(what) => Some(what),
    };
    if let Some(what) = not_regular(&seen) {
        return Err(ToolError::invalid(format!(
            "{} is {what}, not a regular file; ReadBytes reads regular files only",
            full.display()
        )));
    }
    let fd = nix::fcntl::open(
        &*at,
        OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| sys_error("cannot open", &full, e))?;
    let st = fstat(&fd).map_err(|e| sys_error("cannot read", &full, e))?;
    if not_regular(&st).is_some() || (st.st_dev, st.st_ino) != (seen.st_dev, seen.st_ino) {
        return Err(ToolError::new(
            ErrorKind::Aborted,
            format!("{} changed while it was opened; retry", full.display()),
        ));
    }
    let too_large = |size: u64| {
        ToolError::new(
            ErrorKind::ResourceExhausted,
            format!(
                "{} is {size} bytes, more than the {SMALL_FILE_LIMIT} bytes (3 MiB) ReadBytes \
                 returns; use Download for larger files",
                full.display()
            ),
        )
    };
    let size = u64::try_from(st.st_size).unwrap_or(0);
    if size > SMALL_FILE_LIMIT {
        return Err(too_large(size));
    }
    let mut data = Vec::with_capacity(size as usize);
    // One byte past the limit tells a file that grew past it since fstat.
    File::from(fd)
        .take(SMALL_FILE_LIMIT + 1)
        .read_to_end(&mut data)
        .map_err(|e| super::io_error("cannot read", &full, e))?;
    if data.len() as u64 > SMALL_FILE_LIMIT {
        return Err(too_large(data.len() as u64));
    }
    Ok(ReadBytes {
        path: full,
        data,
        mode: st.st_mode & 0o777,
    })
}

/// What WriteBytes asks for.
#[derive(Debug, Clone, Default)]
pub struct WriteBytes<'a> {
    pub path: &'a str,
    pub data: &'a [u8],
    /// Permission bits; `None`: the replaced file's, else 0644.
    pub mode: Option<u32>,
    pub create_parents: bool,
    pub no_overwrite: bool,
}

/// Writes a whole file atomically (temporary file beside it, flushed, renamed over it), under
/// the session's rules. Returns the path written.
pub fn write_bytes(rules: &PatchContext, req: &WriteBytes<'_>) -> Result<PathBuf, ToolError> {
    if req.data.len() as u64 > SMALL_FILE_LIMIT {
        return Err(ToolError::invalid(format!(
            "data is {} bytes, more than the {SMALL_FILE_LIMIT} bytes (3 MiB) WriteBytes \
             writes; use Upload for larger files",
            req.data.len()
        )));
    }
    check_mode(req.mode, "the file")?;
    let dest: Destination = destination::for_write(rules, req.path, "", req.create_parents)?;
    let existing = dest.existing()?;
    let mode = req.mode.unwrap_or(match existing {
        Some(e) if e.node == Node::File => e.mode,
        _ => 0o644,
    });
    let path = dest.path.clone();
    let mut receiver = Receiver::new(dest, !req.no_overwrite)?;
    receiver.entry(Entry {
        path: String::new(),
        kind: Kind::File,
        mode: Some(mode),
        size: req.data.len() as u64,
        link_target: String::new(),
    })?;
    receiver.data(req.data)?;
    receiver.finish()?;
    Ok(path)
}
