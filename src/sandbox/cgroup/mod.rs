//! Per-worker memory limits (spec/sandbox.md §8.6, H11): each worker and everything it runs
//! lives in its own memory cgroup, so no tool call can take the host's memory. Without a cgroup,
//! the daemon sets the worker's `RLIMIT_DATA` instead (`ResourceLimits::data_bytes`, applied by
//! `sandbox::limits`): a per-process ceiling.
//!
//! And a per-worker process limit (H21): `pids.max` in the worker's cgroup (v2) or in a cgroup
//! of the same name in the v1 `pids` hierarchy, because `RLIMIT_NPROC` does not bind uid 0 — a
//! confined root session could otherwise fork until the host's pid table is full.
//!
//! This module finds and manages the cgroups; it does not decide limits (policy) or spawn
//! workers (the pool). Use:
//! 1. [`MemoryCgroups::detect`] once at daemon start; `Err` says why no cgroup can be made.
//! 2. [`MemoryCgroups::create`] before spawning each worker.
//! 3. [`WorkerCgroup::join_self_raw`] in the worker `Command`'s `pre_exec` (async-signal-safe),
//!    so the worker is limited before it runs a single instruction of its own.
//! 4. Keep the [`WorkerCgroup`] as long as the worker; drop it after reaping (the directory is
//!    removed, leftover members killed).
//!
//! And a memory ceiling per user (H21): every worker of a uid lives under that user's parent
//! cgroup `user-<uid>`, whose limit bounds all of them together — one user's sixteen workers
//! cannot take the host's memory even when each stays under its own limit.
//!
//! Layout: `<daemon's own memory cgroup>/corral-workers/daemon-<pid>/user-<uid>/<name>` (a
//! spare, started before its user is known, waits at `daemon-<pid>/<name>` and is moved under
//! its user's group when it gets its session). The per-daemon level keeps daemons that share a
//! cgroup (a test suite, two instances) from colliding on worker names or removing each other's
//! directories.
//!
//! Hierarchies: cgroup v2 when its `memory` controller is available (`memory.max`,
//! `memory.swap.max = 0`), else the v1 `memory` controller (`memory.limit_in_bytes`, and
//! `memory.memsw.limit_in_bytes` to the same value when swap accounting exists, so a worker
//! cannot spill into swap instead of being killed). On v2 the daemon's own cgroup must be able to
//! enable `memory` for its subtree: the root cgroup, or one without processes of its own (the
//! "no internal processes" rule).
//!
//! This file holds the daemon's side: [`MemoryCgroups`] (where workers' cgroups are made, and
//! the per-user groups), the rlimit fallback and the default limit. Its parts:
//! - `worker`: one worker's cgroup, [`WorkerCgroup`], from its limits to its removal, and the
//!   async-signal-safe join;
//! - `detect`: finding a usable hierarchy at start and making this daemon's directory there;
//! - `parse`: the pure parsers of `/proc/self/cgroup`, `mountinfo`, `meminfo` and
//!   `memory.events`, tested without a cgroup.

use detect::{enable, prepare, prepare_v2};
use parse::{mem_total_bytes, own_cgroup_dir};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use worker::{PidsGroup, fresh_dir, set_memory_limit};

mod detect;
mod parse;
mod worker;

pub use worker::{WorkerCgroup, join_raw};

/// Directory made under the daemon's own memory cgroup.
pub const WORKERS_DIR: &str = "corral-workers";

/// The lowest default limit, whatever the host's memory.
pub const MIN_DEFAULT_LIMIT: u64 = 1 << 30;

/// A user's group in this daemon's directory: `user-<uid>`.
const USER_PREFIX: &str = "user-";

/// `pids.max` of the probe cgroup made at detection.
const PROBE_PROCESSES: u64 = 16;

/// Which cgroup hierarchy holds the memory controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    V1,
    V2,
}

/// Where this daemon makes its workers' memory cgroups.
#[derive(Debug)]
pub struct MemoryCgroups {
    version: CgroupVersion,
    /// `.../corral-workers/daemon-<pid>`.
    dir: PathBuf,
    /// Where the workers' process limit goes (H21), when a `pids` controller is usable.
    pids: Option<PidsHome>,
}

/// The `pids` controller: in the memory cgroups themselves (v2), or this daemon's directory in
/// the v1 `pids` hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
enum PidsHome {
    SameDir,
    V1(PathBuf),
}

impl MemoryCgroups {
    /// Finds a memory controller this process may create children in, and makes this daemon's
    /// directory there. `Err` names what is missing (for the health report and the fallback).
    pub fn detect() -> Result<Self, String> {
        let cgroups = fs::read_to_string("/proc/self/cgroup")
            .map_err(|e| format!("reading /proc/self/cgroup: {e}"))?;
        let mountinfo = fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| format!("reading /proc/self/mountinfo: {e}"))?;
        let v2 = match own_cgroup_dir(&cgroups, &mountinfo, CgroupVersion::V2) {
            Some(own) => match prepare_v2(&own) {
                Ok(m) => return Ok(m),
                Err(e) => e,
            },
            None => "no cgroup v2 hierarchy".to_string(),
        };
        let v1 = match own_cgroup_dir(&cgroups, &mountinfo, CgroupVersion::V1) {
            Some(own) => match prepare(CgroupVersion::V1, &own) {
                Ok(m) => return Ok(m),
                Err(e) => e,
            },
            None => "no cgroup v1 memory controller mounted".to_string(),
        };
        Err(format!("no memory cgroup available: v2: {v2}; v1: {v1}"))
    }

    #[cfg(test)]
    /// Whether workers also get a `pids.max` (H21); else only `RLIMIT_NPROC`, which does not
    /// bind root.
    pub fn limits_processes(&self) -> bool {
        self.pids.is_some()
    }

    #[cfg(test)]
    pub fn version(&self) -> CgroupVersion {
        self.version
    }

    #[cfg(test)]
    /// This daemon's directory (`.../corral-workers/daemon-<pid>`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Makes the cgroup `name` (one path component, e.g. `worker-3`) with a memory limit of
    /// `limit_bytes` and, where a `pids` controller is usable, at most `max_processes`
    /// processes. A leftover directory of that name without members is replaced.
    pub fn create(
        &self,
        name: &str,
        limit_bytes: u64,
        max_processes: u64,
    ) -> io::Result<WorkerCgroup> {
        self.create_in(&self.dir, name, limit_bytes, max_processes)
    }

    /// [`Self::create`] under `uid`'s group, whose limit becomes `user_limit` (H21).
    pub fn create_for_user(
        &self,
        uid: u32,
        user_limit: u64,
        name: &str,
        limit_bytes: u64,
        max_processes: u64,
    ) -> io::Result<WorkerCgroup> {
        self.in_user_group(uid, user_limit, |group| {
            self.create_in(group, name, limit_bytes, max_processes)
        })
    }

    /// Moves a spare's worker cgroup `cg`, members and all, under `uid`'s group (limit
    /// `user_limit`), keeping its name, limits and `pids` group. Memory the members were
    /// charged before the move stays with the old group, which is removed: a spare has done
    /// nothing yet but exec.
    pub fn move_to_user(
        &self,
        mut cg: WorkerCgroup,
        uid: u32,
        user_limit: u64,
    ) -> io::Result<WorkerCgroup> {
        let name = cg
            .dir
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| io::Error::other("worker cgroup without a name"))?
            .to_string();
        let moved = self.in_user_group(uid, user_limit, |group| {
            let dir = group.join(&name);
            let procs = fresh_dir(&dir)?;
            Ok(WorkerCgroup {
                version: self.version,
                dir,
                procs,
                pids: None,
            })
        })?;
        moved.copy_limits_from(&cg)?;
        let members = fs::read_to_string(cg.dir.join("cgroup.procs"))
            .map_err(|e| with_path(e, "read", &cg.dir.join("cgroup.procs")))?;
        for pid in members.lines().filter(|l| !l.trim().is_empty()) {
            fs::write(moved.procs_file(), pid.trim())
                .map_err(|e| with_path(e, "write", &moved.procs_file()))?;
        }
        let mut moved = moved;
        moved.pids = cg.pids.take();
        Ok(moved)
    }

    /// Runs `make` in `uid`'s group, made (or its limit rewritten) first. A group emptied and
    /// removed by a worker's drop between the two steps is made again.
    fn in_user_group(
        &self,
        uid: u32,
        user_limit: u64,
        make: impl Fn(&Path) -> io::Result<WorkerCgroup>,
    ) -> io::Result<WorkerCgroup> {
        let group = self.dir.join(format!("{USER_PREFIX}{uid}"));
        let mut last = None;
        for _ in 0..3 {
            self.user_group(&group, user_limit)?;
            match make(&group) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => last = Some(e),
                other => return other,
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("user cgroup vanished")))
    }

    /// Makes the user group `group` if missing and sets its limit. A limit that cannot be
    /// lowered below what the user's workers use now (v1: EBUSY) keeps the old one, logged.
    fn user_group(&self, group: &Path, limit: u64) -> io::Result<()> {
        let made = match fs::create_dir(group) {
            Ok(()) => true,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
            Err(e) => return Err(with_path(e, "mkdir", group)),
        };
        if self.version == CgroupVersion::V2 {
            enable(group, "memory").map_err(io::Error::other)?;
            if self.pids == Some(PidsHome::SameDir) {
                enable(group, "pids").map_err(io::Error::other)?;
            }
        }
        match set_memory_limit(self.version, group, limit) {
            Err(e) if !made => {
                tracing::warn!("keeping the old memory ceiling of {}: {e}", group.display());
                Ok(())
            }
            other => other,
        }
    }

    fn create_in(
        &self,
        parent: &Path,
        name: &str,
        limit_bytes: u64,
        max_processes: u64,
    ) -> io::Result<WorkerCgroup> {
        if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("bad cgroup name {name:?}"),
            ));
        }
        let dir = parent.join(name);
        let procs = fresh_dir(&dir)?;
        // From here the directory is removed again if a limit cannot be written.
        let mut cg = WorkerCgroup {
            version: self.version,
            dir,
            procs,
            pids: None,
        };
        cg.set_limit(limit_bytes)?;
        cg.pids = match &self.pids {
            None => None,
            Some(PidsHome::SameDir) => Some(PidsGroup {
                dir: cg.dir.clone(),
                procs: cg.procs.clone(),
                own_dir: false,
            }),
            Some(PidsHome::V1(home)) => Some(PidsGroup::create(&home.join(name))?),
        };
        cg.set_max_processes(max_processes)?;
        Ok(cg)
    }
}

impl Drop for MemoryCgroups {
    fn drop(&mut self) {
        let _ = fs::remove_dir(&self.dir);
        if let Some(PidsHome::V1(home)) = &self.pids {
            let _ = fs::remove_dir(home);
        }
    }
}

/// The policy default: half the host's memory (`MemTotal`), at least [`MIN_DEFAULT_LIMIT`].
pub fn default_limit_bytes() -> u64 {
    let total = fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| mem_total_bytes(&t))
        .unwrap_or(0);
    (total / 2).max(MIN_DEFAULT_LIMIT)
}

fn with_path(e: io::Error, op: &str, p: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{op} {}: {e}", p.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::testutil::in_child;
    use nix::sys::signal::Signal;
    use nix::sys::wait::WaitStatus;
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU32, Ordering};

    const MIB: u64 = 1 << 20;

    /// One detection for the whole test binary (tests run in parallel in one process).
    fn cgroups() -> Option<&'static MemoryCgroups> {
        static CG: OnceLock<Result<MemoryCgroups, String>> = OnceLock::new();
        match CG.get_or_init(MemoryCgroups::detect) {
            Ok(m) => Some(m),
            Err(why) => {
                eprintln!("skipped: {why}");
                None
            }
        }
    }

    fn unique(tag: &str) -> String {
        static N: AtomicU32 = AtomicU32::new(0);
        format!("test-{tag}-{}", N.fetch_add(1, Ordering::Relaxed))
    }

    /// Maps `bytes` of anonymous memory and writes to every page, so it is really charged.
    fn touch(bytes: usize) -> Result<(), String> {
        // SAFETY: a fresh private anonymous mapping, written within its bounds.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            if p == libc::MAP_FAILED {
                return Err(format!("mmap: {}", io::Error::last_os_error()));
            }
            let base = p.cast::<u8>();
            for off in (0..bytes).step_by(4096) {
                base.add(off).write_volatile(1);
            }
        }
        Ok(())
    }

    #[test]
    fn default_limit_is_half_the_memory_and_at_least_1_gib() {
        let total = mem_total_bytes(&fs::read_to_string("/proc/meminfo").unwrap()).unwrap();
        assert_eq!(default_limit_bytes(), (total / 2).max(1 << 30));
        assert!(default_limit_bytes() >= MIN_DEFAULT_LIMIT);
    }

    #[test]
    fn bad_names_are_refused() {
        let Some(cg) = cgroups() else { return };
        for name in ["", ".", "..", "a/b", "../escape"] {
            let err = cg.create(name, 64 * MIB, 1024).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{name:?}");
        }
    }

    #[test]
    fn a_child_over_the_limit_is_oom_killed_and_one_under_it_runs() {
        let Some(cgs) = cgroups() else { return };
        let cg = cgs.create(&unique("oom"), 64 * MIB, 1024).unwrap();
        let dir = cg.path().to_path_buf();
        assert!(dir.starts_with(cgs.dir()));
        // Baseline: without the cgroup, a child touches 256 MiB and exits normally.
        let free = in_child(|| touch(256 << 20));
        assert!(free.exited_ok(), "baseline: {free:?}");
        // Joined through the pre-exec-safe call, the same child dies of SIGKILL (the OOM killer).
        let killed = in_child(|| {
            cg.join_self_raw().map_err(|e| format!("join: {e}"))?;
            touch(256 << 20)?;
            Err("allocated 256 MiB under a 64 MiB limit".into())
        });
        assert!(
            matches!(killed.status, WaitStatus::Signaled(_, Signal::SIGKILL, _)),
            "expected SIGKILL, got {killed:?}"
        );
        assert!(
            cg.oom_kills().unwrap() >= 1,
            "the OOM killer acted in the cgroup"
        );
        let peak = cg.peak_bytes().unwrap();
        assert!(peak <= 64 * MIB, "peak {peak} above the limit");
        eprintln!("peak charged before the kill: {} KiB", peak / 1024);
        // The allowed path: 16 MiB fits.
        let fits = in_child(|| {
            cg.join_self_raw().map_err(|e| format!("join: {e}"))?;
            touch(16 << 20)
        });
        assert!(fits.exited_ok(), "16 MiB under 64 MiB: {fits:?}");
        // The host (this process) is untouched and the directory goes with the handle.
        drop(cg);
        assert!(!dir.exists(), "{} left behind", dir.display());
    }

    /// H21: `pids.max` binds a root process, which `RLIMIT_NPROC` does not.
    #[test]
    fn a_users_workers_together_stay_under_the_users_ceiling() {
        let Some(cgs) = cgroups() else { return };
        let uid = 4_000_000_000 + std::process::id() % 1000;
        // Each worker may have 256 MiB; the user's two together 96 MiB.
        let a = cgs
            .create_for_user(uid, 96 * MIB, &unique("ua"), 256 * MIB, 1024)
            .unwrap();
        let b = cgs
            .create_for_user(uid, 96 * MIB, &unique("ub"), 256 * MIB, 1024)
            .unwrap();
        let group = a.path().parent().unwrap().to_path_buf();
        assert_eq!(group, cgs.dir().join(format!("user-{uid}")));
        assert_eq!(b.path().parent().unwrap(), group);
        // One worker alone over the ceiling: killed although under its own limit.
        let killed = in_child(|| {
            a.join_self_raw().map_err(|e| format!("join: {e}"))?;
            touch(128 << 20)?;
            Err("allocated 128 MiB under a 96 MiB user ceiling".into())
        });
        assert!(
            matches!(killed.status, WaitStatus::Signaled(_, Signal::SIGKILL, _)),
            "expected SIGKILL, got {killed:?}"
        );
        // Under it: fine, in either worker.
        let fits = in_child(|| {
            b.join_self_raw().map_err(|e| format!("join: {e}"))?;
            touch(32 << 20)
        });
        assert!(fits.exited_ok(), "32 MiB under 96 MiB: {fits:?}");
        // A spare moved in keeps its limit and joins the same ceiling.
        let spare = cgs.create(&unique("spare"), 200 * MIB, 1024).unwrap();
        let old = spare.path().to_path_buf();
        let moved = cgs.move_to_user(spare, uid, 96 * MIB).unwrap();
        assert_eq!(moved.path().parent().unwrap(), group);
        assert!(!old.exists(), "the spare's old group is gone");
        let limit = fs::read_to_string(moved.path().join(match cgs.version() {
            CgroupVersion::V1 => "memory.limit_in_bytes",
            CgroupVersion::V2 => "memory.max",
        }))
        .unwrap();
        assert_eq!(limit.trim(), (200 * MIB).to_string());
        // The last worker out removes the user's group.
        drop((a, b));
        assert!(group.exists(), "still in use by the moved spare");
        drop(moved);
        assert!(!group.exists(), "{} left behind", group.display());
    }

    #[test]
    fn root_cannot_fork_past_the_process_limit() {
        let Some(cgs) = cgroups() else { return };
        if !cgs.limits_processes() || !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: no pids controller, or not root");
            return;
        }
        let cg = cgs.create(&unique("pids"), 256 * MIB, 8).unwrap();
        assert!(cg.limits_processes());
        // Forks until refused (children wait on a pipe), counts them, releases them.
        let cg = &cg;
        let forks = |join: bool| {
            in_child(move || {
                if join {
                    cg.join_self_raw().map_err(|e| format!("join: {e}"))?;
                }
                // SAFETY: setrlimit with a valid struct; RLIMIT_NPROC does not bind root.
                unsafe {
                    let one = libc::rlimit {
                        rlim_cur: 4,
                        rlim_max: 4,
                    };
                    libc::setrlimit(libc::RLIMIT_NPROC, &one);
                }
                let mut n = 0;
                while n < 32 {
                    // SAFETY: the child only pauses briefly and exits.
                    match unsafe { libc::fork() } {
                        0 => unsafe {
                            libc::usleep(300_000);
                            libc::_exit(0)
                        },
                        -1 => break,
                        _ => n += 1,
                    }
                }
                if join == (n < 8) {
                    Ok(())
                } else {
                    Err(format!("forked {n} (joined: {join})"))
                }
            })
        };
        // Baseline: RLIMIT_NPROC of 4 does not stop root; in the cgroup, fewer than 8 start.
        assert!(forks(false).exited_ok(), "baseline");
        assert!(forks(true).exited_ok(), "in the cgroup");
    }

    #[test]
    fn a_command_joins_in_pre_exec_and_leftovers_are_killed_on_drop() {
        use std::os::unix::process::CommandExt;
        let Some(cgs) = cgroups() else { return };
        let cg = std::sync::Arc::new(cgs.create(&unique("cmd"), 256 * MIB, 1024).unwrap());
        let dir = cg.path().to_path_buf();
        let joined = cg.clone();
        let mut cmd = std::process::Command::new("sleep");
        cmd.arg("60");
        // SAFETY: join_self_raw is async-signal-safe.
        unsafe { cmd.pre_exec(move || joined.join_self_raw()) };
        let mut child = cmd.spawn().unwrap();
        let procs = fs::read_to_string(dir.join("cgroup.procs")).unwrap();
        assert_eq!(
            procs.trim(),
            child.id().to_string(),
            "the command is the only member"
        );
        // Dropped while the member still runs (a descendant that outlived its worker): the
        // member is killed and the directory removed anyway.
        drop(cmd);
        let cg = std::sync::Arc::into_inner(cg).expect("last handle");
        drop(cg);
        assert!(!dir.exists(), "{} left behind", dir.display());
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL));
    }

    #[test]
    fn a_limit_can_be_raised_and_lowered_with_a_member_inside() {
        let Some(cgs) = cgroups() else { return };
        let cg = cgs.create(&unique("relimit"), 256 * MIB, 1024).unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        fs::write(cg.path().join("cgroup.procs"), child.id().to_string()).unwrap();
        let files: &[&str] = match cg.version {
            CgroupVersion::V1 => &["memory.limit_in_bytes", "memory.memsw.limit_in_bytes"],
            CgroupVersion::V2 => &["memory.max"],
        };
        // Up (v1: memory+swap must move first) and down (it must move last).
        for bytes in [4096 * MIB, 48 * MIB, 1024 * MIB] {
            cg.set_limit(bytes)
                .unwrap_or_else(|e| panic!("to {bytes}: {e}"));
            for file in files {
                match fs::read_to_string(cg.path().join(file)) {
                    Ok(text) => assert_eq!(text.trim(), bytes.to_string(), "{file}"),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => panic!("{file}: {e}"),
                }
            }
        }
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn a_stale_directory_of_the_same_name_is_replaced() {
        let Some(cgs) = cgroups() else { return };
        let name = unique("stale");
        fs::create_dir(cgs.dir().join(&name)).unwrap();
        let cg = cgs.create(&name, 32 * MIB, 1024).unwrap();
        let limit_file = match cg.version {
            CgroupVersion::V1 => "memory.limit_in_bytes",
            CgroupVersion::V2 => "memory.max",
        };
        let limit = fs::read_to_string(cg.path().join(limit_file)).unwrap();
        assert_eq!(limit.trim(), (32 * MIB).to_string());
    }
}
