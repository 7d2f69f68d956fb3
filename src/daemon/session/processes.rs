//! Where a session's long-lived processes live. A session's processes can be spread over
//! several workers: its sandboxed worker, the danger-full-access worker of its escalated calls,
//! and a worker it left when its protection changed (the processes stay where they started).
//! The daemon draws every process id, so ids are unique in the session across those workers,
//! and routes each call that names a process to the worker that has it.
//!
//! Each kept process also holds one of its owner's running-command slots until it is gone, so
//! long-lived processes count against the policy's `max_concurrent_commands`.

use crate::daemon::session::slots::Slot;
use crate::sandbox::policy::SandboxPolicy;
use crate::sync::LockExt;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// The worker a process lives in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Home {
    /// The policy (pool key) of its worker.
    pub policy: SandboxPolicy,
    /// That worker is the session's danger-full-access one.
    pub escalated: bool,
}

struct Kept {
    home: Home,
    /// Frees the owner's running-command slot when the process is gone.
    _slot: Option<Slot>,
}

/// A session's processes, by id.
#[derive(Clone, Default)]
pub struct ProcessHomes {
    inner: Arc<Mutex<HashMap<i32, Kept>>>,
}

impl std::fmt::Debug for ProcessHomes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.lock().keys()).finish()
    }
}

impl ProcessHomes {
    fn lock(&self) -> MutexGuard<'_, HashMap<i32, Kept>> {
        self.inner.locked()
    }

    /// A fresh id no process of the session has.
    pub fn draw_id(&self) -> i32 {
        let kept = self.lock();
        loop {
            let id = crate::tools::unified_exec::table::random_id();
            if !kept.contains_key(&id) {
                return id;
            }
        }
    }

    /// Where process `id` lives, if the session keeps it.
    pub fn home_of(&self, id: i32) -> Option<Home> {
        self.lock().get(&id).map(|k| k.home.clone())
    }

    /// What a worker reported after a call: processes it now keeps (the first takes the call's
    /// running-command slot) and processes it no longer keeps.
    pub fn record(&self, home: &Home, kept: &[i32], ended: &[i32], mut slot: Option<Slot>) {
        let mut all = self.lock();
        for id in ended {
            all.remove(id);
        }
        for id in kept {
            all.insert(
                *id,
                Kept {
                    home: home.clone(),
                    _slot: slot.take(),
                },
            );
        }
    }

    /// Whether any process lives in the worker of `policy`.
    pub fn lives_in(&self, policy: &SandboxPolicy) -> bool {
        self.lock().values().any(|k| k.home.policy == *policy)
    }

    /// The distinct workers the session's processes live in.
    pub fn homes(&self) -> Vec<Home> {
        let mut homes: Vec<Home> = Vec::new();
        for k in self.lock().values() {
            if !homes.contains(&k.home) {
                homes.push(k.home.clone());
            }
        }
        homes
    }

    /// Whether process `id` was started by an escalated call.
    pub fn is_escalated(&self, id: i32) -> bool {
        self.lock().get(&id).is_some_and(|k| k.home.escalated)
    }

    /// Forgets every process (the session closed; their workers killed them).
    pub fn clear(&self) {
        self.lock().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> SandboxPolicy {
        SandboxPolicy::bare(crate::sandbox::policy::Mode::ReadOnly, "/")
    }

    fn home(escalated: bool) -> Home {
        Home {
            policy: policy(),
            escalated,
        }
    }

    #[test]
    fn records_routes_and_forgets() {
        let h = ProcessHomes::default();
        let id = h.draw_id();
        assert!((1_000..100_000).contains(&id));
        h.record(&home(true), &[id], &[], None);
        assert_eq!(h.home_of(id), Some(home(true)));
        assert!(h.is_escalated(id));
        assert!(h.lives_in(&policy()));
        assert_eq!(h.homes().len(), 1);
        h.record(&home(true), &[], &[id], None);
        assert_eq!(h.home_of(id), None);
        assert!(!h.lives_in(&policy()));
    }

    #[test]
    fn drawn_ids_avoid_kept_ones() {
        let h = ProcessHomes::default();
        let kept: Vec<i32> = (1_000..99_999).collect();
        h.record(&home(false), &kept, &[], None);
        // Only 99 999 is free.
        assert_eq!(h.draw_id(), 99_999);
    }
}
