//! The protected-name guard (spec/sandbox.md §2.3 "Creation is blocked", §3.3, §8.6 H1, H2, H14).
//!
//! A read-only mount cannot be placed on a name that does not exist, and a placeholder created on
//! the host would be visible to host tools. So while a call runs, the worker guards each guarded
//! path (`.git`, `.codex`, `.agents`, `.aws`, `HEAD` at a root's top, a `.git` file's missing gitdir)
//! that was absent when the call started, and takes away any that appears — at once, on the
//! creation event, and again in a rescan every 200 ms and when the call ends (which reads the
//! events still queued, and rescans every guarded path when an event may have been missed).
//!
//! Taking it away must work against a sandbox that prepared for it (H1): a tree whose owner
//! removed its own write bits cannot be emptied, so the name is first **renamed** to a
//! quarantine name in the same directory (that needs write permission on the directory only,
//! and ends the danger at once: git looks for `.git`, not for the quarantine name), then the
//! tree is made writable by its owner and deleted. When the rename itself fails, the call fails
//! and says plainly that the name is still there.
//!
//! The guard also keeps each writable root from being opened to other users (H14): a root whose
//! mode gains group or other write permission during a call gets its mode back.
//!
//! **The guard touches only what the sandbox made (H27) and stops it before it races (H18).**
//! Events come from one fanotify group per worker (`notify.rs`), created before seccomp (which
//! denies `fanotify_init` and `inotify_init` to commands: groups are a per-uid host-wide
//! resource, H13) and shared by every call through one thread. In attributed mode each event
//! says whether a process of this sandbox made the name:
//! - made by the sandbox: every process of the sandbox is killed first (one `kill(-1)` from the
//!   worker, PID 1 of the sandbox's PID namespace), then the name is taken away, and the guard
//!   stays *stopped*: later commands and patches of the worker are refused outright, so a loop
//!   gets one guard latency per session, not one per attempt;
//! - made outside (a host process, Codex's own sandbox making its mount points in `/tmp`): left
//!   alone. If it is a directory, it is watched in turn, and what the sandbox makes inside it
//!   is stopped and taken away the same way (a host's empty `.git` is not a way in).
//!
//! Sweeps (the rescans, a call's final scan) only take away what an event attributed to the
//! sandbox. Without attribution (an unprivileged daemon) every creation counts as the
//! sandbox's, nothing is stopped, and the sweeps look at every guarded path, as before H27.
//!
//! This file is the guard itself: [`Guard`] (the worker's, with its watches and the state every
//! call shares) and [`CallGuard`] (one call's registration and final scan). Its parts:
//! - `events`: the watcher thread and what it does with each event (attribution, H18's stop);
//! - `take_away`: renaming a guarded name to quarantine and deleting the tree (H1);
//! - `root_perms`: giving a writable root its mode and ACL back (H14);
//! - `report`: what a call's guard found, and the lines it prints.

use crate::sandbox::notify::{DirKey, Notifier};
use crate::sandbox::policy::SandboxPolicy;
use crate::sync::LockExt;
use events::{drain, share, watch_loop};
use root_perms::{access_acl, restore_root_acls, restore_roots_with};
use std::collections::{HashMap, HashSet};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};
use take_away::{empty_trash, sweep};

mod events;
mod report;
mod root_perms;
mod take_away;

pub use report::{GuardReport, stopped_message};

/// Backstop rescan interval, for anything the events missed (queue overflow, a watch lost, a
/// guarded path whose parent was replaced).
const RESCAN: Duration = Duration::from_millis(200);

/// How long the worker must be idle (no call guarded) before the watcher thread sleeps.
const PARK_AFTER: Duration = Duration::from_secs(1);

/// One call being guarded.
struct Active {
    guarded: Vec<PathBuf>,
    report: GuardReport,
    /// Something the events may have missed for this call (a queue overflow, a watch lost, a
    /// guarded path's directory not watched or on a filesystem whose events are incomplete):
    /// its final scan must look at every guarded path, not only at what events named.
    dirty: bool,
}

/// One watched directory. Watches are kept for the worker's life (its guarded paths never
/// change), so a call neither adds nor removes one unless the directory was replaced.
struct Watch {
    key: DirKey,
    /// `(st_dev, st_ino)` of the directory the watch is on: a call re-checks that the path
    /// still leads there (an ancestor renamed and replaced sends no event on this watch).
    id: (u64, u64),
    /// The directory was deleted or moved (or swapped while it was being marked). Inode
    /// numbers are reused, so `id` alone cannot tell.
    lost: bool,
    /// The filesystem reports every creation (a local one), so no event means no new name. Elsewhere (NFS, FUSE, ...) a call always rescans at its end.
    complete: bool,
}

struct State {
    calls: HashMap<u64, Active>,
    dirs: HashMap<PathBuf, Watch>,
    /// The watcher thread sleeps on `Inner::wake` (no events, no rescans) while no call is
    /// active; `begin` wakes it.
    parked: bool,
    /// When the last call ended: the thread parks once the worker has been idle a while, not
    /// between back-to-back calls (waking it would cost every call).
    last_end: Instant,
    /// Guarded paths whose latest creation event was the sandbox's and that are still there
    /// (not taken away yet): what sweeps may take away in attributed mode.
    sandbox_made: HashSet<PathBuf>,
    /// Guarded directories a process outside the sandbox made: left alone, and watched, so
    /// what the sandbox makes inside them is taken away.
    interiors: Vec<PathBuf>,
    /// Guarded regular files a process outside the sandbox made: left alone, but a sandbox that
    /// writes into one (an empty `.git` becoming a `gitdir:` pointer)
    /// is stopped and the file — its content now the sandbox's — taken away.
    host_files: Vec<PathBuf>,
}

struct Inner {
    notify: Notifier,
    /// Set once a command made a protected path (H18): the sandbox was stopped, and the worker
    /// refuses later commands and patches.
    stopped: Mutex<Option<PathBuf>>,
    /// Each writable root and the permission bits it had when the worker started.
    roots: Vec<(PathBuf, u32)>,
    /// Each writable root's access ACL (`system.posix_acl_access`) when the worker started:
    /// an entry added since lets another user in without any mode bit changing (a 0775 root's
    /// group bits are already the ACL mask's).
    root_acls: Vec<(PathBuf, Option<Vec<u8>>)>,
    state: Mutex<State>,
    wake: Condvar,
    /// Quarantined trees not yet deleted. Pushed under `state`'s lock by the sweep that renamed
    /// them; emptied only under `deleting`, so a finishing call waits for a deletion the watcher
    /// thread has in hand and retries one that failed (its directory was briefly `0555`).
    trash: Mutex<Vec<PathBuf>>,
    deleting: Mutex<()>,
    thread: OnceLock<io::Result<()>>,
    next: AtomicU64,
}

/// The worker's guard: shared by every call (cheap to clone).
#[derive(Clone)]
pub struct Guard {
    inner: Arc<Inner>,
}

impl Guard {
    /// Creates the guard's fanotify group for a policy's writable roots. Call before seccomp
    /// (which denies `fanotify_init`), with `CAP_SYS_ADMIN` for attribution.
    pub fn new(policy: &SandboxPolicy) -> io::Result<Self> {
        Self::for_roots(&policy.writable_roots)
    }

    /// As [`Guard::new`], for explicit roots.
    pub fn for_roots(writable_roots: &[PathBuf]) -> io::Result<Self> {
        let notify = Notifier::new()?;
        let roots = writable_roots
            .iter()
            .filter_map(|r| {
                let mode = std::fs::symlink_metadata(r).ok()?.mode() & 0o7777;
                Some((r.clone(), mode))
            })
            .collect();
        let root_acls = writable_roots
            .iter()
            .map(|r| (r.clone(), access_acl(r)))
            .collect();
        Ok(Self {
            inner: Arc::new(Inner {
                notify,
                stopped: Mutex::new(None),
                roots,
                root_acls,
                state: Mutex::new(State {
                    calls: HashMap::new(),
                    dirs: HashMap::new(),
                    parked: false,
                    last_end: Instant::now(),
                    sandbox_made: HashSet::new(),
                    interiors: Vec::new(),
                    host_files: Vec::new(),
                }),
                wake: Condvar::new(),
                trash: Mutex::default(),
                deleting: Mutex::default(),
                thread: OnceLock::new(),
                next: AtomicU64::new(1),
            }),
        })
    }

    /// The fanotify descriptor (kept open through confinement's descriptor sweep).
    pub fn fd(&self) -> &OwnedFd {
        self.inner.notify.fd()
    }

    /// The protected path whose creation stopped this sandbox (H18), if one did.
    pub fn stopped(&self) -> Option<PathBuf> {
        lock(&self.inner.stopped).clone()
    }

    /// Starts stopped: the worker this one replaces was stopped by `path` (H18 holds for the
    /// session, not for one worker).
    pub fn stop_for(&self, path: PathBuf) {
        lock(&self.inner.stopped).get_or_insert(path);
    }

    /// Starts guarding `paths` for one call. Paths that exist now are left alone: they existed
    /// when the call started (and the caller checked they are protected by mounts).
    pub fn begin(&self, paths: &[PathBuf]) -> io::Result<CallGuard> {
        if let Err(e) = self
            .inner
            .thread
            .get_or_init(|| {
                let inner = Arc::clone(&self.inner);
                std::thread::Builder::new()
                    .name("protected-name-guard".into())
                    .spawn(move || watch_loop(&inner))
                    .map(drop)
            })
            .as_ref()
        {
            return Err(io::Error::new(e.kind(), e.to_string()));
        }
        let id = self.inner.next.fetch_add(1, Ordering::SeqCst);
        let mut state = lock(&self.inner.state);
        // Events queued since the last look first: a watch the kernel dropped must be known
        // before it is trusted below.
        let mut trash = Vec::new();
        drain(&self.inner, &mut state, &mut trash);
        lock(&self.inner.trash).append(&mut trash);
        // Watches first, then the existence check: a name created in between is either seen as
        // existing (left alone) or reported by an event — never missed.
        let mut watched: Vec<PathBuf> = Vec::new();
        let mut dirty = false;
        for dir in paths.iter().filter_map(|p| p.parent()) {
            if watched.iter().any(|d| d == dir) {
                continue;
            }
            match arm(&self.inner, &mut state, dir)? {
                Some(true) => watched.push(dir.to_path_buf()),
                // Not watched (a directory that does not exist cannot gain a name until it is
                // created; the rescans cover that) or events incomplete: scan it all at the end.
                Some(false) | None => dirty = true,
            }
        }
        let guarded: Vec<PathBuf> = paths
            .iter()
            .filter(|p| std::fs::symlink_metadata(p).is_err())
            .cloned()
            .collect();
        state.calls.insert(
            id,
            Active {
                guarded: guarded.clone(),
                report: GuardReport::default(),
                dirty,
            },
        );
        if state.parked {
            self.inner.wake.notify_one();
        }
        Ok(CallGuard {
            inner: Arc::clone(&self.inner),
            id,
            guarded,
            watched,
            finished: false,
        })
    }
}

/// Makes sure `dir` is watched, on the directory its path leads to now. `Some(complete)`:
/// watched, and whether its events can be trusted to name every new entry; `None`: it does not
/// exist. Adds (or replaces) a watch only when the directory is new or was replaced.
fn arm(inner: &Inner, state: &mut State, dir: &Path) -> io::Result<Option<bool>> {
    let now = match std::fs::symlink_metadata(dir) {
        Ok(m) => (m.dev(), m.ino()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    if let Some(w) = state.dirs.get(dir)
        && !w.lost
        && w.id == now
    {
        return Ok(Some(w.complete));
    }
    // A mark on a directory that was replaced stays until that inode goes; its events name a
    // key no path maps to any more, so they are ignored.
    state.dirs.remove(dir);
    let Some((key, marked)) = inner.notify.watch(dir)? else {
        return Ok(None);
    };
    // The path may have been swapped between the stat and the mark: then the mark is on
    // another directory than `now`, and the next call re-arms it (this one scans all at its end).
    let complete = marked == now && events_complete(dir);
    state.dirs.insert(
        dir.to_path_buf(),
        Watch {
            key,
            id: marked,
            lost: marked != now,
            complete,
        },
    );
    Ok(Some(complete))
}

/// Whether `dir`'s filesystem reports every new name: local filesystems do (every creation goes
/// through this kernel's VFS); network and FUSE filesystems can change behind it.
fn events_complete(dir: &Path) -> bool {
    const EXT4: i64 = 0xEF53;
    const XFS: i64 = 0x5846_5342;
    const BTRFS: i64 = 0x9123_683E;
    const TMPFS: i64 = 0x0102_1994;
    const F2FS: i64 = 0xF2F5_2010;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: statfs into a zeroed struct we own.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid C string and out pointer.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return false;
    }
    #[allow(clippy::unnecessary_cast)] // f_type's width differs between libcs.
    let kind = st.f_type as i64;
    matches!(kind, EXT4 | XFS | BTRFS | TMPFS | F2FS)
}

/// One call's registration; [`CallGuard::finish`] ends it with a final scan.
pub struct CallGuard {
    inner: Arc<Inner>,
    id: u64,
    guarded: Vec<PathBuf>,
    /// The directories whose watches this call relies on.
    watched: Vec<PathBuf>,
    finished: bool,
}

impl CallGuard {
    #[cfg(test)]
    /// The paths this call guards.
    pub fn guarded(&self) -> &[PathBuf] {
        &self.guarded
    }

    /// What was found since the guard began or since the last call of this, without ending
    /// the guard (a long-lived process reports findings as it goes).
    pub fn take_report(&self) -> GuardReport {
        let mut state = lock(&self.inner.state);
        state
            .calls
            .get_mut(&self.id)
            .map(|a| std::mem::take(&mut a.report))
            .unwrap_or_default()
    }

    /// Runs the final scan, stops guarding and reports what was found during the call.
    ///
    /// Every name the command created is in the event queue once it has exited (the kernel
    /// queues the event inside the creating system call), so the final scan reads the queue
    /// and takes away what it names. Only when an event may have been missed (the call
    /// is dirty, or a watched path now leads to another directory) does it look at every
    /// guarded path.
    pub fn finish(mut self) -> GuardReport {
        self.finished = true;
        let mut trash = Vec::new();
        let mut state = lock(&self.inner.state);
        drain(&self.inner, &mut state, &mut trash);
        // One stat per watched directory serves both checks below (the roots are usually the
        // watched directories): syscalls are what a call pays for here.
        let seen: Vec<(&Path, Option<std::fs::Metadata>)> = self
            .watched
            .iter()
            .map(|d| (d.as_path(), std::fs::symlink_metadata(d).ok()))
            .collect();
        let dirty = state.calls.get(&self.id).is_none_or(|a| a.dirty)
            || !seen
                .iter()
                .all(|(d, m)| still_watched(&state, d, m.as_ref()));
        let attributed = self.inner.notify.attributed();
        let mut report = if dirty {
            sweep(attributed, &mut state, &self.guarded, &mut trash)
        } else {
            // A guarded path below a root's top (a `.git` file's missing gitdir) has a parent
            // the sandbox can rename, with the name made inside it and the parent moved back:
            // no event of ours names that. These few are looked at on every call.
            let nested: Vec<PathBuf> = self
                .guarded
                .iter()
                .filter(|p| {
                    !p.parent()
                        .is_some_and(|d| self.inner.roots.iter().any(|(r, _)| r == d))
                })
                .cloned()
                .collect();
            sweep(attributed, &mut state, &nested, &mut trash)
        };
        report.roots_restored = restore_roots_with(&self.inner.roots, |root| {
            match seen.iter().find(|(d, _)| *d == root) {
                Some((_, m)) => m.clone(),
                None => std::fs::symlink_metadata(root).ok(),
            }
        });
        report
            .roots_restored
            .extend(restore_root_acls(&self.inner.root_acls));
        // Other calls guarding what this sweep took away hear of it too.
        share(&mut state, &report, Some(self.id));
        if let Some(active) = state.calls.remove(&self.id) {
            let mut all = active.report;
            all.merge(report);
            report = all;
        }
        state.last_end = Instant::now();
        lock(&self.inner.trash).append(&mut trash);
        drop(state);
        empty_trash(&self.inner);
        report
    }
}

/// Whether `dir`'s watch is still on the directory its path leads to (`now`: its metadata).
fn still_watched(state: &State, dir: &Path, now: Option<&std::fs::Metadata>) -> bool {
    let (Some(w), Some(m)) = (state.dirs.get(dir), now) else {
        return false;
    };
    !w.lost && (m.dev(), m.ino()) == w.id
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        if !self.finished {
            let mut state = lock(&self.inner.state);
            state.calls.remove(&self.id);
            state.last_end = Instant::now();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic elsewhere must not stop removals or reporting.
    m.locked()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::notify::Event;
    use crate::sandbox::testutil::TempDir;
    use events::handle_events;
    use std::os::unix::fs::{PermissionsExt, symlink};
    use take_away::QUARANTINE_PREFIX;

    fn names(root: &Path) -> Vec<PathBuf> {
        [".git", ".codex", ".agents", "HEAD"]
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

    fn leftovers(root: &Path) -> Vec<String> {
        std::fs::read_dir(root)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(QUARANTINE_PREFIX))
            .collect()
    }

    #[test]
    fn a_gitdir_made_inside_a_parent_moved_away_and_back_is_still_taken_away() {
        // `.git` says `gitdir: sub/wt`; `sub` exists, `wt` does not: `root/sub/wt` is guarded,
        // and `sub` (not a root) can be renamed. The red-team's sequence: move `sub` away,
        // make the gitdir inside it (our watch on `sub` names `sub/wt`, which is not there),
        // give the thread time to look, move `sub` back (no event names `sub/wt`).
        for settle in [Duration::from_millis(50), Duration::ZERO] {
            let s = TempDir::new("watch");
            let root = s.path().join("root");
            std::fs::create_dir_all(root.join("sub")).unwrap();
            let wt = root.join("sub/wt");
            let guard = Guard::for_roots(std::slice::from_ref(&root)).unwrap();
            let call = guard.begin(std::slice::from_ref(&wt)).unwrap();
            std::fs::rename(root.join("sub"), root.join("x")).unwrap();
            std::fs::create_dir_all(root.join("x/wt/objects")).unwrap();
            std::fs::write(root.join("x/wt/HEAD"), "ref: refs/heads/m\n").unwrap();
            std::thread::sleep(settle);
            std::fs::rename(root.join("x"), root.join("sub")).unwrap();
            let report = call.finish();
            assert!(
                std::fs::symlink_metadata(&wt).is_err(),
                "{} survived the call (settle {settle:?})",
                wt.display()
            );
            assert_eq!(report.removed, vec![wt.clone()], "settle {settle:?}");
        }
    }

    #[test]
    fn removes_created_names_without_following_symlinks() {
        let s = TempDir::new("watch");
        let root = s.path().join("root");
        let outside = s.path().join("outside");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("keep"), "k").unwrap();

        let guard = Guard::for_roots(std::slice::from_ref(&root)).unwrap();
        let call = guard.begin(&names(&root)).unwrap();
        assert_eq!(call.guarded().len(), 4);
        // mkdir with content (a `git init`), a symlink, a rename onto the name, a HEAD file.
        // The guard may take `.git` away between the two mkdirs: that race is the point.
        let _ = std::fs::create_dir_all(root.join(".git/hooks"));
        let _ = std::fs::write(root.join(".git/hooks/pre-commit"), "evil");
        symlink(&outside, root.join(".codex")).unwrap();
        std::fs::create_dir(root.join("t")).unwrap();
        std::fs::rename(root.join("t"), root.join(".agents")).unwrap();
        std::fs::write(root.join("HEAD"), "ref: refs/heads/main\n").unwrap();
        for p in names(&root) {
            assert!(wait_gone(&p), "{} still exists", p.display());
        }
        let report = call.finish();
        let mut sorted = report.removed.clone();
        sorted.sort();
        let mut want = names(&root);
        want.sort();
        assert_eq!(sorted, want);
        assert!(report.not_removed.is_empty());
        // The symlink went, its target did not; nothing is left in quarantine.
        assert_eq!(std::fs::read_to_string(outside.join("keep")).unwrap(), "k");
        assert!(leftovers(&root).is_empty(), "{:?}", leftovers(&root));
        assert_eq!(
            report::blocked_message(&report.removed[0]),
            format!(
                "sandbox blocked creation of protected workspace metadata path {}",
                report.removed[0].display()
            )
        );
    }

    /// H1 (red-team finding 1): a prepared tree whose owner removed its write bits, moved onto
    /// `.git`, and a root directory made 0555 on top.
    #[test]
    fn a_write_protected_tree_moved_onto_the_name_is_still_taken_away() {
        let s = TempDir::new("watch");
        let root = s.path().join("root");
        std::fs::create_dir_all(&root).unwrap();
        let guard = Guard::for_roots(std::slice::from_ref(&root)).unwrap();
        let call = guard.begin(&names(&root)).unwrap();
        let t = root.join("t");
        std::fs::create_dir_all(t.join("objects")).unwrap();
        std::fs::create_dir_all(t.join("refs/heads")).unwrap();
        std::fs::write(t.join("HEAD"), "ref: refs/heads/main\n").unwrap();
        std::fs::write(t.join("config"), "[core]\n\tfsmonitor = evil\n").unwrap();
        for d in ["refs/heads", "refs", "objects", ""] {
            std::fs::set_permissions(t.join(d), std::fs::Permissions::from_mode(0o555)).unwrap();
        }
        std::fs::rename(&t, root.join(".git")).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o555)).unwrap();
        assert!(wait_gone(&root.join(".git")));
        let report = call.finish();
        // Once the call has finished, the quarantined tree is gone even though the root is
        // still 0555 (as root (CI) it is deletable anyway; as its owner after opening it up),
        // and the root keeps the mode the sandbox gave it.
        let left = leftovers(&root);
        let mode = std::fs::metadata(&root).unwrap().mode() & 0o7777;
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(report.removed, vec![root.join(".git")]);
        assert!(report.not_removed.is_empty());
        assert!(left.is_empty(), "{left:?}");
        assert_eq!(mode, 0o555);
    }

    #[test]
    fn existing_names_and_nested_names_are_left_alone() {
        let s = TempDir::new("watch");
        let root = s.path().join("root");
        std::fs::create_dir_all(root.join(".git")).unwrap();
        let guard = Guard::for_roots(std::slice::from_ref(&root)).unwrap();
        let call = guard.begin(&names(&root)).unwrap();
        assert_eq!(call.guarded(), &names(&root)[1..]);
        std::fs::write(root.join(".git/config"), "c").unwrap();
        std::fs::create_dir_all(root.join("vendor/x/.git")).unwrap();
        std::fs::write(root.join("ordinary"), "o").unwrap();
        std::thread::sleep(Duration::from_millis(300));
        assert!(call.finish().is_empty());
        assert!(root.join(".git/config").exists());
        assert!(root.join("vendor/x/.git").exists());
        assert!(root.join("ordinary").exists());
    }

    #[test]
    fn final_scan_catches_a_late_creation_and_calls_share_one_instance() {
        let s = TempDir::new("watch");
        let root = s.path().join("root");
        std::fs::create_dir_all(&root).unwrap();
        let guard = Guard::for_roots(std::slice::from_ref(&root)).unwrap();
        let first = guard.begin(&names(&root)).unwrap();
        let second = guard.begin(&names(&root)).unwrap();
        std::fs::write(root.join(".codex"), "late").unwrap();
        // finish() at once: whichever of the thread or the final scan gets it, it is reported
        // to every call guarding it.
        let a = first.finish();
        let b = second.finish();
        assert_eq!(a.removed, vec![root.join(".codex")]);
        assert_eq!(b.removed, vec![root.join(".codex")]);
        assert!(std::fs::symlink_metadata(root.join(".codex")).is_err());
        // Outside any call nothing is guarded: a name created now stays.
        std::fs::write(root.join(".codex"), "host").unwrap();
        std::thread::sleep(Duration::from_millis(300));
        assert!(root.join(".codex").exists());
    }

    #[test]
    fn hard_link_onto_a_name_is_removed_but_the_original_kept() {
        let s = TempDir::new("watch");
        let root = s.path().join("root");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(root.join("file"), "f").unwrap();
        let guard = Guard::for_roots(std::slice::from_ref(&root)).unwrap();
        let call = guard.begin(&names(&root)).unwrap();
        std::fs::hard_link(root.join("file"), root.join(".agents")).unwrap();
        assert!(wait_gone(&root.join(".agents")));
        assert_eq!(call.finish().removed, vec![root.join(".agents")]);
        assert_eq!(std::fs::read_to_string(root.join("file")).unwrap(), "f");
    }

    /// H14: a root opened to other users during a call gets its mode back.
    #[test]
    fn a_root_made_world_writable_is_restored() {
        let s = TempDir::new("watch");
        let root = s.path().join("root");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o750)).unwrap();
        let guard = Guard::for_roots(std::slice::from_ref(&root)).unwrap();
        let call = guard.begin(&names(&root)).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o777)).unwrap();
        let report = call.finish();
        assert_eq!(report.roots_restored, vec![(root.clone(), 0o755)]);
        let mode = std::fs::metadata(&root).unwrap().mode() & 0o7777;
        assert_eq!(mode, 0o755, "group/other write cleared, the rest kept");
    }

    /// The final scan reads the event queue rather than stat'ing every guarded path: a name
    /// the command creates just before it exits is still taken away and reported, whether the
    /// watcher thread or the final scan handles its event first.
    #[test]
    fn a_name_created_just_before_the_end_is_always_taken_away() {
        let s = TempDir::new("watch");
        let root = s.path().join("root");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(root.join("file"), "f").unwrap();
        let guard = Guard::for_roots(std::slice::from_ref(&root)).unwrap();
        for i in 0..200 {
            let call = guard.begin(&names(&root)).unwrap();
            let name = &names(&root)[i % 4];
            match i % 4 {
                0 => std::fs::create_dir(name).unwrap(),
                1 => symlink("/", name).unwrap(),
                2 => std::fs::hard_link(root.join("file"), name).unwrap(),
                _ => {
                    std::fs::create_dir(root.join("t")).unwrap();
                    std::fs::rename(root.join("t"), name).unwrap();
                }
            }
            let report = call.finish();
            assert_eq!(report.removed, vec![name.clone()], "round {i}");
            assert!(std::fs::symlink_metadata(name).is_err(), "round {i}");
        }
        assert!(leftovers(&root).is_empty(), "{:?}", leftovers(&root));
        assert_eq!(std::fs::read_to_string(root.join("file")).unwrap(), "f");
    }

    /// Watches are kept between calls; a root replaced in between (an ancestor renamed, a new
    /// directory in its place: no event on the old watch) is watched again, and one replaced
    /// during a call makes the final scan look at every guarded path.
    #[test]
    fn a_replaced_root_is_still_guarded() {
        let s = TempDir::new("watch");
        let root = s.path().join("a/root");
        std::fs::create_dir_all(&root).unwrap();
        let guard = Guard::for_roots(std::slice::from_ref(&root)).unwrap();
        assert!(guard.begin(&names(&root)).unwrap().finish().is_empty());

        // Between calls.
        std::fs::rename(s.path().join("a"), s.path().join("old1")).unwrap();
        std::fs::create_dir_all(&root).unwrap();
        let ino = std::fs::metadata(&root).unwrap().ino();
        let call = guard.begin(&names(&root)).unwrap();
        {
            let state = lock(&guard.inner.state);
            let w = &state.dirs[&root];
            assert!(
                !w.lost && w.id.1 == ino,
                "the watch follows the new directory"
            );
            assert!(!state.calls[&call.id].dirty);
        }
        std::fs::write(root.join(".codex"), "x").unwrap();
        assert!(wait_gone(&root.join(".codex")));
        assert_eq!(call.finish().removed, vec![root.join(".codex")]);

        // During a call, finishing at once (before any rescan).
        let call = guard.begin(&names(&root)).unwrap();
        std::fs::rename(s.path().join("a"), s.path().join("old2")).unwrap();
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir(root.join(".git")).unwrap();
        assert_eq!(call.finish().removed, vec![root.join(".git")]);
        assert!(std::fs::symlink_metadata(root.join(".git")).is_err());
    }

    /// A root deleted and created again between calls (its inode number may well be reused)
    /// loses its watch: the next call sees its deletion event and watches it again, so
    /// its events arrive (no full scan needed).
    #[test]
    fn a_recreated_root_is_watched_again() {
        let s = TempDir::new("watch");
        let root = s.path().join("root");
        std::fs::create_dir_all(&root).unwrap();
        let guard = Guard::for_roots(std::slice::from_ref(&root)).unwrap();
        assert!(guard.begin(&names(&root)).unwrap().finish().is_empty());
        let old_key = lock(&guard.inner.state).dirs[&root].key.clone();
        std::fs::remove_dir(&root).unwrap();
        std::fs::create_dir(&root).unwrap();
        let call = guard.begin(&names(&root)).unwrap();
        let mut state = lock(&guard.inner.state);
        assert_ne!(state.dirs[&root].key, old_key);
        assert!(!state.calls[&call.id].dirty);
        // With the watcher thread held off by the lock, the event alone names the path.
        std::fs::write(root.join("HEAD"), "ref: refs/heads/main\n").unwrap();
        let mut trash = Vec::new();
        drain(&guard.inner, &mut state, &mut trash);
        assert_eq!(
            state.calls[&call.id].report.removed,
            vec![root.join("HEAD")]
        );
        lock(&guard.inner.trash).append(&mut trash);
        drop(state);
        assert_eq!(call.finish().removed, vec![root.join("HEAD")]);
        assert!(std::fs::symlink_metadata(root.join("HEAD")).is_err());
    }

    /// An overflowed event queue has lost events: the calls then active scan every guarded
    /// path at their end, so a name whose event was lost is still taken away.
    #[test]
    fn a_lost_event_after_an_overflow_is_caught_by_the_final_scan() {
        let s = TempDir::new("watch");
        let root = s.path().join("root");
        std::fs::create_dir_all(&root).unwrap();
        let guard = Guard::for_roots(std::slice::from_ref(&root)).unwrap();
        let call = guard.begin(&names(&root)).unwrap();
        let mut state = lock(&guard.inner.state);
        std::fs::create_dir(root.join(".agents")).unwrap();
        // Throw the real event away (as an overflow would) and deliver the overflow marker.
        assert!(
            !guard.inner.notify.read().is_empty(),
            "the creation was queued"
        );
        let mut trash = Vec::new();
        let overflow = [Event {
            dir: None,
            name: Default::default(),
            mask: libc::FAN_Q_OVERFLOW,
            pid: 0,
        }];
        assert!(handle_events(
            &guard.inner,
            &mut state,
            &overflow,
            &mut trash
        ));
        assert!(state.calls[&call.id].dirty);
        drop(state);
        assert_eq!(call.finish().removed, vec![root.join(".agents")]);
        assert!(std::fs::symlink_metadata(root.join(".agents")).is_err());
    }

    /// An idle worker's watcher thread sleeps (no wakeups for names created in its watched
    /// directories between calls); the next call wakes it, and removal is immediate again.
    #[test]
    fn the_parked_watcher_wakes_for_the_next_call() {
        let s = TempDir::new("watch");
        let root = s.path().join("root");
        std::fs::create_dir_all(&root).unwrap();
        let guard = Guard::for_roots(std::slice::from_ref(&root)).unwrap();
        assert!(guard.begin(&names(&root)).unwrap().finish().is_empty());
        let deadline = Instant::now() + PARK_AFTER + Duration::from_secs(5);
        while !lock(&guard.inner.state).parked {
            assert!(Instant::now() < deadline, "the thread never parked");
            std::thread::sleep(Duration::from_millis(50));
        }
        // Created between calls: left alone, though its event is queued for the next call.
        std::fs::write(root.join(".codex"), "host").unwrap();
        let call = guard.begin(&names(&root)).unwrap();
        assert_eq!(call.guarded().len(), 3);
        std::fs::create_dir(root.join(".git")).unwrap();
        assert!(
            wait_gone(&root.join(".git")),
            "the woken thread took it away"
        );
        assert_eq!(call.finish().removed, vec![root.join(".git")]);
        assert!(root.join(".codex").exists());
    }

    #[test]
    fn events_are_trusted_on_local_filesystems_only() {
        let s = TempDir::new("watch");
        let kind = std::process::Command::new("stat")
            .args(["-f", "-c", "%t"])
            .arg(s.path())
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        if ["ef53", "58465342", "9123683e", "1021994", "f2f52010"].contains(&kind.as_str()) {
            assert!(events_complete(s.path()));
        }
        assert!(!events_complete(Path::new("/proc/self")));
        assert!(!events_complete(Path::new("/nonexistent-corral-dir")));
    }
}
