//! The host's process table, as the fault and hardening tests see a daemon's workers: which
//! processes are below it, which one serves calls, and killing it the way a crash would.

use super::{Daemon, eventually};

/// One host process as `/proc/<pid>/stat` shows it; the same process while pid and start
/// time are.
#[derive(Debug, Clone, Copy)]
pub struct Proc {
    pub pid: i32,
    pub ppid: i32,
    /// Clock ticks after boot: with the pid, names the process even after its pid is reused.
    pub start: u64,
}

impl PartialEq for Proc {
    fn eq(&self, other: &Proc) -> bool {
        (self.pid, self.start) == (other.pid, other.start)
    }
}

pub fn stat(pid: i32) -> Option<Proc> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: the fields start after the last ')'.
    // fields[0] is the state (field 3 of stat(5)), [1] the parent, [19] the start time.
    let fields: Vec<&str> = text.get(text.rfind(')')? + 2..)?.split(' ').collect();
    Some(Proc {
        pid,
        ppid: fields.get(1)?.parse().ok()?,
        start: fields.get(19)?.parse().ok()?,
    })
}

pub fn processes() -> Vec<Proc> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter_map(stat)
        .collect()
}

/// Every descendant of `root` (not `root` itself).
pub fn descendants(root: i32) -> Vec<Proc> {
    let all = processes();
    let mut found: Vec<Proc> = Vec::new();
    let mut parents = vec![root];
    while let Some(parent) = parents.pop() {
        for p in all.iter().filter(|p| p.ppid == parent) {
            found.push(*p);
            parents.push(p.pid);
        }
    }
    found
}

/// Still in the process table as the same process (a zombie counts).
pub fn present(p: &Proc) -> bool {
    stat(p.pid).is_some_and(|now| now.start == p.start)
}

/// Still running: present and not a zombie. An orphan's zombie waits for the host's init to
/// reap it, which can take a while and says nothing about corral.
pub fn running(p: &Proc) -> bool {
    present(p)
        && std::fs::read_to_string(format!("/proc/{}/stat", p.pid))
            .ok()
            .and_then(|t| t.get(t.rfind(')')? + 2..)?.chars().next())
            .is_some_and(|state| state != 'Z')
}

pub fn cmdline(pid: i32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

pub fn is_worker(p: &Proc) -> bool {
    cmdline(p.pid).contains("__worker")
}

/// The daemon's workers: every `__worker` process below it (a sandboxed worker is two, the
/// parent that waits and PID 1 of the sandbox's pid namespace). A zombie has no command line,
/// so only live ones.
pub fn workers(daemon: &Daemon) -> Vec<Proc> {
    descendants(daemon.pid() as i32)
        .into_iter()
        .filter(is_worker)
        .collect()
}

/// The worker process that serves calls: a `__worker` with no `__worker` child (in a sandboxed
/// mode, PID 1 of the sandbox; in danger-full-access, the only one). A command being forked
/// still has the worker's command line for a moment, so this is for workers with none.
pub fn serving_workers(daemon: &Daemon) -> Vec<Proc> {
    let all = workers(daemon);
    all.iter()
        .filter(|w| !all.iter().any(|c| c.ppid == w.pid))
        .copied()
        .collect()
}

/// The serving worker (the nearest `__worker` ancestor) of host process `pid`.
pub fn worker_of(pid: i32) -> Option<Proc> {
    let mut p = stat(pid)?;
    loop {
        p = stat(p.ppid)?;
        if is_worker(&p) {
            return Some(p);
        }
    }
}

pub fn sigkill(p: &Proc) {
    if present(p) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(p.pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// SIGKILLs the daemon's serving workers, as a crash would, and waits until the daemon has
/// reaped them and the processes waiting for them (so its next call starts a new worker).
/// Returns what was killed.
pub async fn kill_serving_workers(daemon: &Daemon) -> Vec<Proc> {
    let serving = serving_workers(daemon);
    let mut gone = serving.clone();
    gone.extend(
        serving
            .iter()
            .filter_map(|w| stat(w.ppid).filter(is_worker)),
    );
    serving.iter().for_each(sigkill);
    let reaped = eventually(std::time::Duration::from_secs(5), || {
        gone.iter().all(|p| !present(p))
    })
    .await;
    assert!(reaped, "the killed workers were not reaped: {gone:?}");
    serving
}
