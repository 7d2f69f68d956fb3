//! The reader thread of one process: it owns the child and its [`ProcessTree`], reads the output
//! into the shared state as it arrives, notices the leader's exit without reaping it (so the
//! tree's session id stays reserved), polls the protected-name guard and keeps the tree's
//! membership current; at the end it kills what is left of the tree, reaps the leader and marks
//! the process closed. Everything here runs on that thread; callers see it only through
//! [`Process`](super::Process)'s state.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{ProcessGuard, Shared};
use crate::tools::shell::exec::{FINAL_DRAIN, IO_DRAIN_TIMEOUT_MS, KILL_LIMIT};
use crate::tools::shell::proctree::{ProcessTree, pidfd_open};

/// After the leader exits, how long output is still read before the rest of its tree is killed:
/// the shell tools' `IO_DRAIN_TIMEOUT_MS`.
const EXIT_DRAIN: Duration = Duration::from_millis(IO_DRAIN_TIMEOUT_MS);
/// How often the reader thread looks at the kill flag, the guard and the tree when nothing
/// else happens.
const TICK: Duration = Duration::from_millis(50);

/// The reader thread's side.
pub(super) struct Reader {
    pub(super) shared: Arc<Shared>,
    /// The PTY master or the two pipes; `None` once at end-of-file.
    pub(super) fds: Vec<Option<OwnedFd>>,
    pub(super) guard: Option<Box<dyn ProcessGuard>>,
    pub(super) tree: ProcessTree,
    pub(super) child: std::process::Child,
}

impl Reader {
    pub(super) fn run(mut self) {
        let start = Instant::now();
        let leader = self.tree.leader();
        let pidfd = pidfd_open(leader).ok();
        let mut exited_at: Option<Instant> = None;
        let mut next_refresh = start + Duration::from_millis(2);
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            if self.shared.lock().kill {
                break;
            }
            let now = Instant::now();
            if exited_at.is_none()
                && let Some(code) = exit_code_of(leader)
            {
                exited_at = Some(now);
                self.shared.lock().exit = Some(code);
                self.shared.changed.notify_all();
            }
            let open = self.fds.iter().any(Option::is_some);
            if let Some(t) = exited_at
                && (!open || now >= t + EXIT_DRAIN)
            {
                break;
            }
            if now >= next_refresh {
                self.tree.refresh();
                next_refresh = now + refresh_interval(now - start);
            }
            self.poll_guard();
            let watch = if exited_at.is_none() {
                pidfd.as_ref()
            } else {
                None
            };
            let wait = if exited_at.is_none() && pidfd.is_none() {
                Duration::from_millis(5)
            } else {
                TICK
            };
            self.poll_and_read(watch.map(|f| f.as_raw_fd()), wait, &mut buf);
        }
        self.tree.kill_all(KILL_LIMIT);
        let end = Instant::now() + FINAL_DRAIN;
        while self.fds.iter().any(Option::is_some) && Instant::now() < end {
            self.poll_and_read(None, end - Instant::now(), &mut buf);
        }
        let status = self.child.wait();
        if exited_at.is_none() {
            use std::os::unix::process::ExitStatusExt;
            let code = match status {
                Ok(s) => s
                    .code()
                    .or_else(|| s.signal().map(|sig| 128 + sig))
                    .unwrap_or(-1),
                Err(_) => -1,
            };
            self.shared.lock().exit = Some(code);
        }
        self.poll_guard();
        if let Some(guard) = self.guard.take() {
            let lines = guard.finish();
            self.push_lines(lines);
        }
        self.shared.lock().closed = true;
        self.shared.changed.notify_all();
        // `self.tree` drops here, unregistering the (now reaped) leader.
    }

    fn poll_guard(&mut self) {
        if let Some(guard) = self.guard.as_mut() {
            let lines = guard.poll();
            self.push_lines(lines);
        }
    }

    /// Each finding becomes a line of the process's output, and the process counts as denied.
    fn push_lines(&self, lines: Vec<String>) {
        if lines.is_empty() {
            return;
        }
        let mut text = String::new();
        for l in lines {
            text.push_str(&l);
            text.push('\n');
        }
        let mut s = self.shared.lock();
        s.denied = true;
        s.pending.push(text.as_bytes());
        s.retained.push(text.as_bytes());
        drop(s);
        self.shared.changed.notify_all();
    }

    fn poll_and_read(&mut self, pidfd: Option<RawFd>, wait: Duration, buf: &mut [u8]) {
        let mut pfds: Vec<libc::pollfd> = Vec::new();
        let mut which = Vec::new();
        for (i, fd) in self.fds.iter().enumerate() {
            if let Some(fd) = fd {
                pfds.push(libc::pollfd {
                    fd: fd.as_fd().as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
                which.push(i);
            }
        }
        if let Some(fd) = pidfd {
            pfds.push(libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            });
        }
        if pfds.is_empty() {
            std::thread::sleep(wait);
            return;
        }
        let ms = wait.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int;
        // SAFETY: pfds holds pfds.len() initialised pollfd structs.
        let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
        if n <= 0 {
            return;
        }
        for (slot, &i) in which.iter().enumerate() {
            if pfds[slot].revents != 0 {
                self.read_available(i, buf);
            }
        }
    }

    fn read_available(&mut self, i: usize, buf: &mut [u8]) {
        let Some(fd) = &self.fds[i] else { return };
        let raw = fd.as_raw_fd();
        let mut total = 0;
        while total < 256 * 1024 {
            // SAFETY: reading into a buffer we own.
            let n = unsafe { libc::read(raw, buf.as_mut_ptr().cast(), buf.len()) };
            if n > 0 {
                let data = &buf[..n as usize];
                total += data.len();
                let mut s = self.shared.lock();
                s.pending.push(data);
                s.retained.push(data);
                drop(s);
                self.shared.changed.notify_all();
            } else if n == 0 {
                self.fds[i] = None;
                return;
            } else {
                match io::Error::last_os_error().raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(libc::EAGAIN) => return,
                    // EIO: every slave side of the PTY is closed. Anything else ends the stream.
                    _ => {
                        self.fds[i] = None;
                        return;
                    }
                }
            }
        }
    }
}

/// Snapshots are frequent at first, when short-lived forks happen, and rarer for long runs.
fn refresh_interval(elapsed: Duration) -> Duration {
    if elapsed < Duration::from_millis(200) {
        Duration::from_millis(10)
    } else if elapsed < Duration::from_secs(2) {
        Duration::from_millis(50)
    } else {
        Duration::from_millis(500)
    }
}

/// The leader's exit code if it has exited, without reaping it (`WNOWAIT`): `128 + N` for death
/// by signal N.
fn exit_code_of(pid: i32) -> Option<i32> {
    // SAFETY: siginfo_t is plain data; waitid fills it in.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let rc = unsafe {
        libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    // SAFETY: si_pid/si_status are valid for the SIGCHLD siginfo waitid produces.
    if rc != 0 || unsafe { info.si_pid() } == 0 {
        return None;
    }
    let status = unsafe { info.si_status() };
    Some(match info.si_code {
        libc::CLD_EXITED => status,
        _ => 128 + status,
    })
}
