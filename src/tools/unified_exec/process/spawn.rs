//! Starting a unified-exec process: `Command` with `pre_exec` hooks, on a PTY or on pipes, its
//! output descriptors made non-blocking and handed to a new reader thread (reader.rs).
//!
//! This is the second of corral's two ways to start a command, on purpose. The shell tools start
//! theirs with `posix_spawn` (tools/shell/spawn.rs: no page tables of the worker copied), which
//! can reset signals and make a new session (`POSIX_SPAWN_SETSID`) but cannot give that session
//! a controlling terminal. A PTY process needs exactly that: after `setsid` the child must make
//! the PTY's slave side its controlling terminal with `ioctl(TIOCSCTTY)`, between fork and
//! exec, or the terminal has no session and no foreground job (a resize's `SIGWINCH` reaches
//! nobody).
//! No spawn attribute or file action does that, so this path keeps a `fork` + `pre_exec` hook
//! (signals to their defaults, `setsid`, `TIOCSCTTY` on a PTY); pipes mode goes through the same
//! hook, only without the `TIOCSCTTY`. Both paths still share the tree tracking and the kill
//! (`ProcessTree`, tools/shell/proctree.rs) and the pinned working directory
//! (tools/shell/pinned_cwd.rs).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};

use super::reader::Reader;
use super::{
    PTY_COLS, PTY_ROWS, Process, ProcessGuard, Shared, State, UNIFIED_EXEC_OUTPUT_MAX_BYTES,
};
use crate::tools::shell::proctree::ProcessTree;
use crate::tools::unified_exec::buffer::HeadTail;

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
