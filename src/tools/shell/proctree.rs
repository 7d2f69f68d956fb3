//! Process-tree tracking and killing for shell commands (spec/tools.md §6.2: "the whole process
//! tree is killed … including ones that called setsid/setpgid or double-forked").
//!
//! How a command's processes are found, without cgroups:
//! - The worker is a *child subreaper* ([`become_subreaper`]), so a process whose parent dies is
//!   re-parented to the worker instead of escaping to init.
//! - While a command runs, [`ProcessTree::refresh`] snapshots `/proc` and records the command's
//!   processes as `(pid, start time)` pairs: the leader, the members of its session and process
//!   group (the leader calls `setsid`, so both ids equal its pid), everything reachable from those
//!   through parent links, and orphans re-parented to the worker that no other in-flight command
//!   can claim (never one in the worker's own session or older than the command: those are
//!   children that other code spawned directly). Recording them keeps a process attributed after it leaves the session and its
//!   parent dies. The start time guards every link against pid reuse.
//! - At completion, timeout or cancel, [`ProcessTree::kill_all`] repeats snapshot → SIGKILL →
//!   reap until none of those processes remains.
//!
//! Concurrent commands share one registry. A process is only ever attributed to one command: a
//! re-parented orphan with no recorded owner is claimed when no *other* in-flight command could
//! have started it (every other command started after it), or when its stdout or stderr is
//! still this command's pipe; otherwise it is left for the last of
//! the possible owners to collect. A spawn first registers a placeholder carrying the current
//! time, so while fork/exec is under way (without holding the lock) every new child of this
//! process counts as possibly the spawner's and no concurrent cleanup kills or reaps it.
//!
//! The command leader stays an unreaped zombie until its command is cleaned up (exec.rs waits
//! with `WNOWAIT`). That reserves its pid, and with it the session and process-group ids, so the
//! session rule cannot match an unrelated process that happens to get the same number.

use crate::sync::LockExt;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::process::{Child, Command};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Makes the calling process a child subreaper (`PR_SET_CHILD_SUBREAPER`), so orphaned
/// descendants of its commands are re-parented to it and can be found and killed. Per process;
/// call once at worker start-up.
pub fn become_subreaper() -> io::Result<()> {
    // SAFETY: prctl with integer arguments has no memory effects.
    let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether the calling process is a child subreaper.
pub fn is_subreaper() -> bool {
    let mut flag: libc::c_int = 0;
    // SAFETY: PR_GET_CHILD_SUBREAPER writes one int through the pointer we pass.
    let rc = unsafe { libc::prctl(libc::PR_GET_CHILD_SUBREAPER, &mut flag as *mut libc::c_int) };
    rc == 0 && flag != 0
}

/// One process as seen in `/proc/{pid}/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Proc {
    pid: i32,
    ppid: i32,
    pgid: i32,
    sid: i32,
    /// Start time in clock ticks since boot: with the pid, the identity of a process.
    start: u64,
    /// Exited but not reaped (`Z`), or being torn down (`X`).
    dead: bool,
}

/// A process identity that survives pid reuse.
type Ident = (i32, u64);

fn read_stat(pid: i32) -> Option<Proc> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(pid, &text)
}

/// Parses `/proc/{pid}/stat`. The command name may contain spaces and parentheses, so the
/// fields are taken after the *last* `)`.
fn parse_stat(pid: i32, text: &str) -> Option<Proc> {
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_ascii_whitespace().collect();
    // f[0] is field 3 (state); field 22 (starttime) is f[19].
    Some(Proc {
        pid,
        dead: matches!(f.first()?.as_bytes().first(), Some(b'Z' | b'X' | b'x')),
        ppid: f.get(1)?.parse().ok()?,
        pgid: f.get(2)?.parse().ok()?,
        sid: f.get(3)?.parse().ok()?,
        start: f.get(19)?.parse().ok()?,
    })
}

/// All processes visible in `/proc`, or `None` if `/proc` cannot be read. Processes that exit
/// while the directory is read are simply missing.
fn snapshot() -> Option<HashMap<i32, Proc>> {
    let dir = std::fs::read_dir("/proc").ok()?;
    let mut procs = HashMap::new();
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        if let Some(p) = read_stat(pid) {
            procs.insert(pid, p);
        }
    }
    Some(procs)
}

/// One in-flight command.
#[derive(Debug)]
struct Entry {
    leader: i32,
    leader_start: u64,
    members: HashSet<Ident>,
    /// Inodes of the command's stdout/stderr pipes: an orphan still holding one of them was
    /// started by this command.
    pipes: Vec<u64>,
}

#[derive(Debug)]
struct Registry {
    next_id: u64,
    entries: BTreeMap<u64, Entry>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    next_id: 0,
    entries: BTreeMap::new(),
});

fn registry() -> MutexGuard<'static, Registry> {
    // A panic while holding the lock leaves the data consistent enough (sets of pids), and
    // refusing to clean up afterwards would leak processes.
    REGISTRY.locked()
}

/// What [`ProcessTree::kill_all`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KillReport {
    /// Processes other than the leader that received SIGKILL.
    pub killed: usize,
    /// Processes still present when the time limit ran out (e.g. stuck in uninterruptible
    /// sleep). Empty in the normal case.
    pub leftover: Vec<i32>,
}

/// The processes of one command, registered while the command is in flight.
#[derive(Debug)]
pub struct ProcessTree {
    id: u64,
    leader: i32,
    finished: bool,
}

impl ProcessTree {
    /// Spawns `cmd` and registers its process as a tree leader. The command should call
    /// `setsid` (exec.rs does, in `pre_exec`). The leader must not be reaped before
    /// [`ProcessTree::kill_all`] has run.
    pub fn spawn(cmd: &mut Command) -> io::Result<(Child, ProcessTree)> {
        Self::spawn_with(|| {
            let child = cmd.spawn()?;
            let pid = child.id() as i32;
            let fds = [
                child.stdout.as_ref().map(|p| p.as_raw_fd()),
                child.stderr.as_ref().map(|p| p.as_raw_fd()),
            ];
            Ok((child, pid, fds))
        })
    }

    /// Like [`ProcessTree::spawn`] for any way of starting a child of this process: `start`
    /// returns what it started, the child's pid and its stdout/stderr pipe descriptors.
    pub(crate) fn spawn_with<T>(
        start: impl FnOnce() -> io::Result<(T, i32, [Option<RawFd>; 2])>,
    ) -> io::Result<(T, ProcessTree)> {
        // The placeholder makes every process started from now on ambiguous to other commands'
        // cleanup (see `collect`), which covers the new leader until it is registered. The lock
        // is not held across the spawn, which can take milliseconds and would serialise spawns.
        let id = {
            let mut reg = registry();
            let id = reg.next_id;
            reg.next_id += 1;
            reg.entries.insert(
                id,
                Entry {
                    leader: 0,
                    leader_start: boot_ticks_now().saturating_sub(1),
                    members: HashSet::new(),
                    pipes: Vec::new(),
                },
            );
            id
        };
        let (child, pid, fds) = match start() {
            Ok(started) => started,
            Err(e) => {
                registry().entries.remove(&id);
                return Err(e);
            }
        };
        let pipes = fds.into_iter().flatten().filter_map(pipe_inode).collect();
        let mut reg = registry();
        reg.entries.remove(&id);
        let tree = Self::register_locked(&mut reg, pid, pipes);
        Ok((child, tree))
    }

    /// Registers an already spawned, unreaped child of this process as a tree leader (for other
    /// subsystems that spawn children: anything not registered looks like an orphan to the
    /// cleanup of a command).
    pub fn register(pid: i32) -> ProcessTree {
        let mut reg = registry();
        Self::register_locked(&mut reg, pid, Vec::new())
    }

    fn register_locked(reg: &mut Registry, pid: i32, pipes: Vec<u64>) -> ProcessTree {
        // The child is unreaped, so its /proc entry exists; 0 (only without /proc) makes the
        // start-time checks accept everything, which then matters only for the fallback.
        let start = read_stat(pid).map_or(0, |p| p.start);
        let id = reg.next_id;
        reg.next_id += 1;
        reg.entries.insert(
            id,
            Entry {
                leader: pid,
                leader_start: start,
                members: HashSet::from([(pid, start)]),
                pipes,
            },
        );
        ProcessTree {
            id,
            leader: pid,
            finished: false,
        }
    }

    /// The leader's pid.
    pub fn leader(&self) -> i32 {
        self.leader
    }

    /// Records the command's current processes (called periodically while it runs).
    pub fn refresh(&self) {
        let Some(snap) = snapshot() else { return };
        let mut reg = registry();
        let owned = collect(&reg, self.id, &snap);
        if let Some(e) = reg.entries.get_mut(&self.id) {
            e.members = owned.iter().map(|p| (p.pid, p.start)).collect();
        }
    }

    /// The pids of the command's processes right now (the leader included while it exists).
    pub fn current_pids(&self) -> Vec<i32> {
        let Some(snap) = snapshot() else {
            return Vec::new();
        };
        let reg = registry();
        let mut pids: Vec<i32> = collect(&reg, self.id, &snap)
            .iter()
            .map(|p| p.pid)
            .collect();
        pids.sort_unstable();
        pids
    }

    /// SIGKILLs every process of the command (the leader too, if still running) and reaps the
    /// dead ones that are this process's children, repeating until none but the leader's zombie
    /// remains or `limit` passes. The leader is left for its `Child` to reap.
    pub fn kill_all(&mut self, limit: Duration) -> KillReport {
        self.finished = true;
        let began = Instant::now();
        let me = std::process::id() as i32;
        let mut killed: HashSet<Ident> = HashSet::new();
        let mut pause = Duration::from_millis(1);
        let mut group_killed = false;
        loop {
            let Some(snap) = snapshot() else {
                // No /proc: all that can be done is the session's process group.
                // SAFETY: plain syscall; the leader's pid (its zombie) is still reserved.
                unsafe { libc::kill(-self.leader, libc::SIGKILL) };
                return KillReport::default();
            };
            let mut reg = registry();
            let owned = collect(&reg, self.id, &snap);
            let leaders: HashSet<i32> = reg.entries.values().map(|e| e.leader).collect();
            if let Some(e) = reg.entries.get_mut(&self.id) {
                e.members = owned.iter().map(|p| (p.pid, p.start)).collect();
            }
            let owned_pids: HashSet<i32> = owned.iter().map(|p| p.pid).collect();
            if !group_killed {
                // The command's process group first, in one syscall: a shell and its children
                // die together. Killed one by one, the shell could see its child die and run the
                // rest of its script (`sleep 30; rm x` ran `rm` after the timeout on a busy
                // machine) before its own SIGKILL. Then, below, each process of the snapshot
                // (taken before, so each is counted), whatever left the group included.
                // SAFETY: plain syscall; the leader's pid (its zombie) reserves the group id.
                unsafe { libc::kill(-self.leader, libc::SIGKILL) };
                group_killed = true;
            }
            let mut remaining = Vec::new();
            for p in &owned {
                if !p.dead {
                    send_sigkill(p);
                    if p.pid != self.leader {
                        killed.insert((p.pid, p.start));
                        remaining.push(p.pid);
                    }
                } else if p.ppid == me && !leaders.contains(&p.pid) {
                    reap(p.pid);
                    remaining.push(p.pid);
                } else if owned_pids.contains(&p.ppid) {
                    // A zombie whose parent is being killed: it is re-parented to us next.
                    remaining.push(p.pid);
                }
            }
            drop(reg);
            if remaining.is_empty() {
                return KillReport {
                    killed: killed.len(),
                    leftover: Vec::new(),
                };
            }
            if began.elapsed() >= limit {
                return KillReport {
                    killed: killed.len(),
                    leftover: remaining,
                };
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }
}

impl Drop for ProcessTree {
    fn drop(&mut self) {
        if !self.finished {
            self.kill_all(Duration::from_secs(5));
        }
        registry().entries.remove(&self.id);
    }
}

/// The processes of command `id` in `snap` (see the module comment for the rules).
fn collect(reg: &Registry, id: u64, snap: &HashMap<i32, Proc>) -> Vec<Proc> {
    let Some(me) = reg.entries.get(&id) else {
        return Vec::new();
    };
    let others: Vec<&Entry> = reg
        .entries
        .iter()
        .filter(|(k, _)| **k != id)
        .map(|(_, e)| e)
        .collect();
    let other_leader = |pid: i32| others.iter().any(|e| e.leader == pid);
    // A placeholder (leader 0, spawn in progress) has no session yet; 0 is the session of
    // kernel threads.
    let in_session = |p: &Proc, e: &Entry| {
        e.leader != 0 && (p.sid == e.leader || p.pgid == e.leader) && p.start >= e.leader_start
    };

    let mut owned: HashMap<i32, Proc> = HashMap::new();
    for &(pid, start) in &me.members {
        if let Some(p) = snap.get(&pid).filter(|p| p.start == start) {
            owned.insert(pid, *p);
        }
    }
    for p in snap.values() {
        if in_session(p, me) && !other_leader(p.pid) {
            owned.insert(p.pid, *p);
        }
    }

    // Orphans re-parented to this process (as subreaper). Two guards keep children that other
    // code in this process spawned directly (not through `ProcessTree`) out of reach: such a
    // child is still in this process's session unless it called setsid itself, whereas every
    // descendant of a command is in the command's session or one it made; and no process older
    // than this command's leader can be the command's.
    let self_pid = std::process::id() as i32;
    let own_sid = snap.get(&self_pid).map(|p| p.sid);
    for p in snap.values() {
        if p.ppid != self_pid || owned.contains_key(&p.pid) || p.pid == me.leader {
            continue;
        }
        if Some(p.sid) == own_sid || p.start < me.leader_start {
            continue;
        }
        if other_leader(p.pid) {
            continue;
        }
        let claimed = others
            .iter()
            .any(|e| e.members.contains(&(p.pid, p.start)) || in_session(p, e));
        if claimed {
            continue;
        }
        // Any other command that started no later than the orphan might have started it; then
        // only an inherited output pipe tells whose it is.
        let ambiguous = others.iter().any(|e| e.leader_start <= p.start);
        let mine = if ambiguous {
            let held = held_pipes(p.pid);
            held.iter().any(|i| me.pipes.contains(i))
                && !others
                    .iter()
                    .any(|e| held.iter().any(|i| e.pipes.contains(i)))
        } else {
            true
        };
        if mine {
            owned.insert(p.pid, *p);
        }
    }

    // Everything below an owned process (children start no earlier than their parent; a child
    // that seems older is a stale link to a reused pid).
    let mut children: HashMap<i32, Vec<&Proc>> = HashMap::new();
    for p in snap.values() {
        children.entry(p.ppid).or_default().push(p);
    }
    let mut stack: Vec<Proc> = owned.values().copied().collect();
    while let Some(parent) = stack.pop() {
        for c in children.get(&parent.pid).into_iter().flatten() {
            if c.start >= parent.start && !owned.contains_key(&c.pid) && !other_leader(c.pid) {
                owned.insert(c.pid, **c);
                stack.push(**c);
            }
        }
    }
    owned.into_values().collect()
}

/// Now, in the unit of `/proc/{pid}/stat` start times: clock ticks since boot.
fn boot_ticks_now() -> u64 {
    // SAFETY: clock_gettime and sysconf write only the timespec we pass.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    ts.tv_sec as u64 * hz + ts.tv_nsec as u64 * hz / 1_000_000_000
}

/// The inode of the pipe behind `fd`.
fn pipe_inode(fd: RawFd) -> Option<u64> {
    // SAFETY: fstat writes into the stat struct we pass.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::fstat(fd, &mut st) };
    (rc == 0 && (st.st_mode & libc::S_IFMT) == libc::S_IFIFO).then_some(st.st_ino)
}

/// Inodes of the pipes `pid` has as stdout and stderr (`/proc/{pid}/fd/{1,2} -> pipe:[inode]`).
///
/// Only fds 1 and 2: a child between fork and exec still holds copies of every fd of this
/// process, including the *read* ends of other commands' pipes (closed on exec), so any other fd
/// would wrongly tie a freshly forked leader to another command.
fn held_pipes(pid: i32) -> Vec<u64> {
    [1, 2]
        .iter()
        .filter_map(|fd| std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).ok())
        .filter_map(|target| {
            let t = target.to_str()?;
            t.strip_prefix("pipe:[")?.strip_suffix(']')?.parse().ok()
        })
        .collect()
}

pub fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        Err(io::Error::last_os_error())
    } else {
        // SAFETY: the kernel just returned this fd to us; nothing else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
    }
}

/// SIGKILLs `p` if the pid still names the same process. A pidfd pins the process between the
/// identity check and the signal, so a reused pid is never hit; without pidfd support (old
/// kernels) there is a tiny window, between checking the start time and `kill`.
fn send_sigkill(p: &Proc) {
    match pidfd_open(p.pid) {
        Ok(fd) => {
            if read_stat(p.pid).is_some_and(|now| now.start == p.start) {
                // SAFETY: valid pidfd, null siginfo, no flags.
                unsafe {
                    libc::syscall(
                        libc::SYS_pidfd_send_signal,
                        fd.as_raw_fd(),
                        libc::SIGKILL,
                        std::ptr::null::<libc::siginfo_t>(),
                        0,
                    )
                };
            }
        }
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
        Err(_) => {
            if read_stat(p.pid).is_some_and(|now| now.start == p.start) {
                // SAFETY: plain syscall.
                unsafe { libc::kill(p.pid, libc::SIGKILL) };
            }
        }
    }
}

/// Reaps one dead child without blocking. Only ever called with a specific pid, never -1, so the
/// exit status of another command's leader is never stolen from its `Child`.
fn reap(pid: i32) {
    let mut status = 0;
    // SAFETY: waitpid writes the status int we pass.
    unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_odd_command_names() {
        let line =
            "4242 (we ird) (x)) S 1 4242 4242 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 987654 1 2 3";
        let p = parse_stat(4242, line).unwrap();
        assert_eq!(
            p,
            Proc {
                pid: 4242,
                ppid: 1,
                pgid: 4242,
                sid: 4242,
                start: 987654,
                dead: false
            }
        );
        let z = "7 (z) Z 5 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 55 0 0";
        assert!(parse_stat(7, z).unwrap().dead);
        assert!(parse_stat(7, "7 (z").is_none());
    }

    #[test]
    fn snapshot_sees_this_process() {
        let me = std::process::id() as i32;
        let snap = snapshot().expect("/proc is readable");
        let p = snap.get(&me).expect("own entry");
        assert!(!p.dead);
        assert!(p.start > 0);
    }

    #[test]
    fn boot_ticks_are_start_time_units() {
        // Spawned through the registry: a bare spawn would look like an orphan to the cleanup
        // of commands that other tests run concurrently.
        let before = boot_ticks_now();
        let (mut child, mut tree) = ProcessTree::spawn(&mut Command::new("true")).unwrap();
        let start = read_stat(child.id() as i32).unwrap().start;
        let after = boot_ticks_now();
        tree.kill_all(Duration::from_secs(1));
        child.wait().unwrap();
        assert!(
            before <= start + 1 && start <= after + 1,
            "{before} {start} {after}"
        );
    }

    #[test]
    fn subreaper_flag() {
        become_subreaper().unwrap();
        assert!(is_subreaper());
    }
}
