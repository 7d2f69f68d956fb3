//! One long-lived process of `exec_command` (spec/tools.md §7.1): spawned with pipes (stdin
//! closed) or on a PTY, its output kept per process, its whole tree tracked and killed.
//!
//! A reader thread per process owns the child and its [`ProcessTree`]: it reads the output as
//! it arrives, notices the leader's exit (without reaping it, so the tree's session id stays
//! reserved), polls the protected-name guard and keeps the tree's membership current. When the
//! leader has exited and the output is closed — or the process is terminated — it kills what is
//! left of the tree, reaps the leader and marks the process closed.
//!
//! Three rooms: this file is the [`Process`] handle the tools hold (the state it shares with its
//! reader thread, and what a call does with it: wait and collect, write, resize, signal,
//! terminate); `spawn.rs` starts the process (`Command` + `pre_exec`, not the shell tools'
//! `posix_spawn`, because a PTY must become the new session's controlling terminal with
//! `TIOCSCTTY`; see there); `reader.rs` is the reader thread.
//!
//! [`ProcessTree`]: crate::tools::shell::proctree::ProcessTree

mod reader;
mod spawn;

use crate::sync::LockExt;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::buffer::HeadTail;

pub use spawn::SpawnSpec;

/// `UNIFIED_EXEC_OUTPUT_MAX_BYTES` (§7.1).
pub const UNIFIED_EXEC_OUTPUT_MAX_BYTES: usize = 1024 * 1024;
/// PTY size (§7.1, corral's choice).
pub const PTY_ROWS: u16 = 24;
pub const PTY_COLS: u16 = 80;
/// How long a write to a full PTY may wait.
const WRITE_LIMIT: Duration = Duration::from_secs(5);

/// The sandbox's watch over a process's whole life (the protected-name guard): what it found
/// so far, and its final report. Each finding is one line for the process's output.
pub trait ProcessGuard: Send {
    /// Findings since the last poll.
    fn poll(&mut self) -> Vec<String>;
    /// Stops guarding; the findings not yet polled.
    fn finish(self: Box<Self>) -> Vec<String>;
}

#[derive(Debug)]
struct State {
    /// Output not yet returned to the model (drained by each call).
    pending: HeadTail,
    /// Output retained for readers that resume from a sequence number.
    retained: HeadTail,
    /// The leader's exit code (`128 + N` for death by signal N), once it exited.
    exit: Option<i32>,
    /// The output reached end-of-file and the tree is gone.
    closed: bool,
    /// Termination was requested.
    kill: bool,
    /// The guard found something: a clean exit is reported as a failure.
    denied: bool,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.locked()
    }
}

/// A running (or finished) process.
pub struct Process {
    shared: Arc<Shared>,
    /// The PTY master, for writes; `None` in pipes mode.
    master: Option<Arc<OwnedFd>>,
    /// Pipes mode with an open stdin: its write end, until closed.
    stdin: Mutex<Option<OwnedFd>>,
    pid: i32,
    reader: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for Process {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Process")
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

/// A snapshot of a process for a caller that waits on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    pub exit: Option<i32>,
    pub closed: bool,
}

impl Process {
    /// The leader's pid.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    pub fn status(&self) -> Status {
        let s = self.shared.lock();
        Status {
            exit: s.exit.map(|c| if s.denied && c == 0 { 1 } else { c }),
            closed: s.closed,
        }
    }

    pub fn has_exited(&self) -> bool {
        self.shared.lock().exit.is_some()
    }

    /// The retained output after the cursor `after` (see [`HeadTail::read_after`]), waiting
    /// until `deadline` for some when there is none yet and the output is not closed; with the
    /// process's status as of the read (a resuming reader's call; the model's calls use
    /// [`Process::collect`]).
    pub fn read_after(
        &self,
        after: Option<u64>,
        max_bytes: usize,
        deadline: Instant,
    ) -> (super::buffer::Read, Status, u64) {
        let mut s = self.shared.lock();
        loop {
            let read = s.retained.read_after(after, max_bytes);
            let now = Instant::now();
            if !read.chunks.is_empty() || read.gap || s.closed || now >= deadline {
                let status = Status {
                    exit: s.exit.map(|c| if s.denied && c == 0 { 1 } else { c }),
                    closed: s.closed,
                };
                return (read, status, s.retained.total());
            }
            s = self
                .shared
                .changed
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Whether the process has a TTY.
    pub fn is_tty(&self) -> bool {
        self.master.is_some()
    }

    /// Sets the PTY's size (the foreground job gets SIGWINCH from the kernel).
    pub fn resize(&self, rows: u16, cols: u16) -> io::Result<()> {
        let Some(master) = &self.master else {
            return Err(io::Error::from_raw_os_error(libc::ENOTTY));
        };
        let ws = libc::winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCSWINSZ reads one winsize from a live struct.
        if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &ws) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Sends `signal` to the process's group (the leader made its own session and group at
    /// spawn). A process that has exited gets nothing: its pid may be reused.
    pub fn signal(&self, signal: i32) -> io::Result<()> {
        let s = self.shared.lock();
        if s.exit.is_some() || s.closed {
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
        // The leader is not reaped before `closed` (the reader waits with WNOWAIT), so while
        // we hold the state lock its pid still names this process group.
        // SAFETY: kill on a process group we created.
        let rc = unsafe { libc::kill(-self.pid, signal) };
        drop(s);
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Closes stdin (pipes mode): the process reads end-of-file.
    pub fn close_stdin(&self) -> io::Result<()> {
        match self.stdin.locked().take() {
            Some(_) => Ok(()),
            None => Err(io::Error::from_raw_os_error(libc::EBADF)),
        }
    }

    /// Bytes of output so far.
    pub fn output_bytes(&self) -> u64 {
        self.shared.lock().retained.total()
    }

    /// Collects the output not yet returned, until `deadline`, or until the process has exited
    /// and its output is closed — waiting at most `post_exit_cap` after the exit for the
    /// close (Codex's `collect_output_until_deadline`).
    pub fn collect(&self, deadline: Instant, post_exit_cap: Duration, sink: &mut dyn FnMut(&[u8])) {
        let mut post_exit_deadline: Option<Instant> = None;
        let mut s = self.shared.lock();
        loop {
            let chunks = s.pending.drain();
            if !chunks.is_empty() {
                for c in &chunks {
                    sink(&c.data);
                }
                if Instant::now() >= deadline {
                    return;
                }
                continue;
            }
            if s.exit.is_some() && s.closed {
                return;
            }
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            let until = if s.exit.is_some() {
                let d =
                    *post_exit_deadline.get_or_insert(now + (deadline - now).min(post_exit_cap));
                if now >= d {
                    return;
                }
                d
            } else {
                deadline
            };
            s = self
                .shared
                .changed
                .wait_timeout(s, until - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Writes `data` to the PTY, or to stdin in pipes mode when it is open.
    pub fn write(&self, data: &[u8]) -> io::Result<()> {
        let stdin = self.stdin.locked();
        let fd = match (&self.master, stdin.as_ref()) {
            (Some(master), _) => master.as_raw_fd(),
            (None, Some(pipe)) => pipe.as_raw_fd(),
            (None, None) => return Err(io::Error::from_raw_os_error(libc::EBADF)),
        };
        write_all_within(fd, data)
    }
}

/// Writes all of `data` to a non-blocking descriptor, waiting at most `WRITE_LIMIT` for room.
fn write_all_within(fd: RawFd, data: &[u8]) -> io::Result<()> {
    let deadline = Instant::now() + WRITE_LIMIT;
    let mut rest = data;
    while !rest.is_empty() {
        // SAFETY: writing from a live slice to a descriptor we own.
        let n = unsafe { libc::write(fd, rest.as_ptr().cast(), rest.len()) };
        if n >= 0 {
            rest = &rest[n as usize..];
            continue;
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => {}
            Some(libc::EAGAIN) => {
                let now = Instant::now();
                if now >= deadline {
                    return Err(e);
                }
                let mut p = [libc::pollfd {
                    fd,
                    events: libc::POLLOUT,
                    revents: 0,
                }];
                let ms = (deadline - now).as_millis().min(1000) as libc::c_int;
                // SAFETY: one valid pollfd.
                unsafe { libc::poll(p.as_mut_ptr(), 1, ms) };
            }
            _ => return Err(e),
        }
    }
    Ok(())
}

impl Process {
    /// Asks the reader to kill the whole tree (returns at once).
    pub fn terminate(&self) {
        self.shared.lock().kill = true;
        self.shared.changed.notify_all();
    }

    /// Kills the whole tree and waits until it is gone.
    pub fn terminate_and_wait(&self) {
        self.terminate();
        let handle = self.reader.locked().take();
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}
