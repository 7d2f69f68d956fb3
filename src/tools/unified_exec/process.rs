//! One long-lived process of `exec_command` (spec/tools.md §7.1): spawned with pipes (stdin
//! closed) or on a PTY, its output kept per process, its whole tree tracked and killed.
//!
//! A reader thread per process owns the child and its [`ProcessTree`]: it reads the output as
//! it arrives, notices the leader's exit (without reaping it, so the tree's session id stays
//! reserved), polls the protected-name guard and keeps the tree's membership current. When the
//! leader has exited and the output is closed — or the process is terminated — it kills what is
//! left of the tree, reaps the leader and marks the process closed.

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::buffer::HeadTail;
use crate::tools::shell::exec::{FINAL_DRAIN, IO_DRAIN_TIMEOUT_MS, KILL_LIMIT};
use crate::tools::shell::proctree::{ProcessTree, pidfd_open};

/// `UNIFIED_EXEC_OUTPUT_MAX_BYTES` (§7.1).
pub const UNIFIED_EXEC_OUTPUT_MAX_BYTES: usize = 1024 * 1024;
/// PTY size (§7.1, corral's choice).
pub const PTY_ROWS: u16 = 24;
pub const PTY_COLS: u16 = 80;
/// After the leader exits, how long output is still read before the rest of its tree is killed:
/// the shell tools' `IO_DRAIN_TIMEOUT_MS`.
const EXIT_DRAIN: Duration = Duration::from_millis(IO_DRAIN_TIMEOUT_MS);
/// How often the reader thread looks at the kill flag, the guard and the tree when nothing
/// else happens.
const TICK: Duration = Duration::from_millis(50);
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

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpawnSpec {
    pub argv: Vec<String>,
    pub cwd: PathBuf,
    /// The exact environment.
    pub env: Vec<(String, String)>,
    /// A PTY (stdin open) instead of pipes.
    pub tty: bool,
    /// Pipes mode only: stdin is a pipe the caller writes to (and may close) instead of
    /// closed from the start (exec_command's pipes mode, as in Codex).
    pub stdin_pipe: bool,
    /// The PTY's size (rows, columns); `None`: 24×80.
    pub size: Option<(u16, u16)>,
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
        self.state.lock().unwrap_or_else(|p| p.into_inner())
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
    /// Starts `spec`. The error text is the reason (for `Failed to create unified exec
    /// process: {reason}`).
    pub fn spawn(
        spec: &SpawnSpec,
        guard: Option<Box<dyn ProcessGuard>>,
    ) -> Result<Process, String> {
        let Some(program) = spec.argv.first() else {
            return Err("missing command line for unified exec request".into());
        };
        match std::fs::metadata(&spec.cwd) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                let e = io::Error::from_raw_os_error(libc::ENOTDIR);
                return Err(format!("{e}: {}", spec.cwd.display()));
            }
            Err(e) => return Err(format!("{e}: {}", spec.cwd.display())),
        }
        let mut cmd = Command::new(program);
        cmd.args(&spec.argv[1..])
            .env_clear()
            .envs(spec.env.iter().map(|(k, v)| (k, v)));
        // H24: from the directory the worker pinned, not wherever the path leads now. Held
        // until the spawn is done.
        let start = crate::tools::shell::pinned_cwd::open(&spec.cwd)
            .transpose()
            .map_err(|e| format!("{e}: {}", spec.cwd.display()))?;
        match &start {
            Some(dir) => {
                use std::os::unix::process::CommandExt;
                let fd = dir.raw();
                // SAFETY: fchdir is async-signal-safe; the descriptor outlives the spawn.
                unsafe {
                    cmd.pre_exec(move || {
                        if libc::fchdir(fd) != 0 {
                            return Err(io::Error::last_os_error());
                        }
                        Ok(())
                    });
                }
            }
            None => {
                cmd.current_dir(&spec.cwd);
            }
        }
        let master = if spec.tty {
            let (rows, cols) = spec.size.unwrap_or((PTY_ROWS, PTY_COLS));
            let (master, slave) =
                open_pty(rows, cols).map_err(|e| format!("cannot open a PTY: {e}"))?;
            let dup = |fd: &OwnedFd| {
                fd.try_clone()
                    .map_err(|e| format!("cannot open a PTY: {e}"))
            };
            cmd.stdin(Stdio::from(dup(&slave)?))
                .stdout(Stdio::from(dup(&slave)?))
                .stderr(Stdio::from(slave));
            Some(master)
        } else {
            cmd.stdin(if spec.stdin_pipe {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
            None
        };
        let tty = spec.tty;
        // SAFETY: the closure runs between fork and exec; it only makes async-signal-safe
        // calls (signal, setsid, ioctl) and does not allocate.
        unsafe {
            cmd.pre_exec(move || {
                for sig in 1..32 {
                    if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                        libc::signal(sig, libc::SIG_DFL);
                    }
                }
                // A new session: its id names the process's tree, and on a PTY the terminal
                // becomes the session's controlling terminal.
                if libc::setsid() < 0 {
                    return Err(io::Error::last_os_error());
                }
                if tty && libc::ioctl(0, libc::TIOCSCTTY as _, 0) < 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let (mut child, tree) =
            ProcessTree::spawn(&mut cmd).map_err(|e| format!("{e}: {program}"))?;
        // Only the child holds the slave side now (`cmd` owns the parent's copies).
        drop(cmd);
        let pid = tree.leader();
        let stdin = child.stdin.take().map(OwnedFd::from);
        if let Some(fd) = &stdin {
            set_nonblocking(fd.as_raw_fd());
        }
        let mut fds: Vec<OwnedFd> = Vec::new();
        if let Some(m) = &master {
            fds.push(m.try_clone().map_err(|e| e.to_string())?);
        }
        fds.extend(child.stdout.take().map(OwnedFd::from));
        fds.extend(child.stderr.take().map(OwnedFd::from));
        for fd in &fds {
            set_nonblocking(fd.as_raw_fd());
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                pending: HeadTail::new(UNIFIED_EXEC_OUTPUT_MAX_BYTES),
                retained: HeadTail::new(UNIFIED_EXEC_OUTPUT_MAX_BYTES),
                exit: None,
                closed: false,
                kill: false,
                denied: false,
            }),
            changed: Condvar::new(),
        });
        let reader_shared = shared.clone();
        let handle = std::thread::Builder::new()
            .name(format!("uexec-{pid}"))
            .spawn(move || {
                Reader {
                    shared: reader_shared,
                    fds: fds.into_iter().map(Some).collect(),
                    guard,
                    tree,
                    child,
                }
                .run()
            });
        let handle = match handle {
            Ok(h) => h,
            Err(e) => {
                // The closure (and with it the tree, whose drop kills it) is gone.
                return Err(format!("cannot start the output reader: {e}"));
            }
        };
        Ok(Process {
            shared,
            master: master.map(Arc::new),
            stdin: Mutex::new(stdin),
            pid,
            reader: Mutex::new(Some(handle)),
        })
    }

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
        match self.stdin.lock().unwrap_or_else(|p| p.into_inner()).take() {
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
        let stdin = self.stdin.lock().unwrap_or_else(|p| p.into_inner());
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
        let handle = self.reader.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}

/// The reader thread's side.
struct Reader {
    shared: Arc<Shared>,
    /// The PTY master or the two pipes; `None` once at end-of-file.
    fds: Vec<Option<OwnedFd>>,
    guard: Option<Box<dyn ProcessGuard>>,
    tree: ProcessTree,
    child: std::process::Child,
}

impl Reader {
    fn run(mut self) {
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

fn set_nonblocking(fd: RawFd) {
    // SAFETY: fcntl on a descriptor we own.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
    }
}

/// A new PTY pair of the given size, both ends close-on-exec from the start, so no concurrently spawned
/// command inherits them.
fn open_pty(rows: u16, cols: u16) -> io::Result<(OwnedFd, OwnedFd)> {
    // SAFETY: plain syscalls; every returned descriptor is owned at once.
    unsafe {
        let m = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        if m < 0 {
            return Err(io::Error::last_os_error());
        }
        let master = OwnedFd::from_raw_fd(m);
        if libc::grantpt(m) != 0 || libc::unlockpt(m) != 0 {
            return Err(io::Error::last_os_error());
        }
        let mut name = [0 as libc::c_char; 128];
        if libc::ptsname_r(m, name.as_mut_ptr(), name.len()) != 0 {
            return Err(io::Error::last_os_error());
        }
        let s = libc::open(
            name.as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        );
        if s < 0 {
            return Err(io::Error::last_os_error());
        }
        let slave = OwnedFd::from_raw_fd(s);
        let ws = libc::winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        libc::ioctl(s, libc::TIOCSWINSZ, &ws);
        Ok((master, slave))
    }
}
