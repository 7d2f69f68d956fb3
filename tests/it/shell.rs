//! The shell tools through the real daemon: Codex's model-facing formats via Invoke, the typed
//! Shell and ShellStream RPCs, escalation, cancellation, and the protected-name watcher.

use crate::common::{Daemon, host_sh, scratch};
use corral::api::{self, SandboxMode};
use std::time::{Duration, Instant};

#[tokio::test]
async fn shell_through_the_bridge_is_codex_text() {
    let d = Daemon::start(&[]).await;
    let cwd = scratch();
    let id = d.open(cwd.path(), SandboxMode::WorkspaceWrite).await;

    // §6.6 test 1 and 2.
    assert_eq!(
        d.invoke(&id, "shell", r#"{"command":["bash","-lc","echo hi"]}"#)
            .await,
        (
            r#"{"output":"hi\n","metadata":{"exit_code":0,"duration_seconds":0.0}}"#.to_string(),
            true
        )
    );
    let (out, ok) = d
        .invoke(
            &id,
            "shell",
            r#"{"command":["bash","-lc","echo oops; exit 3"]}"#,
        )
        .await;
    assert!(!ok);
    assert!(
        out.starts_with(r#"{"output":"oops\n","metadata":{"exit_code":3,"#),
        "{out}"
    );
    // container.exec is an alias.
    let (out, ok) = d
        .invoke(&id, "container.exec", r#"{"command":["true"]}"#)
        .await;
    assert!(ok, "{out}");

    // shell_command: the freeform format.
    let (out, ok) = d
        .invoke(
            &id,
            "shell_command",
            r#"{"command":"echo hi","login":false}"#,
        )
        .await;
    assert!(ok);
    assert_eq!(out, "Exit code: 0\nWall time: 0 seconds\nOutput:\nhi\n");

    // Truncation (§6.5 worked example): seq 1 3000.
    let (out, _) = d
        .invoke(&id, "shell", r#"{"command":["seq","1","3000"]}"#)
        .await;
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let text = v["output"].as_str().unwrap();
    assert!(text.starts_with("Total output lines: 3000\n\n1\n2\n"));
    assert!(
        text.contains("1221\n12…3893 chars truncated…2001\n2002\n"),
        "{text}"
    );

    // Signal death is 128+N with the output kept (§6.6 test 15); stdin is /dev/null (test 16).
    let (out, ok) = d
        .invoke(
            &id,
            "shell",
            r#"{"command":["bash","-lc","kill -SEGV $$"]}"#,
        )
        .await;
    assert!(!ok);
    assert!(out.contains(r#""exit_code":139"#), "{out}");
    let (out, ok) = d
        .invoke(&id, "shell", r#"{"command":["bash","-lc","cat"]}"#)
        .await;
    assert!(ok, "{out}");

    // Spawn failure and parse errors.
    assert_eq!(
        d.invoke(&id, "shell", r#"{"command":["nosuchcmd-corral"]}"#)
            .await,
        (
            "execution error: No such file or directory (os error 2): nosuchcmd-corral".to_string(),
            false
        )
    );
    assert_eq!(
        d.invoke(&id, "shell", r#"{"command":"echo"}"#).await.0,
        "failed to parse function arguments: invalid type: string \"echo\", expected a sequence at line 1 column 17"
    );
    // Network off (§6.6 test 17).
    let (out, _) = d
        .invoke(
            &id,
            "shell",
            r#"{"command":["bash","-lc","echo $CODEX_SANDBOX_NETWORK_DISABLED"]}"#,
        )
        .await;
    assert!(out.starts_with(r#"{"output":"1\n""#), "{out}");
}

#[tokio::test]
async fn process_trees_are_killed_at_timeout_and_after_the_drain() {
    let d = Daemon::start(&[]).await;
    let cwd = scratch();
    let id = d.open(cwd.path(), SandboxMode::WorkspaceWrite).await;
    // §6.6 test 13: escaped descendants die with the tree.
    // The host-wide check below counts on durations no other test of the binary runs.
    let (out, ok) = d
        .invoke(&id, "shell", r#"{"command":["bash","-lc","setsid sleep 1041 & (sleep 1042 &) ; sleep 1043"],"timeout_ms":300}"#)
        .await;
    assert!(!ok);
    assert!(out.contains(r#""exit_code":124"#), "{out}");
    assert!(out.contains("command timed out after "), "{out}");
    let (_, ps) = host_sh("ps -eo args");
    for s in ["sleep 1041", "sleep 1042", "sleep 1043"] {
        assert!(!ps.lines().any(|l| l == s), "{s} survived");
    }
    // §6.6 test 14: background leftovers are killed after the 2 s drain.
    let start = Instant::now();
    let (out, ok) = d
        .invoke(
            &id,
            "shell",
            r#"{"command":["bash","-lc","sleep 100 & echo started"]}"#,
        )
        .await;
    assert!(ok, "{out}");
    assert!(out.starts_with(r#"{"output":"started\n""#));
    assert!(start.elapsed() < Duration::from_secs(5));
    let (_, ps) = host_sh("ps -eo args");
    assert!(
        !ps.lines().any(|l| l == "sleep 100"),
        "background sleep survived"
    );
}

#[tokio::test]
async fn typed_shell_and_stream() {
    let d = Daemon::start(&[]).await;
    let cwd = scratch();
    let id = d.open(cwd.path(), SandboxMode::ReadOnly).await;
    let r = d.sh(&id, "echo out; echo err >&2; exit 4").await;
    assert_eq!(r.exit_code, 4);
    assert!(!r.response.success);
    assert_eq!(r.response.stdout.as_ref().unwrap().head, b"out\n");
    assert_eq!(r.response.stderr.as_ref().unwrap().head, b"err\n");

    // A script runs in the user's shell with the freeform text.
    let r = d
        .shell(api::ShellRequest {
            session_id: id.clone(),
            script: "echo $((6*7))".into(),
            login: Some(false),
            ..Default::default()
        })
        .await;
    assert_eq!(
        r.response.text,
        "Exit code: 0\nWall time: 0 seconds\nOutput:\n42\n"
    );

    // Neither command nor script.
    let err = d
        .tools()
        .await
        .shell(api::ShellRequest {
            session_id: id.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);

    // The stream: begin, every delta in order, end.
    let mut stream = d
        .tools()
        .await
        .shell_stream(api::ShellRequest {
            session_id: id.clone(),
            command: vec![
                "bash".into(),
                "-c".into(),
                "for i in 1 2 3; do echo $i; sleep 0.05; done".into(),
            ],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut events = Vec::new();
    while let Some(ev) = stream.message().await.unwrap() {
        events.push(ev.event.unwrap());
    }
    use api::shell_stream_event::Event;
    assert!(matches!(events.first(), Some(Event::Begin(b)) if b.argv[0] == "bash"));
    let mut data = Vec::new();
    let mut seqs = Vec::new();
    for ev in &events[1..events.len() - 1] {
        let Event::Delta(delta) = ev else {
            panic!("{ev:?}")
        };
        seqs.push(delta.seq);
        data.extend_from_slice(&delta.data);
    }
    assert_eq!(data, b"1\n2\n3\n");
    assert_eq!(seqs, (0..seqs.len() as u64).collect::<Vec<_>>());
    let Some(Event::End(end)) = events.last() else {
        panic!()
    };
    assert_eq!(end.exit_code, 0);
}

#[tokio::test]
async fn a_cancelled_stream_kills_its_command() {
    let d = Daemon::start(&[]).await;
    let cwd = scratch();
    let id = d.open(cwd.path(), SandboxMode::WorkspaceWrite).await;
    let mut stream = d
        .tools()
        .await
        .shell_stream(api::ShellRequest {
            session_id: id,
            command: vec![
                "bash".into(),
                "-c".into(),
                "echo go; setsid sleep 1234 & sleep 1235".into(),
            ],
            timeout_ms: Some(60_000),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    // Wait for the first output, then walk away.
    loop {
        let ev = stream.message().await.unwrap().unwrap();
        if let Some(api::shell_stream_event::Event::Delta(_)) = ev.event {
            break;
        }
    }
    drop(stream);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (_, ps) = host_sh("ps -eo args");
        if !ps.lines().any(|l| l == "sleep 1234" || l == "sleep 1235") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "cancelled command still running:\n{ps}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn escalation_is_refused_unless_the_operator_allows_it() {
    const REFUSAL: &str = "approval policy is Never; reject command \u{2014} you should not ask for escalated permissions if the approval policy is Never";
    let d = Daemon::start(&[]).await;
    let cwd = scratch();
    let id = d.open(cwd.path(), SandboxMode::ReadOnly).await;
    for args in [
        r#"{"command":["touch","x"],"sandbox_permissions":"require_escalated"}"#,
        r#"{"command":["touch","x"],"with_escalated_permissions":true}"#,
    ] {
        assert_eq!(
            d.invoke(&id, "shell", args).await,
            (REFUSAL.to_string(), false)
        );
    }
    let err = d
        .tools()
        .await
        .shell(api::ShellRequest {
            session_id: id.clone(),
            command: vec!["touch".into(), "x".into()],
            with_escalated_permissions: true,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        (err.code(), err.message()),
        (tonic::Code::PermissionDenied, REFUSAL)
    );
    assert!(!cwd.path().join("x").exists());

    // With escalation allowed, the same read-only session's call writes (danger-full-access).
    let d = Daemon::start(&["--allow-escalation", "--root-callers", "trusted"]).await;
    let id = d.open(cwd.path(), SandboxMode::ReadOnly).await;
    let (out, ok) = d
        .invoke(
            &id,
            "shell",
            r#"{"command":["touch","x"],"sandbox_permissions":"require_escalated"}"#,
        )
        .await;
    assert!(ok, "{out}");
    assert!(cwd.path().join("x").exists());
    // Without asking, the session stays read-only.
    let (_, ok) = d.invoke(&id, "shell", r#"{"command":["touch","y"]}"#).await;
    assert!(!ok);
    assert!(!cwd.path().join("y").exists());

    // Closing the session releases its workers, the escalated one included. (A worker's policy
    // is not in its argv — other users could read it — so count the daemon's worker children.)
    let daemon_pid = d.child.as_ref().unwrap().id();
    let workers = || {
        host_sh(&format!("pgrep -c -P {daemon_pid} -f __worker"))
            .1
            .trim()
            .parse::<u32>()
            .unwrap_or(0)
    };
    assert_eq!(workers(), 2, "the session's worker and the escalated one");
    d.sessions()
        .await
        .close_session(api::CloseSessionRequest { session_id: id })
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while workers() > 0 {
        assert!(
            Instant::now() < deadline,
            "the escalated worker outlived its session"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// spec/sandbox.md §8.2 case 28: protected names cannot be created.
#[tokio::test]
async fn creating_protected_names_is_blocked() {
    let d = Daemon::start(&[]).await;
    let cwd = scratch();
    let real = std::fs::canonicalize(cwd.path()).unwrap();
    for (script, name) in [
        ("git init -q", ".git"),
        ("mkdir .codex", ".codex"),
        ("mkdir .agents", ".agents"),
        ("touch .codex", ".codex"),
        ("ln -s x .git", ".git"),
        ("mkdir t && mv t .agents", ".agents"),
    ] {
        // A command that makes a protected name stops its session (H18): one session each.
        let id = d.open(cwd.path(), SandboxMode::WorkspaceWrite).await;
        let r = d.sh(&id, script).await;
        assert_ne!(r.exit_code, 0, "{script}: {}", r.output);
        assert!(r.response.sandbox_denied, "{script}");
        assert!(
            r.output.contains(&format!(
                "sandbox blocked creation of protected workspace metadata path {}/{name}",
                real.display()
            )),
            "{script}: {}",
            r.output
        );
        for n in [".git", ".codex", ".agents"] {
            assert!(!cwd.path().join(n).exists(), "{script}: {n} exists");
        }
    }
    // Ordinary files are still writable.
    let id = d.open(cwd.path(), SandboxMode::WorkspaceWrite).await;
    let r = d.sh(&id, "echo ok > fine.txt").await;
    assert_eq!(r.exit_code, 0);
}

#[tokio::test]
async fn a_dead_worker_fails_only_its_calls_and_is_replaced() {
    let d = Daemon::start(&[]).await;
    let cwd = scratch();
    let id = d.open(cwd.path(), SandboxMode::ReadOnly).await;
    let mut tools = d.tools().await;
    let same_session = id.clone();
    let call = tokio::spawn(async move {
        tools
            .shell(api::ShellRequest {
                session_id: id,
                command: vec!["sleep".into(), "37".into()],
                timeout_ms: Some(60_000),
                ..Default::default()
            })
            .await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Kill this session's worker (the daemon's only worker child) from outside.
    let daemon_pid = d.child.as_ref().unwrap().id();
    let (code, out) = host_sh(&format!("pkill -KILL -P {daemon_pid} -f __worker"));
    assert_eq!(code, 0, "no worker found: {out}");
    let err = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("the call must fail promptly")
        .unwrap()
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable);
    assert!(
        err.message().contains("sandbox worker"),
        "{}",
        err.message()
    );
    // The session's next call gets a new worker.
    let r = d.sh(&same_session, "echo back").await;
    assert_eq!(r.output, "back\n");
    // The sleep of the dead worker's command did not survive it.
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Host-wide: `sleep 37` is this test's alone (other tests run `sleep 30`).
    let (_, ps) = host_sh("ps -eo args");
    assert!(
        !ps.lines().any(|l| l == "sleep 37"),
        "orphaned command survived"
    );
}

#[tokio::test]
async fn closing_a_session_cancels_its_running_commands() {
    // danger-full-access has no PID namespace to end them, so this is the demanding case.
    let d = Daemon::start(&["--root-callers", "trusted"]).await;
    let cwd = scratch();
    let id = d.open(cwd.path(), SandboxMode::DangerFullAccess).await;
    let mut tools = d.tools().await;
    let sid = id.clone();
    let call = tokio::spawn(async move {
        tools
            .shell(api::ShellRequest {
                session_id: sid,
                command: vec![
                    "bash".into(),
                    "-c".into(),
                    "setsid sleep 1237 & sleep 1236".into(),
                ],
                timeout_ms: Some(60_000),
                ..Default::default()
            })
            .await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    d.sessions()
        .await
        .close_session(api::CloseSessionRequest { session_id: id })
        .await
        .unwrap();
    let err = tokio::time::timeout(Duration::from_secs(5), call)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Cancelled);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (_, ps) = host_sh("ps -eo args");
        if !ps.lines().any(|l| l == "sleep 1236" || l == "sleep 1237") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "commands of the closed session survived:\n{ps}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A timeout kills the shell and its children together: killed one by one, the shell could see
/// its child die and run the rest of its script before its own SIGKILL (3 of 25 runs of
/// `sleep 30; echo finished` printed `finished` under load before the group kill). Under CPU
/// load, no script runs past its timeout; the marker it would write proves it on the host.
#[tokio::test]
async fn a_timed_out_script_runs_nothing_after_its_timeout() {
    let d = Daemon::start(&[]).await;
    let cwd = scratch();
    let id = d.open(cwd.path(), SandboxMode::WorkspaceWrite).await;
    let burners: Vec<std::process::Child> = (0..3)
        .map(|_| {
            std::process::Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .spawn()
                .unwrap()
        })
        .collect();
    let marker = cwd.path().join("after-timeout");
    for _ in 0..25 {
        let (out, ok) = d
            .invoke(
                &id,
                "shell_command",
                r#"{"command":"sleep 29; touch after-timeout; echo finished","timeout_ms":200}"#,
            )
            .await;
        assert!(!ok, "{out}");
        assert!(
            !out.contains("\nfinished") && !marker.exists(),
            "the script went on after its timeout: {out}"
        );
    }
    for mut b in burners {
        let _ = b.kill();
        let _ = b.wait();
    }
}
