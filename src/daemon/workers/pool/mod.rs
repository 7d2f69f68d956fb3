//! Sandbox workers: one confined process per effective policy, spawned on demand, shared by the
//! sessions with that policy, dropped when the last of them closes, replaced when one dies.
//!
//! A worker is a re-exec of this binary (`corral __worker`), so confinement happens in a fresh
//! single-threaded process (DESIGN.md §1). Calls travel as frames over a socketpair; a worker
//! that dies fails only the calls in flight on it.
//!
//! This file is the pool itself: the workers by policy, the sessions counted on each, and the
//! spawn of a policy's worker (from a spare when one is ready) and the shutdown of all. The
//! rest, one room each:
//! - `spare`: starting a worker process (fork, exec, cgroup join) and the spares started ahead;
//! - `worker`: the [`Worker`] handle, its birth (spec, ready), its writer and reader tasks, and
//!   its reaping;
//! - `call`: sending a call to a worker, and the [`CallHandle`] that cancels it on drop and
//!   returns flow-control [`Credits`].

mod call;
mod spare;
mod worker;

pub use call::{CallHandle, Credits};
pub use worker::Worker;

use crate::daemon::error::CallError;
use crate::sandbox::cgroup::MemoryCgroups;
use crate::sandbox::policy::SandboxPolicy;
use crate::sandbox::report::Layer;
use crate::sync::LockExt;
use crate::wire::spec::WorkerSpec;
use spare::{REPLACE_AFTER, Spare, Spares};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use worker::LIVE;

/// One policy's worker slot: the worker (started on first use, replaced when it died) and the
/// number of sessions using it.
struct PoolEntry {
    /// Held only by calls for this policy while they start or replace its worker: a slow spawn
    /// (a hung mount, a loaded host) never stalls another policy, let alone another user
    /// (spec/sandbox.md §8.6 H5).
    worker: Arc<tokio::sync::Mutex<Option<Arc<Worker>>>>,
    users: usize,
}

/// The workers by policy (whose key includes the pinned root identities, H4).
#[derive(Clone)]
pub struct WorkerPool {
    /// Short critical sections only; never held across an await.
    workers: Arc<Mutex<HashMap<SandboxPolicy, PoolEntry>>>,
    degraded: Vec<Layer>,
    /// Where each worker gets its memory cgroup; `None` (no controller this daemon may use):
    /// workers fall back to RLIMIT_DATA.
    cgroups: Option<Arc<MemoryCgroups>>,
    /// Why there is none (e.g. a daemon that is not root may not write its cgroup).
    no_cgroup_because: Option<Arc<str>>,
    spawned: Arc<AtomicU64>,
    /// Workers started ahead, not yet given a spec; shared by nobody (see [`Spare`]).
    spares: Arc<Mutex<Spares>>,
}

impl WorkerPool {
    pub fn new(degraded: Vec<Layer>) -> Self {
        let (cgroups, no_cgroup_because) = match MemoryCgroups::detect() {
            Ok(c) => (Some(Arc::new(c)), None),
            Err(why) => {
                tracing::warn!(
                    "no memory cgroup for sandbox workers ({why}); their memory is limited by \
                     RLIMIT_DATA per process instead"
                );
                (None, Some(Arc::from(why)))
            }
        };
        Self {
            workers: Arc::default(),
            degraded,
            cgroups,
            no_cgroup_because,
            spawned: Arc::default(),
            spares: Arc::default(),
        }
    }

    /// Whether workers get a memory cgroup (else the RLIMIT_DATA fallback applies).
    pub fn has_memory_cgroups(&self) -> bool {
        self.cgroups.is_some()
    }

    /// Why workers get no memory cgroup, when they do not.
    pub fn no_memory_cgroup_because(&self) -> Option<&str> {
        self.no_cgroup_because.as_deref()
    }

    pub fn degraded(&self) -> &[Layer] {
        &self.degraded
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<SandboxPolicy, PoolEntry>> {
        self.workers.locked()
    }

    /// The slot of `policy`, created if missing; `join` counts one more session on it.
    fn slot(
        &self,
        policy: &SandboxPolicy,
        join: bool,
    ) -> Arc<tokio::sync::Mutex<Option<Arc<Worker>>>> {
        let mut table = self.table();
        let join_slot = |entry: &mut PoolEntry| {
            if join || entry.users == 0 {
                entry.users += 1;
            }
            entry.worker.clone()
        };
        // Looked up first: a policy is cloned only for a new slot, not on every call.
        if let Some(entry) = table.get_mut(policy) {
            return join_slot(entry);
        }
        join_slot(table.entry(policy.clone()).or_insert_with(|| PoolEntry {
            worker: Arc::default(),
            users: 0,
        }))
    }

    /// The live worker in `slot`, starting one if there is none or it died.
    async fn live(
        &self,
        policy: &SandboxPolicy,
        slot: &tokio::sync::Mutex<Option<Arc<Worker>>>,
    ) -> Result<Arc<Worker>, CallError> {
        let mut current = slot.lock().await;
        let replaces_a_dead_worker = match current.as_ref() {
            Some(worker) if !worker.is_dead() => return Ok(worker.clone()),
            Some(_) => {
                tracing::info!(
                    mode = policy.mode.as_str(),
                    "replacing a sandbox worker that exited"
                );
                true
            }
            None => false,
        };
        // A stop is the session's, not the process's (H18): dying does not undo it.
        let stopped_by = current.as_ref().and_then(|w| w.stopped());
        let worker = self
            .spawn(policy, replaces_a_dead_worker, stopped_by)
            .await?;
        *current = Some(worker.clone());
        Ok(worker)
    }

    /// A session starts using `policy`: make sure a live worker exists for it.
    pub async fn acquire(&self, policy: &SandboxPolicy) -> Result<Arc<Worker>, CallError> {
        let slot = self.slot(policy, true);
        match self.live(policy, &slot).await {
            Ok(worker) => Ok(worker),
            Err(e) => {
                self.release(policy).await;
                Err(e)
            }
        }
    }

    /// The live worker for `policy`, replacing one that died.
    pub async fn get(&self, policy: &SandboxPolicy) -> Result<Arc<Worker>, CallError> {
        let slot = self.slot(policy, false);
        self.live(policy, &slot).await
    }

    /// The protected path whose creation stopped the worker for `policy` (H18), if it did.
    pub async fn stopped(&self, policy: &SandboxPolicy) -> Option<PathBuf> {
        let slot = self.table().get(policy).map(|e| e.worker.clone())?;
        let current = slot.lock().await;
        current.as_ref().and_then(|w| w.stopped())
    }

    /// The live worker for `policy`, if there is one (never starts one).
    pub async fn existing(&self, policy: &SandboxPolicy) -> Option<Arc<Worker>> {
        let slot = self.table().get(policy).map(|e| e.worker.clone())?;
        let current = slot.lock().await;
        current.as_ref().filter(|w| !w.is_dead()).cloned()
    }

    /// A session stopped using `policy`; the last one out drops the worker (it exits on EOF
    /// once the calls still holding it are done).
    pub async fn release(&self, policy: &SandboxPolicy) {
        let mut table = self.table();
        if let Some(entry) = table.get_mut(policy) {
            entry.users = entry.users.saturating_sub(1);
            if entry.users == 0 {
                table.remove(policy);
            }
        }
    }

    async fn spawn(
        &self,
        policy: &SandboxPolicy,
        replaces_a_dead_worker: bool,
        stopped_by: Option<PathBuf>,
    ) -> Result<Arc<Worker>, CallError> {
        // A spare is only usable if it sits in a cgroup whenever workers get one.
        let spare = self
            .take_spare()
            .filter(|s| s.cgroup.0.is_some() == self.cgroups.is_some());
        // Replace the spare taken (or start the first), once this open has had the CPU.
        self.prewarm_after(REPLACE_AFTER);
        let limit = policy.limits.memory_bytes;
        let processes = policy.limits.processes;
        // Every worker of a user lives under that user's ceiling (H21).
        let uid = policy
            .identity
            .as_ref()
            .map_or_else(|| nix::unistd::geteuid().as_raw(), |i| i.uid);
        let user_limit = policy.limits.user_memory_bytes;
        let cgroups = self.cgroups.clone();
        let cant_limit = |e: &dyn std::fmt::Display| {
            CallError::Unmet(format!(
                "sandbox unavailable: limits could not be applied: cannot create the worker's \
                 memory cgroup or set its limit: {e}. Check the daemon may write its cgroup"
            ))
        };
        let spare = match spare {
            // The session's limit goes on before the spec, so it covers everything the worker
            // does for the session (H11). No process moves between cgroups here.
            Some(mut spare) => {
                let spare = tokio::task::spawn_blocking(move || {
                    if let (Some(cg), Some(cgroups)) = (spare.cgroup.0.take(), &cgroups) {
                        let cg = cgroups.move_to_user(cg, uid, user_limit)?;
                        cg.set_limit(limit)?;
                        cg.set_max_processes(processes)?;
                        spare.cgroup.0 = Some(cg);
                    }
                    Ok::<_, std::io::Error>(spare)
                })
                .await
                .map_err(|e| CallError::Internal(format!("memory cgroup task: {e}")))?;
                spare.map_err(|e| cant_limit(&e))?
            }
            // No spare ready (opens back to back): a worker of its own, started in its cgroup.
            None => {
                let cgroup = match &self.cgroups {
                    Some(cgroups) => {
                        let n = self.spawned.fetch_add(1, Ordering::Relaxed);
                        let cgroups = cgroups.clone();
                        let made = tokio::task::spawn_blocking(move || {
                            cgroups.create_for_user(
                                uid,
                                user_limit,
                                &format!("worker-{n}"),
                                limit,
                                processes,
                            )
                        })
                        .await
                        .map_err(|e| CallError::Internal(format!("memory cgroup task: {e}")))?;
                        Some(made.map_err(|e| cant_limit(&e))?)
                    }
                    None => None,
                };
                Spare::start(cgroup, false)?
            }
        };
        let spec = WorkerSpec {
            policy: policy.clone(),
            degraded: self.degraded.clone(),
            replaces_a_dead_worker,
            stopped_by,
        };
        Worker::specialise(spare, &spec).await
    }

    /// Stops every worker (the daemon is shutting down and no call is left on them): kills each,
    /// waits until it is reaped, and kills the commands of danger-full-access workers that
    /// outlived them (`orphans`). Bounded: a few seconds at most.
    pub async fn shutdown(&self) {
        // Spares never got a spec: dropping them kills them.
        let spares: Vec<Spare> = {
            let mut spares = self.spares();
            spares.closed = true;
            spares.ready.drain(..).collect()
        };
        drop(spares);
        // Every worker process, also those no session uses any more that are still finishing.
        let workers: Vec<_> = LIVE.locked().drain(..).collect();
        for (stop, _) in &workers {
            stop.notify_one();
        }
        for (_, mut reaped) in workers {
            let _ = tokio::time::timeout(Duration::from_secs(3), reaped.wait_for(|r| *r)).await;
        }
        let _ = tokio::task::spawn_blocking(crate::daemon::workers::orphans::kill_adopted).await;
    }

    // Added for the per-user worker cap (H12, policy `max_workers`); keep when rewriting.
    /// Live workers running as `uid` (a worker without an identity runs as the daemon's uid),
    /// and whether `policy` already has one (opening a session for it spawns nothing new).
    pub async fn workers_of(&self, uid: u32, policy: &SandboxPolicy) -> (usize, bool) {
        let daemon_uid = nix::unistd::geteuid().as_raw();
        let table = self.table();
        // A slot whose worker is being started right now counts: it will be live.
        let live = |e: &PoolEntry| {
            e.worker
                .try_lock()
                .map(|w| w.as_ref().is_some_and(|w| !w.is_dead()))
                .unwrap_or(true)
        };
        let count = table
            .iter()
            .filter(|(p, e)| live(e) && p.identity.as_ref().map_or(daemon_uid, |i| i.uid) == uid)
            .count();
        let exists = table.get(policy).is_some_and(live);
        (count, exists)
    }
}
