//! The watcher thread and the handling of each fanotify event: which guarded name appeared,
//! whether a process of the sandbox made it (H27), stopping the sandbox when one did (H18), and
//! the backstop rescans; and sharing what a sweep found with every call guarding it. Apart from
//! the guard's bookkeeping (`mod.rs`) because this is the part that runs on its own thread and
//! decides, event by event, what gets taken away.

use super::report::GuardReport;
use super::root_perms::{restore_root_acls, restore_roots};
use super::take_away::{QUARANTINE_PREFIX, empty_trash, sweep};
use super::{Inner, PARK_AFTER, RESCAN, State, arm, lock};
use crate::sandbox::notify::Event;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::Instant;

/// Reads and handles every queued event (never blocks): marks lost watches, marks every active
/// call dirty on an overflow or a lost watch, stops the sandbox on a creation it made (H18) and
/// takes away the guarded names the events attribute to it, reporting them to every call
/// guarding them. Returns whether the queue overflowed. Called with `state` locked, so an event
/// is handled before any call can end.
pub(super) fn drain(inner: &Inner, state: &mut State, trash: &mut Vec<PathBuf>) -> bool {
    let events = inner.notify.read();
    if events.is_empty() {
        return false;
    }
    handle_events(inner, state, &events, trash)
}

/// [`drain`]'s handling of the events read.
pub(super) fn handle_events(
    inner: &Inner,
    state: &mut State,
    events: &[Event],
    trash: &mut Vec<PathBuf>,
) -> bool {
    let attributed = inner.notify.attributed();
    let mut overflow = false;
    let mut candidates: Vec<PathBuf> = Vec::new();
    // The first path a command of the sandbox made (not the worker itself, PID 1: its own
    // writes are checked before they are made).
    let mut made_by_command: Option<PathBuf> = None;
    let mut new_interiors: Vec<PathBuf> = Vec::new();
    for ev in events {
        if ev.overflowed() {
            overflow = true;
            continue;
        }
        let Some(key) = &ev.dir else { continue };
        // Two paths may lead to one directory (a bind mount): one mark, both paths.
        let dirs: Vec<PathBuf> = state
            .dirs
            .iter_mut()
            .filter(|(_, w)| w.key == *key)
            .map(|(d, w)| {
                if ev.watch_lost() {
                    w.lost = true;
                }
                d.clone()
            })
            .collect();
        if ev.watch_lost() {
            overflow |= !dirs.is_empty();
            continue;
        }
        let by_sandbox = !attributed || ev.pid != 0;
        // Not exclusive: the kernel merges a creation and the writes that follow it (same
        // directory, name and process) into one event.
        if ev.is_write() {
            for dir in &dirs {
                let path = dir.join(&ev.name);
                if by_sandbox && attributed && state.host_files.contains(&path) {
                    if ev.pid != 1 && made_by_command.is_none() {
                        made_by_command = Some(path.clone());
                    }
                    state.sandbox_made.insert(path.clone());
                    candidates.push(path);
                }
            }
        }
        // The guard's own quarantine renames (inside a host-made directory they are events of
        // a watched directory) are not creations.
        if !ev.is_new_entry()
            || (ev.pid == 1 && ev.name.as_bytes().starts_with(QUARANTINE_PREFIX.as_bytes()))
        {
            continue;
        }
        for dir in dirs {
            let path = dir.join(&ev.name);
            let guarded = state.calls.values().any(|a| a.guarded.contains(&path));
            let inside_host_made = state.interiors.contains(&dir);
            if !guarded && !inside_host_made {
                continue;
            }
            if !by_sandbox {
                // H27: a host process made it; never ours to take away.
                state.sandbox_made.remove(&path);
                match std::fs::symlink_metadata(&path) {
                    Ok(m) if guarded && m.is_dir() => new_interiors.push(path),
                    // Its writes are reported through its directory's mark.
                    Ok(m) if guarded && m.is_file() => {
                        state.host_files.retain(|p| *p != path);
                        state.host_files.push(path);
                    }
                    _ => {}
                }
                continue;
            }
            if attributed && ev.pid != 1 && made_by_command.is_none() {
                made_by_command = Some(path.clone());
            }
            state.sandbox_made.insert(path.clone());
            candidates.push(path);
        }
    }
    for dir in new_interiors {
        // `arm` marks a directory that replaced a known one again (by its identity).
        if matches!(arm(inner, state, &dir), Ok(Some(_))) && !state.interiors.contains(&dir) {
            state.interiors.push(dir);
        }
    }
    if overflow {
        for a in state.calls.values_mut() {
            a.dirty = true;
        }
    }
    // H18: stop first, then take away — a loop that is dead cannot put the name back.
    if let Some(path) = &made_by_command {
        stop_sandbox();
        lock(&inner.stopped).get_or_insert_with(|| path.clone());
    }
    if !candidates.is_empty() {
        candidates.sort();
        candidates.dedup();
        let mut found = sweep(attributed, state, &candidates, trash);
        found.stopped = made_by_command.clone();
        // A guarded name that an event named and that is not there any more was moved away
        // (or removed) at once: perhaps with its parent, to be moved back where no event of
        // ours sees it. The calls guarding it look at every guarded path when they end.
        for gone in candidates.iter().filter(|p| {
            !found.removed.contains(p) && !found.not_removed.iter().any(|(q, _)| q == *p)
        }) {
            for a in state
                .calls
                .values_mut()
                .filter(|a| a.guarded.contains(gone))
            {
                a.dirty = true;
            }
        }
        share(state, &found, None);
    }
    overflow
}

/// H18: kills every process of the sandbox but the worker. The worker is PID 1 of the sandbox's
/// own PID namespace (attributed mode requires it), so `kill(-1)` reaches exactly the processes
/// of that namespace — every command of every call, and every process kept for the session —
/// in one system call. A fork racing the first signal is caught by the second.
fn stop_sandbox() {
    debug_assert_eq!(std::process::id(), 1);
    for _ in 0..2 {
        // SAFETY: kill with integer arguments; from PID 1 of a PID namespace, -1 means every
        // other process of that namespace.
        unsafe { libc::kill(-1, libc::SIGKILL) };
    }
}

pub(super) fn watch_loop(inner: &Inner) {
    // The rescan runs on a clock, not only when the events are quiet: a sandbox that keeps a watched
    // directory busy must not postpone it (a guarded path whose parent appeared later is found
    // by the rescan alone).
    let mut last_rescan = Instant::now();
    loop {
        {
            // Idle a while: sleep until a call begins, rather than waking for every name
            // created in a watched directory (the watches stay) and every rescan tick.
            let mut state = lock(&inner.state);
            if state.calls.is_empty() && state.last_end.elapsed() >= PARK_AFTER {
                state.parked = true;
                while state.calls.is_empty() {
                    state = inner.wake.wait(state).unwrap_or_else(|e| e.into_inner());
                }
                state.parked = false;
            }
        }
        let mut fds = [libc::pollfd {
            fd: inner.notify.fd().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 1, RESCAN.as_millis() as libc::c_int) };
        if n < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            std::thread::sleep(RESCAN);
            continue;
        }
        let mut rescan = n == 0 || last_rescan.elapsed() >= RESCAN;
        if rescan {
            last_rescan = Instant::now();
        }
        // Read, sweep and report under one lock, so no call can finish between a removal and
        // its report, nor between the read of an event and its handling; delete the
        // quarantined trees after.
        let mut trash = Vec::new();
        {
            let mut state = lock(&inner.state);
            rescan |= drain(inner, &mut state, &mut trash);
            if rescan && !state.calls.is_empty() {
                let mut all: Vec<PathBuf> = state
                    .calls
                    .values()
                    .flat_map(|a| a.guarded.iter().cloned())
                    .chain(state.sandbox_made.iter().cloned())
                    .collect();
                all.sort();
                all.dedup();
                let mut found = sweep(inner.notify.attributed(), &mut state, &all, &mut trash);
                found.roots_restored = restore_roots(&inner.roots);
                found
                    .roots_restored
                    .extend(restore_root_acls(&inner.root_acls));
                share(&mut state, &found, None);
            }
            lock(&inner.trash).append(&mut trash);
        }
        empty_trash(inner);
    }
}

/// Adds what a sweep found to every active call (but `except`) that guards it.
/// What the sandbox made inside a host-made guarded directory concerns every call; a stop
/// (which killed every call's processes) too.
pub(super) fn share(state: &mut State, found: &GuardReport, except: Option<u64>) {
    let interiors = &state.interiors;
    let inside = |p: &PathBuf| p.parent().is_some_and(|d| interiors.iter().any(|i| i == d));
    for (id, active) in state.calls.iter_mut() {
        if Some(*id) == except {
            continue;
        }
        let mine = GuardReport {
            removed: found
                .removed
                .iter()
                .filter(|p| active.guarded.contains(p) || inside(p))
                .cloned()
                .collect(),
            not_removed: found
                .not_removed
                .iter()
                .filter(|(p, _)| active.guarded.contains(p) || inside(p))
                .cloned()
                .collect(),
            roots_restored: found.roots_restored.clone(),
            stopped: found.stopped.clone(),
        };
        active.report.merge(mine);
    }
}
