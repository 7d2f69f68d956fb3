//! Reads a file or a directory tree into a transfer stream: the root first (path ""), then
//! depth-first with each directory's entries in byte order, each file's entry followed by exactly
//! its bytes. Symlinks are sent as symlinks and never followed (the root too: a symlink named as
//! the source is sent as that symlink, like `cp -R`); FIFOs, sockets and devices are skipped and
//! listed, and so are names that are not UTF-8 (the stream's paths are strings).
//!
//! Every node is opened relative to its directory's descriptor with `O_NOFOLLOW`, and checked to
//! be the node `lstat` saw; a file is read with `O_NONBLOCK`, so nothing here blocks on a FIFO.
//! A file yields exactly the size it had when its entry was sent: one that shrank meanwhile ends
//! the transfer with ABORTED (its entry promised bytes that no longer exist).

use super::fsx::{self, Node};
use super::{Entry, Item, Kind, MAX_DEPTH, Summary, shown, sys_error};
use crate::tools::{ErrorKind, ToolError};
use nix::errno::Errno;
use nix::fcntl::{OFlag, openat};
use nix::sys::stat::{FileStat, Mode, fstat};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

/// How a file is opened for sending.
const FILE_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_NONBLOCK)
    .union(OFlag::O_NOCTTY)
    .union(OFlag::O_CLOEXEC);

/// Where the stream goes. An error stops the transfer (the receiver went away).
pub type Sink<'a> = dyn FnMut(Item) -> Result<(), ToolError> + 'a;

/// A directory being walked.
struct Level {
    fd: OwnedFd,
    /// Its path relative to the root ("" for the root).
    rel: String,
    /// Its entries not yet sent, last first.
    left: Vec<OsString>,
}

/// Sends `path` (not followed if it is a symlink) in `chunk`-byte data items.
pub fn send(path: &Path, chunk: usize, sink: &mut Sink<'_>) -> Result<Summary, ToolError> {
    let mut summary = Summary {
        path: path.to_path_buf(),
        ..Default::default()
    };
    let (parent, name) = open_parent(path)?;
    let st = fsx::lstat_at(&parent, &name).map_err(|e| sys_error("cannot read", path, e))?;
    match fsx::node_of(&st) {
        Node::Other(what) => {
            return Err(ToolError::invalid(format!(
                "{} is {what}; a transfer sends regular files, directories and symlinks",
                path.display()
            )));
        }
        Node::Symlink => {
            let target = link_target(parent.as_fd(), &name, path)?.ok_or_else(|| {
                ToolError::invalid(format!(
                    "{} is a symlink whose target is not UTF-8; it cannot be sent",
                    path.display()
                ))
            })?;
            sink(Item::Entry(Entry {
                path: String::new(),
                kind: Kind::Symlink,
                mode: None,
                size: 0,
                link_target: target,
            }))?;
            summary.symlinks += 1;
        }
        Node::File => {
            if !send_file(
                parent.as_fd(),
                &name,
                &st,
                "",
                path,
                chunk,
                sink,
                &mut summary,
            )? {
                return Err(ToolError::new(
                    ErrorKind::Aborted,
                    format!("{} changed while it was opened; retry", path.display()),
                ));
            }
        }
        Node::Directory => {
            let fd = open_same_dir(parent.as_fd(), &name, &st)
                .map_err(|e| sys_error("cannot open", path, e))?
                .ok_or_else(|| changed(path))?;
            sink(Item::Entry(dir_entry(String::new(), &st)))?;
            summary.directories += 1;
            walk(fd, path, chunk, sink, &mut summary)?;
        }
    }
    Ok(summary)
}

/// Sends everything below the directory `root` (whose entry was sent).
fn walk(
    root: OwnedFd,
    base: &Path,
    chunk: usize,
    sink: &mut Sink<'_>,
    summary: &mut Summary,
) -> Result<(), ToolError> {
    let listing = |fd: BorrowedFd<'_>, rel: &str| -> Result<Vec<OsString>, ToolError> {
        let mut names =
            fsx::names(fd).map_err(|e| sys_error("cannot list", &shown(base, rel), e))?;
        names.reverse();
        Ok(names)
    };
    let mut stack = vec![Level {
        left: listing(root.as_fd(), "")?,
        fd: root,
        rel: String::new(),
    }];
    loop {
        let depth = stack.len();
        let Some(top) = stack.last_mut() else {
            break;
        };
        let Some(name) = top.left.pop() else {
            stack.pop();
            continue;
        };
        let lossy = name.to_string_lossy();
        let rel = if top.rel.is_empty() {
            lossy.to_string()
        } else {
            format!("{}/{lossy}", top.rel)
        };
        if name.to_str().is_none() {
            summary.skipped.push(rel);
            continue;
        }
        let st = match fsx::lstat_at(&top.fd, &name) {
            Ok(st) => st,
            // Removed since the listing: it is simply not part of the tree any more.
            Err(Errno::ENOENT) => continue,
            Err(e) => return Err(sys_error("cannot read", &shown(base, &rel), e)),
        };
        match fsx::node_of(&st) {
            Node::Other(_) => summary.skipped.push(rel),
            Node::Symlink => match link_target(top.fd.as_fd(), &name, &shown(base, &rel))? {
                Some(target) => {
                    sink(Item::Entry(Entry {
                        path: rel,
                        kind: Kind::Symlink,
                        mode: None,
                        size: 0,
                        link_target: target,
                    }))?;
                    summary.symlinks += 1;
                }
                None => summary.skipped.push(rel),
            },
            Node::File => {
                let fd = top.fd.as_fd();
                if !send_file(
                    fd,
                    &name,
                    &st,
                    &rel,
                    &shown(base, &rel),
                    chunk,
                    sink,
                    summary,
                )? {
                    // It became something else between lstat and open: skipped like one.
                    summary.skipped.push(rel);
                }
            }
            Node::Directory => {
                if depth >= MAX_DEPTH {
                    return Err(ToolError::new(
                        ErrorKind::ResourceExhausted,
                        format!(
                            "{} is nested deeper than {MAX_DEPTH} directories; transfer a \
                             deeper part on its own",
                            shown(base, &rel).display()
                        ),
                    ));
                }
                let Some(fd) = open_same_dir(top.fd.as_fd(), &name, &st)
                    .map_err(|e| sys_error("cannot open", &shown(base, &rel), e))?
                else {
                    summary.skipped.push(rel);
                    continue;
                };
                sink(Item::Entry(dir_entry(rel.clone(), &st)))?;
                summary.directories += 1;
                let left = listing(fd.as_fd(), &rel)?;
                stack.push(Level { fd, rel, left });
            }
        }
    }
    Ok(())
}

fn dir_entry(path: String, st: &FileStat) -> Entry {
    Entry {
        path,
        kind: Kind::Directory,
        mode: Some(st.st_mode & 0o777),
        size: 0,
        link_target: String::new(),
    }
}

/// Sends one regular file: its entry, then exactly its size in data items. `false` when the
/// node is no longer the regular file `seen` (nothing was sent).
#[allow(clippy::too_many_arguments)]
fn send_file(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    seen: &FileStat,
    rel: &str,
    shown: &Path,
    chunk: usize,
    sink: &mut Sink<'_>,
    summary: &mut Summary,
) -> Result<bool, ToolError> {
    let fd = match openat(dir, name, FILE_FLAGS, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::ELOOP | Errno::ENOENT | Errno::ENXIO) => return Ok(false),
        Err(e) => return Err(sys_error("cannot open", shown, e)),
    };
    let st = fstat(&fd).map_err(|e| sys_error("cannot read", shown, e))?;
    if fsx::node_of(&st) != Node::File || (st.st_dev, st.st_ino) != (seen.st_dev, seen.st_ino) {
        return Ok(false);
    }
    let size = u64::try_from(st.st_size).unwrap_or(0);
    sink(Item::Entry(Entry {
        path: rel.to_string(),
        kind: Kind::File,
        mode: Some(st.st_mode & 0o777),
        size,
        link_target: String::new(),
    }))?;
    summary.files += 1;
    let mut file = File::from(fd);
    let mut left = size;
    while left > 0 {
        let want = usize::try_from(left).unwrap_or(usize::MAX).min(chunk);
        let mut buf = vec![0u8; want];
        let mut got = 0;
        while got < want {
            match file.read(&mut buf[got..]) {
                Ok(0) => {
                    return Err(ToolError::new(
                        ErrorKind::Aborted,
                        format!(
                            "{} shrank while it was read ({} of the {size} bytes its entry \
                             announced exist); the transfer stopped — retry when it is not \
                             being written",
                            shown.display(),
                            size - left + got as u64
                        ),
                    ));
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(super::io_error("cannot read", shown, e)),
            }
        }
        left -= want as u64;
        summary.bytes += want as u64;
        sink(Item::Data(buf))?;
    }
    Ok(true)
}

/// Opens directory `name` and checks it is the one `lstat` saw (`None`: it was replaced).
fn open_same_dir(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    seen: &FileStat,
) -> nix::Result<Option<OwnedFd>> {
    let fd = match fsx::open_dir(dir, name) {
        Ok(fd) => fd,
        Err(Errno::ELOOP | Errno::ENOTDIR | Errno::ENOENT) => return Ok(None),
        Err(e) => return Err(e),
    };
    let st = fstat(&fd)?;
    Ok(((st.st_dev, st.st_ino) == (seen.st_dev, seen.st_ino)).then_some(fd))
}

/// A symlink's target, `None` when it is not UTF-8.
fn link_target(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    shown: &Path,
) -> Result<Option<String>, ToolError> {
    let target =
        nix::fcntl::readlinkat(dir, name).map_err(|e| sys_error("cannot read link", shown, e))?;
    Ok(target.into_string().ok())
}

/// The directory holding `path` (opened as any program would, following symlinks on the way)
/// and the final name, which is not followed. At or below the pinned working directory the
/// directory is opened from its descriptor (H24); the pinned directory itself is named from its
/// own side (`.`), as its parent is not its to walk.
fn open_parent(path: &Path) -> Result<(OwnedFd, OsString), ToolError> {
    use crate::tools::shell::pinned_cwd::{beneath, fs_path};
    let (parent, name): (PathBuf, OsString) = match path.file_name() {
        _ if beneath(path).is_some_and(|(_, rest)| {
            rest.components().all(|c| c == std::path::Component::CurDir)
        }) =>
        {
            (path.to_path_buf(), OsString::from("."))
        }
        // `.`, `..`, `/`: the node itself is a directory; name it from its parent's side.
        _ if path.ends_with("..") || path == Path::new("/") || path.as_os_str().is_empty() => {
            (path.to_path_buf(), OsString::from("."))
        }
        Some(name) => (
            path.parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."))
                .to_path_buf(),
            name.to_os_string(),
        ),
        None => (path.to_path_buf(), OsString::from(".")),
    };
    let fd = nix::fcntl::open(
        &*fs_path(&parent),
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| sys_error("cannot open", &parent, e))?;
    Ok((fd, name))
}

fn changed(path: &Path) -> ToolError {
    ToolError::new(
        ErrorKind::Aborted,
        format!("{} changed while it was opened; retry", path.display()),
    )
}
