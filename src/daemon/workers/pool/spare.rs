//! Starting a worker process: the socketpair, the fork and exec of `corral __worker` (or
//! `__spare_`), the cgroup it joins, and the spares the pool starts ahead so that a session's
//! worker skips the fork and exec. Kept apart from the [`Worker`](super::Worker) handle because a
//! started process is not yet a worker: it becomes one when it gets its spec
//! (`Worker::specialise`).

use super::WorkerPool;
use super::worker::hung_up;
use crate::daemon::error::CallError;
use crate::sandbox::cgroup::WorkerCgroup;
use crate::sync::LockExt;
use crate::wire::spec::{SPARE_ARG, WORKER_FD};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// How many spare workers ([`Spare`]) the pool keeps started ahead. Two, so that an
/// `OpenSession` right after another still finds one: a replacement is not ready for 10–20 ms
/// (its cgroup join waits for an RCU grace period, see [`Spare`]).
const SPARE_WORKERS: usize = 2;

/// How long after a spare is taken its replacement starts: the fork and exec of the binary
/// take CPU that the open which took the spare needs more (measured: an open after idle time,
/// 6.2 ms with the replacement starting at once). The other spare covers an open meanwhile.
pub(super) const REPLACE_AFTER: Duration = Duration::from_millis(20);

/// The memory limit of a spare's cgroup until a session's spec gives it the session's own: a
/// spare runs only the daemon's code, so this only bounds a fault in it.
const SPARE_MEMORY_BYTES: u64 = 256 * 1024 * 1024;

/// The process limit (threads count) of a spare's cgroup until its session's is set, likewise.
const SPARE_PROCESSES: u64 = 256;

/// A started `corral __worker` that has not received its spec: it has only exec'd and waits on
/// its socketpair, unconfined but holding nothing of anyone (it runs as the daemon, with an empty
/// environment, and only the daemon has the other end of its socket). Prepared ahead so that
/// starting a session's worker skips the fork and exec of the binary. Specialised at most once:
/// the worker reads exactly one spec, and a `Spare` is consumed by [`Worker::specialise`].
///
/// A spare is started **in its own memory cgroup** (when workers get one), which becomes the
/// worker's: moving a process into a cgroup waits for an RCU grace period whenever no other
/// move happened just before (the kernel's `cgroup_threadgroup_rwsem`), 5–16 ms on an idle
/// host, and that wait belongs in the background, not in an `OpenSession`. Only the limit is
/// the session's, written before the spec is sent (H11).
pub struct Spare {
    pub(super) child: tokio::process::Child,
    pub(super) ours: std::os::unix::net::UnixStream,
    /// Declared after `child`: a spare dropped unused is killed before its cgroup is removed.
    pub(super) cgroup: CgroupHold,
}

impl Spare {
    /// Starts a worker process in `cgroup`. A spare started ahead (`ahead`) is named `__spare_`
    /// until it gets its spec (`worker::serve` renames it).
    pub(super) fn start(cgroup: Option<WorkerCgroup>, ahead: bool) -> Result<Spare, CallError> {
        // A session's own worker joins its cgroup before it runs (H11). A spare is moved in
        // from here right after its exec: in a child that joined itself, the wait for the RCU
        // grace period (see [`Spare`]) kept a copy-on-write copy of the daemon alive while the
        // daemon served the next open (measured: an open right after another, 13 ms instead
        // of 4). A spare does nothing before its spec, and its spec comes after the move.
        let join = match ahead {
            true => None,
            false => cgroup
                .as_ref()
                .map(|c| (c.procs_path(), c.pids_procs_path())),
        };
        let cgroup = CgroupHold(cgroup);
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(|e| {
            CallError::Internal(format!("cannot create the worker socketpair: {e}"))
        })?;
        let theirs_fd = theirs.as_raw_fd();
        let mut cmd = tokio::process::Command::new("/proc/self/exe");
        cmd.arg(if ahead { SPARE_ARG } else { "__worker" })
            // The daemon's environment (and any secret in it) never reaches the sandbox.
            .env_clear()
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            // Relayed into the daemon's log (its format, bounded): see worker_log.
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        // SAFETY: between fork and exec we only call dup2/fcntl and the cgroup join (open,
        // write, close of a path built before the fork), all async-signal-safe.
        unsafe {
            cmd.pre_exec(move || {
                // The worker's memory limit covers it and every command from its first
                // instruction (H11).
                if let Some((procs, pids)) = &join {
                    crate::sandbox::cgroup::join_raw(procs)?;
                    // And the process limit, which binds root too (H21).
                    if let Some(pids) = pids {
                        crate::sandbox::cgroup::join_raw(pids)?;
                    }
                }
                if theirs_fd == WORKER_FD {
                    // dup2 onto itself would keep FD_CLOEXEC set; clear it explicitly.
                    if libc::fcntl(theirs_fd, libc::F_SETFD, 0) == -1 {
                        return Err(std::io::Error::last_os_error());
                    }
                } else if libc::dup2(theirs_fd, WORKER_FD) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| CallError::Internal(format!("cannot start a sandbox worker: {e}")))?;
        drop(theirs);
        if let Some(stderr) = child.stderr.take() {
            crate::daemon::workers::worker_log::relay(stderr, child.id());
        }
        if ahead && let Some(cg) = &cgroup.0 {
            // On failure `child` is dropped, which kills it.
            let pid = child
                .id()
                .ok_or_else(|| CallError::Internal("a spare worker exited at once".into()))?;
            cg.add_process(pid).map_err(|e| {
                CallError::Internal(format!("cannot move a spare worker into its cgroup: {e}"))
            })?;
        }
        Ok(Spare {
            child,
            ours,
            cgroup,
        })
    }

    /// The process exited (or closed its end) while waiting.
    fn is_dead(&self) -> bool {
        hung_up(&self.ours)
    }
}

/// A worker's memory cgroup, removed (which may wait for its last processes) on a blocking
/// thread, never on the async runtime.
pub(super) struct CgroupHold(pub(super) Option<WorkerCgroup>);

impl Drop for CgroupHold {
    fn drop(&mut self) {
        if let Some(cg) = self.0.take() {
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    rt.spawn_blocking(move || drop(cg));
                }
                Err(_) => drop(cg),
            }
        }
    }
}

/// The spare workers: ready ones, and how many are being started.
#[derive(Default)]
pub(super) struct Spares {
    pub(super) ready: Vec<Spare>,
    starting: usize,
    /// The daemon is stopping: start no more.
    pub(super) closed: bool,
}

impl WorkerPool {
    pub(super) fn spares(&self) -> std::sync::MutexGuard<'_, Spares> {
        self.spares.locked()
    }

    /// Starts spare workers in the background until [`SPARE_WORKERS`] are ready or starting.
    /// Never waits, and holds no lock while a spare starts.
    pub fn prewarm(&self) {
        self.prewarm_after(Duration::ZERO);
    }

    /// [`Self::prewarm`], with each spare started `delay` from now.
    pub(super) fn prewarm_after(&self, delay: Duration) {
        let mut spares = self.spares();
        while !spares.closed && spares.ready.len() + spares.starting < SPARE_WORKERS {
            spares.starting += 1;
            let shared = self.spares.clone();
            let cgroups = self.cgroups.clone();
            let n = self.spawned.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(async move {
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                    // The daemon may have begun stopping meanwhile: start nothing then.
                    let mut spares = shared.locked();
                    if spares.closed {
                        spares.starting -= 1;
                        return;
                    }
                }
                // The cgroup and the fork of the daemon are made on a blocking thread, not a
                // runtime thread.
                let started = tokio::task::spawn_blocking(move || {
                    let cgroup = match cgroups {
                        Some(cgroups) => Some(
                            cgroups
                                .create(&format!("worker-{n}"), SPARE_MEMORY_BYTES, SPARE_PROCESSES)
                                .map_err(|e| {
                                    CallError::Internal(format!(
                                        "cannot create a spare worker's memory cgroup: {e}"
                                    ))
                                })?,
                        ),
                        None => None,
                    };
                    Spare::start(cgroup, true)
                })
                .await;
                let mut spares = shared.locked();
                spares.starting -= 1;
                match started {
                    Ok(Ok(spare)) if !spares.closed => spares.ready.push(spare),
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => tracing::warn!("cannot start a spare sandbox worker: {e}"),
                    Err(e) => tracing::warn!("spare sandbox worker task: {e}"),
                }
            });
        }
    }

    /// A live spare, if one is ready (dead ones are dropped, which kills and reaps them). The
    /// caller owns it: it leaves the pool for good.
    pub(super) fn take_spare(&self) -> Option<Spare> {
        let mut spares = self.spares();
        while let Some(spare) = spares.ready.pop() {
            if !spare.is_dead() {
                return Some(spare);
            }
        }
        None
    }
}
