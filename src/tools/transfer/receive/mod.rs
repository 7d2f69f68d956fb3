//! Writes a transfer stream to disk, atomically: the root entry decides the shape — one file,
//! one symlink, or a directory tree — which is built under a hidden staging name beside the
//! destination (`.NAME.corral-upload-RANDOM`) and renamed into place only when the stream ended
//! complete. A replaced directory is swapped in with `RENAME_EXCHANGE` and the old tree removed
//! afterwards. Until then nothing at the destination changes; dropping an unfinished
//! [`Receiver`] (an error, a cancelled call) removes the staging.
//!
//! Entries are created relative to directory descriptors opened with `O_NOFOLLOW`, exclusively
//! (`O_EXCL`, `mkdirat`, `symlinkat`), so a symlink entry, a duplicate entry, or a staged
//! directory swapped for a symlink by a concurrent process cannot redirect a write: the call
//! fails instead. Files and directories are staged owner-only (0600/0700); their final modes are
//! applied at the end, directories deepest first, so a tree may contain a 0555 directory.
//!
//! Durability: a file's data is flushed (`fdatasync`) before it is renamed into place, and a
//! tree's filesystem once (`syncfs`) before the tree is; the parent directory is flushed after
//! the rename. So a crash never leaves a half-written file under the final name, and a write
//! error the disk reports late (a full disk, EIO) fails the transfer before anything changes.
//!
//! Three rooms: this file is the [`Receiver`] and the stream's order (root entry first, entries
//! below it, data after its file entry, the end) with the refusals a client can get;
//! `staging.rs` makes and fills the staging on disk; `place.rs` renames it into place at the end,
//! or removes it when the receiver is dropped unfinished.

mod place;
mod staging;

use super::destination::{Destination, Existing};
use super::fsx;
use super::{Entry, Kind, Summary, check_mode, default_mode, shown, sys_error};
use crate::tools::{ErrorKind, ToolError};
use nix::errno::Errno;
use nix::sys::stat::{Mode, fchmod, mkdirat};
use staging::{Made, close_file, create_file, walk};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

/// A file being filled.
#[derive(Debug)]
struct Filling {
    /// Its path relative to the root ("" for a single file).
    path: String,
    file: File,
    size: u64,
    written: u64,
    mode: u32,
}

/// What has been staged so far. Every staging name here exists on disk until it is renamed into
/// place (dropping the receiver then removes it), and is locked (`fsx::lock_staging`) by a
/// descriptor held here, so a transfer that starts later knows it is in use.
#[derive(Debug)]
enum Stage {
    /// Nothing yet: the root entry comes first.
    Empty,
    File {
        staged: OsString,
        filling: Option<Filling>,
        /// Holds the staging's lock after `filling` is closed.
        _lock: File,
    },
    /// A symlink is made under its staging name only when the stream has ended, the moment
    /// before it is renamed into place (a symlink cannot hold a lock).
    Symlink {
        target: String,
        staged: Option<OsString>,
    },
    Tree {
        staged: OsString,
        /// The staged root, which holds the staging's lock.
        root: OwnedFd,
        /// Every directory and its final mode, in creation order (parents before children).
        dirs: Vec<(String, u32)>,
        filling: Option<Filling>,
        /// The directory of the last entry: consecutive entries usually share it.
        last_parent: Option<(String, OwnedFd)>,
    },
}

impl Stage {
    fn staged(&self) -> Option<&OsStr> {
        match self {
            Stage::Empty => None,
            Stage::File { staged, .. } | Stage::Tree { staged, .. } => Some(staged),
            Stage::Symlink { staged, .. } => staged.as_deref(),
        }
    }
}

/// Receives one transfer stream into a destination.
#[derive(Debug)]
pub struct Receiver {
    dest: Destination,
    overwrite: bool,
    /// The largest file this process may write (RLIMIT_FSIZE), if limited.
    max_file: Option<u64>,
    stage: Stage,
    summary: Summary,
}

/// The most bytes this process may write to one file, if limited.
fn file_size_limit() -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills the struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_FSIZE, &mut r) } != 0
        || r.rlim_cur == libc::RLIM_INFINITY
    {
        return None;
    }
    Some(r.rlim_cur)
}

impl Receiver {
    /// Starts receiving into `dest`. Refuses at once (ALREADY_EXISTS) when something is there
    /// and `overwrite` is not set, so a client learns it before sending any data.
    pub fn new(dest: Destination, overwrite: bool) -> Result<Receiver, ToolError> {
        if let (Some(existing), false) = (dest.existing()?, overwrite) {
            return Err(already_exists(&dest.path, &existing));
        }
        let removed = if fsx::leftovers_possible() {
            super::remove_stale_stagings(&dest)
        } else {
            0
        };
        if removed > 0 {
            eprintln!(
                "corral: removed {removed} staging(s) of {} that an earlier transfer left \
                 behind when its worker died",
                dest.path.display()
            );
        }
        Ok(Receiver {
            summary: Summary {
                path: dest.path.clone(),
                ..Default::default()
            },
            dest,
            overwrite,
            max_file: file_size_limit(),
            stage: Stage::Empty,
        })
    }

    /// The next entry of the stream.
    pub fn entry(&mut self, entry: Entry) -> Result<(), ToolError> {
        check_mode(entry.mode, &format!("`{}`", entry.path))?;
        if entry.kind == Kind::Symlink
            && (entry.link_target.is_empty() || entry.link_target.contains('\0'))
        {
            return Err(ToolError::invalid(format!(
                "symlink entry `{}` needs a link_target (non-empty, no NUL byte)",
                entry.path
            )));
        }
        if entry.kind == Kind::File
            && let Some(max) = self.max_file.filter(|max| entry.size > *max)
        {
            return Err(ToolError::new(
                ErrorKind::ResourceExhausted,
                format!(
                    "{} is {} bytes, more than the sandbox's file size limit ({max} bytes, the \
                     profile's file_size_bytes); nothing was written",
                    shown(&self.dest.path, &entry.path).display(),
                    entry.size
                ),
            ));
        }
        match &mut self.stage {
            Stage::Empty => self.root(entry),
            Stage::File { .. } | Stage::Symlink { .. } => Err(ToolError::invalid(format!(
                "entry `{}` follows a root that is not a directory; a file or symlink upload is \
                 one entry",
                entry.path
            ))),
            Stage::Tree { .. } => self.child(entry),
        }
    }

    /// The root entry: decides the shape and creates the staging.
    fn root(&mut self, entry: Entry) -> Result<(), ToolError> {
        if !entry.path.is_empty() {
            return Err(ToolError::invalid(format!(
                "the first entry must be the root (path \"\"), not `{}`",
                entry.path
            )));
        }
        if let Some(existing) = self.dest.existing()? {
            if !self.overwrite {
                return Err(already_exists(&self.dest.path, &existing));
            }
            if !existing.replaceable_by(entry.kind) {
                return Err(kind_mismatch(&self.dest.path, &existing, entry.kind));
            }
        }
        self.summary.count(entry.kind);
        self.stage = match entry.kind {
            Kind::File => {
                let (staged, made) = self.make_staging(Kind::File, entry.size)?;
                let Made::File { file, lock } = made else {
                    unreachable!("a file staging for a file entry");
                };
                Stage::File {
                    staged,
                    _lock: lock,
                    filling: Some(Filling {
                        path: String::new(),
                        file,
                        size: entry.size,
                        written: 0,
                        mode: entry.mode.unwrap_or(default_mode(Kind::File)),
                    }),
                }
            }
            Kind::Symlink => Stage::Symlink {
                target: entry.link_target,
                staged: None,
            },
            Kind::Directory => {
                let (staged, made) = self.make_staging(Kind::Directory, 0)?;
                let Made::Tree(root) = made else {
                    unreachable!("a tree staging for a directory entry");
                };
                Stage::Tree {
                    staged,
                    root,
                    dirs: vec![(
                        String::new(),
                        entry.mode.unwrap_or(default_mode(Kind::Directory)),
                    )],
                    filling: None,
                    last_parent: None,
                }
            }
        };
        Ok(())
    }

    /// An entry below the root of a tree.
    fn child(&mut self, entry: Entry) -> Result<(), ToolError> {
        let Stage::Tree {
            root,
            dirs,
            filling,
            last_parent,
            ..
        } = &mut self.stage
        else {
            unreachable!("child entries only follow a directory root");
        };
        if let Some(f) = filling.take() {
            close_file(f, &self.dest.path)?;
        }
        let (parent_path, name) = split_entry_path(&entry.path)?;
        let shown_path = shown(&self.dest.path, &entry.path);
        // The parent must be a directory sent before: it exists in the staging, reached from the
        // root without following a symlink (a symlink or file entry there fails here).
        let parent = match last_parent.take() {
            Some((p, fd)) if p == parent_path => fd,
            _ => walk(root.as_fd(), parent_path).map_err(|e| match e {
                Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP => ToolError::invalid(format!(
                    "entry `{}`: its parent `{parent_path}` is not a directory entry sent \
                     before it",
                    entry.path
                )),
                e => sys_error("cannot open", &shown(&self.dest.path, parent_path), e),
            })?,
        };
        let exists = |e: Errno, op: &str| match e {
            Errno::EEXIST => ToolError::invalid(format!(
                "entry `{}` was sent twice (or its name is taken in the staging)",
                entry.path
            )),
            e => sys_error(op, &shown_path, e),
        };
        let name = OsStr::new(name);
        match entry.kind {
            Kind::File => {
                let file = match create_file(parent.as_fd(), name, &shown_path, entry.size) {
                    Err(e) if e.kind == ErrorKind::AlreadyExists => {
                        return Err(exists(Errno::EEXIST, ""));
                    }
                    other => other?,
                };
                *filling = Some(Filling {
                    path: entry.path.clone(),
                    file,
                    size: entry.size,
                    written: 0,
                    mode: entry.mode.unwrap_or(default_mode(Kind::File)),
                });
            }
            Kind::Directory => {
                mkdirat(parent.as_fd(), name, Mode::from_bits_truncate(0o700))
                    .map_err(|e| exists(e, "cannot create directory"))?;
                dirs.push((
                    entry.path.clone(),
                    entry.mode.unwrap_or(default_mode(Kind::Directory)),
                ));
            }
            Kind::Symlink => {
                nix::unistd::symlinkat(entry.link_target.as_str(), parent.as_fd(), name)
                    .map_err(|e| exists(e, "cannot create symlink"))?;
            }
        }
        *last_parent = Some((parent_path.to_string(), parent));
        self.summary.count(entry.kind);
        Ok(())
    }

    /// The next data bytes of the current file entry.
    pub fn data(&mut self, bytes: &[u8]) -> Result<(), ToolError> {
        let filling = match &mut self.stage {
            Stage::File { filling, .. } | Stage::Tree { filling, .. } => filling.as_mut(),
            _ => None,
        };
        let Some(f) = filling else {
            return Err(ToolError::invalid(
                "data without a file entry before it (data follows its FILE entry)",
            ));
        };
        let len = bytes.len() as u64;
        if len > f.size - f.written {
            return Err(ToolError::invalid(format!(
                "{}: more data than its size ({} bytes announced); nothing was written",
                shown(&self.dest.path, &f.path).display(),
                f.size
            )));
        }
        f.file
            .write_all(bytes)
            .map_err(|e| super::io_error("cannot write", &shown(&self.dest.path, &f.path), e))?;
        f.written += len;
        self.summary.bytes += len;
        Ok(())
    }

    /// The stream ended: checks it is complete, applies the final modes, flushes, and renames
    /// the staging into place. Returns what was written. On an error the staging stays in
    /// `self.stage`, so dropping `self` removes it.
    pub fn finish(mut self) -> Result<Summary, ToolError> {
        let path = &self.dest.path;
        let kind = match &mut self.stage {
            Stage::Empty => {
                return Err(ToolError::invalid(
                    "the stream ended before its root entry (path \"\")",
                ));
            }
            Stage::File { filling, .. } => {
                if let Some(f) = filling.take() {
                    let file = close_file(f, path)?;
                    nix::unistd::fdatasync(&file)
                        .map_err(|e| sys_error("cannot flush", path, e))?;
                }
                Kind::File
            }
            Stage::Symlink { target, staged } => {
                let name = fsx::staging_name(&self.dest.name, "upload");
                nix::unistd::symlinkat(target.as_str(), self.dest.parent.as_fd(), name.as_os_str())
                    .map_err(|e| sys_error("cannot create symlink", path, e))?;
                *staged = Some(name);
                Kind::Symlink
            }
            Stage::Tree {
                root,
                dirs,
                filling,
                last_parent,
                ..
            } => {
                *last_parent = None;
                if let Some(f) = filling.take() {
                    close_file(f, path)?;
                }
                // Deepest first: a directory's mode may take away the search permission its
                // children's need (the creation order has parents first).
                for (rel, mode) in dirs.iter().rev() {
                    let fd = walk(root.as_fd(), rel).map_err(|e| changed(&shown(path, rel), e))?;
                    fchmod(&fd, Mode::from_bits_truncate(*mode))
                        .map_err(|e| sys_error("cannot set the mode of", &shown(path, rel), e))?;
                }
                nix::unistd::syncfs(&*root).map_err(|e| sys_error("cannot flush", path, e))?;
                Kind::Directory
            }
        };
        let staged = self
            .stage
            .staged()
            .map(OsStr::to_os_string)
            .unwrap_or_default();
        self.place(&staged, kind)?;
        // In place: nothing left to remove.
        self.stage = Stage::Empty;
        Ok(std::mem::take(&mut self.summary))
    }
}

/// Splits an entry path below the root into its parent ("" for the root) and its name, refusing
/// anything but plain names.
fn split_entry_path(path: &str) -> Result<(&str, &str), ToolError> {
    let bad = || {
        ToolError::invalid(format!(
            "entry path `{path}` must be relative to the root, '/'-separated names only (no \
             empty, `.` or `..` component, no leading `/`)"
        ))
    };
    if path.is_empty() {
        return Err(ToolError::invalid(
            "the root entry (path \"\") was sent twice",
        ));
    }
    if path.contains('\0')
        || path
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Err(bad());
    }
    Ok(match path.rsplit_once('/') {
        Some((parent, name)) => (parent, name),
        None => ("", path),
    })
}

fn already_exists(path: &Path, existing: &Existing) -> ToolError {
    ToolError::new(
        ErrorKind::AlreadyExists,
        format!(
            "{} already exists ({}); set overwrite to replace it",
            path.display(),
            existing.noun()
        ),
    )
}

fn kind_mismatch(path: &Path, existing: &Existing, kind: Kind) -> ToolError {
    ToolError::new(
        ErrorKind::FailedPrecondition,
        format!(
            "{} is {}, and {} cannot replace it (a directory replaces only a directory, a file \
             or symlink only a file or symlink); remove it first or choose another destination",
            path.display(),
            existing.noun(),
            kind.noun()
        ),
    )
}

fn changed(at: &Path, e: Errno) -> ToolError {
    match e {
        Errno::ELOOP | Errno::ENOTDIR | Errno::ENOENT => ToolError::new(
            ErrorKind::Aborted,
            format!(
                "{} changed while the transfer ran (a staged directory was replaced); nothing \
                 was changed",
                at.display()
            ),
        ),
        e => sys_error("cannot open", at, e),
    }
}
