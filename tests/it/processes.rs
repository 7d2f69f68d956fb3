//! The Processes service through a real daemon: interactive and long-running processes,
//! resumable reads on a new connection, retention gaps, the whole tree's death, the shared
//! table with exec_command/write_stdin, routing to an escalated worker, limits, confinement
//! and every bad input.

use crate::common::{Daemon, eventually, host_pids, outside, scratch};
use corral::api::{self, SandboxMode, start_process_request::Command};
use std::time::{Duration, Instant};
use tonic::Code;

fn argv(args: &[&str]) -> Option<Command> {
    Some(Command::Argv(api::Argv {
        args: args.iter().map(|s| s.to_string()).collect(),
    }))
}

fn script(text: &str) -> Option<Command> {
    Some(Command::Script(text.into()))
}

async fn start(
    d: &Daemon,
    session: &str,
    req: api::StartProcessRequest,
) -> Result<i32, tonic::Status> {
    d.processes()
        .await
        .start_process(api::StartProcessRequest {
            session_id: session.into(),
            ..req
        })
        .await
        .map(|r| r.into_inner().process_id)
}

async fn read(
    d: &Daemon,
    session: &str,
    id: i32,
    after: Option<u64>,
    wait_ms: u32,
) -> Result<api::ReadProcessResponse, tonic::Status> {
    d.processes()
        .await
        .read_process(api::ReadProcessRequest {
            session_id: session.into(),
            process_id: id,
            after_seq: after,
            wait_ms,
            max_bytes: 0,
        })
        .await
        .map(|r| r.into_inner())
}

/// Reads from `after` until the output closes (or `limit`); the bytes, the last cursor, and
/// whether any read reported a gap.
async fn read_to_end(
    d: &Daemon,
    session: &str,
    id: i32,
    mut after: Option<u64>,
    limit: Duration,
) -> (Vec<u8>, Option<u64>, bool, api::ProcessState) {
    let end = Instant::now() + limit;
    let mut got = Vec::new();
    let mut gap = false;
    loop {
        let r = read(d, session, id, after, 1_000).await.expect("read");
        gap |= r.gap;
        for c in &r.chunks {
            got.extend_from_slice(&c.data);
        }
        after = r.last_seq;
        let state = r.state.expect("state");
        if (state.closed && !r.more) || Instant::now() > end {
            return (got, after, gap, state);
        }
    }
}

async fn write(
    d: &Daemon,
    session: &str,
    id: i32,
    data: &[u8],
    close: bool,
) -> Result<(), tonic::Status> {
    d.processes()
        .await
        .write_process(api::WriteProcessRequest {
            session_id: session.into(),
            process_id: id,
            data: data.to_vec(),
            close_stdin: close,
        })
        .await
        .map(drop)
}

async fn terminate(d: &Daemon, session: &str, id: i32) -> Result<api::ProcessState, tonic::Status> {
    d.processes()
        .await
        .terminate_process(api::TerminateProcessRequest {
            session_id: session.into(),
            process_id: id,
        })
        .await
        .map(|r| r.into_inner().state.expect("state"))
}

async fn list(d: &Daemon, session: &str) -> Vec<api::ProcessInfo> {
    d.processes()
        .await
        .list_processes(api::ListProcessesRequest {
            session_id: session.into(),
        })
        .await
        .expect("list")
        .into_inner()
        .processes
}

/// Pipes: stdin is written and closed, the output read to its end, the exit code kept, and the
/// process stays readable until terminated.
#[tokio::test]
async fn a_pipe_process_takes_stdin_and_reports_its_exit() {
    let d = Daemon::start(&[]).await;
    let cwd = scratch();
    let s = d.open(cwd.path(), SandboxMode::WorkspaceWrite).await;
    let id = start(
        &d,
        &s,
        api::StartProcessRequest {
            command: script("echo start:$GREETING; tr a-z A-Z; exit 3"),
            env: [("GREETING".to_string(), "hi".to_string())].into(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    write(&d, &s, id, b"abc\n", false).await.unwrap();
    write(&d, &s, id, b"def\n", true).await.unwrap();
    let (out, _, gap, state) = read_to_end(&d, &s, id, None, Duration::from_secs(10)).await;
    assert_eq!(String::from_utf8_lossy(&out), "start:hi\nABC\nDEF\n");
    assert!(!gap);
    assert_eq!(
        (state.running, state.exit_code, state.closed),
        (false, Some(3), true)
    );
    assert_eq!(state.output_bytes, out.len() as u64);
    // Written after stdin closed: refused, clearly.
    let e = write(&d, &s, id, b"x", false).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{}", e.message());
    assert!(e.message().contains("closed"), "{}", e.message());
    // Still listed (and readable) until terminated.
    assert_eq!(
        list(&d, &s)
            .await
            .iter()
            .map(|p| p.process_id)
            .collect::<Vec<_>>(),
        vec![id]
    );
    terminate(&d, &s, id).await.unwrap();
    assert!(list(&d, &s).await.is_empty());
    let e = read(&d, &s, id, None, 0).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
}

/// A reader that goes away and comes back on a new connection resumes from its cursor with
/// nothing lost and nothing repeated.
#[tokio::test]
async fn a_reader_resumes_on_a_new_connection_without_loss() {
    let d = Daemon::start(&[]).await;
    let cwd = scratch();
    let s = d.open(cwd.path(), SandboxMode::ReadOnly).await;
    let id = start(
        &d,
        &s,
        api::StartProcessRequest {
            command: script("for i in $(seq 1 300); do echo line$i; sleep 0.002; done"),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    // First connection: a few reads, then it is dropped.
    let mut got = Vec::new();
    let mut cursor = None;
    {
        let mut client = d.processes().await;
        for _ in 0..3 {
            let r = client
                .read_process(api::ReadProcessRequest {
                    session_id: s.clone(),
                    process_id: id,
                    after_seq: cursor,
                    wait_ms: 500,
                    max_bytes: 0,
                })
                .await
                .unwrap()
                .into_inner();
            assert!(!r.gap);
            for c in &r.chunks {
                assert_eq!(c.offset, got.len() as u64, "offsets are contiguous");
                got.extend_from_slice(&c.data);
            }
            cursor = r.last_seq;
        }
    }
    assert!(!got.is_empty());
    // A new connection goes on from the cursor.
    let (rest, _, gap, state) = read_to_end(&d, &s, id, cursor, Duration::from_secs(20)).await;
    assert!(!gap);
    got.extend(rest);
    let expected: String = (1..=300).map(|i| format!("line{i}\n")).collect();
    assert_eq!(String::from_utf8_lossy(&got), expected);
    assert_eq!(state.exit_code, Some(0));
}

/// Output beyond the 1 MiB window: a reader from the start gets the head, is told of the gap,
/// and the offsets say exactly how much fell out; the tail is the stream's last bytes.
#[tokio::test]
async fn output_beyond_the_window_is_reported_as_a_gap() {
    let d = Daemon::start(&[]).await;
    let cwd = scratch();
    let s = d.open(cwd.path(), SandboxMode::ReadOnly).await;
    // 3 MiB of numbered 16-byte records.
    let id = start(
        &d,
        &s,
        api::StartProcessRequest {
            command: script("seq -f '%015g' 1 196608"),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let mut state = None;
    for _ in 0..100 {
        let r = read(&d, &s, id, Some(u64::MAX - 1), 200).await.unwrap();
        if r.state.as_ref().unwrap().closed {
            state = r.state;
            break;
        }
    }
    let state = state.expect("the process ended");
    assert_eq!(state.output_bytes, 196_608 * 16);
    let (bytes, _, gap, _) = read_to_end(&d, &s, id, None, Duration::from_secs(10)).await;
    assert!(gap, "the middle fell out of the window");
    assert_eq!(bytes.len(), 1024 * 1024);
    assert!(bytes.starts_with(b"000000000000001\n000000000000002\n"));
    assert!(bytes.ends_with(b"000000000196608\n"));
    // The first read's last piece is the tail's end: its offset + length is the stream's length.
    let r = read(&d, &s, id, None, 0).await.unwrap();
    let last = r.chunks.last().unwrap();
    assert_eq!(last.offset + last.data.len() as u64, state.output_bytes);
}

/// A TTY: size at start, resize, a signal to the group, write_stdin from the model on the same
/// process, and terminate kills the whole tree (a background child included).
#[tokio::test]
async fn a_tty_process_is_resized_signalled_shared_and_killed_whole() {
    let d = Daemon::start(&[]).await;
    let cwd = scratch();
    let s = d.open(cwd.path(), SandboxMode::WorkspaceWrite).await;
    let id = start(
        &d,
        &s,
        api::StartProcessRequest {
            command: script(
                "sleep 1000 & trap 'echo got-usr1' USR1; stty size; \
                 while read l; do echo \"echo:$l\"; stty size; done",
            ),
            tty: true,
            rows: 30,
            cols: 100,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let wait_for = |needle: &'static str| {
        let d = &d;
        let s = s.clone();
        async move {
            let end = Instant::now() + Duration::from_secs(10);
            loop {
                let r = read(d, &s, id, None, 500).await.unwrap();
                let text: String = r
                    .chunks
                    .iter()
                    .map(|c| String::from_utf8_lossy(&c.data).into_owned())
                    .collect();
                if text.contains(needle) || Instant::now() > end {
                    return text;
                }
            }
        }
    };
    assert!(wait_for("30 100").await.contains("30 100"));
    d.processes()
        .await
        .resize_process(api::ResizeProcessRequest {
            session_id: s.clone(),
            process_id: id,
            rows: 40,
            cols: 120,
        })
        .await
        .unwrap();
    // The model's write_stdin reaches the same process.
    let (out, ok) = d
        .invoke(
            &s,
            "write_stdin",
            &serde_json::json!({"session_id": id, "chars": "hello\n"}).to_string(),
        )
        .await;
    assert!(ok, "{out}");
    assert!(out.contains("echo:hello"), "{out}");
    assert!(wait_for("40 120").await.contains("40 120"));
    d.processes()
        .await
        .signal_process(api::SignalProcessRequest {
            session_id: s.clone(),
            process_id: id,
            signal: "SIGUSR1".into(),
        })
        .await
        .unwrap();
    assert!(wait_for("got-usr1").await.contains("got-usr1"));
    let listed = list(&d, &s).await;
    assert_eq!(listed.len(), 1);
    assert!(listed[0].tty && listed[0].state.as_ref().unwrap().running && !listed[0].escalated);
    assert!(
        !host_pids("[s]leep 1000").is_empty(),
        "baseline: the background child runs"
    );
    let state = terminate(&d, &s, id).await.unwrap();
    assert!(state.closed && !state.running);
    assert!(
        eventually(Duration::from_secs(5), || host_pids("[s]leep 1000")
            .is_empty())
        .await,
        "the background child survived terminate"
    );
}

/// Closing the session kills its processes' trees.
#[tokio::test]
async fn closing_the_session_kills_its_processes() {
    let d = Daemon::start(&[]).await;
    let cwd = scratch();
    let s = d.open(cwd.path(), SandboxMode::ReadOnly).await;
    start(
        &d,
        &s,
        api::StartProcessRequest {
            command: argv(&["sh", "-c", "sleep 1001 & sleep 1001"]),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(
        eventually(Duration::from_secs(5), || host_pids("[s]leep 1001").len()
            >= 2)
        .await
    );
    d.sessions()
        .await
        .close_session(api::CloseSessionRequest { session_id: s })
        .await
        .unwrap();
    assert!(
        eventually(Duration::from_secs(5), || host_pids("[s]leep 1001")
            .is_empty())
        .await
    );
}

/// A process is confined like any command: it cannot write outside the workspace, and it can
/// write inside.
#[tokio::test]
async fn a_process_is_confined_like_any_command() {
    let d = Daemon::start(&[]).await;
    let cwd = scratch();
    let out = outside();
    let target = out.path().join("escaped");
    let s = d.open(cwd.path(), SandboxMode::WorkspaceWrite).await;
    let id = start(
        &d,
        &s,
        api::StartProcessRequest {
            command: script(&format!(
                "touch '{}' 2>&1; echo inside > inside.txt; echo done",
                target.display()
            )),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let (text, _, _, state) = read_to_end(&d, &s, id, None, Duration::from_secs(10)).await;
    let text = String::from_utf8_lossy(&text);
    assert!(text.contains("done"), "{text}");
    assert_eq!(state.exit_code, Some(0));
    assert!(!target.exists(), "the process wrote outside its workspace");
    assert_eq!(
        std::fs::read_to_string(cwd.path().join("inside.txt")).unwrap(),
        "inside\n"
    );
}

/// An escalated exec_command's process lives in the danger-full-access worker; write_stdin and
/// the typed calls reach it there, and the listing says it is escalated.
#[tokio::test]
async fn calls_reach_a_process_started_escalated() {
    let d = Daemon::start(&["--allow-escalation", "--root-callers", "trusted"]).await;
    let cwd = scratch();
    let s = d.open(cwd.path(), SandboxMode::ReadOnly).await;
    let (out, ok) = d
        .invoke(
            &s,
            "exec_command",
            &serde_json::json!({"cmd": "cat", "tty": true, "yield_time_ms": 300,
                "sandbox_permissions": "require_escalated"})
            .to_string(),
        )
        .await;
    assert!(ok, "{out}");
    let pid: i32 = out
        .lines()
        .find_map(|l| l.strip_prefix("Process running with session ID "))
        .expect("kept")
        .parse()
        .unwrap();
    let (out, ok) = d
        .invoke(
            &s,
            "write_stdin",
            &serde_json::json!({"session_id": pid, "chars": "ping\n"}).to_string(),
        )
        .await;
    assert!(ok && out.contains("ping"), "{out}");
    // And a sandboxed one beside it.
    let sandboxed = start(
        &d,
        &s,
        api::StartProcessRequest {
            command: argv(&["sleep", "30"]),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let listed = list(&d, &s).await;
    let flags: Vec<(i32, bool)> = listed.iter().map(|p| (p.process_id, p.escalated)).collect();
    let mut expected = vec![(pid, true), (sandboxed, false)];
    expected.sort();
    assert_eq!(flags, expected);
    terminate(&d, &s, pid).await.unwrap();
    terminate(&d, &s, sandboxed).await.unwrap();
    assert!(list(&d, &s).await.is_empty());
}

/// Long-lived processes count against the owner's `max_concurrent_commands`; terminating one
/// frees its slot.
#[tokio::test]
async fn processes_count_against_the_running_command_limit() {
    let conf_dir = outside();
    let conf = conf_dir.path().join("corral.toml");
    std::fs::write(&conf, "[policy.default]\nmax_concurrent_commands = 2\n").unwrap();
    let d = Daemon::start(&["--config", conf.to_str().unwrap()]).await;
    let cwd = scratch();
    let s = d.open(cwd.path(), SandboxMode::ReadOnly).await;
    let sleeper = || api::StartProcessRequest {
        command: argv(&["sleep", "30"]),
        ..Default::default()
    };
    let a = start(&d, &s, sleeper()).await.unwrap();
    let _b = start(&d, &s, sleeper()).await.unwrap();
    let e = start(&d, &s, sleeper()).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{}", e.message());
    // A shell command is refused too while the processes hold both slots.
    let e = d
        .tools()
        .await
        .shell(api::ShellRequest {
            session_id: s.clone(),
            command: vec!["true".into()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{}", e.message());
    terminate(&d, &s, a).await.unwrap();
    start(&d, &s, sleeper()).await.expect("a slot was freed");
}

/// Every bad input has a clear status, and nothing names another session's process.
#[tokio::test]
async fn bad_input_is_refused_clearly() {
    let d = Daemon::start(&[]).await;
    let cwd = scratch();
    let s = d.open(cwd.path(), SandboxMode::ReadOnly).await;
    let other = d.open(cwd.path(), SandboxMode::ReadOnly).await;
    let pipe = start(
        &d,
        &s,
        api::StartProcessRequest {
            command: argv(&["sleep", "30"]),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let tty = start(
        &d,
        &s,
        api::StartProcessRequest {
            command: argv(&["sleep", "30"]),
            tty: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let code = |r: Result<(), tonic::Status>| {
        r.map_err(|e| (e.code(), e.message().to_string()))
            .unwrap_err()
    };

    // Another session's process and an unknown id: NOT_FOUND.
    let (c, m) = code(read(&d, &other, pipe, None, 0).await.map(drop));
    assert_eq!(c, Code::NotFound, "{m}");
    let (c, _) = code(terminate(&d, &s, 99_999_999).await.map(drop));
    assert_eq!(c, Code::NotFound);
    // An unknown session: NOT_FOUND; no session: INVALID_ARGUMENT.
    let (c, _) = code(read(&d, "no-such-session", pipe, None, 0).await.map(drop));
    assert_eq!(c, Code::NotFound);
    let (c, _) = code(read(&d, "", pipe, None, 0).await.map(drop));
    assert_eq!(c, Code::InvalidArgument);

    let starts = [
        (api::StartProcessRequest::default(), "argv or script"),
        (
            api::StartProcessRequest {
                command: argv(&[]),
                ..Default::default()
            },
            "empty",
        ),
        (
            api::StartProcessRequest {
                command: script("  "),
                ..Default::default()
            },
            "script is empty",
        ),
        (
            api::StartProcessRequest {
                command: argv(&["true"]),
                tty: true,
                rows: 5000,
                ..Default::default()
            },
            "rows must be between",
        ),
        (
            api::StartProcessRequest {
                command: argv(&["true"]),
                rows: 10,
                cols: 10,
                ..Default::default()
            },
            "for tty processes",
        ),
        (
            api::StartProcessRequest {
                command: argv(&["true"]),
                env: [("A=B".to_string(), "x".to_string())].into(),
                ..Default::default()
            },
            "is not valid",
        ),
        (
            api::StartProcessRequest {
                command: argv(&["/no/such/program"]),
                ..Default::default()
            },
            "cannot start",
        ),
    ];
    for (req, needle) in starts {
        let e = start(&d, &s, req).await.unwrap_err();
        assert!(
            matches!(e.code(), Code::InvalidArgument | Code::NotFound),
            "{:?} {}",
            e.code(),
            e.message()
        );
        assert!(e.message().contains(needle), "{needle}: {}", e.message());
    }
    let mut p = d.processes().await;
    let e = p
        .signal_process(api::SignalProcessRequest {
            session_id: s.clone(),
            process_id: pipe,
            signal: "SEGV".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("use one of"), "{}", e.message());
    let e = p
        .resize_process(api::ResizeProcessRequest {
            session_id: s.clone(),
            process_id: pipe,
            rows: 10,
            cols: 10,
        })
        .await
        .unwrap_err();
    assert!(e.message().contains("has no PTY"), "{}", e.message());
    let e = p
        .resize_process(api::ResizeProcessRequest {
            session_id: s.clone(),
            process_id: tty,
            rows: 0,
            cols: 10,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = write(&d, &s, tty, b"", true).await.unwrap_err();
    assert!(e.message().contains("Ctrl-D"), "{}", e.message());
    let e = write(&d, &s, pipe, &vec![b'x'; 2 * 1024 * 1024], false)
        .await
        .unwrap_err();
    assert!(e.message().contains("at most"), "{}", e.message());
    let e = p
        .read_process(api::ReadProcessRequest {
            session_id: s.clone(),
            process_id: pipe,
            wait_ms: 60_000,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(e.message().contains("wait at most"), "{}", e.message());
    let e = p
        .read_process(api::ReadProcessRequest {
            session_id: s.clone(),
            process_id: pipe,
            max_bytes: 64 << 20,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(e.message().contains("at most"), "{}", e.message());
    // A signal to an exited process is refused (its pid may be reused).
    let e = p
        .signal_process(api::SignalProcessRequest {
            session_id: s.clone(),
            process_id: pipe,
            signal: "KILL".into(),
        })
        .await;
    assert!(e.is_ok(), "{e:?}");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let r = read(&d, &s, pipe, None, 200).await.unwrap();
        if r.state.unwrap().closed || Instant::now() > deadline {
            break;
        }
    }
    let e = p
        .signal_process(api::SignalProcessRequest {
            session_id: s.clone(),
            process_id: pipe,
            signal: "TERM".into(),
        })
        .await
        .unwrap_err();
    assert!(e.message().contains("has exited"), "{}", e.message());
    assert_eq!(
        read(&d, &s, pipe, None, 0)
            .await
            .unwrap()
            .state
            .unwrap()
            .exit_code,
        Some(128 + 9)
    );
}

/// A cursor at the very end of the range (u64::MAX) is answered, with nothing after it.
#[tokio::test]
async fn a_cursor_at_the_end_of_the_range_is_answered() {
    let d = Daemon::start(&[]).await;
    let cwd = scratch();
    let s = d.open(cwd.path(), SandboxMode::ReadOnly).await;
    let id = start(
        &d,
        &s,
        api::StartProcessRequest {
            command: argv(&["echo", "hi"]),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let r = tokio::time::timeout(
        Duration::from_secs(10),
        read(&d, &s, id, Some(u64::MAX), 100),
    )
    .await
    .expect("answered")
    .unwrap();
    assert!(r.chunks.is_empty() && !r.gap);
    assert_eq!(r.last_seq, Some(u64::MAX));
}
