//! One worker's cgroup ([`WorkerCgroup`]): its memory limit (swap included) and `pids.max`, the
//! async-signal-safe join a forked child makes before `exec`, moving other processes in, the
//! OOM-kill count, and removal when the worker is gone (killing members that outlived it).
//! Apart from the daemon's side (`mod.rs`) because this is what lives as long as one worker and
//! runs, in part, between `fork` and `exec`.

use super::parse::keyed_value;
use super::{CgroupVersion, USER_PREFIX, with_path};
use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// One worker's memory cgroup; removed on drop.
#[derive(Debug)]
pub struct WorkerCgroup {
    pub(super) version: CgroupVersion,
    pub(super) dir: PathBuf,
    /// `<dir>/cgroup.procs`, built before any fork so joining allocates nothing.
    pub(super) procs: CString,
    /// Where `pids.max` is written: `dir` itself (v2) or the v1 `pids` group, removed on drop.
    pub(super) pids: Option<PidsGroup>,
}

/// A worker's cgroup in the v1 `pids` hierarchy (or, on v2, its memory cgroup's directory).
#[derive(Debug)]
pub(super) struct PidsGroup {
    pub(super) dir: PathBuf,
    pub(super) procs: CString,
    /// Removed on drop (v1 only: on v2 it is the memory cgroup's own directory).
    pub(super) own_dir: bool,
}

impl PidsGroup {
    pub(super) fn create(dir: &Path) -> io::Result<PidsGroup> {
        Ok(PidsGroup {
            procs: fresh_dir(dir)?,
            dir: dir.to_path_buf(),
            own_dir: true,
        })
    }
}

impl Drop for PidsGroup {
    /// Removes a v1 group once its last member is gone (the memory cgroup's drop killed them).
    fn drop(&mut self) {
        if self.own_dir {
            remove_when_empty(&self.dir, || kill_listed_members(&self.dir));
        }
    }
}

/// Makes the cgroup directory `dir` (replacing a leftover one without members); its
/// `cgroup.procs` path, built now so that joining from a forked child allocates nothing.
pub(super) fn fresh_dir(dir: &Path) -> io::Result<CString> {
    if let Err(e) = fs::create_dir(dir) {
        if e.kind() != io::ErrorKind::AlreadyExists {
            return Err(with_path(e, "mkdir", dir));
        }
        fs::remove_dir(dir).map_err(|e| with_path(e, "rmdir stale", dir))?;
        fs::create_dir(dir).map_err(|e| with_path(e, "mkdir", dir))?;
    }
    CString::new(dir.join("cgroup.procs").as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

/// Removes the cgroup directory `dir`. A cgroup stays busy for a moment after its last member
/// is reaped (v1 offlines the memory first), hence the retries; `kill` runs on members still
/// alive after the first attempts. Never panics; gives up after about a second.
fn remove_when_empty(dir: &Path, kill: impl Fn()) {
    for attempt in 0..40 {
        match fs::remove_dir(dir) {
            Ok(()) => return,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return,
            Err(_) => {
                if attempt == 3 {
                    kill();
                }
                std::thread::sleep(Duration::from_millis(5 * (attempt.min(5) + 1)));
            }
        }
    }
}

/// Sets the memory limit of the cgroup `dir`, swap included (v2 `memory.max` and
/// `memory.swap.max = 0`; v1 `memory.limit_in_bytes` and `memory.memsw.limit_in_bytes`).
pub(super) fn set_memory_limit(version: CgroupVersion, dir: &Path, bytes: u64) -> io::Result<()> {
    let write = |file: &str, value: u64| {
        let p = dir.join(file);
        fs::write(&p, value.to_string()).map_err(|e| with_path(e, "write", &p))
    };
    let write_if_present = |file: &str, value: u64| match write(file, value) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    };
    match version {
        CgroupVersion::V2 => {
            write("memory.max", bytes)?;
            write_if_present("memory.swap.max", 0)
        }
        CgroupVersion::V1 => {
            // v1 refuses any step that leaves memory+swap below memory (EINVAL): a raised
            // limit takes memory+swap first, a lowered one takes it last.
            match write_if_present("memory.memsw.limit_in_bytes", bytes) {
                Err(e) if e.kind() == io::ErrorKind::InvalidInput => {
                    write("memory.limit_in_bytes", bytes)?;
                    write("memory.memsw.limit_in_bytes", bytes)?;
                }
                other => {
                    other?;
                    write("memory.limit_in_bytes", bytes)?;
                }
            }
            // Without swap accounting, at least prefer reclaiming cache to swapping.
            write_if_present("memory.swappiness", 0)
        }
    }
}

/// SIGKILLs every process `dir/cgroup.procs` lists.
fn kill_listed_members(dir: &Path) {
    if let Ok(text) = fs::read_to_string(dir.join("cgroup.procs")) {
        for pid in text.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            // SAFETY: signalling a pid; a member that exited meanwhile gives ESRCH.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

impl WorkerCgroup {
    #[cfg(test)]
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Sets (or changes: a spare's cgroup gets its session's limit later) the memory limit of
    /// everything in the cgroup, swap included.
    pub fn set_limit(&self, bytes: u64) -> io::Result<()> {
        set_memory_limit(self.version, &self.dir, bytes)
    }

    /// Gives this (new, empty) cgroup the memory limit `other` has.
    pub(super) fn copy_limits_from(&self, other: &WorkerCgroup) -> io::Result<()> {
        let file = match self.version {
            CgroupVersion::V1 => "memory.limit_in_bytes",
            CgroupVersion::V2 => "memory.max",
        };
        let p = other.dir.join(file);
        let text = fs::read_to_string(&p).map_err(|e| with_path(e, "read", &p))?;
        let bytes = match text.trim() {
            "max" => u64::MAX,
            n => n.parse().map_err(|e| {
                io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", p.display()))
            })?,
        };
        self.set_limit(bytes)
    }

    pub(super) fn procs_file(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    /// Sets (or changes, for a spare given its session's limits) how many processes the worker
    /// and its commands may have at once (`pids.max`), where a `pids` controller is usable.
    pub fn set_max_processes(&self, max: u64) -> io::Result<()> {
        match &self.pids {
            Some(g) => {
                let p = g.dir.join("pids.max");
                fs::write(&p, max.to_string()).map_err(|e| with_path(e, "write", &p))
            }
            None => Ok(()),
        }
    }

    #[cfg(test)]
    /// Whether this worker's processes are counted by a `pids` cgroup.
    pub fn limits_processes(&self) -> bool {
        self.pids.is_some()
    }

    #[cfg(test)]
    /// Moves the calling process into this cgroup (and its v1 `pids` group). Async-signal-safe
    /// (only `open`, `write` and `close` on paths built in advance), so it may run in a
    /// `pre_exec` closure after `fork`.
    pub fn join_self_raw(&self) -> io::Result<()> {
        join_raw(&self.procs)?;
        match &self.pids {
            Some(g) if g.own_dir => join_raw(&g.procs),
            _ => Ok(()),
        }
    }
}

/// Moves the calling process into the cgroup whose `cgroup.procs` is `procs`: only `open`,
/// `write` and `close`, so it is safe between `fork` and `exec`.
pub fn join_raw(procs: &CString) -> io::Result<()> {
    {
        // SAFETY: a valid NUL-terminated path; a static one-byte buffer; our own fd.
        unsafe {
            let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            let n = libc::write(fd, b"0".as_ptr().cast(), 1);
            // Read errno before close can change it.
            let err = (n != 1).then(io::Error::last_os_error);
            libc::close(fd);
            match err {
                Some(e) => Err(e),
                None => Ok(()),
            }
        }
    }
}

impl WorkerCgroup {
    /// The path a forked child writes to join this cgroup (see [`join_raw`]); a copy, so a
    /// `pre_exec` closure holds no reference to the cgroup itself.
    pub fn procs_path(&self) -> CString {
        self.procs.clone()
    }

    /// The v1 `pids` group's `cgroup.procs`, to join as well (see [`join_raw`]).
    pub fn pids_procs_path(&self) -> Option<CString> {
        self.pids
            .as_ref()
            .filter(|g| g.own_dir)
            .map(|g| g.procs.clone())
    }

    /// Moves another process (by pid) into this cgroup (and its v1 `pids` group).
    pub fn add_process(&self, pid: u32) -> io::Result<()> {
        let p = self.dir.join("cgroup.procs");
        fs::write(&p, pid.to_string()).map_err(|e| with_path(e, "write", &p))?;
        if let Some(g) = self.pids.as_ref().filter(|g| g.own_dir) {
            let p = g.dir.join("cgroup.procs");
            fs::write(&p, pid.to_string()).map_err(|e| with_path(e, "write", &p))?;
        }
        Ok(())
    }

    /// How many times the kernel's OOM killer acted in this cgroup (v1 `memory.oom_control`,
    /// v2 `memory.events`), so the pool can say a worker died of its memory limit.
    pub fn oom_kills(&self) -> io::Result<u64> {
        let file = match self.version {
            CgroupVersion::V1 => "memory.oom_control",
            CgroupVersion::V2 => "memory.events",
        };
        let p = self.dir.join(file);
        let text = fs::read_to_string(&p).map_err(|e| with_path(e, "read", &p))?;
        Ok(keyed_value(&text, "oom_kill").unwrap_or(0))
    }

    #[cfg(test)]
    /// Peak memory charged to the cgroup (v1 `memory.max_usage_in_bytes`, v2 `memory.peak`).
    pub fn peak_bytes(&self) -> io::Result<u64> {
        let file = match self.version {
            CgroupVersion::V1 => "memory.max_usage_in_bytes",
            CgroupVersion::V2 => "memory.peak",
        };
        let p = self.dir.join(file);
        let text = fs::read_to_string(&p).map_err(|e| with_path(e, "read", &p))?;
        text.trim().parse().map_err(|e| {
            io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", p.display()))
        })
    }

    /// SIGKILLs the members left in the cgroup (descendants that outlived the reaped worker).
    fn kill_members(&self) {
        if self.version == CgroupVersion::V2 && fs::write(self.dir.join("cgroup.kill"), "1").is_ok()
        {
            return;
        }
        kill_listed_members(&self.dir);
    }
}

impl Drop for WorkerCgroup {
    /// Removes the directory (see [`remove_when_empty`]), killing members still alive, and
    /// its user's group if this was the user's last worker (busy otherwise: left).
    fn drop(&mut self) {
        remove_when_empty(&self.dir, || self.kill_members());
        if let Some(group) = self.dir.parent().filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(USER_PREFIX))
        }) {
            let _ = fs::remove_dir(group);
        }
    }
}
