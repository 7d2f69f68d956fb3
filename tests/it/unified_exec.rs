//! Unified exec through a real daemon (spec/tools.md §7.6, plus session close, TIOCSTI and the
//! protected-name guard of long-lived processes).

use crate::common::{Daemon, eventually, host_pids, scratch};
use corral::api::{self, SandboxMode};
use std::time::{Duration, Instant};

fn args(v: serde_json::Value) -> String {
    v.to_string()
}

/// The `Process running with session ID {n}` of a text.
fn session_id_of(text: &str) -> Option<i32> {
    text.lines()
        .find_map(|l| l.strip_prefix("Process running with session ID "))
        .map(|n| n.parse().expect("numeric id"))
}

/// The body after the `Output:` line.
fn body_of(text: &str) -> &str {
    text.split_once("\nOutput:\n").map(|(_, b)| b).unwrap_or("")
}

async fn close(d: &Daemon, session: &str) {
    d.sessions()
        .await
        .close_session(api::CloseSessionRequest {
            session_id: session.into(),
        })
        .await
        .expect("close_session");
}

/// §7.6 tests 1 and 7: a short command's whole text, and the environment overrides.
#[tokio::test]
async fn echo_hi_and_environment() {
    let d = Daemon::start(&[]).await;
    let cwd = scratch();
    let s = d.open(cwd.path(), SandboxMode::WorkspaceWrite).await;
    let (out, ok) = d
        .invoke(
            &s,
            "exec_command",
            &args(serde_json::json!({"cmd": "echo hi"})),
        )
        .await;
    assert!(ok, "{out}");
    let lines: Vec<&str> = out.split('\n').collect();
    assert_eq!(lines.len(), 7, "{out:?}");
    assert!(
        lines[0].len() == 16
            && lines[0].starts_with("Chunk ID: ")
            && lines[0][10..]
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
        "{out:?}"
    );
    let wall = lines[1]
        .strip_prefix("Wall time: ")
        .and_then(|r| r.strip_suffix(" seconds"))
        .expect("wall time line");
    let (secs, frac) = wall.split_once('.').expect("decimals");
    assert!(
        secs.bytes().all(|b| b.is_ascii_digit()) && frac.len() == 4,
        "{wall}"
    );
    assert_eq!(
        &lines[2..],
        [
            "Process exited with code 0",
            "Original token count: 1",
            "Output:",
            "hi",
            ""
        ]
    );
    let (out, ok) = d
        .invoke(
            &s,
            "exec_command",
            &args(serde_json::json!({"cmd": "echo $PAGER $TERM"})),
        )
        .await;
    assert!(ok);
    assert_eq!(body_of(&out), "cat dumb\n", "{out}");
    // A non-zero exit is still a produced text: success.
    let (out, ok) = d
        .invoke(
            &s,
            "exec_command",
            &args(serde_json::json!({"cmd": "exit 3"})),
        )
        .await;
    assert!(
        ok && out.contains("\nProcess exited with code 3\n"),
        "{out}"
    );
}

/// §7.6 tests 2, 3 and 4: a running process, an empty poll's 5 s floor, unknown ids, and
/// stdin closed in pipes mode.
#[tokio::test]
async fn running_process_polls_and_errors() {
    let d = Daemon::start(&[]).await;
    let cwd = scratch();
    let s = d.open(cwd.path(), SandboxMode::WorkspaceWrite).await;
    let (out, ok) = d
        .invoke(
            &s,
            "exec_command",
            &args(serde_json::json!({"cmd": "sleep 30", "yield_time_ms": 500})),
        )
        .await;
    assert!(ok, "{out}");
    assert!(!out.contains("Process exited"), "{out}");
    let id = session_id_of(&out).expect("running");
    assert!((1_000..100_000).contains(&id));
    let began = Instant::now();
    let (out, ok) = d
        .invoke(
            &s,
            "write_stdin",
            &args(serde_json::json!({"session_id": id, "chars": ""})),
        )
        .await;
    assert!(ok, "{out}");
    assert!(
        began.elapsed() >= Duration::from_secs(5),
        "{:?}",
        began.elapsed()
    );
    assert_eq!(session_id_of(&out), Some(id));

    let (out, ok) = d
        .invoke(
            &s,
            "write_stdin",
            &args(serde_json::json!({"session_id": 999999})),
        )
        .await;
    assert_eq!(
        (out.as_str(), ok),
        ("write_stdin failed: Unknown process id 999999", false)
    );

    let (out, _) = d
        .invoke(
            &s,
            "exec_command",
            &args(serde_json::json!({"cmd": "cat; sleep 30", "tty": false, "yield_time_ms": 250})),
        )
        .await;
    let cat = session_id_of(&out).expect("running");
    let (out, ok) = d
        .invoke(
            &s,
            "write_stdin",
            &args(serde_json::json!({"session_id": cat, "chars": "x"})),
        )
        .await;
    assert_eq!(
        (out.as_str(), ok),
        (
            "write_stdin failed: stdin is closed for this session; rerun exec_command with tty=true to keep stdin open",
            false
        )
    );
    close(&d, &s).await;
}

/// §7.6 test 6, a PTY child's session-close kill checked from the host, and TIOCSTI denied.
#[tokio::test]
async fn pty_echo_tiocsti_and_close_kills_the_tree() {
    let d = Daemon::start(&[]).await;
    let cwd = scratch();
    let s = d.open(cwd.path(), SandboxMode::WorkspaceWrite).await;
    let (out, _) = d
        .invoke(
            &s,
            "exec_command",
            &args(serde_json::json!({"cmd": "cat", "tty": true, "yield_time_ms": 250})),
        )
        .await;
    let id = session_id_of(&out).expect("running");
    let (out, ok) = d
        .invoke(
            &s,
            "write_stdin",
            &args(serde_json::json!({"session_id": id, "chars": "abc\n"})),
        )
        .await;
    assert!(ok && body_of(&out).contains("abc"), "{out}");

    let probe = "import fcntl, termios\ntry:\n    fcntl.ioctl(0, termios.TIOCSTI, b'x')\n    print('injected')\nexcept OSError as e:\n    print('errno', e.errno)\n";
    let (out, _) = d
        .invoke(
            &s,
            "exec_command",
            &args(serde_json::json!({"cmd": format!("python3 -c \"{probe}\""), "tty": true, "yield_time_ms": 5000})),
        )
        .await;
    assert!(body_of(&out).contains("errno 1"), "{out}");

    let (out, _) = d
        .invoke(
            &s,
            "exec_command",
            &args(serde_json::json!({
                "cmd": "sleep 1011 & setsid sleep 1012 & (sleep 1013 &); sleep 1014",
                "tty": true,
                "yield_time_ms": 500,
            })),
        )
        .await;
    assert!(session_id_of(&out).is_some(), "{out}");
    assert!(
        eventually(Duration::from_secs(5), || host_pids("sleep 101[1-4]").len()
            >= 4)
        .await,
        "the tree runs: {:?}",
        host_pids("sleep 101")
    );
    close(&d, &s).await;
    assert!(
        eventually(Duration::from_secs(5), || host_pids("sleep 101[1-4]")
            .is_empty())
        .await,
        "left behind: {:?}",
        host_pids("sleep 101[1-4]")
    );
}

/// A long-lived process that creates `.git` between calls: it is taken away at once (checked
/// on the host), the next call's output says so, and the clean exit is reported as 1.
#[tokio::test]
async fn protected_name_created_by_a_live_process_is_taken_away() {
    let d = Daemon::start(&[]).await;
    let cwd = scratch();
    let s = d.open(cwd.path(), SandboxMode::WorkspaceWrite).await;
    let (out, _) = d
        .invoke(
            &s,
            "exec_command",
            &args(serde_json::json!({
                "cmd": "read a; mkdir .git && echo made; read b; exit 0",
                "tty": true,
                "yield_time_ms": 250,
            })),
        )
        .await;
    let id = session_id_of(&out).expect("running");
    let (out, ok) = d
        .invoke(
            &s,
            "write_stdin",
            &args(serde_json::json!({"session_id": id, "chars": "go\n", "yield_time_ms": 1000})),
        )
        .await;
    assert!(ok, "{out}");
    assert!(
        eventually(Duration::from_secs(3), || !cwd.path().join(".git").exists()).await,
        ".git survived"
    );
    // H18: the process that made it was killed with every other process of the sandbox, and
    // the session refuses further commands.
    assert!(
        out.contains(&format!(
            "sandbox blocked creation of protected workspace metadata path {}",
            cwd.path().join(".git").display()
        )),
        "{out}"
    );
    assert!(
        out.contains("sandbox stopped every process of this session"),
        "{out}"
    );
    assert!(out.contains("Process exited with code 137"), "{out}");
    assert!(!cwd.path().join(".git").exists());
    let refused = d.try_sh(&s, "true").await.unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
}

/// §7.6 test 8: 65 processes; every call succeeds; the first is evicted and its tree killed.
#[tokio::test]
async fn sixty_five_processes_evict_the_oldest() {
    let d = Daemon::start(&[]).await;
    let cwd = scratch();
    let s = d.open(cwd.path(), SandboxMode::WorkspaceWrite).await;
    // Durations unique to this test process: the host-wide process counts below must not see
    // another run of this suite on the same machine (two CI runs side by side counted 128).
    let (oldest, rest) = {
        let base = 100_000 + 2 * (std::process::id() % 400_000);
        (base, base + 1)
    };
    let mut first = None;
    for i in 0..65 {
        let secs = if i == 0 { oldest } else { rest };
        let (out, ok) = d
            .invoke(
                &s,
                "exec_command",
                &args(serde_json::json!({"cmd": format!("sleep {secs}"), "yield_time_ms": 250})),
            )
            .await;
        assert!(ok, "call {}: {out}", i + 1);
        let id = session_id_of(&out).expect("running");
        first.get_or_insert(id);
    }
    let first = first.unwrap();
    let (out, ok) = d
        .invoke(
            &s,
            "write_stdin",
            &args(serde_json::json!({"session_id": first})),
        )
        .await;
    assert_eq!(
        (out, ok),
        (
            format!("write_stdin failed: Unknown process id {first}"),
            false
        )
    );
    assert!(
        eventually(Duration::from_secs(5), || host_pids(&format!(
            "slee[p] {oldest}$"
        ))
        .is_empty())
        .await,
        "the evicted process survived"
    );
    assert_eq!(host_pids(&format!("slee[p] {rest}$")).len(), 64);
    close(&d, &s).await;
    assert!(
        eventually(Duration::from_secs(10), || host_pids(&format!(
            "slee[p] {rest}$"
        ))
        .is_empty())
        .await
    );
}

/// Codex's `background_terminal_max_timeout` as a session option: an empty poll that asks for a
/// minute waits only the session's ceiling; a ceiling over an hour is refused, naming the field.
#[tokio::test]
async fn the_empty_poll_ceiling_is_a_session_option() {
    let d = Daemon::start(&[]).await;
    let cwd = scratch();
    let req = |ms: u64| api::OpenSessionRequest {
        cwd: cwd.path().to_string_lossy().into_owned(),
        mode: SandboxMode::ReadOnly as i32,
        background_terminal_max_timeout_ms: ms,
        ..Default::default()
    };
    let e = d.try_open_with(req(3_600_001)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(
        e.message().contains("background_terminal_max_timeout_ms"),
        "{}",
        e.message()
    );
    let s = d.open_with(req(6_000)).await;
    let (out, ok) = d
        .invoke(
            &s,
            "exec_command",
            &args(serde_json::json!({"cmd": "sleep 60", "yield_time_ms": 250})),
        )
        .await;
    assert!(ok, "{out}");
    let id = session_id_of(&out).expect("kept");
    let t = Instant::now();
    let (out, ok) = d
        .invoke(
            &s,
            "write_stdin",
            &args(serde_json::json!({"session_id": id, "chars": "", "yield_time_ms": 60_000})),
        )
        .await;
    let waited = t.elapsed();
    assert!(ok, "{out}");
    assert!(
        waited >= Duration::from_millis(5_900) && waited < Duration::from_secs(15),
        "waited {waited:?}"
    );
    assert_eq!(session_id_of(&out), Some(id));
}
