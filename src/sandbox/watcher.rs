//! The protected-name creation blocker (spec/sandbox.md §2.3 "Creation is blocked", §3.3).
//!
//! A read-only mount cannot be placed on a name that does not exist, and a placeholder created on
//! the host would be visible to host tools. So while a command runs, the worker watches each
//! writable root that lacked `.git`, `.codex` or `.agents` when the session opened, and deletes
//! any of those names the moment it appears, then once more in a final scan when the command
//! ends. The caller turns a non-empty removal list into a sandbox denial (the
//! [`blocked_message`] line, exit status forced to 1).
//!
//! It runs inside the confined worker: inotify is allowed by the seccomp filter, and the worker
//! can delete these names because they lie directly inside writable roots.

use crate::sandbox::policy::SandboxPolicy;
use std::collections::HashMap;
use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Backstop rescan interval, for anything inotify missed (queue overflow, a watch lost).
const RESCAN: Duration = Duration::from_millis(200);

/// Attempts to remove a name that is being refilled concurrently (`ENOTEMPTY` races).
const REMOVE_ATTEMPTS: usize = 20;

/// The output line for a blocked creation (spec/sandbox.md §9).
pub fn blocked_message(path: &Path) -> String {
    format!(
        "sandbox blocked creation of protected workspace metadata path {}",
        path.display()
    )
}

/// A running watcher; [`ProtectedNameWatcher::stop`] ends it and reports what was removed.
pub struct ProtectedNameWatcher {
    /// Full paths being guarded (those absent when the watcher started).
    guarded: Arc<Vec<PathBuf>>,
    removed: Arc<Mutex<Vec<PathBuf>>>,
    /// Writing to this pipe tells the thread to stop.
    stop_tx: Option<OwnedFd>,
    /// Signalled when the thread has finished its work. Closing an inotify descriptor that
    /// holds watches waits for an RCU grace period (~16 ms measured here), so the thread closes
    /// it after signalling, and nobody waits for that.
    done: Option<std::sync::mpsc::Receiver<()>>,
    thread: Option<JoinHandle<()>>,
}

impl ProtectedNameWatcher {
    /// Starts guarding `policy.protected_missing`.
    pub fn start(policy: &SandboxPolicy) -> io::Result<Self> {
        Self::start_for(&policy.protected_missing)
    }

    /// Starts guarding the given paths (each `<writable root>/<protected name>`). Names that
    /// exist at this moment are left alone: they existed "when the command started".
    pub fn start_for(paths: &[PathBuf]) -> io::Result<Self> {
        // SAFETY: inotify_init1 with flags only.
        let ino = unsafe { libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK) };
        if ino < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor we own.
        let ino = unsafe { OwnedFd::from_raw_fd(ino) };

        // Watches are added before the existence check, so a name created in between is either
        // seen as existing (left alone) or reported by inotify — never missed.
        let mut dirs: HashMap<PathBuf, i32> = HashMap::new();
        for p in paths {
            let Some(dir) = p.parent() else { continue };
            if dirs.contains_key(dir) {
                continue;
            }
            let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
                .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
            let mask =
                libc::IN_CREATE | libc::IN_MOVED_TO | libc::IN_ONLYDIR | libc::IN_DONT_FOLLOW;
            // SAFETY: valid descriptor and C string.
            let wd = unsafe { libc::inotify_add_watch(ino.as_raw_fd(), c.as_ptr(), mask) };
            if wd < 0 {
                let e = io::Error::last_os_error();
                // A root that vanished cannot gain a name; anything else is a real failure.
                if e.kind() == io::ErrorKind::NotFound {
                    continue;
                }
                return Err(e);
            }
            dirs.insert(dir.to_path_buf(), wd);
        }
        let guarded: Vec<PathBuf> = paths
            .iter()
            .filter(|p| std::fs::symlink_metadata(p).is_err())
            .cloned()
            .collect();

        // wd -> names guarded in that directory.
        let mut by_wd: HashMap<i32, Vec<(OsString, PathBuf)>> = HashMap::new();
        for p in &guarded {
            if let (Some(dir), Some(name)) = (p.parent(), p.file_name())
                && let Some(wd) = dirs.get(dir)
            {
                by_wd
                    .entry(*wd)
                    .or_default()
                    .push((name.to_os_string(), p.clone()));
            }
        }

        let (stop_rx, stop_tx) = pipe()?;
        let guarded = Arc::new(guarded);
        let removed = Arc::new(Mutex::new(Vec::new()));
        let (done_tx, done) = std::sync::mpsc::channel();
        let thread = {
            let guarded = Arc::clone(&guarded);
            let removed = Arc::clone(&removed);
            std::thread::Builder::new()
                .name("protected-name-watcher".into())
                .spawn(move || {
                    watch_loop(&ino, stop_rx, by_wd, &guarded, &removed);
                    let _ = done_tx.send(());
                    // `ino` is closed here, after the caller stopped waiting.
                })?
        };
        Ok(Self {
            guarded,
            removed,
            stop_tx: Some(stop_tx),
            done: Some(done),
            thread: Some(thread),
        })
    }

    /// The paths being guarded.
    pub fn guarded(&self) -> &[PathBuf] {
        &self.guarded
    }

    /// Stops watching, runs the final scan and returns every path removed (each once, in the
    /// order first removed).
    pub fn stop(mut self) -> Vec<PathBuf> {
        self.shutdown();
        scan(&self.guarded, &self.removed);
        let mut out = std::mem::take(&mut *lock(&self.removed));
        let mut seen = std::collections::HashSet::new();
        out.retain(|p| seen.insert(p.clone()));
        out
    }

    fn shutdown(&mut self) {
        if let Some(tx) = self.stop_tx.take() {
            // Closing the write end makes the read end readable (EOF): no write needed.
            drop(tx);
        }
        if let Some(done) = self.done.take() {
            // Ok: the work is done; Err: the thread ended (panicked) — either way, go on.
            let _ = done.recv();
        }
        // Detach: the thread only has the descriptor's close left to do.
        drop(self.thread.take());
    }
}

impl Drop for ProtectedNameWatcher {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn watch_loop(
    ino: &OwnedFd,
    stop: OwnedFd,
    by_wd: HashMap<i32, Vec<(OsString, PathBuf)>>,
    guarded: &[PathBuf],
    removed: &Mutex<Vec<PathBuf>>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let mut fds = [
            libc::pollfd {
                fd: ino.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: stop.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: two valid pollfds.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, RESCAN.as_millis() as libc::c_int) };
        if n < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        if fds[1].revents != 0 {
            return;
        }
        if n == 0 {
            scan(guarded, removed);
            continue;
        }
        // SAFETY: reading into our buffer.
        let len = unsafe { libc::read(ino.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if len <= 0 {
            continue;
        }
        let mut overflow = false;
        for (wd, mask, name) in parse_events(&buf[..len as usize]) {
            if mask & libc::IN_Q_OVERFLOW != 0 {
                overflow = true;
                continue;
            }
            if let Some(names) = by_wd.get(&wd)
                && let Some((_, path)) = names.iter().find(|(n, _)| *n == name)
            {
                remove_guarded(path, removed);
            }
        }
        if overflow {
            scan(guarded, removed);
        }
    }
}

/// Splits a buffer of `struct inotify_event`s into (wd, mask, name).
fn parse_events(buf: &[u8]) -> Vec<(i32, u32, OsString)> {
    const HEADER: usize = std::mem::size_of::<libc::inotify_event>();
    let mut out = Vec::new();
    let mut off = 0;
    while off + HEADER <= buf.len() {
        // SAFETY: the kernel wrote whole events; read_unaligned copes with any alignment.
        let ev: libc::inotify_event =
            unsafe { std::ptr::read_unaligned(buf[off..].as_ptr().cast()) };
        let start = off + HEADER;
        let end = (start + ev.len as usize).min(buf.len());
        let raw = &buf[start..end];
        // The name is NUL-padded.
        let name = raw.split(|b| *b == 0).next().unwrap_or(&[]);
        out.push((ev.wd, ev.mask, OsString::from_vec(name.to_vec())));
        off = end;
    }
    out
}

/// Removes every guarded path that exists now.
fn scan(guarded: &[PathBuf], removed: &Mutex<Vec<PathBuf>>) {
    for p in guarded {
        remove_guarded(p, removed);
    }
}

fn remove_guarded(path: &Path, removed: &Mutex<Vec<PathBuf>>) {
    if remove_no_follow(path) {
        lock(removed).push(path.to_path_buf());
    }
}

/// Removes `path` recursively without following symlinks (a symlink is removed itself, never its
/// target). Retries while a concurrent writer refills a directory. Returns whether anything was
/// there.
pub fn remove_no_follow(path: &Path) -> bool {
    let mut found = false;
    for _ in 0..REMOVE_ATTEMPTS {
        let meta = match std::fs::symlink_metadata(path) {
            Ok(m) => m,
            Err(_) => return found,
        };
        found = true;
        // std's remove_dir_all works through O_NOFOLLOW directory descriptors, so a symlink
        // planted inside the tree cannot redirect the deletion.
        let r = if meta.is_dir() {
            std::fs::remove_dir_all(path)
        } else {
            std::fs::remove_file(path)
        };
        if r.is_ok() && std::fs::symlink_metadata(path).is_err() {
            return true;
        }
    }
    found
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: a two-element buffer for pipe2.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh descriptors we own.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic elsewhere must not stop removals or reporting.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Instant;

    struct Scratch(PathBuf);
    impl Scratch {
        fn new() -> Self {
            static N: AtomicUsize = AtomicUsize::new(0);
            let p = std::env::temp_dir().join(format!(
                "corral-watch-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::SeqCst)
            ));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            Scratch(p)
        }
    }
    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn names(root: &Path) -> Vec<PathBuf> {
        [".git", ".codex", ".agents"]
            .iter()
            .map(|n| root.join(n))
            .collect()
    }

    fn wait_gone(p: &Path) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if std::fs::symlink_metadata(p).is_err() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    #[test]
    fn removes_created_names_without_following_symlinks() {
        let s = Scratch::new();
        let root = s.0.join("root");
        let outside = s.0.join("outside");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("keep"), "k").unwrap();

        let w = ProtectedNameWatcher::start_for(&names(&root)).unwrap();
        assert_eq!(w.guarded().len(), 3);
        // mkdir with content (a `git init`), a symlink, a rename onto the name.
        // The watcher may remove `.git` between the two mkdirs: that race is the point.
        let _ = std::fs::create_dir_all(root.join(".git/hooks"));
        let _ = std::fs::write(root.join(".git/hooks/pre-commit"), "evil");
        symlink(&outside, root.join(".codex")).unwrap();
        std::fs::create_dir(root.join("t")).unwrap();
        std::fs::rename(root.join("t"), root.join(".agents")).unwrap();
        for p in names(&root) {
            assert!(wait_gone(&p), "{} still exists", p.display());
        }
        let removed = w.stop();
        let mut sorted = removed.clone();
        sorted.sort();
        let mut want = names(&root);
        want.sort();
        assert_eq!(sorted, want);
        // The symlink went, its target did not.
        assert_eq!(std::fs::read_to_string(outside.join("keep")).unwrap(), "k");
        assert_eq!(
            blocked_message(&removed[0]),
            format!(
                "sandbox blocked creation of protected workspace metadata path {}",
                removed[0].display()
            )
        );
    }

    #[test]
    fn existing_names_and_nested_names_are_left_alone() {
        let s = Scratch::new();
        let root = s.0.join("root");
        std::fs::create_dir_all(root.join(".git")).unwrap();
        let w = ProtectedNameWatcher::start_for(&names(&root)).unwrap();
        assert_eq!(w.guarded(), &names(&root)[1..]);
        std::fs::write(root.join(".git/config"), "c").unwrap();
        std::fs::create_dir_all(root.join("vendor/x/.git")).unwrap();
        std::fs::write(root.join("ordinary"), "o").unwrap();
        std::thread::sleep(Duration::from_millis(300));
        assert!(w.stop().is_empty());
        assert!(root.join(".git/config").exists());
        assert!(root.join("vendor/x/.git").exists());
        assert!(root.join("ordinary").exists());
    }

    #[test]
    fn final_scan_catches_a_late_creation() {
        let s = Scratch::new();
        let root = s.0.join("root");
        std::fs::create_dir_all(&root).unwrap();
        let w = ProtectedNameWatcher::start_for(&names(&root)).unwrap();
        std::fs::write(root.join(".codex"), "late").unwrap();
        // stop() immediately: whichever of the thread or the final scan gets it, it is reported.
        let removed = w.stop();
        assert_eq!(removed, vec![root.join(".codex")]);
        assert!(std::fs::symlink_metadata(root.join(".codex")).is_err());
    }

    #[test]
    fn hard_link_onto_a_name_is_removed_but_the_original_kept() {
        let s = Scratch::new();
        let root = s.0.join("root");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(root.join("file"), "f").unwrap();
        let w = ProtectedNameWatcher::start_for(&names(&root)).unwrap();
        std::fs::hard_link(root.join("file"), root.join(".agents")).unwrap();
        assert!(wait_gone(&root.join(".agents")));
        assert_eq!(w.stop(), vec![root.join(".agents")]);
        assert_eq!(std::fs::read_to_string(root.join("file")).unwrap(), "f");
    }

    #[test]
    fn parses_packed_events() {
        let mut buf = Vec::new();
        for (wd, name) in [(1i32, ".git"), (2, ".agents")] {
            let padded = 16u32;
            buf.extend_from_slice(&wd.to_ne_bytes());
            buf.extend_from_slice(&libc::IN_CREATE.to_ne_bytes());
            buf.extend_from_slice(&0u32.to_ne_bytes());
            buf.extend_from_slice(&padded.to_ne_bytes());
            let mut n = name.as_bytes().to_vec();
            n.resize(padded as usize, 0);
            buf.extend_from_slice(&n);
        }
        let evs = parse_events(&buf);
        assert_eq!(evs.len(), 2);
        assert_eq!(evs[0], (1, libc::IN_CREATE, OsString::from(".git")));
        assert_eq!(evs[1], (2, libc::IN_CREATE, OsString::from(".agents")));
    }
}
