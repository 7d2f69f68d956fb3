//! The Files service's filesystem operations beside the transfers: Stat, ListDirectory (reads,
//! as any reader of the session would: symlinks on the way followed), MakeDirectory, Remove and
//! Copy (writes, under exactly WriteBytes's rules: the target is resolved and checked by
//! [`destination::for_write`] — writable roots, protected names and paths, read-only sessions —
//! and every change is made relative to the parent directory it opened without following a
//! symlink).
//!
//! Paths at or below the worker's pinned working directory are reached through it
//! ([`fs_path`], spec/sandbox.md H24), as ReadBytes and WriteBytes reach them.

use super::destination::{self, Destination};
use super::fsx::{self, Node};
use super::receive::Receiver;
use super::{Item, SEND_CHUNK, io_error, send, sys_error};
use crate::tools::apply_patch::{PatchContext, resolve_target};
use crate::tools::shell::pinned_cwd::fs_path;
use crate::tools::{ErrorKind, ToolError};
use nix::errno::Errno;
use nix::fcntl::{OFlag, open};
use nix::sys::stat::{Mode, fchmod, mkdirat};
use nix::unistd::{UnlinkatFlags, unlinkat};
use std::ffi::OsString;
use std::fs::{FileType, Metadata};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::UNIX_EPOCH;

/// Most entries ListDirectory returns; a larger directory is RESOURCE_EXHAUSTED.
pub const MAX_LIST_ENTRIES: usize = 100_000;

/// What Stat reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    /// The path, resolved against the cwd.
    pub path: PathBuf,
    pub node: Node,
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// Milliseconds since the Unix epoch.
    pub modified_ms: i64,
    /// Birth time in milliseconds since the Unix epoch; 0 when the filesystem has none.
    pub created_ms: i64,
}

/// `cwd.join(path)`, refusing an empty path or one with a NUL byte.
fn joined(cwd: &Path, path: &str, field: &str) -> Result<PathBuf, ToolError> {
    if path.is_empty() {
        return Err(ToolError::invalid(format!("{field} is required")));
    }
    if path.contains('\0') {
        return Err(ToolError::invalid(format!("{field} contains a NUL byte")));
    }
    Ok(cwd.join(path))
}

/// The kind of a node from its file type.
fn node_of_type(t: FileType) -> Node {
    if t.is_symlink() {
        Node::Symlink
    } else if t.is_dir() {
        Node::Directory
    } else if t.is_file() {
        Node::File
    } else if t.is_fifo() {
        Node::Other("a FIFO")
    } else if t.is_socket() {
        Node::Other("a socket")
    } else if t.is_char_device() {
        Node::Other("a character device")
    } else if t.is_block_device() {
        Node::Other("a block device")
    } else {
        Node::Other("of an unknown type")
    }
}

/// Milliseconds since the epoch of a `(seconds, nanoseconds)` time.
fn millis(secs: i64, nsecs: i64) -> i64 {
    secs.saturating_mul(1000).saturating_add(nsecs / 1_000_000)
}

fn stat_of(path: PathBuf, m: &Metadata) -> Stat {
    let created_ms = m
        .created()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    Stat {
        path,
        node: node_of_type(m.file_type()),
        size: m.size(),
        mode: m.mode() & 0o777,
        modified_ms: millis(m.mtime(), m.mtime_nsec()),
        created_ms,
    }
}

/// Stat: what is at `path` (absolute or relative to `cwd`). A final symlink is described
/// itself unless `follow_symlinks`.
pub fn stat(cwd: &Path, path: &str, follow_symlinks: bool) -> Result<Stat, ToolError> {
    let full = joined(cwd, path, "path")?;
    let at = fs_path(&full);
    let meta = if follow_symlinks {
        std::fs::metadata(&*at)
    } else {
        std::fs::symlink_metadata(&*at)
    }
    .map_err(|e| io_error("cannot stat", &full, e))?;
    Ok(stat_of(full, &meta))
}

/// ListDirectory: the entries of the directory at `path` (symlinks on the way, and a final
/// one, followed), without `.` and `..`, sorted bytewise; each entry's kind as `lstat` sees it.
pub fn list_directory(
    cwd: &Path,
    path: &str,
) -> Result<(PathBuf, Vec<(OsString, Node)>), ToolError> {
    let full = joined(cwd, path, "path")?;
    let fd = open(
        &*fs_path(&full),
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| sys_error("cannot list", &full, e))?;
    // A second description for the entries whose type the listing does not carry.
    let probe = fd
        .try_clone()
        .map_err(|e| io_error("cannot list", &full, e))?;
    let mut listing = nix::dir::Dir::from_fd(fd).map_err(|e| sys_error("cannot list", &full, e))?;
    let mut out = Vec::new();
    for entry in listing.iter() {
        let entry = entry.map_err(|e| sys_error("cannot list", &full, e))?;
        let bytes = entry.file_name().to_bytes();
        if bytes == b"." || bytes == b".." {
            continue;
        }
        if out.len() == MAX_LIST_ENTRIES {
            return Err(ToolError::new(
                ErrorKind::ResourceExhausted,
                format!(
                    "{} has more than {MAX_LIST_ENTRIES} entries, the most ListDirectory \
                     returns; list it with a command instead",
                    full.display()
                ),
            ));
        }
        let name = std::ffi::OsStr::from_bytes(bytes).to_os_string();
        use nix::dir::Type;
        let node = match entry.file_type() {
            Some(Type::File) => Node::File,
            Some(Type::Directory) => Node::Directory,
            Some(Type::Symlink) => Node::Symlink,
            Some(Type::Fifo) => Node::Other("a FIFO"),
            Some(Type::Socket) => Node::Other("a socket"),
            Some(Type::CharacterDevice) => Node::Other("a character device"),
            Some(Type::BlockDevice) => Node::Other("a block device"),
            None => match fsx::lstat_at(probe.as_fd(), &name) {
                Ok(st) => fsx::node_of(&st),
                // Removed since it was listed.
                Err(Errno::ENOENT) => continue,
                Err(e) => return Err(sys_error("cannot inspect", &full.join(&name), e)),
            },
        };
        out.push((name, node));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok((full, out))
}

/// NOT_FOUND for `full`, with the OS's own text: `{op} {path}: No such file or directory (os
/// error 2)`.
fn not_found(op: &str, full: &Path) -> ToolError {
    io_error(op, full, std::io::Error::from_raw_os_error(libc::ENOENT))
}

/// [`destination::for_write`], with a missing parent said the OS's way (`op` names the call).
fn target(
    rules: &PatchContext,
    path: &str,
    create_parents: bool,
    op: &str,
) -> Result<Destination, ToolError> {
    let full = joined(&rules.cwd, path, "path")?;
    match destination::for_write(rules, path, "", create_parents) {
        Err(e) if e.kind == ErrorKind::NotFound && !e.message.contains("os error") => {
            Err(not_found(op, &full))
        }
        other => other,
    }
}

/// MakeDirectory: creates the directory `path` (0755 whatever the umask); with `recursive`,
/// its missing parents too (0755), and an existing directory there is fine (`mkdir -p`).
/// Returns the directory's resolved path.
pub fn make_directory(
    rules: &PatchContext,
    path: &str,
    recursive: bool,
) -> Result<PathBuf, ToolError> {
    let full = joined(&rules.cwd, path, "path")?;
    // `mkdir -p` of a directory that exists creates nothing, wherever it is (a read-only
    // session still writes nothing, and says so).
    if recursive
        && !rules.read_only
        && std::fs::metadata(&*fs_path(&full)).is_ok_and(|m| m.is_dir())
    {
        return Ok(full);
    }
    let dest = target(rules, path, recursive, "cannot create directory")?;
    match mkdirat(
        dest.parent.as_fd(),
        dest.name.as_os_str(),
        Mode::from_bits_truncate(0o755),
    ) {
        Ok(()) => {
            let made = fsx::open_dir(dest.parent.as_fd(), &dest.name)
                .map_err(|e| sys_error("cannot open", &dest.path, e))?;
            // 0755 exactly, whatever the umask.
            fchmod(&made, Mode::from_bits_truncate(0o755))
                .map_err(|e| sys_error("cannot set the mode of", &dest.path, e))?;
            Ok(dest.path)
        }
        Err(Errno::EEXIST) => match dest.existing()? {
            // (It exists as a directory, or a symlink to one: `mkdir -p` is satisfied.)
            Some(_)
                if recursive
                    && std::fs::metadata(&*fs_path(&dest.path)).is_ok_and(|m| m.is_dir()) =>
            {
                Ok(dest.path)
            }
            Some(e) if recursive => Err(ToolError::new(
                ErrorKind::FailedPrecondition,
                format!(
                    "{} exists and is {}, not a directory",
                    dest.path.display(),
                    e.noun()
                ),
            )),
            existing => Err(ToolError::new(
                ErrorKind::AlreadyExists,
                format!(
                    "cannot create directory {}: it already exists ({}); set recursive to accept \
                     an existing directory",
                    dest.path.display(),
                    existing.map_or("something", |e| e.noun())
                ),
            )),
        },
        Err(e) => Err(sys_error("cannot create directory", &dest.path, e)),
    }
}

/// Remove: `rm` of `path` — a file, a symlink (the link itself, never what it points to), or
/// with `recursive` a directory and everything below it (no permission is changed on the way).
/// With `force` a missing path is not an error. A writable root, a protected path and anything
/// containing one are refused by the same rules as every write. Returns the resolved path.
pub fn remove(
    rules: &PatchContext,
    path: &str,
    recursive: bool,
    force: bool,
) -> Result<PathBuf, ToolError> {
    let full = joined(&rules.cwd, path, "path")?;
    let dest = match target(rules, path, false, "cannot remove") {
        Err(e) if e.kind == ErrorKind::NotFound && force => return Ok(full),
        other => other?,
    };
    let seen = match fsx::lstat_at(dest.parent.as_fd(), &dest.name) {
        Ok(st) => st,
        Err(Errno::ENOENT) if force => return Ok(dest.path),
        Err(e) => return Err(sys_error("cannot remove", &dest.path, e)),
    };
    if fsx::node_of(&seen) == Node::Directory {
        if !recursive {
            return Err(ToolError::new(
                ErrorKind::FailedPrecondition,
                format!(
                    "cannot remove {}: it is a directory; set recursive to remove it and \
                     everything below it",
                    dest.path.display()
                ),
            ));
        }
        fsx::remove_tree_plain(dest.parent.as_fd(), &dest.name)
            .map_err(|e| sys_error("cannot remove", &dest.path, e))?;
    } else {
        match unlinkat(
            dest.parent.as_fd(),
            dest.name.as_os_str(),
            UnlinkatFlags::NoRemoveDir,
        ) {
            Ok(()) => {}
            Err(Errno::ENOENT) if force => {}
            Err(e) => return Err(sys_error("cannot remove", &dest.path, e)),
        }
    }
    Ok(dest.path)
}

/// Copy: `source` (a file, a symlink copied as the symlink, or with `recursive` a directory
/// tree; permission bits kept, FIFOs, sockets and devices inside a tree skipped) to exactly
/// `destination`, received like an upload: staged beside it and renamed into place, so the copy
/// appears complete or not at all. An existing file or symlink there is replaced; an existing
/// directory is not (ALREADY_EXISTS). The destination follows WriteBytes's rules. `cancel` stops
/// the copy (and removes its staging). Returns the destination's resolved path.
pub fn copy(
    rules: &PatchContext,
    source: &str,
    destination_path: &str,
    recursive: bool,
    cancel: &AtomicBool,
) -> Result<PathBuf, ToolError> {
    let src = joined(&rules.cwd, source, "source_path")?;
    joined(&rules.cwd, destination_path, "destination_path")?;
    let meta =
        std::fs::symlink_metadata(&*fs_path(&src)).map_err(|e| io_error("cannot copy", &src, e))?;
    let is_dir = meta.is_dir();
    if is_dir && !recursive {
        return Err(ToolError::new(
            ErrorKind::FailedPrecondition,
            format!(
                "cannot copy {}: it is a directory; set recursive to copy it and everything \
                 below it",
                src.display()
            ),
        ));
    }
    let dest = target(rules, destination_path, false, "cannot copy to")?;
    if is_dir {
        let resolved =
            resolve_target(&src, false).map_err(|e| io_error("cannot resolve", &src, e))?;
        if dest.path.starts_with(&resolved) {
            return Err(ToolError::invalid(format!(
                "cannot copy the directory {} into itself ({})",
                src.display(),
                dest.path.display()
            )));
        }
        if let Some(existing) = dest.existing()? {
            return Err(ToolError::new(
                ErrorKind::AlreadyExists,
                format!(
                    "{} already exists ({}); a directory is copied only to a new path, never \
                     merged into or swapped for an existing one",
                    dest.path.display(),
                    existing.noun()
                ),
            ));
        }
    }
    let path = dest.path.clone();
    let mut receiver = Receiver::new(dest, !is_dir)?;
    let mut sink = |item: Item| {
        if cancel.load(Ordering::SeqCst) {
            return Err(ToolError::new(
                ErrorKind::Cancelled,
                "the copy was cancelled; nothing was changed",
            ));
        }
        match item {
            Item::Entry(e) => receiver.entry(e),
            Item::Data(d) => receiver.data(&d),
        }
    };
    send::send(&src, SEND_CHUNK, &mut sink)?;
    receiver.finish()?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{PermissionsExt, symlink};

    fn rules(root: &Path) -> PatchContext {
        PatchContext::writable_root_for_tests(root)
    }

    fn root() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        (dir, root)
    }

    #[test]
    fn stat_describes_files_directories_and_links() {
        let (_d, root) = root();
        std::fs::write(root.join("f"), b"hello").unwrap();
        std::fs::set_permissions(root.join("f"), std::fs::Permissions::from_mode(0o640)).unwrap();
        symlink("f", root.join("l")).unwrap();
        let s = stat(&root, "f", false).unwrap();
        assert_eq!((s.node, s.size, s.mode), (Node::File, 5, 0o640));
        assert_eq!(s.path, root.join("f"));
        let now = std::time::SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        assert!((now - s.modified_ms).abs() < 60_000, "{s:?}");
        assert!(
            s.created_ms == 0 || (now - s.created_ms).abs() < 60_000,
            "{s:?}"
        );
        assert_eq!(stat(&root, "l", false).unwrap().node, Node::Symlink);
        assert_eq!(stat(&root, "l", true).unwrap().node, Node::File);
        assert_eq!(stat(&root, ".", false).unwrap().node, Node::Directory);
        let e = stat(&root, "missing", false).unwrap_err();
        assert_eq!(e.kind, ErrorKind::NotFound);
        assert!(
            e.message.contains("No such file or directory (os error 2)"),
            "{e:?}"
        );
        assert_eq!(
            stat(&root, "", false).unwrap_err().kind,
            ErrorKind::InvalidArgument
        );
    }

    #[test]
    fn list_directory_is_sorted_and_kind_exact() {
        let (_d, root) = root();
        std::fs::write(root.join("b"), "").unwrap();
        std::fs::create_dir(root.join("a")).unwrap();
        symlink("a", root.join("c")).unwrap();
        nix::unistd::mkfifo(&root.join("d"), Mode::from_bits_truncate(0o600)).unwrap();
        let (path, entries) = list_directory(&root, ".").unwrap();
        assert_eq!(path, root.join("."));
        let got: Vec<(String, Node)> = entries
            .into_iter()
            .map(|(n, k)| (n.to_string_lossy().into_owned(), k))
            .collect();
        assert_eq!(
            got,
            vec![
                ("a".into(), Node::Directory),
                ("b".into(), Node::File),
                ("c".into(), Node::Symlink),
                ("d".into(), Node::Other("a FIFO")),
            ]
        );
        // Through a symlink to a directory: its entries.
        assert!(list_directory(&root, "c").unwrap().1.is_empty());
        let e = list_directory(&root, "b").unwrap_err();
        assert_eq!(e.kind, ErrorKind::FailedPrecondition, "{e:?}");
        let e = list_directory(&root, "nope").unwrap_err();
        assert_eq!(e.kind, ErrorKind::NotFound, "{e:?}");
        assert!(e.message.contains("(os error 2)"), "{e:?}");
    }

    #[test]
    fn make_directory_is_mkdir_and_mkdir_p() {
        let (_d, root) = root();
        let r = rules(&root);
        let p = make_directory(&r, "a", false).unwrap();
        assert_eq!(p, root.join("a"));
        let mode = std::fs::metadata(root.join("a"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o755);
        assert_eq!(
            make_directory(&r, "a", false).unwrap_err().kind,
            ErrorKind::AlreadyExists
        );
        make_directory(&r, "a", true).unwrap();
        let e = make_directory(&r, "x/y", false).unwrap_err();
        assert_eq!(e.kind, ErrorKind::NotFound, "{e:?}");
        assert!(e.message.contains("(os error 2)"), "{e:?}");
        make_directory(&r, "x/y/z", true).unwrap();
        assert!(root.join("x/y/z").is_dir());
        std::fs::write(root.join("f"), "").unwrap();
        assert_eq!(
            make_directory(&r, "f", true).unwrap_err().kind,
            ErrorKind::FailedPrecondition
        );
        assert_eq!(
            make_directory(&r, "f", false).unwrap_err().kind,
            ErrorKind::AlreadyExists
        );
        for p in [".git", ".git/hooks", "../outside"] {
            let e = make_directory(&r, p, true).unwrap_err();
            assert_eq!(e.kind, ErrorKind::PermissionDenied, "{p}: {e:?}");
        }
        assert!(!root.join(".git").exists());
        let mut ro = rules(&root);
        ro.read_only = true;
        assert_eq!(
            make_directory(&ro, "b", false).unwrap_err().kind,
            ErrorKind::PermissionDenied
        );
        assert_eq!(
            make_directory(&ro, "a", true).unwrap_err().kind,
            ErrorKind::PermissionDenied
        );
    }

    #[test]
    fn remove_is_rm_and_never_follows_a_link() {
        let (_d, root) = root();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("keep"), "x").unwrap();
        let r = rules(&root);
        std::fs::write(root.join("f"), "").unwrap();
        assert_eq!(remove(&r, "f", false, false).unwrap(), root.join("f"));
        assert!(!root.join("f").exists());
        let e = remove(&r, "f", false, false).unwrap_err();
        assert_eq!(e.kind, ErrorKind::NotFound);
        assert!(
            e.message.contains("No such file or directory (os error 2)"),
            "{e:?}"
        );
        remove(&r, "f", false, true).unwrap();
        remove(&r, "no/such/parent", false, true).unwrap();
        let e = remove(&r, "no/such/parent", false, false).unwrap_err();
        assert_eq!(e.kind, ErrorKind::NotFound, "{e:?}");
        assert!(e.message.contains("(os error 2)"), "{e:?}");
        std::fs::create_dir_all(root.join("d/e")).unwrap();
        std::fs::write(root.join("d/e/f"), "").unwrap();
        symlink(outside.path(), root.join("d/out")).unwrap();
        assert_eq!(
            remove(&r, "d", false, false).unwrap_err().kind,
            ErrorKind::FailedPrecondition
        );
        symlink(outside.path(), root.join("link")).unwrap();
        remove(&r, "link", false, false).unwrap();
        remove(&r, "d", true, false).unwrap();
        assert!(!root.join("d").exists() && !root.join("link").exists());
        assert!(outside.path().join("keep").exists(), "nothing followed");
        std::fs::create_dir(root.join(".git")).unwrap();
        for p in [".git", ".git/config", ".", root.to_str().unwrap(), "../x"] {
            let e = remove(&r, p, true, true).unwrap_err();
            assert!(
                matches!(
                    e.kind,
                    ErrorKind::PermissionDenied | ErrorKind::InvalidArgument
                ),
                "{p}: {e:?}"
            );
        }
        let e = remove(&r, root.to_str().unwrap(), true, false).unwrap_err();
        assert_eq!(e.kind, ErrorKind::PermissionDenied, "{e:?}");
        assert!(root.join(".git").is_dir());
        // A directory holding a nested root is refused whole.
        let mut nested = rules(&root);
        std::fs::create_dir_all(root.join("n/inner")).unwrap();
        nested.writable_roots.push(root.join("n/inner"));
        assert_eq!(
            remove(&nested, "n", true, false).unwrap_err().kind,
            ErrorKind::PermissionDenied
        );
    }

    #[test]
    fn remove_changes_no_permission() {
        if nix::unistd::geteuid().is_root() {
            return; // root ignores the modes this relies on
        }
        let (_d, root) = root();
        std::fs::create_dir_all(root.join("d/ro")).unwrap();
        std::fs::write(root.join("d/ro/f"), "").unwrap();
        std::fs::set_permissions(root.join("d/ro"), std::fs::Permissions::from_mode(0o555))
            .unwrap();
        let e = remove(&rules(&root), "d", true, false).unwrap_err();
        assert_eq!(e.kind, ErrorKind::PermissionDenied, "{e:?}");
        let mode = std::fs::metadata(root.join("d/ro"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o555);
        std::fs::set_permissions(root.join("d/ro"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
    }

    #[test]
    fn copy_is_cp_with_links_as_links() {
        let (_d, root) = root();
        let r = rules(&root);
        let never = AtomicBool::new(false);
        std::fs::write(root.join("f"), b"data").unwrap();
        std::fs::set_permissions(root.join("f"), std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(copy(&r, "f", "g", false, &never).unwrap(), root.join("g"));
        assert_eq!(std::fs::read(root.join("g")).unwrap(), b"data");
        assert_eq!(
            std::fs::metadata(root.join("g"))
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o600
        );
        // Over an existing file: replaced.
        std::fs::write(root.join("f"), b"new").unwrap();
        copy(&r, "f", "g", false, &never).unwrap();
        assert_eq!(std::fs::read(root.join("g")).unwrap(), b"new");
        symlink("f", root.join("l")).unwrap();
        copy(&r, "l", "l2", false, &never).unwrap();
        assert_eq!(std::fs::read_link(root.join("l2")).unwrap(), Path::new("f"));
        std::fs::create_dir_all(root.join("t/s")).unwrap();
        std::fs::write(root.join("t/s/x"), b"x").unwrap();
        symlink("s/x", root.join("t/lx")).unwrap();
        assert_eq!(
            copy(&r, "t", "u", false, &never).unwrap_err().kind,
            ErrorKind::FailedPrecondition
        );
        copy(&r, "t", "u", true, &never).unwrap();
        assert_eq!(std::fs::read(root.join("u/s/x")).unwrap(), b"x");
        assert!(
            std::fs::symlink_metadata(root.join("u/lx"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(
            copy(&r, "t", "u", true, &never).unwrap_err().kind,
            ErrorKind::AlreadyExists
        );
        assert_eq!(
            copy(&r, "t", "t/s/in", true, &never).unwrap_err().kind,
            ErrorKind::InvalidArgument
        );
        let e = copy(&r, "missing", "m2", false, &never).unwrap_err();
        assert_eq!(e.kind, ErrorKind::NotFound);
        assert!(e.message.contains("(os error 2)"), "{e:?}");
        for dst in [".git", ".git/x", "../out", root.to_str().unwrap()] {
            let e = copy(&r, "f", dst, false, &never).unwrap_err();
            assert_eq!(e.kind, ErrorKind::PermissionDenied, "{dst}: {e:?}");
        }
        assert!(!root.join(".git").exists());
        let mut ro = rules(&root);
        ro.read_only = true;
        assert_eq!(
            copy(&ro, "f", "h", false, &never).unwrap_err().kind,
            ErrorKind::PermissionDenied
        );
        // Cancelled: nothing appears, no staging is left.
        let stop = AtomicBool::new(true);
        assert_eq!(
            copy(&r, "t", "v", true, &stop).unwrap_err().kind,
            ErrorKind::Cancelled
        );
        let left: Vec<_> = std::fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".v") || n == "v")
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
