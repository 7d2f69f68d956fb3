//! The protected-name guard's event source: one fanotify group that reports each new name in a
//! watched directory **with the process that made it** (spec/sandbox.md H18, H27).
//!
//! Why fanotify and not inotify: inotify says that a name appeared, not who made it, so the guard
//! could not tell a sandboxed command's `.git` from the empty mount point Codex's own sandbox (or
//! the user) creates in a shared `/tmp`, and took both away. A fanotify group made with
//! `CAP_SYS_ADMIN` reports the creator's pid, translated into the reader's PID namespace: the
//! worker is PID 1 of the sandbox's own namespace, so a pid is non-zero exactly when a process of
//! this sandbox made the name, and 0 when anything outside did. That is **attributed** mode.
//!
//! Without that privilege (a daemon that is not root) the group is an unprivileged one, whose
//! events carry no pid of other processes: every creation then counts as the sandbox's, as
//! before attribution existed (the guard says so in its layer report).

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;

/// What a watched directory reports: a new entry (made, hard-linked, or moved in), for files and
/// directories alike; a write to a file in it (so a write into a file a host process made there
/// is seen however soon it follows the creation); and the directory's own deletion.
const MARK_EVENTS: u64 = libc::FAN_CREATE
    | libc::FAN_MOVED_TO
    | libc::FAN_ONDIR
    | libc::FAN_MODIFY
    | libc::FAN_EVENT_ON_CHILD;
const SELF_EVENTS: u64 = libc::FAN_DELETE_SELF | libc::FAN_MOVE_SELF;

/// Identifies a directory in events: its filesystem id and file handle, as fanotify reports them.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DirKey(Vec<u8>);

/// One event read from the group.
#[derive(Debug)]
pub struct Event {
    /// The directory the event is about (`None` for a queue overflow).
    pub dir: Option<DirKey>,
    /// The entry's name in it (empty for the directory's own events).
    pub name: OsString,
    pub mask: u64,
    /// The process that made the entry, in the reader's PID namespace; 0 when it is outside it
    /// (or the group is unprivileged).
    pub pid: i32,
}

impl Event {
    pub fn overflowed(&self) -> bool {
        self.mask & libc::FAN_Q_OVERFLOW != 0
    }

    /// The watched directory itself was deleted or moved: its mark cannot be trusted any more.
    pub fn watch_lost(&self) -> bool {
        self.mask & SELF_EVENTS != 0
    }

    pub fn is_new_entry(&self) -> bool {
        self.mask & (libc::FAN_CREATE | libc::FAN_MOVED_TO) != 0 && !self.name.is_empty()
    }

    /// A file in a watched directory was written (`dir` and `name` are its parent and name).
    pub fn is_write(&self) -> bool {
        self.mask & libc::FAN_MODIFY != 0 && !self.name.is_empty()
    }
}

/// The fanotify group.
pub struct Notifier {
    fd: OwnedFd,
    attributed: bool,
}

impl Notifier {
    /// Makes the group: privileged (unlimited queue, creators reported) when the process holds
    /// `CAP_SYS_ADMIN` and is PID 1 of its own PID namespace, unprivileged otherwise. Call before
    /// seccomp, which denies `fanotify_init` to commands.
    pub fn new() -> io::Result<Self> {
        let base = libc::FAN_CLASS_NOTIF
            | libc::FAN_CLOEXEC
            | libc::FAN_NONBLOCK
            | libc::FAN_REPORT_DFID_NAME;
        let event_flags = (libc::O_RDONLY | libc::O_CLOEXEC) as libc::c_uint;
        // SAFETY: fanotify_init with flags only.
        let fd = unsafe { libc::fanotify_init(base | libc::FAN_UNLIMITED_QUEUE, event_flags) };
        let (fd, privileged) = if fd >= 0 {
            (fd, true)
        } else {
            // SAFETY: as above.
            let fd = unsafe { libc::fanotify_init(base, event_flags) };
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            (fd, false)
        };
        Ok(Self {
            // SAFETY: a fresh descriptor we own.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            // Outside a PID namespace of its own, a non-zero pid would not mean "this sandbox".
            attributed: privileged && std::process::id() == 1,
        })
    }

    /// Whether event pids say who made a name (see the module documentation).
    pub fn attributed(&self) -> bool {
        self.attributed
    }

    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// Watches the directory `dir` leads to now, without following a symlink; returns its key
    /// and `(st_dev, st_ino)`, or `None` when there is no such directory.
    pub fn watch(&self, dir: &Path) -> io::Result<Option<(DirKey, (u64, u64))>> {
        let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: open with a valid C string; the descriptor is owned below.
        let raw = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        if raw < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP) => Ok(None),
                _ => Err(e),
            };
        }
        // SAFETY: a fresh descriptor we own.
        let dirfd = unsafe { OwnedFd::from_raw_fd(raw) };
        // Everything below is about the opened directory, so a path swapped meanwhile cannot
        // make the mark, the key and the identity disagree.
        // SAFETY: marking the directory behind a valid descriptor (NULL path: the fd itself).
        let r = unsafe {
            libc::fanotify_mark(
                self.fd.as_raw_fd(),
                libc::FAN_MARK_ADD,
                MARK_EVENTS | SELF_EVENTS,
                dirfd.as_raw_fd(),
                std::ptr::null(),
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        let key = key_of(&dirfd)?;
        // SAFETY: fstat into a zeroed struct we own.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: valid descriptor and out pointer.
        if unsafe { libc::fstat(dirfd.as_raw_fd(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        #[allow(clippy::unnecessary_cast)] // st_dev's width differs between libcs.
        Ok(Some((key, (st.st_dev as u64, st.st_ino as u64))))
    }

    /// Reads every queued event; never blocks.
    pub fn read(&self) -> Vec<Event> {
        // u64-aligned, as the kernel lays out event metadata.
        let mut buf = vec![0u64; 1024];
        let mut out = Vec::new();
        loop {
            // SAFETY: reading into our buffer; the descriptor is non-blocking.
            let len =
                unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len() * 8) };
            if len <= 0 {
                break;
            }
            // SAFETY: the buffer is ours and `len` bytes of it were written.
            let bytes =
                unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), len as usize) };
            out.extend(parse(bytes));
        }
        out
    }
}

/// The key of the directory behind `dirfd`: the filesystem id then the file handle (type and
/// bytes), laid out as fanotify's DFID records carry them.
fn key_of(dirfd: &OwnedFd) -> io::Result<DirKey> {
    // SAFETY: fstatfs into a zeroed struct we own.
    let mut sfs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid descriptor and out pointer.
    if unsafe { libc::fstatfs(dirfd.as_raw_fd(), &mut sfs) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fsid_t is two 32-bit integers (`__kernel_fsid_t`), as in the event record.
    let fsid: [u8; 8] = unsafe { std::mem::transmute(sfs.f_fsid) };
    const MAX_HANDLE: usize = 128;
    #[repr(C)]
    struct Handle {
        bytes: u32,
        kind: i32,
        data: [u8; MAX_HANDLE],
    }
    let mut h = Handle {
        bytes: MAX_HANDLE as u32,
        kind: 0,
        data: [0; MAX_HANDLE],
    };
    let mut mount_id: libc::c_int = 0;
    let empty = c"";
    // SAFETY: valid descriptor, empty path with AT_EMPTY_PATH, a handle buffer of the size it
    // claims, and an out pointer for the mount id.
    let r = unsafe {
        libc::name_to_handle_at(
            dirfd.as_raw_fd(),
            empty.as_ptr(),
            (&mut h as *mut Handle).cast(),
            &mut mount_id,
            libc::AT_EMPTY_PATH,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    let n = (h.bytes as usize).min(MAX_HANDLE);
    let mut key = Vec::with_capacity(12 + n);
    key.extend_from_slice(&fsid);
    key.extend_from_slice(&h.kind.to_ne_bytes());
    key.extend_from_slice(&h.data[..n]);
    Ok(DirKey(key))
}

/// Splits a buffer of fanotify events (metadata, then info records) into [`Event`]s.
fn parse(buf: &[u8]) -> Vec<Event> {
    const META: usize = std::mem::size_of::<libc::fanotify_event_metadata>();
    let mut out = Vec::new();
    let mut off = 0;
    while off + META <= buf.len() {
        // SAFETY: the kernel wrote whole events; read_unaligned copes with any alignment.
        let m: libc::fanotify_event_metadata =
            unsafe { std::ptr::read_unaligned(buf[off..].as_ptr().cast()) };
        let len = m.event_len as usize;
        if len < META || off + len > buf.len() {
            break;
        }
        if m.fd >= 0 {
            // Not expected in FID mode; never leak one.
            // SAFETY: a descriptor the kernel handed us.
            drop(unsafe { OwnedFd::from_raw_fd(m.fd) });
        }
        let mut event = Event {
            dir: None,
            name: OsString::new(),
            mask: m.mask,
            pid: m.pid,
        };
        let mut info = off + m.metadata_len as usize;
        while info + 4 <= off + len {
            let kind = buf[info];
            let info_len = u16::from_ne_bytes([buf[info + 2], buf[info + 3]]) as usize;
            if info_len < 4 || info + info_len > off + len {
                break;
            }
            let record = &buf[info + 4..info + info_len];
            if matches!(
                kind,
                libc::FAN_EVENT_INFO_TYPE_DFID_NAME | libc::FAN_EVENT_INFO_TYPE_DFID
            ) && let Some((key, rest)) = split_fid(record)
            {
                event.dir = Some(key);
                if kind == libc::FAN_EVENT_INFO_TYPE_DFID_NAME {
                    let name = rest.split(|b| *b == 0).next().unwrap_or(&[]);
                    event.name = OsString::from_vec(name.to_vec());
                }
            }
            info += info_len;
        }
        out.push(event);
        off += len;
    }
    out
}

/// A DFID record's body (fsid, `struct file_handle`, then the name for DFID_NAME) as the
/// directory's key and what follows the handle.
fn split_fid(record: &[u8]) -> Option<(DirKey, &[u8])> {
    if record.len() < 16 {
        return None;
    }
    let fsid = &record[..8];
    let bytes = u32::from_ne_bytes(record[8..12].try_into().ok()?) as usize;
    let kind = &record[12..16];
    let end = 16usize.checked_add(bytes)?;
    let data = record.get(16..end)?;
    let mut key = Vec::with_capacity(12 + bytes);
    key.extend_from_slice(fsid);
    key.extend_from_slice(kind);
    key.extend_from_slice(data);
    Some((DirKey(key), &record[end..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("corral-notify-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_new_name_is_reported_with_its_directory_and_maker() {
        let d = scratch("new");
        let n = Notifier::new().unwrap();
        let (key, id) = n.watch(&d).unwrap().unwrap();
        let meta = std::fs::metadata(&d).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!(id, (meta.dev(), meta.ino()));
        std::fs::create_dir(d.join(".git")).unwrap();
        std::fs::write(d.join("HEAD"), b"").unwrap();
        std::fs::create_dir(d.join("moved")).unwrap();
        std::fs::rename(d.join("moved"), d.join(".codex")).unwrap();
        let events = n.read();
        let names: Vec<_> = events
            .iter()
            .filter(|e| e.is_new_entry() && e.dir.as_ref() == Some(&key))
            .map(|e| e.name.to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, [".git", "HEAD", "moved", ".codex"]);
        // This test is not PID 1 of a namespace: events of its own process carry its pid when
        // the group is privileged (root), and never a wrong one.
        for e in events.iter().filter(|e| e.is_new_entry()) {
            assert!(e.pid == 0 || e.pid == std::process::id() as i32, "{e:?}");
        }
        assert!(
            !n.attributed(),
            "only PID 1 of its own namespace attributes"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_missing_or_symlinked_directory_is_not_watched() {
        let d = scratch("missing");
        let n = Notifier::new().unwrap();
        assert!(n.watch(&d.join("nope")).unwrap().is_none());
        std::os::unix::fs::symlink(&d, d.join("link")).unwrap();
        assert!(n.watch(&d.join("link")).unwrap().is_none());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_deleted_directory_reports_its_watch_lost() {
        let d = scratch("deleted");
        let sub = d.join("sub");
        std::fs::create_dir(&sub).unwrap();
        let n = Notifier::new().unwrap();
        n.watch(&sub).unwrap().unwrap();
        std::fs::remove_dir(&sub).unwrap();
        assert!(n.read().iter().any(Event::watch_lost));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
