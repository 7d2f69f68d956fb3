//! Verification over a virtual tree, then an atomic commit with rollback (spec/tools.md §5.7).
//!
//! [`verify`] walks the hunks over a view of the tree that starts as the disk and reflects every
//! earlier hunk; it computes every new file content, records the originals needed to undo, and
//! lists the targets for the policy check. Nothing is written there. [`commit`] then performs the
//! planned operations (each write through a temporary file in the target's directory and a
//! rename) and, on the first I/O error, undoes everything already done.
//!
//! Paths here are [`resolve`]'s (and the `cwd.join` form for messages); every system call on
//! one goes through `fs_path`, so a path at or below the pinned working directory is reached
//! from its descriptor (spec/sandbox.md H24), temporary file and rename included.

use std::collections::HashMap;
use std::fs::{self, Permissions};
use std::io::{self, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::parser::{Hunk, Patch};
use super::paths::resolve;
use super::update::compute_update;
use super::{FileChange, FileChangeKind, PatchContext};
use crate::tools::shell::pinned_cwd::fs_path;
use crate::tools::transfer::fsx::{
    leftovers_possible, lock_staging, locks_unsupported, remove_unlocked,
};
use crate::tools::{ErrorKind, ToolError, kind_of_io, resolve_path};

/// `EISDIR` (Linux and macOS).
const EISDIR: i32 = 21;
/// `ENOENT`.
const ENOENT: i32 = 2;
/// Prefix of every verification error.
const VERIFY_PREFIX: &str = "apply_patch verification failed: ";
/// Temporary files are named `.corral-patch-XXXXXX.tmp`: never a protected name.
const TEMP_PREFIX: &str = ".corral-patch-";
const TEMP_SUFFIX: &str = ".tmp";

/// The result of verification: what to do, what to report, what to check.
pub struct Plan {
    pub ops: Vec<Op>,
    pub changes: Vec<FileChange>,
    /// Every target as (resolved path or `None` if it could not be resolved, `cwd.join` form).
    pub targets: Vec<(Option<PathBuf>, PathBuf)>,
    originals: HashMap<PathBuf, Original>,
}

/// Why an entry is removed (it selects the error text).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoveKind {
    Delete,
    MoveSource,
}

/// One disk operation of the commit.
#[derive(Debug)]
pub enum Op {
    /// Write `content` at the resolved `target`; `perms` are kept from the replaced file.
    Write {
        target: PathBuf,
        display: PathBuf,
        content: Vec<u8>,
        perms: Option<Permissions>,
    },
    /// Remove the entry `entry` (a symlink itself, not its target).
    Remove {
        entry: PathBuf,
        display: PathBuf,
        kind: RemoveKind,
    },
}

/// What was on disk at a path before the patch.
#[derive(Debug, Clone)]
enum Original {
    Absent,
    Dir,
    /// A FIFO, socket or device: never read (a FIFO would block), never replaced.
    Special,
    Symlink(PathBuf),
    /// A regular file; `bytes` is `None` when it could not be read.
    File {
        bytes: Option<Vec<u8>>,
        perms: Permissions,
    },
}

/// A path's state in the virtual view.
enum Entry {
    File {
        bytes: Vec<u8>,
        perms: Option<Permissions>,
    },
    Gone,
}

/// What the view holds at a path right now.
enum Current {
    Absent,
    Dir,
    Special,
    /// A file; `bytes` is the read error if it could not be read; `perms` are what a rewrite keeps.
    File {
        bytes: Result<Vec<u8>, io::Error>,
        perms: Option<Permissions>,
    },
}

#[derive(Default)]
struct View {
    entries: HashMap<PathBuf, Entry>,
    originals: HashMap<PathBuf, Original>,
}

fn snapshot(path: &Path) -> io::Result<Original> {
    let path = &*fs_path(path);
    match fs::symlink_metadata(path) {
        Err(e)
            if e.kind() == io::ErrorKind::NotFound || e.kind() == io::ErrorKind::NotADirectory =>
        {
            Ok(Original::Absent)
        }
        Err(e) => Err(e),
        Ok(meta) if meta.file_type().is_symlink() => Ok(Original::Symlink(fs::read_link(path)?)),
        Ok(meta) if meta.is_dir() => Ok(Original::Dir),
        Ok(meta) if !meta.is_file() => Ok(Original::Special),
        Ok(meta) => Ok(Original::File {
            bytes: fs::read(path).ok(),
            perms: meta.permissions(),
        }),
    }
}

impl View {
    fn original(&mut self, path: &Path) -> io::Result<&Original> {
        if !self.originals.contains_key(path) {
            let original = snapshot(path)?;
            self.originals.insert(path.to_path_buf(), original);
        }
        Ok(&self.originals[path])
    }

    fn has_live_children(&self, path: &Path) -> bool {
        self.entries
            .iter()
            .any(|(p, e)| matches!(e, Entry::File { .. }) && p != path && p.starts_with(path))
    }

    fn current(&mut self, path: &Path) -> io::Result<Current> {
        if self.has_live_children(path) {
            return Ok(Current::Dir);
        }
        match self.entries.get(path) {
            Some(Entry::File { bytes, perms }) => {
                return Ok(Current::File {
                    bytes: Ok(bytes.clone()),
                    perms: perms.clone(),
                });
            }
            Some(Entry::Gone) => return Ok(Current::Absent),
            None => {}
        }
        Ok(match self.original(path)? {
            Original::Absent => Current::Absent,
            Original::Dir => Current::Dir,
            Original::Special => Current::Special,
            Original::File { bytes, perms } => Current::File {
                bytes: match bytes {
                    Some(b) => Ok(b.clone()),
                    None => read_regular(path),
                },
                perms: Some(perms.clone()),
            },
            // A symlink at a follow-resolved path only survives a failed resolution; read
            // through it so the error is the kernel's.
            Original::Symlink(_) => Current::File {
                bytes: read_regular(path),
                perms: None,
            },
        })
    }

    fn set(&mut self, path: &Path, entry: Entry) {
        self.entries.insert(path.to_path_buf(), entry);
    }
}

fn verify_error(msg: impl std::fmt::Display) -> ToolError {
    ToolError::invalid(format!("{VERIFY_PREFIX}{msg}"))
}

fn is_a_directory() -> io::Error {
    io::Error::from_raw_os_error(EISDIR)
}

fn not_regular() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, "not a regular file")
}

/// Reads a regular file (following symlinks); a directory or a special file is an error, and a
/// FIFO is never opened.
fn read_regular(path: &Path) -> io::Result<Vec<u8>> {
    let path = &*fs_path(path);
    let meta = fs::metadata(path)?;
    if meta.is_dir() {
        return Err(is_a_directory());
    }
    if !meta.is_file() {
        return Err(not_regular());
    }
    fs::read(path)
}

fn unified_diff(old: &[u8], new: &[u8]) -> String {
    let old = String::from_utf8_lossy(old);
    let new = String::from_utf8_lossy(new);
    similar::TextDiff::from_lines(old.as_ref(), new.as_ref())
        .unified_diff()
        .context_radius(1)
        .to_string()
}

/// Verifies every hunk in order over the virtual view. On success nothing has been written and
/// the plan holds every operation; on failure the error is the exact model text.
/// `diffs`: compute each change's unified diff (the typed result shows it; the model text does
/// not, and on a large file the diff costs more than applying the patch).
pub fn verify(patch: &Patch, ctx: &PatchContext, diffs: bool) -> Result<Plan, ToolError> {
    let unified_diff = |old: &[u8], new: &[u8]| {
        if diffs {
            unified_diff(old, new)
        } else {
            String::new()
        }
    };
    let mut view = View::default();
    let mut ops = Vec::new();
    let mut changes = Vec::new();
    let mut targets = Vec::new();
    for hunk in &patch.hunks {
        let abs = resolve_path(&ctx.cwd, hunk.path());
        match hunk {
            Hunk::Add { path, contents } => {
                let resolved = resolve(&abs, true).ok();
                let key = resolved.clone().unwrap_or_else(|| abs.clone());
                targets.push((resolved, abs.clone()));
                let current = view
                    .current(&key)
                    .map_err(|e| verify_error(format!("Failed to read {}: {e}", abs.display())))?;
                let (old, perms, overwritten) = match current {
                    Current::Dir => {
                        return Err(verify_error(format!(
                            "Failed to write file {}: {}",
                            abs.display(),
                            is_a_directory()
                        )));
                    }
                    Current::Special => {
                        return Err(verify_error(format!(
                            "Failed to write file {}: {}",
                            abs.display(),
                            not_regular()
                        )));
                    }
                    Current::Absent => (Vec::new(), None, false),
                    Current::File { bytes, perms } => (bytes.unwrap_or_default(), perms, true),
                };
                let content = contents.as_bytes().to_vec();
                changes.push(FileChange {
                    path: abs.clone(),
                    spelled: path.clone(),
                    kind: FileChangeKind::Added,
                    unified_diff: unified_diff(&old, &content),
                    overwritten,
                });
                view.set(
                    &key,
                    Entry::File {
                        bytes: content.clone(),
                        perms: perms.clone(),
                    },
                );
                ops.push(Op::Write {
                    target: key,
                    display: abs,
                    content,
                    perms,
                });
            }
            Hunk::Delete { path } => {
                let read_error =
                    |e: io::Error| verify_error(format!("Failed to read {}: {e}", abs.display()));
                let entry = resolve(&abs, false).map_err(read_error)?;
                targets.push((Some(entry.clone()), abs.clone()));
                let old = match view.current(&entry).map_err(read_error)? {
                    Current::Absent => {
                        return Err(read_error(io::Error::from_raw_os_error(ENOENT)));
                    }
                    Current::Dir => return Err(read_error(is_a_directory())),
                    Current::Special => return Err(read_error(not_regular())),
                    Current::File { bytes, .. } => bytes.map_err(read_error)?,
                };
                changes.push(FileChange {
                    path: abs.clone(),
                    spelled: path.clone(),
                    kind: FileChangeKind::Deleted,
                    unified_diff: unified_diff(&old, b""),
                    overwritten: false,
                });
                view.set(&entry, Entry::Gone);
                ops.push(Op::Remove {
                    entry,
                    display: abs,
                    kind: RemoveKind::Delete,
                });
            }
            Hunk::Update {
                path,
                move_to,
                chunks,
            } => {
                let read_error = |e: io::Error| {
                    verify_error(format!(
                        "Failed to read file to update {}: {e}",
                        abs.display()
                    ))
                };
                let source = resolve(&abs, true).map_err(read_error)?;
                let (old, perms) = match view.current(&source).map_err(read_error)? {
                    Current::Absent => {
                        return Err(read_error(io::Error::from_raw_os_error(ENOENT)));
                    }
                    Current::Dir => return Err(read_error(is_a_directory())),
                    Current::Special => return Err(read_error(not_regular())),
                    Current::File { bytes, perms } => (bytes.map_err(read_error)?, perms),
                };
                let text = std::str::from_utf8(&old).map_err(|_| {
                    read_error(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "stream did not contain valid UTF-8",
                    ))
                })?;
                let new = compute_update(text, chunks, &abs.display().to_string())
                    .map_err(verify_error)?
                    .into_bytes();
                let diff = unified_diff(&old, &new);
                let Some(dest_spelled) = move_to else {
                    targets.push((Some(source.clone()), abs.clone()));
                    changes.push(FileChange {
                        path: abs.clone(),
                        spelled: path.clone(),
                        kind: FileChangeKind::Modified,
                        unified_diff: diff,
                        overwritten: false,
                    });
                    view.set(
                        &source,
                        Entry::File {
                            bytes: new.clone(),
                            perms: perms.clone(),
                        },
                    );
                    ops.push(Op::Write {
                        target: source,
                        display: abs,
                        content: new,
                        perms,
                    });
                    continue;
                };
                let dest_abs = resolve_path(&ctx.cwd, dest_spelled);
                let dest = resolve(&dest_abs, true).ok();
                let dest_key = dest.clone().unwrap_or_else(|| dest_abs.clone());
                targets.push((dest.clone(), dest_abs.clone()));
                if dest.as_ref() == Some(&source) {
                    // The destination is the source: an in-place update.
                    changes.push(FileChange {
                        path: dest_abs.clone(),
                        spelled: dest_spelled.clone(),
                        kind: FileChangeKind::Modified,
                        unified_diff: diff,
                        overwritten: false,
                    });
                    view.set(
                        &source,
                        Entry::File {
                            bytes: new.clone(),
                            perms: perms.clone(),
                        },
                    );
                    ops.push(Op::Write {
                        target: source,
                        display: dest_abs,
                        content: new,
                        perms,
                    });
                    continue;
                }
                let source_entry = resolve(&abs, false).ok();
                targets.push((source_entry.clone(), abs.clone()));
                let source_entry = source_entry.unwrap_or_else(|| abs.clone());
                let overwritten = match view.current(&dest_key).map_err(|e| {
                    verify_error(format!("Failed to read {}: {e}", dest_abs.display()))
                })? {
                    Current::Dir => {
                        return Err(verify_error(format!(
                            "Failed to write file {}: {}",
                            dest_abs.display(),
                            is_a_directory()
                        )));
                    }
                    Current::Special => {
                        return Err(verify_error(format!(
                            "Failed to write file {}: {}",
                            dest_abs.display(),
                            not_regular()
                        )));
                    }
                    Current::Absent => false,
                    Current::File { .. } => true,
                };
                changes.push(FileChange {
                    path: dest_abs.clone(),
                    spelled: dest_spelled.clone(),
                    kind: FileChangeKind::Moved { from: abs.clone() },
                    unified_diff: diff,
                    overwritten,
                });
                view.set(
                    &dest_key,
                    Entry::File {
                        bytes: new.clone(),
                        perms: perms.clone(),
                    },
                );
                view.set(&source_entry, Entry::Gone);
                ops.push(Op::Write {
                    target: dest_key,
                    display: dest_abs,
                    content: new,
                    perms,
                });
                ops.push(Op::Remove {
                    entry: source_entry,
                    display: abs,
                    kind: RemoveKind::MoveSource,
                });
            }
        }
    }
    Ok(Plan {
        ops,
        changes,
        targets,
        originals: view.originals,
    })
}

/// A failed commit: the error kind and the output text (every line ends with `\n`).
#[derive(Debug)]
pub struct CommitError {
    pub kind: ErrorKind,
    pub text: String,
}

/// Where the test-only fault hook (`super::fault`) is consulted during the commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    /// Before creating one missing parent directory.
    CreateDir,
    /// After the temporary file is written, before it is renamed over the target.
    Write,
    /// Before removing an entry.
    Remove,
    /// Before restoring one file during rollback.
    Rollback,
}

#[cfg(test)]
fn inject(point: Point, path: &Path) -> io::Result<()> {
    super::fault::check(point, path)
}

#[cfg(not(test))]
#[inline(always)]
fn inject(_point: Point, _path: &Path) -> io::Result<()> {
    Ok(())
}

/// Whether `name` is one of [`write_atomic`]'s temporary names: `.corral-patch-`, six letters or
/// digits (tempfile's), `.tmp`.
fn is_patch_temp(name: &std::ffi::OsStr) -> bool {
    use std::os::unix::ffi::OsStrExt;
    name.as_bytes()
        .strip_prefix(TEMP_PREFIX.as_bytes())
        .and_then(|r| r.strip_suffix(TEMP_SUFFIX.as_bytes()))
        .is_some_and(|r| r.len() == 6 && r.iter().all(u8::is_ascii_alphanumeric))
}

/// Locks a temporary file as in use (`fsx::lock_staging`); where the filesystem keeps no locks
/// it goes unlocked, and no later commit can lock it to take it for one left behind.
fn lock_temp(file: &fs::File) -> io::Result<()> {
    match lock_staging(file.as_fd()) {
        Err(e) if !locks_unsupported(e) => Err(e.into()),
        _ => Ok(()),
    }
}

/// Removes the temporary files a commit killed between its link and its rename left in the
/// directories this plan writes to: theirs are unlocked (their writer died), a live commit's
/// are locked. Each directory once.
fn remove_stale_temps(plan: &Plan) {
    let mut dirs: Vec<&Path> = plan
        .ops
        .iter()
        .filter_map(|op| match op {
            Op::Write { target, .. } => target.parent(),
            Op::Remove { .. } => None,
        })
        .collect();
    dirs.sort();
    dirs.dedup();
    for dir in dirs {
        // A directory the plan is about to create has nothing in it yet. O_DIRECTORY: never
        // blocks on a FIFO put in its place.
        let flags = nix::fcntl::OFlag::O_RDONLY
            | nix::fcntl::OFlag::O_DIRECTORY
            | nix::fcntl::OFlag::O_NONBLOCK
            | nix::fcntl::OFlag::O_CLOEXEC;
        if let Ok(fd) = nix::fcntl::open(&*fs_path(dir), flags, nix::sys::stat::Mode::empty()) {
            remove_unlocked(fd.as_fd(), is_patch_temp, None);
        }
    }
}

/// Writes `content` to `target` atomically: a reader (or a crash) sees the old file or the new
/// one, never part of either. `perms` are set on the new file; `None` gives `0666 & ~umask`.
///
/// The content goes to an unnamed file (`O_TMPFILE`) in the target's directory, is synced, then
/// linked under a temporary name and renamed over the target at once. A worker killed while it
/// writes therefore leaves nothing behind: only a kill in the instant between the link and the
/// rename can leave a `.corral-patch-*.tmp` file, and the file is locked before it is linked,
/// so the next commit writing in that directory knows it was left behind and removes it. Where the filesystem has no `O_TMPFILE` (or
/// there is no `/proc` to name the file by) a named temporary file is written instead. Either
/// temporary file is removed on any failure.
fn write_atomic(
    target: &Path,
    content: &[u8],
    perms: Option<&Permissions>,
    point: Point,
) -> io::Result<()> {
    let dir = fs_path(target.parent().unwrap_or(Path::new("/")));
    let file = match open_unnamed(&dir) {
        Ok(file) => file,
        Err(e) if no_unnamed_files(&e) => return write_named(target, content, perms, point),
        Err(e) => return Err(e),
    };
    fill(&file, content, perms)?;
    // Before it has a name: a later patch must see it in use while it is linked.
    lock_temp(&file)?;
    inject(point, target)?;
    let named = match temp_builder().make_in(&*dir, |name| link_unnamed(&file, name)) {
        Ok(named) => named,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            // No /proc in this mount namespace: the unnamed file cannot be given a name.
            return write_named(target, content, perms, point);
        }
        Err(e) => return Err(e),
    };
    named.persist(&*fs_path(target)).map_err(|e| e.error)?;
    Ok(())
}

/// The fallback of [`write_atomic`]: a named temporary file, written, synced and renamed.
fn write_named(
    target: &Path,
    content: &[u8],
    perms: Option<&Permissions>,
    point: Point,
) -> io::Result<()> {
    let dir = fs_path(target.parent().unwrap_or(Path::new("/")));
    let mut builder = temp_builder();
    if perms.is_none() {
        builder.permissions(Permissions::from_mode(0o666));
    }
    let tmp = builder.tempfile_in(&*dir)?;
    lock_temp(tmp.as_file())?;
    fill(tmp.as_file(), content, perms)?;
    inject(point, target)?;
    tmp.persist(&*fs_path(target)).map_err(|e| e.error)?;
    Ok(())
}

fn temp_builder() -> tempfile::Builder<'static, 'static> {
    let mut builder = tempfile::Builder::new();
    builder.prefix(TEMP_PREFIX).suffix(TEMP_SUFFIX);
    builder
}

/// An unnamed regular file in `dir`, `0666 & ~umask` like a created file.
fn open_unnamed(dir: &Path) -> io::Result<fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    fs::OpenOptions::new()
        .write(true)
        .mode(0o666)
        .custom_flags(libc::O_TMPFILE)
        .open(dir)
}

/// The filesystem (or kernel) cannot make unnamed files: `EOPNOTSUPP` from the filesystem,
/// `EISDIR` or `EINVAL` from a kernel that predates `O_TMPFILE`.
fn no_unnamed_files(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL)
    )
}

/// Writes the whole content, sets the mode and syncs.
fn fill(mut file: &fs::File, content: &[u8], perms: Option<&Permissions>) -> io::Result<()> {
    file.write_all(content)?;
    if let Some(p) = perms {
        // The rewritten file keeps its mode but never a set-id bit: a sandbox refuses to set
        // one (spec/sandbox.md §8.6 H3), and new content must not inherit the old privilege.
        file.set_permissions(Permissions::from_mode(p.mode() & 0o1777))?;
    }
    file.sync_all()
}

/// Gives the unnamed `file` the name `name` (through `/proc/self/fd`: linking a descriptor
/// directly needs `CAP_DAC_READ_SEARCH`). `EEXIST` lets the caller pick another name.
fn link_unnamed(file: &fs::File, name: &Path) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let by_fd = format!("/proc/self/fd/{}", file.as_raw_fd());
    nix::unistd::linkat(
        nix::fcntl::AT_FDCWD,
        by_fd.as_str(),
        nix::fcntl::AT_FDCWD,
        name,
        nix::fcntl::AtFlags::AT_SYMLINK_FOLLOW,
    )
    .map_err(io::Error::from)
}

/// Creates the missing ancestors of `target`, outermost first, recording each one created.
fn create_parents(target: &Path, created: &mut Vec<PathBuf>) -> io::Result<()> {
    let mut missing = Vec::new();
    let mut dir = target.parent();
    while let Some(d) = dir {
        match fs::symlink_metadata(fs_path(d)) {
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::NotFound => missing.push(d.to_path_buf()),
            Err(e) => return Err(e),
        }
        dir = d.parent();
    }
    for d in missing.into_iter().rev() {
        inject(Point::CreateDir, &d)?;
        fs::create_dir(fs_path(&d))?;
        created.push(d);
    }
    Ok(())
}

fn remove_if_present(path: &Path) -> io::Result<()> {
    match fs::remove_file(fs_path(path)) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// Puts `path` back to `original`.
fn restore(path: &Path, original: &Original) -> io::Result<()> {
    inject(Point::Rollback, path)?;
    match original {
        Original::Absent => remove_if_present(path),
        Original::Dir | Original::Special => Ok(()),
        Original::Symlink(target) => {
            remove_if_present(path)?;
            std::os::unix::fs::symlink(target, fs_path(path))
        }
        Original::File { bytes, perms } => match bytes {
            Some(bytes) => write_atomic(path, bytes, Some(perms), Point::Rollback),
            None => Err(io::Error::other("original content could not be read")),
        },
    }
}

/// Performs the plan. On an I/O error every change already made is undone in reverse order and
/// the error text is returned.
pub fn commit(plan: &Plan) -> Result<(), CommitError> {
    // Paths whose originals are needed to undo; a write over an unreadable file cannot be undone,
    // so it is refused before anything changes.
    let mut view = View {
        entries: HashMap::new(),
        originals: plan.originals.clone(),
    };
    for op in &plan.ops {
        let (path, display) = match op {
            Op::Write {
                target, display, ..
            } => (target, display),
            Op::Remove { entry, display, .. } => (entry, display),
        };
        let original = view.original(path).map_err(|e| fail_before(display, &e))?;
        if let Original::File { bytes: None, .. } = original {
            let e = read_regular(path)
                .err()
                .unwrap_or_else(|| io::Error::other("unreadable"));
            return Err(fail_before(display, &e));
        }
    }

    if leftovers_possible() {
        remove_stale_temps(plan);
    }
    let mut done: Vec<(&Path, &Path)> = Vec::new();
    let mut created = Vec::new();
    let mut failure = None;
    for op in &plan.ops {
        let result = match op {
            Op::Write {
                target,
                display,
                content,
                perms,
            } => create_parents(target, &mut created)
                .map_err(|e| {
                    let text = format!(
                        "Failed to create parent directories for {}: {e}",
                        display.display()
                    );
                    (kind_of_io(&e), text)
                })
                .and_then(|()| {
                    write_atomic(target, content, perms.as_ref(), Point::Write).map_err(|e| {
                        let text = format!("Failed to write file {}: {e}", display.display());
                        (kind_of_io(&e), text)
                    })
                })
                .map(|()| (target.as_path(), display.as_path())),
            Op::Remove {
                entry,
                display,
                kind,
            } => inject(Point::Remove, entry)
                .and_then(|()| fs::remove_file(fs_path(entry)))
                .map_err(|e| {
                    let text = match kind {
                        RemoveKind::Delete => {
                            format!("Failed to delete file {}: {e}", display.display())
                        }
                        RemoveKind::MoveSource => {
                            format!("Failed to remove original {}: {e}", display.display())
                        }
                    };
                    (kind_of_io(&e), text)
                })
                .map(|()| (entry.as_path(), display.as_path())),
        };
        match result {
            Ok((path, display)) => {
                if !done.iter().any(|(p, _)| *p == path) {
                    done.push((path, display));
                }
            }
            Err(f) => {
                failure = Some(f);
                break;
            }
        }
    }
    let Some((kind, first_line)) = failure else {
        return Ok(());
    };

    let mut text = format!("{first_line}\n");
    let mut rollback_failed = false;
    for (path, display) in done.iter().rev() {
        let original = &view.originals[*path];
        if let Err(e) = restore(path, original) {
            rollback_failed = true;
            text.push_str(&format!("Rollback failed for {}: {e}\n", display.display()));
        }
    }
    for dir in created.iter().rev() {
        let _ = fs::remove_dir(fs_path(dir));
    }
    if !rollback_failed {
        text.push_str("All changes made by this patch were rolled back.\n");
    }
    Err(CommitError { kind, text })
}

fn fail_before(display: &Path, e: &io::Error) -> CommitError {
    CommitError {
        kind: kind_of_io(e),
        text: format!(
            "Failed to write file {}: {e}\nAll changes made by this patch were rolled back.\n",
            display.display()
        ),
    }
}
