//! The audit log: one JSON line per call with who, what, how it ended — never file contents —
//! and reopened on SIGHUP for logrotate.

use crate::common::{Daemon, outside, scratch};
use corral::api::{self, SandboxMode};
use std::time::Duration;

fn lines(path: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test]
async fn every_call_is_one_json_line_and_sighup_reopens_the_file() {
    let logs = outside();
    let log = logs.path().join("audit.log");
    let d = Daemon::start(&["--audit-log", log.to_str().unwrap()]).await;
    let cwd = scratch();
    std::fs::write(cwd.path().join("f.txt"), "TOP-SECRET-CONTENT\n").unwrap();
    let id = d.open(cwd.path(), SandboxMode::WorkspaceWrite).await;

    d.invoke(&id, "read_file", r#"{"file_path":"f.txt"}"#).await;
    let r = d.sh(&id, "exit 3").await;
    assert_eq!(r.exit_code, 3);
    let patch = serde_json::json!({"input": "*** Begin Patch\n*** Add File: new.txt\n+PATCH-BODY-SECRET\n*** End Patch"}).to_string();
    assert!(d.invoke(&id, "apply_patch", &patch).await.1);
    let err = d
        .tools()
        .await
        .read_file(api::ReadFileRequest {
            session_id: id.clone(),
            file_path: "missing.txt".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);

    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        !text.contains("TOP-SECRET-CONTENT") && !text.contains("PATCH-BODY-SECRET"),
        "{text}"
    );
    let l = lines(&log);
    assert_eq!(l.len(), 4, "{text}");
    let me = nix::unistd::geteuid().as_raw();
    for line in &l {
        assert_eq!(line["uid"], me);
        assert!(line["pid"].as_i64().unwrap() > 0);
        assert_eq!(line["session"], id.as_str());
        assert_eq!(line["mode"], "workspace-write");
        assert_eq!(line["escalated"], false);
        assert!(line["time"].as_str().unwrap().ends_with('Z'));
        assert!(line["duration_ms"].is_u64());
        assert!(line["bytes_in"].as_u64().unwrap() > 0);
    }
    assert_eq!(
        (l[0]["tool"].as_str(), l[0]["outcome"].as_str()),
        (Some("read_file"), Some("ok"))
    );
    assert_eq!(l[0]["targets"], serde_json::json!(["f.txt"]));
    assert!(l[0]["bytes_out"].as_u64().unwrap() > 0);
    assert_eq!(
        (l[1]["tool"].as_str(), l[1]["outcome"].as_str()),
        (Some("shell"), Some("failed"))
    );
    assert_eq!(l[1]["exit_code"], 3);
    assert_eq!(l[1]["targets"], serde_json::json!(["bash", "-c", "exit 3"]));
    assert_eq!(l[2]["tool"], "apply_patch");
    assert_eq!(l[2]["targets"], serde_json::json!(["new.txt"]));
    assert_eq!(
        (l[3]["tool"].as_str(), l[3]["outcome"].as_str()),
        (Some("read_file"), Some("NOT_FOUND"))
    );

    // logrotate: move the file away, SIGHUP, and the next line lands in a new file.
    let rotated = logs.path().join("audit.log.1");
    std::fs::rename(&log, &rotated).unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.pid() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    d.invoke(&id, "list_dir", r#"{"dir_path":"."}"#).await;
    assert_eq!(lines(&rotated).len(), 4);
    let fresh = lines(&log);
    assert_eq!(fresh.len(), 1);
    assert_eq!(fresh[0]["tool"], "list_dir");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&log).unwrap().permissions().mode() & 0o777,
        0o600
    );
}

/// H25: every command is in the audit log — Codex's default shell tool included: what ran
/// (`exec_command`'s `cmd`), where (cwd, mode), how it ended (exit code) or the process id it
/// still runs under; a `write_stdin` names its process and byte count, and the one that sees
/// the exit writes the exit code. The typed Processes RPCs the same way.
#[tokio::test]
async fn every_command_is_audited_with_how_it_ended() {
    let logs = outside();
    let log = logs.path().join("audit.log");
    let d = Daemon::start(&["--audit-log", log.to_str().unwrap()]).await;
    let cwd = scratch();
    let id = d.open(cwd.path(), SandboxMode::WorkspaceWrite).await;
    let canonical = std::fs::canonicalize(cwd.path()).unwrap();
    let last = || lines(&log).last().cloned().unwrap();

    let (_, ok) = d
        .invoke(&id, "exec_command", r#"{"cmd":"echo hi; exit 7"}"#)
        .await;
    assert!(ok);
    let line = last();
    assert_eq!(line["tool"], "exec_command");
    assert_eq!(line["targets"], serde_json::json!(["echo hi; exit 7"]));
    assert_eq!(line["exit_code"], 7, "{line}");
    assert_eq!(line["mode"], "workspace-write");
    assert_eq!(line["cwd"], canonical.to_str().unwrap(), "{line}");
    assert!(line.get("process_id").is_none(), "{line}");

    // A command that is still running: its process id, no exit code yet.
    let (out, _) = d
        .invoke(
            &id,
            "exec_command",
            r#"{"cmd":"read line; echo got $line; exit 4","tty":true,"yield_time_ms":300}"#,
        )
        .await;
    let line = last();
    let pid = line["process_id"]
        .as_i64()
        .unwrap_or_else(|| panic!("a process id: {line}\n{out}"));
    assert!(out.contains(&format!("session ID {pid}")), "{out}");
    assert!(line["exit_code"].is_null(), "{line}");

    // write_stdin: the process and the bytes written; the call that sees the exit has it.
    let (out, _) = d
        .invoke(
            &id,
            "write_stdin",
            &serde_json::json!({"session_id": pid, "chars": "abc\n", "yield_time_ms": 2000})
                .to_string(),
        )
        .await;
    assert!(out.contains("got abc"), "{out}");
    let line = last();
    assert_eq!(line["tool"], "write_stdin");
    assert_eq!(line["process_id"], pid, "{line}");
    assert_eq!(line["input_bytes"], 4, "{line}");
    assert_eq!(line["exit_code"], 4, "{line}");

    // shell and shell_command through Invoke.
    d.invoke(&id, "shell", r#"{"command":["bash","-c","exit 5"]}"#)
        .await;
    assert_eq!(last()["exit_code"], 5);
    let id2 = d
        .open_with(api::OpenSessionRequest {
            cwd: cwd.path().to_string_lossy().into_owned(),
            mode: SandboxMode::ReadOnly as i32,
            shell_tool: api::ShellTool::ShellCommand as i32,
            ..Default::default()
        })
        .await;
    d.invoke(&id2, "shell_command", r#"{"command":"exit 6"}"#)
        .await;
    let line = last();
    assert_eq!(
        (line["exit_code"].clone(), line["mode"].clone()),
        (6.into(), "read-only".into())
    );

    // A typed StartProcess: its argv and process id.
    let started = d
        .processes()
        .await
        .start_process(api::StartProcessRequest {
            session_id: id.clone(),
            command: Some(api::start_process_request::Command::Argv(api::Argv {
                args: vec!["sleep".into(), "30".into()],
            })),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let line = last();
    assert_eq!(line["tool"], "process_start");
    assert_eq!(line["targets"], serde_json::json!(["sleep", "30"]));
    assert_eq!(line["process_id"], started.process_id, "{line}");
}
