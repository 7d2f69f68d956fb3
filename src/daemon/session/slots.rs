//! Shell commands running now, per user: the policy's `max_concurrent_commands` and the
//! running-commands metric. A slot is held for the whole command and freed on drop.

use crate::daemon::error::CallError;
use crate::daemon::session::sessions::Session;
use crate::sync::LockExt;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

#[derive(Clone, Default)]
pub struct RunningCommands {
    by_uid: Arc<Mutex<HashMap<u32, usize>>>,
}

/// One running command; dropping it frees the slot.
pub struct Slot {
    running: RunningCommands,
    uid: u32,
}

impl RunningCommands {
    /// Takes a slot for one of `session`'s owner's commands, or refuses with the rule's name.
    pub fn start(&self, session: &Session) -> Result<Slot, CallError> {
        let uid = session.owner_uid();
        let mut by_uid = self.by_uid.locked();
        let running = by_uid.entry(uid).or_default();
        if let Some(rule) = session.rule()
            && *running >= rule.max_concurrent_commands
        {
            return Err(CallError::exhausted(format!(
                "uid {uid} already runs {running} commands, the most policy rule `{}` allows; \
                 wait for one to finish",
                rule.name
            )));
        }
        *running += 1;
        metrics::gauge!(crate::daemon::metrics::RUNNING_COMMANDS).increment(1.0);
        Ok(Slot {
            running: self.clone(),
            uid,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut by_uid = self.running.by_uid.locked();
        if let Some(n) = by_uid.get_mut(&self.uid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                by_uid.remove(&self.uid);
            }
        }
        metrics::gauge!(crate::daemon::metrics::RUNNING_COMMANDS).decrement(1.0);
    }
}
