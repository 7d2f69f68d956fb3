//! The typed process calls (the `Processes` service): start, write, read from a cursor,
//! resize, signal, terminate and list — on the same per-session table as `exec_command`, so
//! the model and its client see one set of processes.
//!
//! Plain Rust: the worker's dispatcher turns proto messages into these calls and back.

use std::time::{Duration, Instant};

use super::buffer::Read;
use super::process::{PTY_COLS, PTY_ROWS, Status};
use super::{Process, SpawnSpec, table, table_of};
use crate::tools::shell::NETWORK_DISABLED_ENV_VAR;
use crate::tools::{ErrorKind, ToolContext, ToolError, resolve_path};
use std::sync::Arc;

/// Longest wait of one read.
pub const MAX_READ_WAIT: Duration = Duration::from_secs(30);
/// A read's default and largest size.
pub const DEFAULT_READ_BYTES: usize = 1024 * 1024;
pub const MAX_READ_BYTES: usize = 4 * 1024 * 1024;
/// Largest write of one call.
pub const MAX_WRITE_BYTES: usize = 1024 * 1024;
/// Largest PTY side.
pub const MAX_PTY_SIDE: u32 = 1000;

/// The signals a client may send (names without `SIG`). Others (SEGV, ABRT, …) exist to
/// report faults, not to be sent; refusing them keeps the set small and obvious.
const SIGNALS: [(&str, i32); 11] = [
    ("HUP", libc::SIGHUP),
    ("INT", libc::SIGINT),
    ("QUIT", libc::SIGQUIT),
    ("KILL", libc::SIGKILL),
    ("USR1", libc::SIGUSR1),
    ("USR2", libc::SIGUSR2),
    ("TERM", libc::SIGTERM),
    ("CONT", libc::SIGCONT),
    ("STOP", libc::SIGSTOP),
    ("TSTP", libc::SIGTSTP),
    ("WINCH", libc::SIGWINCH),
];

/// What to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartArgs {
    pub argv: Vec<String>,
    /// Relative to the session's cwd; `None`: the cwd.
    pub workdir: Option<String>,
    pub tty: bool,
    /// (rows, cols); `None`: 24×80.
    pub size: Option<(u16, u16)>,
    /// Overrides on top of the session's environment.
    pub env: Vec<(String, String)>,
}

/// A process as a listing shows it.
#[derive(Debug, Clone)]
pub struct Listed {
    pub id: i32,
    pub command: Vec<String>,
    pub tty: bool,
    pub status: Status,
    pub output_bytes: u64,
}

/// What a read returns.
#[derive(Debug, Clone)]
pub struct ReadOut {
    pub read: Read,
    pub status: Status,
    pub output_bytes: u64,
}

fn not_found(id: i32) -> ToolError {
    ToolError::new(
        ErrorKind::NotFound,
        format!(
            "process {id} does not exist in this session (it was terminated, evicted, or never started here)"
        ),
    )
}

fn process(ctx: &ToolContext, id: i32) -> Result<Arc<Process>, ToolError> {
    table_of(&ctx.session_id)
        .touch(id)
        .map(|e| e.process)
        .ok_or_else(|| not_found(id))
}

/// A PTY side from the wire: 0 is the default; 1..=1000.
pub fn pty_side(field: &str, v: u32, default: u16) -> Result<u16, ToolError> {
    match v {
        0 => Ok(default),
        1..=MAX_PTY_SIDE => Ok(v as u16),
        _ => Err(ToolError::invalid(format!(
            "{field} must be between 1 and {MAX_PTY_SIDE} (0 for the default), got {v}"
        ))),
    }
}

/// The PTY size a start asks for.
pub fn pty_size(rows: u32, cols: u32) -> Result<(u16, u16), ToolError> {
    Ok((
        pty_side("rows", rows, PTY_ROWS)?,
        pty_side("cols", cols, PTY_COLS)?,
    ))
}

/// A signal by name (`TERM`, `SIGTERM`, any case) or number, from the allowed set.
pub fn parse_signal(text: &str) -> Result<i32, ToolError> {
    let t = text.trim();
    let name = t.to_ascii_uppercase();
    let name = name.strip_prefix("SIG").unwrap_or(&name);
    let found = match t.parse::<i32>() {
        Ok(n) => SIGNALS.iter().find(|(_, s)| *s == n),
        Err(_) => SIGNALS.iter().find(|(n, _)| *n == name),
    };
    found.map(|(_, s)| *s).ok_or_else(|| {
        ToolError::invalid(format!(
            "signal `{text}` is not one a process may be sent; use one of {}",
            SIGNALS.map(|(n, _)| n).join(", ")
        ))
    })
}

/// Starts a process and keeps it in the session's table. Unlike exec_command, a full table is
/// an error (RESOURCE_EXHAUSTED) rather than a reason to evict a process the client started on
/// purpose.
pub fn start(ctx: &ToolContext, args: &StartArgs) -> Result<i32, ToolError> {
    if args.argv.first().is_none_or(|p| p.is_empty()) {
        return Err(ToolError::invalid(
            "the command is empty: give argv with a program, or a script",
        ));
    }
    if let Some((k, _)) = args
        .env
        .iter()
        .find(|(k, _)| k.is_empty() || k.contains('=') || k.contains('\0'))
    {
        return Err(ToolError::invalid(format!(
            "environment variable name `{k}` is not valid (empty, or has `=` or NUL)"
        )));
    }
    if args.env.iter().any(|(_, v)| v.contains('\0')) || args.argv.iter().any(|a| a.contains('\0'))
    {
        return Err(ToolError::invalid(
            "argv and environment values cannot contain NUL bytes",
        ));
    }
    let table = table_of(&ctx.session_id);
    if table.len() >= super::MAX_UNIFIED_EXEC_PROCESSES {
        return Err(ToolError::new(
            ErrorKind::ResourceExhausted,
            format!(
                "this session already keeps {} processes, the most it may; terminate some first",
                super::MAX_UNIFIED_EXEC_PROCESSES
            ),
        ));
    }
    let cwd = match args.workdir.as_deref().filter(|w| !w.is_empty()) {
        Some(w) => resolve_path(&ctx.cwd, w),
        None => ctx.cwd.clone(),
    };
    let spec = SpawnSpec {
        argv: args.argv.clone(),
        cwd,
        env: start_env(ctx, args),
        tty: args.tty,
        stdin_pipe: !args.tty,
        size: args.size,
    };
    let id = super::new_id(ctx, &table);
    let spawned = ctx
        .runner
        .guard_process()
        .and_then(|guard| Process::spawn(&spec, guard).map_err(ToolError::invalid));
    let process = match spawned {
        Ok(p) => Arc::new(p),
        Err(e) => {
            table.release_id(id);
            return Err(ToolError::new(
                e.kind,
                format!("cannot start `{}`: {}", args.argv[0], e.message),
            ));
        }
    };
    table.store(
        id,
        table::Entry {
            process,
            command: args.argv.clone(),
            tty: args.tty,
            last_used: Instant::now(),
        },
    );
    Ok(id)
}

/// The session's environment, the network flag, then the client's overrides; a TTY gets a
/// `TERM` unless one was given.
fn start_env(ctx: &ToolContext, args: &StartArgs) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = ctx
        .env
        .iter()
        .filter(|(k, _)| !(ctx.network_disabled && k == NETWORK_DISABLED_ENV_VAR))
        .cloned()
        .collect();
    if ctx.network_disabled {
        env.push((NETWORK_DISABLED_ENV_VAR.into(), "1".into()));
    }
    for (k, v) in &args.env {
        env.retain(|(e, _)| e != k);
        env.push((k.clone(), v.clone()));
    }
    if args.tty && !env.iter().any(|(k, _)| k == "TERM") {
        env.push(("TERM".into(), "xterm-256color".into()));
    }
    env
}

/// Writes to stdin, then closes it when asked.
pub fn write(ctx: &ToolContext, id: i32, data: &[u8], close: bool) -> Result<(), ToolError> {
    if data.len() > MAX_WRITE_BYTES {
        return Err(ToolError::invalid(format!(
            "data is {} bytes; write at most {MAX_WRITE_BYTES} bytes per call",
            data.len()
        )));
    }
    let p = process(ctx, id)?;
    if close && p.is_tty() {
        return Err(ToolError::invalid(
            "close_stdin is for pipes mode; on a PTY write \"\\x04\" (Ctrl-D) for end-of-file",
        ));
    }
    if !data.is_empty() {
        p.write(data).map_err(|e| match e.raw_os_error() {
            Some(libc::EBADF) => ToolError::invalid(format!(
                "stdin of process {id} is closed; nothing can be written to it"
            )),
            Some(libc::EPIPE) | Some(libc::EIO) => ToolError::invalid(format!(
                "process {id} no longer reads its stdin (it exited or closed it)"
            )),
            Some(libc::EAGAIN) => ToolError::new(
                ErrorKind::DeadlineExceeded,
                format!("process {id} did not read its stdin for 5 s; nothing more was written"),
            ),
            _ => ToolError::new(ErrorKind::Internal, format!("writing to process {id}: {e}")),
        })?;
    }
    if close {
        p.close_stdin()
            .map_err(|_| ToolError::invalid(format!("stdin of process {id} is already closed")))?;
    }
    Ok(())
}

/// Reads retained output after the cursor.
pub fn read(
    ctx: &ToolContext,
    id: i32,
    after: Option<u64>,
    wait: Duration,
    max_bytes: usize,
) -> Result<ReadOut, ToolError> {
    if wait > MAX_READ_WAIT {
        return Err(ToolError::invalid(format!(
            "wait_ms is {}; wait at most {} ms per read",
            wait.as_millis(),
            MAX_READ_WAIT.as_millis()
        )));
    }
    if max_bytes > MAX_READ_BYTES {
        return Err(ToolError::invalid(format!(
            "max_bytes is {max_bytes}; read at most {MAX_READ_BYTES} bytes per call"
        )));
    }
    let max_bytes = if max_bytes == 0 {
        DEFAULT_READ_BYTES
    } else {
        max_bytes
    };
    let p = process(ctx, id)?;
    let (read, status, output_bytes) = p.read_after(after, max_bytes, Instant::now() + wait);
    Ok(ReadOut {
        read,
        status,
        output_bytes,
    })
}

/// Sets the PTY size.
pub fn resize(ctx: &ToolContext, id: i32, rows: u16, cols: u16) -> Result<(), ToolError> {
    let p = process(ctx, id)?;
    if !p.is_tty() {
        return Err(ToolError::invalid(format!(
            "process {id} has no PTY (it was started with tty = false)"
        )));
    }
    p.resize(rows, cols)
        .map_err(|e| ToolError::new(ErrorKind::Internal, format!("resizing process {id}: {e}")))
}

/// Sends a signal to the process's group.
pub fn signal(ctx: &ToolContext, id: i32, sig: i32) -> Result<(), ToolError> {
    let p = process(ctx, id)?;
    p.signal(sig).map_err(|e| match e.raw_os_error() {
        Some(libc::ESRCH) => ToolError::invalid(format!(
            "process {id} has exited; there is nothing to signal"
        )),
        _ => ToolError::new(ErrorKind::Internal, format!("signalling process {id}: {e}")),
    })
}

/// Kills the whole tree, waits until it is gone and forgets the process; its final state.
pub fn terminate(ctx: &ToolContext, id: i32) -> Result<(Status, u64), ToolError> {
    let table = table_of(&ctx.session_id);
    let entry = table.release_id(id).ok_or_else(|| not_found(id))?;
    entry.process.terminate_and_wait();
    Ok((entry.process.status(), entry.process.output_bytes()))
}

/// The session's processes (in this worker), by id.
pub fn list(ctx: &ToolContext) -> Vec<Listed> {
    table_of(&ctx.session_id)
        .entries()
        .into_iter()
        .map(|(id, e)| Listed {
            id,
            command: e.command,
            tty: e.tty,
            status: e.process.status(),
            output_bytes: e.process.output_bytes(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_by_name_or_number_from_the_allowed_set() {
        assert_eq!(parse_signal("TERM").unwrap(), libc::SIGTERM);
        assert_eq!(parse_signal("sigint").unwrap(), libc::SIGINT);
        assert_eq!(parse_signal(" 9 ").unwrap(), libc::SIGKILL);
        for bad in ["SEGV", "11", "", "SIG", "-1", "TERMX"] {
            let e = parse_signal(bad).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidArgument, "{bad}");
            assert!(e.message.contains("use one of HUP, INT"), "{}", e.message);
        }
    }

    #[test]
    fn pty_sizes_are_bounded() {
        assert_eq!(pty_size(0, 0).unwrap(), (24, 80));
        assert_eq!(pty_size(50, 200).unwrap(), (50, 200));
        assert!(
            pty_size(1001, 80)
                .unwrap_err()
                .message
                .contains("rows must be between")
        );
        assert!(pty_size(24, 5000).unwrap_err().message.contains("cols"));
    }

    fn ctx(dir: &std::path::Path, session: &str) -> ToolContext {
        let mut c = crate::worker::commands::test_context(dir);
        c.session_id = session.to_string();
        c
    }

    fn args(argv: &[&str], tty: bool) -> StartArgs {
        StartArgs {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            workdir: None,
            tty,
            size: None,
            env: vec![("GREETING".into(), "hello".into())],
        }
    }

    #[test]
    fn a_pipe_process_reads_what_is_written_and_ends_on_close() {
        let dir = tempfile::tempdir().unwrap();
        let c = ctx(dir.path(), "typed-pipe");
        let id = start(&c, &args(&["sh", "-c", "echo $GREETING; cat"], false)).unwrap();
        write(&c, id, b"ping\n", true).unwrap();
        let mut got = Vec::new();
        let mut cursor = None;
        loop {
            let r = read(&c, id, cursor, Duration::from_secs(5), 0).unwrap();
            for ch in &r.read.chunks {
                got.extend_from_slice(&ch.data);
                cursor = Some(ch.seq);
            }
            assert!(!r.read.gap);
            if r.status.closed {
                assert_eq!(r.status.exit, Some(0));
                break;
            }
        }
        assert_eq!(got, b"hello\nping\n");
        // Reading again from the start returns the same bytes (retained).
        let again = read(&c, id, None, Duration::ZERO, 0).unwrap();
        let all: Vec<u8> = again
            .read
            .chunks
            .iter()
            .flat_map(|c| c.data.clone())
            .collect();
        assert_eq!(all, b"hello\nping\n");
        let e = write(&c, id, b"x", false).unwrap_err();
        assert!(e.message.contains("closed"), "{}", e.message);
        let (status, bytes) = terminate(&c, id).unwrap();
        assert_eq!((status.exit, bytes), (Some(0), 11));
        assert_eq!(
            read(&c, id, None, Duration::ZERO, 0).unwrap_err().kind,
            ErrorKind::NotFound
        );
    }

    #[test]
    fn a_tty_process_is_resized_and_signalled() {
        let dir = tempfile::tempdir().unwrap();
        let c = ctx(dir.path(), "typed-tty");
        let id = start(
            &c,
            &StartArgs {
                size: Some((30, 100)),
                ..args(
                    &[
                        "sh",
                        "-c",
                        "trap 'echo got-usr1' USR1; stty size; while :; do sleep 0.05; done",
                    ],
                    true,
                )
            },
        )
        .unwrap();
        let wait_for = |needle: &str| {
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut text = String::new();
            while Instant::now() < deadline && !text.contains(needle) {
                let r = read(&c, id, None, Duration::from_millis(200), 0).unwrap();
                text = r
                    .read
                    .chunks
                    .iter()
                    .map(|c| String::from_utf8_lossy(&c.data).into_owned())
                    .collect();
            }
            text
        };
        assert!(wait_for("30 100").contains("30 100"));
        resize(&c, id, 40, 120).unwrap();
        signal(&c, id, libc::SIGUSR1).unwrap();
        assert!(wait_for("got-usr1").contains("got-usr1"));
        assert!(
            write(&c, id, b"", true)
                .unwrap_err()
                .message
                .contains("Ctrl-D")
        );
        let listed = list(&c);
        assert_eq!(listed.len(), 1);
        assert!(listed[0].tty && listed[0].status.exit.is_none());
        let (status, _) = terminate(&c, id).unwrap();
        assert!(status.closed);
        assert!(list(&c).is_empty());
    }
}
