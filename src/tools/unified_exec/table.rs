//! A session's unified-exec processes (spec/tools.md §7.3–7.4): random ids in 1000–99 999,
//! at most `MAX_UNIFIED_EXEC_PROCESSES` kept, with Codex's eviction order.

use crate::sync::LockExt;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use super::process::Process;

/// `MAX_UNIFIED_EXEC_PROCESSES` (§7.4).
pub const MAX_UNIFIED_EXEC_PROCESSES: usize = 64;
/// `WARNING_UNIFIED_EXEC_PROCESSES` (§7.4).
pub const WARNING_UNIFIED_EXEC_PROCESSES: usize = 60;
/// Processes spared by eviction: the most recently used ones.
const PROTECTED_RECENT: usize = 8;
/// Ids are drawn from `[MIN_ID, MAX_ID)`.
const MIN_ID: i32 = 1_000;
const MAX_ID: i32 = 100_000;

/// One kept process.
#[derive(Debug, Clone)]
pub struct Entry {
    pub process: Arc<Process>,
    pub command: Vec<String>,
    pub tty: bool,
    /// The last exec_command or write_stdin call that named it.
    pub last_used: Instant,
}

#[derive(Debug, Default)]
struct Inner {
    processes: HashMap<i32, Entry>,
    /// Ids in use: kept processes and ones being started.
    reserved: HashSet<i32>,
    /// Ids kept and ids no longer kept since [`ProcessTable::take_changes`] (the daemon routes
    /// and counts processes by them).
    kept: Vec<i32>,
    ended: Vec<i32>,
}

impl Inner {
    fn forget(&mut self, id: i32) -> Option<Entry> {
        self.reserved.remove(&id);
        let e = self.processes.remove(&id)?;
        self.ended.push(id);
        Some(e)
    }
}

/// What [`ProcessTable::store`] did.
#[derive(Debug)]
pub struct Stored {
    /// Processes kept after storing, the new one included.
    pub count: usize,
    /// The process evicted to make room (already asked to terminate).
    pub evicted: Option<(i32, Entry)>,
}

/// The processes of one session.
#[derive(Debug, Default)]
pub struct ProcessTable {
    inner: Mutex<Inner>,
}

/// A process's state after a call.
#[derive(Debug)]
pub enum Refreshed {
    Alive,
    Exited(Entry),
    Unknown,
}

impl ProcessTable {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.locked()
    }

    /// A fresh random id, reserved until released or stored.
    pub fn allocate_id(&self) -> i32 {
        let mut inner = self.lock();
        loop {
            let id = random_id();
            if inner.reserved.insert(id) {
                return id;
            }
        }
    }

    /// Reserves `id` (drawn by the daemon); false if it is in use here.
    pub fn reserve_id(&self, id: i32) -> bool {
        self.lock().reserved.insert(id)
    }

    /// Gives back an id (and forgets its process, if kept).
    pub fn release_id(&self, id: i32) -> Option<Entry> {
        self.lock().forget(id)
    }

    /// The ids kept and no longer kept since the last call.
    pub fn take_changes(&self) -> (Vec<i32>, Vec<i32>) {
        let mut inner = self.lock();
        (
            std::mem::take(&mut inner.kept),
            std::mem::take(&mut inner.ended),
        )
    }

    /// Every kept process, by id.
    pub fn entries(&self) -> Vec<(i32, Entry)> {
        let mut all: Vec<(i32, Entry)> = self
            .lock()
            .processes
            .iter()
            .map(|(id, e)| (*id, e.clone()))
            .collect();
        all.sort_by_key(|(id, _)| *id);
        all
    }

    /// Keeps a process, evicting one first when the table is full.
    pub fn store(&self, id: i32, entry: Entry) -> Stored {
        let mut inner = self.lock();
        let mut evicted = None;
        if inner.processes.len() >= MAX_UNIFIED_EXEC_PROCESSES {
            let meta: Vec<(i32, Instant, bool)> = inner
                .processes
                .iter()
                .map(|(id, e)| (*id, e.last_used, e.process.has_exited()))
                .collect();
            if let Some(victim) = pick_eviction(&meta)
                && let Some(e) = inner.forget(victim)
            {
                evicted = Some((victim, e));
            }
        }
        inner.reserved.insert(id);
        inner.processes.insert(id, entry);
        inner.kept.push(id);
        let count = inner.processes.len();
        drop(inner);
        if let Some((_, e)) = &evicted {
            e.process.terminate();
        }
        Stored { count, evicted }
    }

    /// The kept process `id`, marked as used now.
    pub fn touch(&self, id: i32) -> Option<Entry> {
        let mut inner = self.lock();
        let e = inner.processes.get_mut(&id)?;
        e.last_used = Instant::now();
        Some(e.clone())
    }

    /// Whether `id` is still kept; an exited process is removed (and reported once).
    pub fn refresh(&self, id: i32) -> Refreshed {
        let mut inner = self.lock();
        let Some(e) = inner.processes.get(&id) else {
            return Refreshed::Unknown;
        };
        if e.process.has_exited() {
            match inner.forget(id) {
                Some(e) => Refreshed::Exited(e),
                None => Refreshed::Unknown,
            }
        } else {
            Refreshed::Alive
        }
    }

    /// Kept processes.
    pub fn len(&self) -> usize {
        self.lock().processes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Removes every process and kills each one's whole tree, waiting until they are gone.
    pub fn terminate_all(&self) {
        let entries: Vec<Entry> = {
            let mut inner = self.lock();
            inner.reserved.clear();
            let ids: Vec<i32> = inner.processes.keys().copied().collect();
            inner.ended.extend(ids);
            inner.processes.drain().map(|(_, e)| e).collect()
        };
        for e in &entries {
            e.process.terminate();
        }
        for e in &entries {
            e.process.terminate_and_wait();
        }
    }
}

/// Codex's pruning order (`process_id_to_prune_from_meta`): the 8 most recently used are
/// spared; of the rest, the least recently used that has exited, else the least recently used.
pub fn pick_eviction(meta: &[(i32, Instant, bool)]) -> Option<i32> {
    let mut by_recent = meta.to_vec();
    by_recent.sort_by_key(|(_, used, _)| std::cmp::Reverse(*used));
    let spared: HashSet<i32> = by_recent
        .iter()
        .take(PROTECTED_RECENT)
        .map(|(id, _, _)| *id)
        .collect();
    let mut lru = meta.to_vec();
    lru.sort_by_key(|(_, used, _)| *used);
    lru.iter()
        .find(|(id, _, exited)| *exited && !spared.contains(id))
        .or_else(|| lru.iter().find(|(id, _, _)| !spared.contains(id)))
        .map(|(id, _, _)| *id)
}

/// A random id in Codex's range (the daemon draws a session's ids with it too).
pub fn random_id() -> i32 {
    let mut b = [0u8; 4];
    if getrandom::fill(&mut b).is_err() {
        // No entropy source: fall back to the clock (ids need only be unique, not secret).
        let n = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        b = n.to_le_bytes();
    }
    MIN_ID + (u32::from_le_bytes(b) % (MAX_ID - MIN_ID) as u32) as i32
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn ids_are_in_range_and_unique() {
        let t = ProcessTable::default();
        let mut seen = HashSet::new();
        for _ in 0..2_000 {
            let id = t.allocate_id();
            assert!((1_000..100_000).contains(&id), "{id}");
            assert!(seen.insert(id), "duplicate {id}");
        }
        let id = *seen.iter().next().unwrap();
        t.release_id(id);
        assert!(t.lock().reserved.len() == 1_999);
    }

    fn meta(n: i32, exited: &[i32]) -> Vec<(i32, Instant, bool)> {
        let base = Instant::now();
        (0..n)
            .map(|i| {
                (
                    i,
                    base + Duration::from_millis(i as u64),
                    exited.contains(&i),
                )
            })
            .collect()
    }

    #[test]
    fn evicts_the_least_recently_used() {
        // 0 is the oldest.
        assert_eq!(pick_eviction(&meta(64, &[])), Some(0));
    }

    #[test]
    fn prefers_an_exited_process() {
        assert_eq!(pick_eviction(&meta(64, &[10, 20])), Some(10));
    }

    #[test]
    fn spares_the_eight_most_recent_even_if_exited() {
        // 56..63 are the 8 most recent; an exited one among them is not chosen.
        assert_eq!(pick_eviction(&meta(64, &[60])), Some(0));
        // With only 8 processes every one is spared.
        assert_eq!(pick_eviction(&meta(8, &[])), None);
        assert_eq!(pick_eviction(&meta(9, &[])), Some(0));
    }
}
