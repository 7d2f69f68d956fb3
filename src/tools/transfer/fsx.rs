//! Descriptor-relative filesystem steps shared by `receive` and `send`: opening a directory
//! without following a symlink, listing one, staging names, removing a tree, and the atomic
//! renames. Everything here acts on `(directory descriptor, name)`, never on a path.

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::{FchmodatFlags, FileStat, Mode, SFlag, fchmod, fchmodat, fstatat};
use nix::unistd::{UnlinkatFlags, unlinkat};
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};

/// How a directory is opened: never through a symlink.
pub const DIR_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

/// The longest name a Linux filesystem takes.
const NAME_MAX: usize = 255;

/// The type of a directory entry, as `lstat` sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Node {
    File,
    Directory,
    Symlink,
    /// A FIFO, socket or device, named.
    Other(&'static str),
}

pub fn node_of(st: &FileStat) -> Node {
    match SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) {
        SFlag::S_IFREG => Node::File,
        SFlag::S_IFDIR => Node::Directory,
        SFlag::S_IFLNK => Node::Symlink,
        SFlag::S_IFIFO => Node::Other("a FIFO"),
        SFlag::S_IFSOCK => Node::Other("a socket"),
        SFlag::S_IFCHR => Node::Other("a character device"),
        SFlag::S_IFBLK => Node::Other("a block device"),
        _ => Node::Other("of an unknown type"),
    }
}

/// Opens directory `name` in `dir`; a symlink there is `ELOOP`, anything else `ENOTDIR`.
pub fn open_dir(dir: impl AsFd, name: &OsStr) -> nix::Result<OwnedFd> {
    openat(dir, name, DIR_FLAGS, Mode::empty())
}

/// `lstat` of `name` in `dir`.
pub fn lstat_at(dir: impl AsFd, name: &OsStr) -> nix::Result<FileStat> {
    fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)
}

/// The names in a directory (without `.` and `..`), sorted bytewise.
pub fn names(dir: BorrowedFd<'_>) -> nix::Result<Vec<OsString>> {
    // A fresh open file description: reading it moves no offset another reader shares.
    let fd = openat(dir, ".", DIR_FLAGS, Mode::empty())?;
    let mut listing = nix::dir::Dir::from_fd(fd)?;
    let mut out = Vec::new();
    for entry in listing.iter() {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            out.push(OsString::from_vec(name.to_vec()));
        }
    }
    out.sort();
    Ok(out)
}

/// A hidden name beside `name` for staging a transfer: `.NAME.corral-TAG-RANDOM`, with NAME cut
/// so the whole stays a valid name. Never a protected name (`.git`, ...): it always carries the
/// `.corral-` part.
pub fn staging_name(name: &OsStr, tag: &str) -> OsString {
    let mut random = [0u8; 8];
    if getrandom::fill(&mut random).is_err() {
        // Uniqueness is what matters (creation is exclusive and retried); the clock will do.
        let n = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        random = n.to_le_bytes();
    }
    let suffix: String = format!(".corral-{tag}-")
        + &random
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>();
    let room = NAME_MAX - 1 - suffix.len();
    let name = name.as_bytes();
    let mut out = Vec::with_capacity(NAME_MAX);
    out.push(b'.');
    out.extend_from_slice(&name[..name.len().min(room)]);
    out.extend_from_slice(suffix.as_bytes());
    OsString::from_vec(out)
}

/// The tag of the staging a transfer receives into. Only these are ever removed as left
/// behind: a replaced tree moved aside (`old`, where the filesystem cannot swap) may be the
/// only copy of the user's data when its writer died, so it stays for the user.
const UPLOAD_TAG: &str = "upload";

/// Whether `candidate` is a name [`staging_name`] makes for `name` with [`UPLOAD_TAG`]:
/// `.NAME.corral-upload-` (NAME cut as it cuts it) and 16 lowercase hex digits.
pub fn is_staging_of(name: &OsStr, candidate: &OsStr) -> bool {
    let (name, candidate) = (name.as_bytes(), candidate.as_bytes());
    let marker_len = ".corral-".len() + UPLOAD_TAG.len() + 1;
    let room = NAME_MAX - 1 - marker_len - 16;
    let cut = &name[..name.len().min(room)];
    let Some(rest) = candidate
        .strip_prefix(b".")
        .and_then(|r| r.strip_prefix(cut))
        .and_then(|r| r.strip_prefix(b".corral-"))
        .and_then(|r| r.strip_prefix(UPLOAD_TAG.as_bytes()))
        .and_then(|r| r.strip_prefix(b"-"))
    else {
        return false;
    };
    rest.len() == 16 && rest.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Whether this process should look for what a dead writer left before it writes (see
/// [`set_leftovers_possible`]). Off by default: the look lists a whole directory, which a
/// write into a large one should not pay for nothing.
static LEFTOVERS_POSSIBLE: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Turns on the look for stagings and patch temporaries a dead writer left: in a worker that
/// replaces one that died (the daemon says so in its spec), and in the CLI's one-shot copy.
pub fn set_leftovers_possible(on: bool) {
    LEFTOVERS_POSSIBLE.store(on, std::sync::atomic::Ordering::Relaxed);
}

pub fn leftovers_possible() -> bool {
    LEFTOVERS_POSSIBLE.load(std::sync::atomic::Ordering::Relaxed)
}

/// Takes the lock that marks a staging as in use: an exclusive `flock` on an open descriptor of
/// it, held until the transfer that made it ends — or the kernel drops it when that process
/// dies. `EWOULDBLOCK` when another process holds it.
pub fn lock_staging(fd: BorrowedFd<'_>) -> nix::Result<()> {
    // SAFETY: flock on a descriptor the caller holds open.
    Errno::result(unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }).map(drop)
}

/// Whether a [`lock_staging`] error means this filesystem keeps no such locks. A writer goes on
/// without one: its staging then cannot be locked by a remover either, so it is never taken for
/// one left behind.
pub fn locks_unsupported(e: Errno) -> bool {
    matches!(e, Errno::ENOLCK | Errno::EOPNOTSUPP | Errno::EINVAL)
}

/// How old a staged symlink must be to count as left behind: a symlink cannot be locked, and
/// a live transfer makes one only the moment before renaming it into place.
const STALE_SYMLINK_SECS: i64 = 60;

/// Removes the stagings of `name` in `dir` that a transfer left behind when its process died
/// (a worker killed mid-upload). Returns how many were removed.
pub fn remove_stale_stagings(dir: BorrowedFd<'_>, name: &OsStr) -> usize {
    remove_unlocked(dir, |c| is_staging_of(name, c), Some(STALE_SYMLINK_SECS))
}

/// Removes the entries of `dir` that `pick` names as stagings and whose lock
/// ([`lock_staging`]) nobody holds: their writer died. A staging in use keeps its lock and is
/// left alone, and so is anything that only looks like one but cannot be opened and locked (a
/// FIFO, a file or directory without read or write permission). A symlink, which cannot be
/// locked, is removed only when older than `symlinks_after` seconds (`None`: never). Never
/// follows a symlink. Shared with apply_patch's temporary files. Returns how many were removed.
///
/// Only in a directory of this process's user that no one else may write to, and only entries
/// of that user: a staging is always its writer's, and anyone else able to name a thing there
/// (a tree it could not remove itself, renamed to a staging's name) must not get it removed by
/// a more privileged remover.
pub fn remove_unlocked(
    dir: BorrowedFd<'_>,
    pick: impl Fn(&OsStr) -> bool,
    symlinks_after: Option<i64>,
) -> usize {
    let me = nix::unistd::geteuid().as_raw();
    match nix::sys::stat::fstat(dir) {
        Ok(st) if st.st_uid == me && st.st_mode & 0o022 == 0 => {}
        _ => return 0,
    }
    let Ok(fd) = openat(dir, ".", DIR_FLAGS, Mode::empty()) else {
        return 0;
    };
    let Ok(mut listing) = nix::dir::Dir::from_fd(fd) else {
        return 0;
    };
    let candidates: Vec<OsString> = listing
        .iter()
        .filter_map(Result::ok)
        .filter(|e| pick(OsStr::from_bytes(e.file_name().to_bytes())))
        .map(|e| OsStr::from_bytes(e.file_name().to_bytes()).to_os_string())
        .collect();
    candidates
        .iter()
        .filter(|c| remove_if_unlocked(dir, c, symlinks_after).unwrap_or(false))
        .count()
}

/// Removes one staging if nobody holds its lock; `Ok(false)` if it is in use or not a staging
/// this can judge.
fn remove_if_unlocked(
    dir: BorrowedFd<'_>,
    candidate: &OsStr,
    symlinks_after: Option<i64>,
) -> nix::Result<bool> {
    let seen = lstat_at(dir, candidate)?;
    if seen.st_uid != nix::unistd::geteuid().as_raw() {
        return Ok(false);
    }
    match node_of(&seen) {
        Node::Symlink => {
            let Some(after) = symlinks_after else {
                return Ok(false);
            };
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64);
            if now - seen.st_ctime < after {
                return Ok(false);
            }
            unlinkat(dir, candidate, UnlinkatFlags::NoRemoveDir)?;
            Ok(true)
        }
        Node::File | Node::Directory => {
            // O_NONBLOCK: never wait on whatever is there now; O_NOFOLLOW: never leave `dir`.
            // Write-only for a file its writer made write-only (no data is touched either way).
            let open = |access: OFlag| {
                openat(
                    dir,
                    candidate,
                    access | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
                    Mode::empty(),
                )
            };
            let fd = match open(OFlag::O_RDONLY) {
                Err(Errno::EACCES) if node_of(&seen) == Node::File => open(OFlag::O_WRONLY)?,
                other => other?,
            };
            match lock_staging(fd.as_fd()) {
                Ok(()) => {}
                Err(Errno::EWOULDBLOCK) => return Ok(false),
                Err(e) => return Err(e),
            }
            // Locked: no live writer holds it. Remove it only if the name still is the thing
            // that was locked.
            let locked = nix::sys::stat::fstat(&fd)?;
            let now = lstat_at(dir, candidate)?;
            if (now.st_dev, now.st_ino) != (locked.st_dev, locked.st_ino) {
                return Ok(false);
            }
            remove_tree(dir, candidate)?;
            Ok(true)
        }
        Node::Other(_) => Ok(false),
    }
}

/// Renames `from` to `to` in `dir` unless `to` exists (`EEXIST`). Filesystems without
/// `RENAME_NOREPLACE` get `link` + `unlink` for a non-directory (as exclusive) and a plain
/// rename for a directory (which can only replace an empty one).
pub fn rename_noreplace(
    dir: BorrowedFd<'_>,
    from: &OsStr,
    to: &OsStr,
    is_dir: bool,
) -> nix::Result<()> {
    match renameat2(dir, from, to, libc::RENAME_NOREPLACE) {
        Err(Errno::EINVAL) if !is_dir => {
            nix::unistd::linkat(dir, from, dir, to, AtFlags::empty())?;
            unlinkat(dir, from, UnlinkatFlags::NoRemoveDir)
        }
        Err(Errno::EINVAL) => nix::fcntl::renameat(dir, from, dir, to),
        other => other,
    }
}

/// `renameat2(2)` within one directory. The raw syscall: musl (the static build) has no wrapper,
/// so neither has nix there.
fn renameat2(
    dir: BorrowedFd<'_>,
    from: &OsStr,
    to: &OsStr,
    flags: libc::c_uint,
) -> nix::Result<()> {
    let from = std::ffi::CString::new(from.as_bytes()).map_err(|_| Errno::EINVAL)?;
    let to = std::ffi::CString::new(to.as_bytes()).map_err(|_| Errno::EINVAL)?;
    // SAFETY: a valid directory descriptor and two NUL-terminated names that outlive the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            dir.as_raw_fd(),
            from.as_ptr(),
            dir.as_raw_fd(),
            to.as_ptr(),
            flags,
        )
    };
    Errno::result(r).map(drop)
}

/// Swaps `a` and `b` in `dir` atomically. `None` when the filesystem cannot (`EINVAL`).
pub fn exchange(dir: BorrowedFd<'_>, a: &OsStr, b: &OsStr) -> Option<nix::Result<()>> {
    match renameat2(dir, a, b, libc::RENAME_EXCHANGE) {
        Err(Errno::EINVAL) => None,
        other => Some(other),
    }
}

/// One directory being emptied by [`remove_tree`].
struct Level {
    fd: OwnedFd,
    /// Its entries not yet removed.
    left: Vec<OsString>,
    /// Its name in its parent.
    name: OsString,
}

/// Opens directory `name` in `parent` for emptying: with `make_writable`, made searchable and
/// writable by its owner first if need be (a 0555 or 0000 directory of the tree).
fn open_level(parent: BorrowedFd<'_>, name: &OsStr, make_writable: bool) -> nix::Result<Level> {
    let fd = match open_dir(parent, name) {
        Err(Errno::EACCES) if make_writable => {
            fchmodat(
                parent,
                name,
                Mode::from_bits_truncate(0o700),
                FchmodatFlags::FollowSymlink,
            )?;
            open_dir(parent, name)?
        }
        other => other?,
    };
    // Without write and search permission its entries cannot be unlinked.
    if make_writable {
        fchmod(&fd, Mode::from_bits_truncate(0o700))?;
    }
    Ok(Level {
        left: names(fd.as_fd())?,
        fd,
        name: name.to_os_string(),
    })
}

/// Removes `name` in `dir` and, for a directory, everything below it, never following a
/// symlink. Iterative, so a deep tree costs descriptors (one per level), not stack. A directory
/// of the tree without write or search permission is made writable by its owner first (what
/// this removes is a staging or a replaced tree, all of it the writer's own).
pub fn remove_tree(dir: BorrowedFd<'_>, name: &OsStr) -> nix::Result<()> {
    remove_tree_as(dir, name, true)
}

/// [`remove_tree`] as `rm -r` does it: no permission is changed, so a directory of the tree
/// its owner may not write (or search) fails the removal with `EACCES`, leaving the rest.
pub fn remove_tree_plain(dir: BorrowedFd<'_>, name: &OsStr) -> nix::Result<()> {
    remove_tree_as(dir, name, false)
}

fn remove_tree_as(dir: BorrowedFd<'_>, name: &OsStr, make_writable: bool) -> nix::Result<()> {
    match unlinkat(dir, name, UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => return Ok(()),
        // Linux answers EISDIR for a directory (some filesystems EPERM).
        Err(Errno::EISDIR | Errno::EPERM) => {}
        Err(e) => return Err(e),
    }
    let mut stack = vec![open_level(dir, name, make_writable)?];
    loop {
        let Some(top) = stack.last_mut() else {
            return Ok(());
        };
        match top.left.pop() {
            Some(child) => match unlinkat(&top.fd, child.as_os_str(), UnlinkatFlags::NoRemoveDir) {
                Ok(()) | Err(Errno::ENOENT) => {}
                Err(Errno::EISDIR | Errno::EPERM) => {
                    let level = open_level(top.fd.as_fd(), &child, make_writable)?;
                    stack.push(level);
                }
                Err(e) => return Err(e),
            },
            None => {
                let done = stack.pop().expect("the loop saw a top level");
                let parent = stack.last().map_or(dir, |l| l.fd.as_fd());
                match unlinkat(parent, done.name.as_os_str(), UnlinkatFlags::RemoveDir) {
                    Ok(()) | Err(Errno::ENOENT) => {}
                    Err(e) => return Err(e),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn staging_names_are_hidden_unique_and_short_enough() {
        let a = staging_name(OsStr::new("out.bin"), "upload");
        let b = staging_name(OsStr::new("out.bin"), "upload");
        assert_ne!(a, b);
        let a = a.to_str().unwrap();
        assert!(a.starts_with(".out.bin.corral-upload-"), "{a}");
        let long = "x".repeat(255);
        assert_eq!(
            staging_name(OsStr::new(&long), "upload").len(),
            NAME_MAX,
            "a long name is cut to fit"
        );
    }

    #[test]
    fn remove_tree_empties_locked_directories_and_never_follows_links() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("keep"), "x").unwrap();
        let t = dir.path().join("t");
        std::fs::create_dir_all(t.join("a/b")).unwrap();
        std::fs::write(t.join("a/b/f"), "1").unwrap();
        std::os::unix::fs::symlink(outside.path(), t.join("link")).unwrap();
        std::fs::set_permissions(t.join("a/b"), std::fs::Permissions::from_mode(0o555)).unwrap();
        std::fs::set_permissions(t.join("a"), std::fs::Permissions::from_mode(0o000)).unwrap();
        let fd = std::fs::File::open(dir.path()).unwrap();
        remove_tree(fd.as_fd(), OsStr::new("t")).unwrap();
        assert!(!t.exists());
        assert!(
            outside.path().join("keep").exists(),
            "the link was not followed"
        );
        // Already gone: fine.
        remove_tree(fd.as_fd(), OsStr::new("t")).unwrap();
    }
}
