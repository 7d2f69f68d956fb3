//! Running one shell-tool command (spec/tools.md §6.1-6.2): spawn (spawn.rs: `posix_spawn`) with
//! an exact environment, stdin `/dev/null`, default signal handling and a new session; read stdout
//! and stderr as they arrive; wait for the leader; drain for at most 2 s after it exits; enforce
//! the timeout; kill the whole remaining process tree; report the exit status.
//!
//! Everything runs on the calling thread with `poll(2)`: the two pipes and (where the kernel has
//! it) a pidfd of the leader, so the leader's exit is seen at once and chunks reach the callback
//! in the order they were read. No reader threads means nothing can be left blocked on a pipe
//! that an escaped process keeps open. The leader is not reaped until its tree is cleaned up
//! (see proctree.rs for why).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::capture::{CaptureBuffer, CaptureLimits, Captured};
use super::denial::is_likely_sandbox_denied;
use super::proctree::{ProcessTree, pidfd_open};
use super::spawn::{self, Spawned};
use crate::tools::{ErrorKind, ToolError, kind_of_io};

/// `DEFAULT_EXEC_COMMAND_TIMEOUT_MS` (§6.2).
pub const DEFAULT_EXEC_COMMAND_TIMEOUT_MS: u64 = 10_000;
/// `EXEC_TIMEOUT_EXIT_CODE` (§6.2).
pub const EXEC_TIMEOUT_EXIT_CODE: i32 = 124;
/// `IO_DRAIN_TIMEOUT_MS` (§6.2): how long the pipes are read after the leader exits.
pub const IO_DRAIN_TIMEOUT_MS: u64 = 2_000;

/// After the tree is killed, how long to wait for the pipes to reach end-of-file. Normally
/// immediate (every writer is dead); the bound only matters if a process escaped tracking.
pub(crate) const FINAL_DRAIN: Duration = Duration::from_millis(200);
/// How long killing the tree may take before the survivors are reported as leftovers.
pub(crate) const KILL_LIMIT: Duration = Duration::from_secs(5);
/// How often the cancel flag is looked at while nothing else happens.
const CANCEL_POLL: Duration = Duration::from_millis(50);
/// Without a pidfd the leader's exit is noticed by polling this often.
const EXIT_POLL: Duration = Duration::from_millis(5);
/// Bytes read from one pipe before looking at the other and at the clock again, so a flood on
/// one stream cannot starve the other or delay the timeout.
const READ_BURST: usize = 256 * 1024;

/// One command to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecRequest {
    /// Program and arguments; `argv[0]` is looked up `execvp`-style in the request's `PATH`.
    pub argv: Vec<String>,
    /// Working directory (already resolved, §0.4).
    pub cwd: PathBuf,
    /// The exact environment: the worker's own environment is never inherited.
    pub env: Vec<(String, String)>,
    /// When the whole tree is killed and the result becomes exit 124.
    pub timeout: Duration,
}

/// A piece of output, as it arrives (for streaming RPCs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutputChunk {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
}

/// The result of a command that was started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutcome {
    /// The exit code; 124 on timeout; `128 + N` for death by signal N.
    pub exit_code: i32,
    /// The signal that killed the leader, unless corral killed it (timeout or cancel).
    pub signal: Option<i32>,
    /// The timeout expired and the tree was killed.
    pub timed_out: bool,
    /// The caller cancelled the run before the leader exited; the tree was killed.
    pub cancelled: bool,
    /// Wall time from spawn to return.
    pub duration: Duration,
    pub stdout: Captured,
    pub stderr: Captured,
    /// stdout and stderr in arrival order: the "content" of the model text.
    pub combined: Captured,
    /// Processes other than the leader that were still alive at the end and were killed.
    pub killed_processes: usize,
    /// Pids of processes that could not be killed in time (normally empty).
    pub leftover_processes: Vec<i32>,
}

impl ExecOutcome {
    /// `success` for shell tools: exit code 0 (§0.2).
    pub fn success(&self) -> bool {
        self.exit_code == 0
    }

    /// The sandbox-denial heuristic (spec/sandbox.md §5.1) applied to this outcome; `sandboxed`
    /// is false under danger-full-access.
    pub fn likely_sandbox_denied(&self, sandboxed: bool) -> bool {
        let keyword = self.stdout.has_denial_keyword()
            || self.stderr.has_denial_keyword()
            || self.combined.has_denial_keyword();
        is_likely_sandbox_denied(sandboxed, self.exit_code, self.timed_out, keyword)
    }
}

/// `execution error: {os error}: {what}` (§6.2), classed by the OS error.
fn spawn_error(err: &io::Error, what: &str) -> ToolError {
    ToolError::new(kind_of_io(err), format!("execution error: {err}: {what}"))
}

/// Runs `req` to completion (or timeout, or cancellation) and returns what it did. Every chunk
/// of output is passed to `on_chunk` as it is read. Fails only if the command could not be
/// started. Call [`super::become_subreaper`] once per process first, or descendants whose parent
/// exits escape to init and cannot be killed.
pub fn run(
    req: &ExecRequest,
    on_chunk: &mut dyn FnMut(OutputChunk),
    cancel: &AtomicBool,
) -> Result<ExecOutcome, ToolError> {
    let Some(program) = req.argv.first() else {
        return Err(ToolError::invalid("command must not be empty"));
    };
    // The child's chdir failure and its exec failure come back as the same bare OS error, so
    // the directory is checked first to say which one failed.
    match std::fs::metadata(&req.cwd) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            let err = io::Error::from_raw_os_error(libc::ENOTDIR);
            return Err(spawn_error(&err, &req.cwd.display().to_string()));
        }
        Err(err) => return Err(spawn_error(&err, &req.cwd.display().to_string())),
    }

    let start = Instant::now();
    let (child, mut tree) = ProcessTree::spawn_with(|| {
        let child = spawn::spawn(&req.argv, &req.env, &req.cwd)?;
        let (pid, fds) = (
            child.pid,
            [
                Some(child.stdout.as_raw_fd()),
                Some(child.stderr.as_raw_fd()),
            ],
        );
        Ok((child, pid, fds))
    })
    .map_err(|e| spawn_error(&e, program))?;
    let leader = tree.leader();
    let leader_fd = pidfd_open(leader).ok();
    let Spawned { stdout, stderr, .. } = child;
    let mut pipes = [
        Pipe::new(Some(stdout), Stream::Stdout),
        Pipe::new(Some(stderr), Stream::Stderr),
    ];
    let mut sink = Sink {
        stdout: CaptureBuffer::new(CaptureLimits::RAW),
        stderr: CaptureBuffer::new(CaptureLimits::RAW),
        combined: CaptureBuffer::new(CaptureLimits::WITH_TEXT),
        on_chunk,
    };

    let deadline = start.checked_add(req.timeout);
    let drain = Duration::from_millis(IO_DRAIN_TIMEOUT_MS);
    let mut exited_at: Option<Instant> = None;
    let mut next_refresh = start + Duration::from_millis(2);
    let end = loop {
        let now = Instant::now();
        if cancel.load(Ordering::Relaxed) {
            break End::Cancelled;
        }
        if exited_at.is_none() && leader_has_exited(leader) {
            exited_at = Some(now);
        }
        let phase_end = match exited_at {
            None => deadline,
            Some(t) => Some(t + drain),
        };
        if exited_at.is_some() && pipes.iter().all(|p| p.fd.is_none()) {
            break End::Exited;
        }
        if phase_end.is_some_and(|d| now >= d) {
            break if exited_at.is_some() {
                End::Exited
            } else {
                End::TimedOut
            };
        }
        if now >= next_refresh {
            tree.refresh();
            next_refresh = now + refresh_interval(now - start);
        }
        let mut wake = (now + CANCEL_POLL).min(next_refresh);
        if let Some(d) = phase_end {
            wake = wake.min(d);
        }
        if exited_at.is_none() && leader_fd.is_none() {
            wake = wake.min(now + EXIT_POLL);
        }
        let watch_leader = if exited_at.is_none() {
            leader_fd.as_ref().map(|fd| fd.as_fd())
        } else {
            None
        };
        poll_and_read(&mut pipes, watch_leader, wake - now, &mut sink);
    };

    // Whatever ended the wait, nothing of the command may outlive the call.
    let report = tree.kill_all(KILL_LIMIT);
    let final_deadline = Instant::now() + FINAL_DRAIN;
    while pipes.iter().any(|p| p.fd.is_some()) {
        let now = Instant::now();
        if now >= final_deadline {
            break;
        }
        poll_and_read(&mut pipes, None, final_deadline - now, &mut sink);
    }
    let status = spawn::wait(leader);
    // Unregister only now: until the leader is reaped, a concurrent cleanup must know it is a
    // leader and not an orphan to reap.
    drop(tree);
    let duration = start.elapsed();
    let status = status.map_err(|e| {
        ToolError::new(
            ErrorKind::Internal,
            format!("execution error: {e}: {program}"),
        )
    })?;

    let (exit_code, signal) = match end {
        End::TimedOut => (EXEC_TIMEOUT_EXIT_CODE, None),
        End::Cancelled if exited_at.is_none() => (128 + libc::SIGKILL, None),
        _ => match (status.code(), status.signal()) {
            (Some(code), _) => (code, None),
            (None, Some(sig)) => (128 + sig, Some(sig)),
            (None, None) => (-1, None),
        },
    };
    Ok(ExecOutcome {
        exit_code,
        signal,
        timed_out: matches!(end, End::TimedOut),
        cancelled: matches!(end, End::Cancelled) && exited_at.is_none(),
        duration,
        stdout: sink.stdout.finish(),
        stderr: sink.stderr.finish(),
        combined: sink.combined.finish(),
        killed_processes: report.killed,
        leftover_processes: report.leftover,
    })
}

/// Why the wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Exited,
    TimedOut,
    Cancelled,
}

/// Snapshots are frequent at first, when short-lived forks happen, and rarer for long runs.
fn refresh_interval(elapsed: Duration) -> Duration {
    if elapsed < Duration::from_millis(200) {
        Duration::from_millis(10)
    } else if elapsed < Duration::from_secs(2) {
        Duration::from_millis(50)
    } else {
        Duration::from_millis(200)
    }
}

/// Whether the leader has exited, without reaping it (`WNOWAIT`): the zombie keeps its pid, and
/// so its session and process-group ids, reserved until the tree is cleaned up.
fn leader_has_exited(pid: i32) -> bool {
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
    // SAFETY: si_pid is valid to read for the SIGCHLD siginfo waitid produces (0 if none).
    rc == 0 && unsafe { info.si_pid() } != 0
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stream {
    Stdout,
    Stderr,
}

/// One output pipe; `fd` is `None` once it reached end-of-file.
struct Pipe {
    fd: Option<OwnedFd>,
    stream: Stream,
}

impl Pipe {
    fn new(fd: Option<OwnedFd>, stream: Stream) -> Self {
        if let Some(fd) = &fd {
            // Non-blocking, so a read never waits past what poll reported.
            // SAFETY: fcntl on an fd we own.
            unsafe {
                let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
                libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
            }
        }
        Pipe { fd, stream }
    }
}

/// Where output goes: the three captures and the caller's callback.
struct Sink<'a> {
    stdout: CaptureBuffer,
    stderr: CaptureBuffer,
    combined: CaptureBuffer,
    on_chunk: &'a mut dyn FnMut(OutputChunk),
}

impl Sink<'_> {
    fn push(&mut self, stream: Stream, data: &[u8]) {
        self.combined.push(data);
        match stream {
            Stream::Stdout => {
                self.stdout.push(data);
                (self.on_chunk)(OutputChunk::Stdout(data.to_vec()));
            }
            Stream::Stderr => {
                self.stderr.push(data);
                (self.on_chunk)(OutputChunk::Stderr(data.to_vec()));
            }
        }
    }
}

/// Waits up to `timeout` for output (or the leader's exit), then reads what is available.
fn poll_and_read(
    pipes: &mut [Pipe; 2],
    leader: Option<BorrowedFd<'_>>,
    timeout: Duration,
    sink: &mut Sink<'_>,
) {
    let mut fds: Vec<libc::pollfd> = Vec::with_capacity(3);
    let mut which: Vec<usize> = Vec::with_capacity(2);
    for (i, p) in pipes.iter().enumerate() {
        if let Some(fd) = &p.fd {
            fds.push(libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
            which.push(i);
        }
    }
    if let Some(fd) = leader {
        fds.push(libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
    }
    // Round up, so a deadline a fraction of a millisecond away is not a busy loop.
    let ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
    if fds.is_empty() {
        std::thread::sleep(timeout);
        return;
    }
    // SAFETY: fds points to fds.len() initialised pollfd structs.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if n <= 0 {
        return; // timeout, or EINTR: the caller's loop looks at the clock again
    }
    for (slot, &i) in which.iter().enumerate() {
        if fds[slot].revents != 0 {
            read_available(&mut pipes[i], sink);
        }
    }
}

/// Reads until the pipe is empty, closed, or `READ_BURST` bytes were read.
fn read_available(pipe: &mut Pipe, sink: &mut Sink<'_>) {
    let Some(fd) = &pipe.fd else { return };
    let raw = fd.as_raw_fd();
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0;
    while total < READ_BURST {
        // SAFETY: reading into a buffer of buf.len() bytes we own.
        let n = unsafe { libc::read(raw, buf.as_mut_ptr().cast(), buf.len()) };
        if n > 0 {
            let n = n as usize;
            total += n;
            sink.push(pipe.stream, &buf[..n]);
        } else if n == 0 {
            pipe.fd = None;
            return;
        } else {
            match io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) => return,
                // Any other read error ends the stream; there is nothing better to do with it.
                _ => {
                    pipe.fd = None;
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::RwLockExt;
    use crate::tools::shell::format::{
        duration_seconds, shell_command_output_text, shell_output_text,
    };
    use crate::tools::shell::truncate::TruncationPolicy;
    use crate::tools::shell::{become_subreaper, shell_command_argv};
    use std::collections::HashMap;
    use std::process::Command;
    use std::sync::{Once, RwLock};

    fn setup() {
        static ONCE: Once = Once::new();
        ONCE.call_once(|| become_subreaper().expect("subreaper"));
    }

    fn test_env() -> Vec<(String, String)> {
        vec![
            ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()),
            ("HOME".into(), "/tmp".into()),
            ("LANG".into(), "C.UTF-8".into()),
        ]
    }

    fn req(argv: &[&str], timeout_ms: u64) -> ExecRequest {
        ExecRequest {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            cwd: PathBuf::from("/tmp"),
            env: test_env(),
            timeout: Duration::from_millis(timeout_ms),
        }
    }

    fn bash(script: &str) -> ExecRequest {
        req(&["bash", "-lc", script], DEFAULT_EXEC_COMMAND_TIMEOUT_MS)
    }

    /// Serialises the one test whose orphan carries no evidence of its owner (see
    /// `background_with_closed_pipes_returns_at_once`) against every other run in this binary.
    static RUNS: RwLock<()> = RwLock::new(());

    /// `run` alongside other tests' runs.
    fn run_shared(
        r: &ExecRequest,
        on_chunk: &mut dyn FnMut(OutputChunk),
        cancel: &AtomicBool,
    ) -> Result<ExecOutcome, ToolError> {
        setup();
        let _shared = RUNS.read_locked();
        run(r, on_chunk, cancel)
    }

    fn run_req(r: &ExecRequest) -> ExecOutcome {
        let never = AtomicBool::new(false);
        run_shared(r, &mut |_| {}, &never).expect("spawned")
    }

    fn combined_text(o: &ExecOutcome) -> String {
        String::from_utf8_lossy(&o.combined.complete_bytes().unwrap()).into_owned()
    }

    /// Pids of live processes whose command line is exactly `argv`.
    fn processes_with_cmdline(argv: &[&str]) -> Vec<i32> {
        let want: Vec<u8> = argv
            .iter()
            .flat_map(|a| [a.as_bytes(), b"\0"].concat())
            .collect();
        let mut found = Vec::new();
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            if std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == want) {
                found.push(pid);
            }
        }
        found
    }

    /// The wall time as the formats print it. The acceptance tests expect `0.0`/`0` for quick
    /// commands; on a loaded machine a command can take longer than 50 ms, so the expected text
    /// uses the measured value (format.rs tests the exact texts with fixed durations).
    fn json_secs(o: &ExecOutcome) -> String {
        serde_json::to_string(&duration_seconds(o.duration)).unwrap()
    }

    fn wall(o: &ExecOutcome) -> String {
        format!("Wall time: {} seconds", duration_seconds(o.duration))
    }

    #[test]
    fn t1_echo_structured() {
        let o = run_req(&bash("echo hi"));
        assert_eq!(o.exit_code, 0);
        assert!(o.success());
        let text = shell_output_text(&o, TruncationPolicy::default());
        assert_eq!(
            text,
            format!(
                r#"{{"output":"hi\n","metadata":{{"exit_code":0,"duration_seconds":{}}}}}"#,
                json_secs(&o)
            )
        );
        if o.duration < Duration::from_millis(50) {
            assert_eq!(
                text,
                r#"{"output":"hi\n","metadata":{"exit_code":0,"duration_seconds":0.0}}"#
            );
        }
    }

    #[test]
    fn t2_nonzero_exit() {
        let o = run_req(&bash("echo oops; exit 3"));
        assert_eq!(o.exit_code, 3);
        assert!(!o.success());
        let text = shell_output_text(&o, TruncationPolicy::default());
        assert!(
            text.starts_with(r#"{"output":"oops\n","metadata":{"exit_code":3,"#),
            "{text}"
        );
    }

    #[test]
    fn t3_both_streams_in_arrival_order() {
        let o = run_req(&bash("echo a; sleep 0.05; echo b 1>&2; sleep 0.05; echo c"));
        assert_eq!(combined_text(&o), "a\nb\nc\n");
        assert_eq!(o.stdout.complete_bytes().unwrap(), b"a\nc\n");
        assert_eq!(o.stderr.complete_bytes().unwrap(), b"b\n");
    }

    #[test]
    fn t4_timeout() {
        let began = Instant::now();
        let o = run_req(&req(&["sleep", "5"], 200));
        assert!(began.elapsed() < Duration::from_secs(2));
        assert!(o.timed_out);
        assert_eq!(o.exit_code, 124);
        assert_eq!(o.signal, None);
        let text = shell_output_text(&o, TruncationPolicy::default());
        assert!(
            text.starts_with(r#"{"output":"command timed out after 2"#),
            "{text}"
        );
        assert!(text.contains(r#""exit_code":124"#));
        let ms = o.duration.as_millis();
        assert!(
            text.contains(&format!("after {ms} milliseconds\\n")),
            "{text}"
        );
    }

    #[test]
    fn t5_t6_t7_freeform() {
        let sh = |script: &str| {
            let argv = shell_command_argv("/bin/bash", script, true);
            let r = ExecRequest {
                argv,
                ..req(&["x"], DEFAULT_EXEC_COMMAND_TIMEOUT_MS)
            };
            run_req(&r)
        };
        let p = TruncationPolicy::default();
        let o = sh("echo hi");
        assert_eq!(
            shell_command_output_text(&o, p),
            format!("Exit code: 0\n{}\nOutput:\nhi\n", wall(&o))
        );
        let o = sh("exit 7");
        assert!(!o.success());
        assert_eq!(
            shell_command_output_text(&o, p),
            format!("Exit code: 7\n{}\nOutput:\n", wall(&o))
        );
        let o = sh("sleep 1.3; true");
        let text = shell_command_output_text(&o, p);
        assert!(o.duration >= Duration::from_millis(1300));
        if o.duration < Duration::from_millis(1350) {
            assert!(text.contains("Wall time: 1.3 seconds\n"), "{text}");
        }
    }

    #[test]
    fn t8_seq_3000_freeform() {
        let o = run_req(&bash("seq 1 3000"));
        let text = shell_command_output_text(&o, TruncationPolicy::default());
        assert!(
            text.starts_with(&format!(
                "Exit code: 0\n{}\nTotal output lines: 3000\nOutput:\n1\n2\n",
                wall(&o)
            )),
            "{text:.200}"
        );
        assert!(text.contains("1221\n12\u{2026}3893 chars truncated\u{2026}2001\n"));
        assert!(text.ends_with("3000\n"));
    }

    #[test]
    fn t9_twenty_thousand_x() {
        let o = run_req(&req(
            &["python3", "-c", "print(\"x\"*20000, end=\"\")"],
            10_000,
        ));
        let text = shell_output_text(&o, TruncationPolicy::default());
        let expected_output = format!(
            "Total output lines: 1\\n\\n{}\u{2026}10000 chars truncated\u{2026}{}",
            "x".repeat(5000),
            "x".repeat(5000)
        );
        assert!(
            text.starts_with(&format!(
                r#"{{"output":"{expected_output}","metadata":{{"exit_code":0,"#
            )),
            "{text:.300}"
        );
    }

    #[test]
    fn t10_exactly_ten_thousand_bytes() {
        let o = run_req(&bash("head -c 10000 /dev/zero | tr '\\0' y"));
        let text = shell_command_output_text(&o, TruncationPolicy::default());
        assert_eq!(
            text,
            format!(
                "Exit code: 0\n{}\nOutput:\n{}",
                wall(&o),
                "y".repeat(10_000)
            )
        );
    }

    #[test]
    fn t11_six_thousand_e_acute() {
        let o = run_req(&req(
            &["python3", "-c", "print(\"é\"*6000, end=\"\")"],
            10_000,
        ));
        let text = shell_output_text(&o, TruncationPolicy::default());
        assert!(text.contains(&format!(
            "{}\u{2026}1000 chars truncated\u{2026}{}\"",
            "é".repeat(2500),
            "é".repeat(2500)
        )));
    }

    #[test]
    fn t12_three_million_x() {
        let mut streamed = 0usize;
        setup();
        let never = AtomicBool::new(false);
        let o = run_shared(
            &bash("head -c 3000000 /dev/zero | tr '\\0' x"),
            &mut |c| {
                if let OutputChunk::Stdout(b) = c {
                    streamed += b.len();
                }
            },
            &never,
        )
        .unwrap();
        assert_eq!(
            streamed, 3_000_000,
            "every byte is delivered to the callback"
        );
        assert_eq!(o.combined.total_bytes, 3_000_000);
        assert_eq!(o.combined.dropped_bytes, 1_951_424);
        assert_eq!(o.stdout.dropped_bytes, 1_951_424);
        let text = shell_output_text(&o, TruncationPolicy::default());
        assert!(
            text.contains(r#"{"output":"Total output lines: 1\n\nxxx"#),
            "{}",
            &text[..60]
        );
        assert!(text.contains("\u{2026}2990000 chars truncated\u{2026}"));
    }

    #[test]
    fn t13_process_tree_killed_on_timeout() {
        let o = run_req(&req(
            &[
                "bash",
                "-lc",
                "setsid sleep 1001 & (sleep 1002 &) ; sleep 1003",
            ],
            300,
        ));
        assert_eq!(o.exit_code, 124);
        for n in ["1001", "1002", "1003"] {
            assert_eq!(
                processes_with_cmdline(&["sleep", n]),
                Vec::<i32>::new(),
                "sleep {n}"
            );
        }
    }

    #[test]
    fn t14_background_leftovers() {
        let began = Instant::now();
        let o = run_req(&bash("sleep 100 & echo started"));
        let took = began.elapsed();
        assert!(
            took >= Duration::from_millis(1900) && took < Duration::from_secs(4),
            "{took:?}"
        );
        assert_eq!(o.exit_code, 0);
        assert_eq!(combined_text(&o), "started\n");
        assert!(o.killed_processes >= 1);
        assert_eq!(processes_with_cmdline(&["sleep", "100"]), Vec::<i32>::new());
    }

    #[test]
    fn background_with_closed_pipes_returns_at_once() {
        // `sleep 101` leaves the session and holds none of the command's pipes, and bash exits
        // at once, so if no snapshot caught it only the start-time rule attributes it, which
        // needs no other command in flight: hence the exclusive lock (a documented limit).
        setup();
        let _exclusive = RUNS.write_locked();
        let began = Instant::now();
        let never = AtomicBool::new(false);
        let o = run(
            &bash("setsid sleep 101 >/dev/null 2>&1 & echo ok"),
            &mut |_| {},
            &never,
        )
        .unwrap();
        assert!(began.elapsed() < Duration::from_millis(1500));
        assert_eq!(combined_text(&o), "ok\n");
        assert_eq!(processes_with_cmdline(&["sleep", "101"]), Vec::<i32>::new());
    }

    #[test]
    fn t15_segv() {
        let o = run_req(&bash("kill -SEGV $$"));
        assert_eq!(o.exit_code, 139);
        assert_eq!(o.signal, Some(libc::SIGSEGV));
        assert!(!o.success());
        assert!(shell_output_text(&o, TruncationPolicy::default()).contains(r#""exit_code":139"#));
    }

    #[test]
    fn t16_stdin_is_dev_null() {
        let began = Instant::now();
        let o = run_req(&bash("cat"));
        assert_eq!(o.exit_code, 0);
        assert!(began.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn t17_exact_environment() {
        // The worker's environment is never inherited; only the request's variables exist.
        let mut r = bash("echo $CODEX_SANDBOX_NETWORK_DISABLED; echo ${CARGO:-unset}");
        r.env
            .push(("CODEX_SANDBOX_NETWORK_DISABLED".into(), "1".into()));
        let o = run_req(&r);
        assert_eq!(combined_text(&o), "1\nunset\n");
    }

    #[test]
    fn new_session_and_no_terminal() {
        let o = run_req(&req(
            &["sh", "-c", "ps -o sid= -p $$; echo $$; tty || true"],
            5000,
        ));
        let text = combined_text(&o);
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        assert_eq!(lines[0], lines[1], "{text}");
        assert_eq!(lines[2], "not a tty");
    }

    /// The `SigBlk` and `SigIgn` masks of the command's own process, from /proc/self/status.
    fn sig_masks(o: &ExecOutcome) -> HashMap<String, u64> {
        combined_text(o)
            .lines()
            .filter_map(|l| l.split_once(":\t"))
            .filter(|(k, _)| ["SigBlk", "SigIgn"].contains(k))
            .map(|(k, v)| (k.to_string(), u64::from_str_radix(v.trim(), 16).unwrap()))
            .collect()
    }

    #[test]
    fn default_signals_and_empty_mask_even_if_the_spawner_ignores_and_blocks() {
        setup();
        // The worker ignores SIGPIPE (Rust's runtime does); make this thread ignore and block
        // more, as a worker thread could, and check none of it reaches the command.
        let masks = std::thread::spawn(|| {
            // SAFETY: changes this test process's dispositions to SIG_IGN for signals nothing in
            // the test binary handles, and this thread's own mask.
            unsafe {
                libc::signal(libc::SIGUSR2, libc::SIG_IGN);
                libc::signal(libc::SIGHUP, libc::SIG_IGN);
                libc::signal(libc::SIGRTMIN() + 3, libc::SIG_IGN);
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, libc::SIGTERM);
                libc::sigaddset(&mut set, libc::SIGINT);
                libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            }
            let never = AtomicBool::new(false);
            let o = run_shared(
                &req(&["cat", "/proc/self/status"], 5000),
                &mut |_| {},
                &never,
            )
            .unwrap();
            sig_masks(&o)
        })
        .join()
        .unwrap();
        assert_eq!(masks["SigBlk"], 0, "{masks:?}");
        // Every signal at its default disposition, glibc's internal 32 and 33 included.
        assert_eq!(masks["SigIgn"], 0, "{masks:?}");
    }

    #[test]
    fn only_stdio_descriptors_reach_the_command() {
        setup();
        // A descriptor without close-on-exec in the spawner (as a careless open would make)
        // must not reach the command either.
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        // SAFETY: clears FD_CLOEXEC on a descriptor this test owns.
        unsafe { libc::fcntl(a.as_raw_fd(), libc::F_SETFD, 0) };
        let o = run_req(&bash("ls /proc/self/fd | sort -n | tr '\\n' ' '"));
        drop((a, b));
        // 0-2, plus the one `ls` has open on /proc/self/fd.
        assert_eq!(combined_text(&o), "0 1 2 3 ", "{}", combined_text(&o));
        let o = run_req(&bash("readlink /proc/self/fd/0"));
        assert_eq!(combined_text(&o), "/dev/null\n");
    }

    #[test]
    fn program_search_uses_the_request_path_and_cwd() {
        setup();
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        // No shebang: execvp runs it with /bin/sh (ENOEXEC fallback).
        std::fs::write(bin.join("corral-noshebang"), "echo from-script \"$@\"\n").unwrap();
        std::fs::write(bin.join("corral-noexec"), "echo never\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        let perm = |mode| std::fs::Permissions::from_mode(mode);
        std::fs::set_permissions(bin.join("corral-noshebang"), perm(0o755)).unwrap();
        std::fs::set_permissions(bin.join("corral-noexec"), perm(0o644)).unwrap();
        let mut r = req(&["corral-noshebang", "x y"], 5000);
        r.cwd = dir.path().to_path_buf();
        // A relative PATH entry resolves against the command's cwd, as after chdir + execvp.
        r.env = vec![("PATH".into(), "/nonexistent:bin:/usr/bin:/bin".into())];
        let o = run_req(&r);
        assert_eq!(combined_text(&o), "from-script x y\n");
        assert_eq!(o.exit_code, 0);
        // Found but not executable, and nothing executable later on the path: EACCES.
        let never = AtomicBool::new(false);
        r.argv = vec!["corral-noexec".into()];
        let err = run_shared(&r, &mut |_| {}, &never).unwrap_err();
        assert_eq!(err.kind, ErrorKind::PermissionDenied, "{}", err.message);
        // A NUL in an argument is refused, not truncated.
        r.argv = vec!["echo".into(), "a\0b".into()];
        let err = run_shared(&r, &mut |_| {}, &never).unwrap_err();
        assert!(err.message.contains("nul byte"), "{}", err.message);
    }

    #[test]
    fn spawn_failures() {
        setup();
        let never = AtomicBool::new(false);
        let err = run_shared(&req(&["nosuchcmd-corral"], 1000), &mut |_| {}, &never).unwrap_err();
        assert_eq!(
            err.message,
            "execution error: No such file or directory (os error 2): nosuchcmd-corral"
        );
        assert_eq!(err.kind, ErrorKind::NotFound);
        let mut r = req(&["true"], 1000);
        r.cwd = PathBuf::from("/nonexistent/dir");
        let err = run_shared(&r, &mut |_| {}, &never).unwrap_err();
        assert_eq!(
            err.message,
            "execution error: No such file or directory (os error 2): /nonexistent/dir"
        );
        let err = run_shared(&req(&[], 1000), &mut |_| {}, &never).unwrap_err();
        assert_eq!(err.message, "command must not be empty");
        let err = run_shared(&req(&["/tmp"], 1000), &mut |_| {}, &never).unwrap_err();
        assert_eq!(
            err.message,
            "execution error: Permission denied (os error 13): /tmp"
        );
        assert_eq!(err.kind, ErrorKind::PermissionDenied);
    }

    #[test]
    fn missing_program_inside_script_is_127() {
        let o = run_req(&bash("nosuchcmd-corral"));
        assert_eq!(o.exit_code, 127);
        assert!(combined_text(&o).contains("nosuchcmd-corral"));
    }

    #[test]
    fn cancel_kills_the_tree() {
        setup();
        let cancel = AtomicBool::new(false);
        let began = Instant::now();
        let o = std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(300));
                cancel.store(true, Ordering::Relaxed);
            });
            run_shared(&bash("sleep 1004 & sleep 1005"), &mut |_| {}, &cancel).unwrap()
        });
        assert!(began.elapsed() < Duration::from_secs(3));
        assert!(o.cancelled);
        assert_eq!(o.exit_code, 137);
        assert!(processes_with_cmdline(&["sleep", "1004"]).is_empty());
        assert!(processes_with_cmdline(&["sleep", "1005"]).is_empty());
    }

    #[test]
    fn double_fork_with_setsid_is_killed() {
        // The intermediate exits at once, so the grandchild is re-parented to us and then leaves
        // the session: it is found as an orphan (or by an earlier snapshot).
        let o = run_req(&bash(
            "( setsid sh -c 'exec sleep 1006' & ) ; sleep 0.3; echo done",
        ));
        assert_eq!(combined_text(&o), "done\n");
        assert!(processes_with_cmdline(&["sleep", "1006"]).is_empty());
    }

    #[test]
    fn no_zombies_left_behind() {
        let o = run_req(&bash(
            "for i in 1 2 3 4 5; do (true &) ; done; (sleep 1007 &); echo x",
        ));
        assert_eq!(o.exit_code, 0);
        // Our own children (other than concurrently running tests' leaders) must not be zombies.
        std::thread::sleep(Duration::from_millis(50));
        let me = std::process::id() as i32;
        let leaked: Vec<i32> = processes_with_cmdline(&["sleep", "1007"]);
        assert!(leaked.is_empty());
        let mut zombies = 0;
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
                continue;
            };
            let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r.to_string()) else {
                continue;
            };
            let f: Vec<&str> = rest.split_whitespace().collect();
            if f[0] == "Z" && f[1].parse::<i32>() == Ok(me) && stat.contains("(true)") {
                zombies += 1;
            }
        }
        assert_eq!(zombies, 0);
    }

    /// Several commands at once: each one's cleanup must leave the others' processes alone,
    /// including an orphan of the long command that left its session (so only a snapshot or the
    /// start-time rule ties it to its command).
    #[test]
    fn concurrent_runs_do_not_kill_each_other() {
        setup();
        std::thread::scope(|s| {
            let long = s.spawn(|| {
                run_req(&bash(
                    "(setsid sh -c 'sleep 0.8; echo survived' &) ; sleep 1.2",
                ))
            });
            std::thread::sleep(Duration::from_millis(100));
            let mut shorts = Vec::new();
            for i in 0..4 {
                shorts.push(s.spawn(move || {
                    // 1020x leaves the session at once and is found through its stdout pipe.
                    run_req(&bash(&format!(
                        "(sleep 1010{i} &) ; (setsid sleep 1020{i} &) ; echo {i}"
                    )))
                }));
            }
            for (i, h) in shorts.into_iter().enumerate() {
                assert_eq!(combined_text(&h.join().unwrap()), format!("{i}\n"));
            }
            let o = long.join().unwrap();
            assert_eq!(combined_text(&o), "survived\n");
            assert_eq!(o.exit_code, 0);
        });
        for i in 0..4 {
            for arg in [format!("1010{i}"), format!("1020{i}")] {
                assert!(
                    processes_with_cmdline(&["sleep", &arg]).is_empty(),
                    "sleep {arg}"
                );
            }
        }
    }

    /// A child that other code spawned directly (not through `ProcessTree`) is neither killed
    /// nor reaped by a command's cleanup, so its `Child::wait` still gets its status.
    #[test]
    fn unregistered_children_are_left_alone() {
        setup();
        let mut bare = Command::new("sleep").arg("0.6").spawn().unwrap();
        let o = run_req(&bash("(setsid sleep 2 >/dev/null 2>&1 &) ; echo x"));
        assert_eq!(o.exit_code, 0);
        assert_eq!(bare.try_wait().unwrap(), None, "still running");
        assert!(bare.wait().unwrap().success());
    }

    #[test]
    fn invalid_utf8_is_decoded_lossily() {
        let o = run_req(&bash("printf 'a\\377b\\n'"));
        assert_eq!(
            shell_output_text(&o, TruncationPolicy::default()),
            format!(
                "{{\"output\":\"a\u{FFFD}b\\n\",\"metadata\":{{\"exit_code\":0,\"duration_seconds\":{}}}}}",
                json_secs(&o)
            )
        );
    }

    #[test]
    fn denial_heuristic_on_outcome() {
        let o = run_req(&bash(
            "echo 'touch: cannot touch x: Permission denied' >&2; exit 1",
        ));
        assert!(o.likely_sandbox_denied(true));
        assert!(!o.likely_sandbox_denied(false));
    }
}
