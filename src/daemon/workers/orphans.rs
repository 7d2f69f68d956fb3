//! Commands left behind by a worker that died. While a worker lives it is the child subreaper of
//! its commands, so everything they start stays below it and its tree kill reaches it; a
//! sandboxed worker's commands also die with its pid namespace. A danger-full-access worker has
//! no pid namespace, and without a memory cgroup to empty (a daemon that is not root, a host
//! that delegates none) its commands would outlive it, re-parented to init — when the worker is
//! killed, runs out of memory, or is stopped with the daemon. So the daemon is a child subreaper
//! as well: they are re-parented to it, and [`kill_adopted`] kills and reaps them.
//!
//! An adopted command is told from the daemon's own children (workers, helpers) by its session.
//! Every command starts in a session of its own (`setsid` before exec) and no process can move
//! back into the daemon's, while the daemon's own children never leave it. A process in the
//! daemon's session is never touched here.

use crate::sync::LockExt;
use std::time::{Duration, Instant};

/// How long one sweep may take: a tree is as many rounds as it is deep, each a few ms.
const SWEEP_LIMIT: Duration = Duration::from_secs(2);

/// Sweeps never overlap: one reaps a pid only while no other can still be about to signal it.
static SWEEPING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Makes the daemon the child subreaper of its workers' descendants (a setting of the process:
/// call once at start-up).
pub fn become_subreaper() -> std::io::Result<()> {
    crate::tools::shell::become_subreaper()
}

/// One child of this process, from `/proc/<pid>/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Child {
    pid: i32,
    session: i32,
    zombie: bool,
}

/// Parses `/proc/<pid>/stat` into (parent, session, zombie). The command name may contain
/// spaces and parentheses, so fields are counted from the last `)`.
fn parse_stat(text: &str) -> Option<(i32, i32, bool)> {
    let fields: Vec<&str> = text.get(text.rfind(')')? + 2..)?.split(' ').collect();
    let state = fields.first()?.chars().next()?;
    let parent = fields.get(1)?.parse().ok()?;
    let session = fields.get(3)?.parse().ok()?;
    Some((parent, session, state == 'Z'))
}

/// Children of this process that are not in its session: commands it adopted.
fn adopted(me: i32, my_session: i32) -> Vec<Child> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let (parent, session, zombie) = parse_stat(&text)?;
            (parent == me && session != my_session).then_some(Child {
                pid,
                session,
                zombie,
            })
        })
        .collect()
}

/// Kills every command this process adopted, then the processes that are re-parented to it as
/// those die, and reaps them all; returns how many it killed. Blocking (it polls `/proc`): run
/// it off the async threads. Gives up after [`SWEEP_LIMIT`].
pub fn kill_adopted() -> usize {
    use nix::sys::signal::{Signal, kill};
    use nix::sys::wait::{WaitPidFlag, waitpid};
    use nix::unistd::Pid;
    let _one_sweep = SWEEPING.locked();
    let me = std::process::id() as i32;
    let Ok(my_session) = nix::unistd::getsid(None) else {
        return 0;
    };
    let my_session = my_session.as_raw();
    let deadline = Instant::now() + SWEEP_LIMIT;
    let mut killed = 0;
    loop {
        let found = adopted(me, my_session);
        if found.is_empty() {
            return killed;
        }
        for child in found {
            // Our own child: nobody else can reap it, so its pid cannot be reused under us.
            let pid = Pid::from_raw(child.pid);
            if child.zombie {
                let _ = waitpid(pid, Some(WaitPidFlag::WNOHANG));
            } else if kill(pid, Signal::SIGKILL).is_ok() {
                killed += 1;
            }
        }
        if Instant::now() >= deadline {
            tracing::warn!(
                killed,
                "orphaned commands of a dead worker are still exiting; giving up on them"
            );
            return killed;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_with_awkward_command_names_parse() {
        let line = "4242 (a) b (c) S 17 4242 4240 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 99";
        assert_eq!(parse_stat(line), Some((17, 4240, false)));
        let zombie = "7 (sleep) Z 1 7 7 0 -1 0";
        assert_eq!(parse_stat(zombie), Some((1, 7, true)));
        assert_eq!(parse_stat("garbage"), None);
    }

    /// Only children outside this process's session are adopted commands: a child that stays
    /// in the session (as workers do) is never touched.
    #[test]
    fn only_children_in_sessions_of_their_own_count() {
        use std::os::unix::process::CommandExt;
        let me = std::process::id() as i32;
        let session = nix::unistd::getsid(None).unwrap().as_raw();
        let mut ours = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let mut own_session = std::process::Command::new("sleep");
        own_session.arg("31");
        // SAFETY: setsid is async-signal-safe.
        unsafe {
            own_session.pre_exec(|| {
                nix::unistd::setsid()?;
                Ok(())
            });
        }
        let mut command = own_session.spawn().unwrap();
        let found: Vec<i32> = adopted(me, session).iter().map(|c| c.pid).collect();
        let _ = (ours.kill(), command.kill(), ours.wait(), command.wait());
        assert!(found.contains(&(command.id() as i32)), "{found:?}");
        assert!(!found.contains(&(ours.id() as i32)), "{found:?}");
    }
}
