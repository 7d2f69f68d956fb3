//! The CLI as a newcomer uses it, through the real binary against a real daemon: `exec` streams
//! live and exits with the command's status, `sessions` and `ps` find things again (only your
//! own), `tools`/`capabilities` say what a session really offers, `cp -p` and its progress
//! line, `invoke` arguments from stdin or a file, `--exclude-slash-tmp`, and errors that say
//! what and where (as JSON under `--json`).

use crate::common::{CORRAL, Daemon, TestUser, client_binary, outside, scratch};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs `corral ARGS --socket SOCKET` in `dir`; (exit code, stdout, stderr).
fn corral(d: &Daemon, dir: &Path, args: &[&str]) -> (i32, String, String) {
    corral_with_stdin(d, dir, args, None)
}

fn corral_with_stdin(
    d: &Daemon,
    dir: &Path,
    args: &[&str],
    stdin: Option<&str>,
) -> (i32, String, String) {
    use std::io::Write;
    // --socket first: after an exec's `--`, everything belongs to the command.
    let mut child = Command::new(client_binary())
        .args(["--socket", d.target()])
        .args(args)
        .current_dir(dir)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[tokio::test]
async fn exec_streams_output_live_and_exits_with_the_commands_status() {
    let d = Daemon::start(&[]).await;
    let ws = scratch();
    // The first line must arrive while the command still runs (it sleeps 3 s after it).
    let started = Instant::now();
    let mut child = Command::new(client_binary())
        .args(["exec", "--socket", d.target(), "--timeout-ms", "20000"])
        .args(["--", "bash", "-c", "echo first; sleep 3; echo second"])
        .current_dir(ws.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "first");
    let first_at = started.elapsed();
    assert_eq!(lines.next().unwrap().unwrap(), "second");
    let second_at = started.elapsed();
    assert!(child.wait().unwrap().success());
    assert!(
        second_at - first_at >= Duration::from_secs(2),
        "the first line came with the last: {first_at:?} vs {second_at:?}"
    );

    // stdout and stderr stay apart; the exit status is the command's.
    let (code, out, err) = corral(
        &d,
        ws.path(),
        &["exec", "--", "sh", "-c", "echo out; echo err >&2; exit 3"],
    );
    assert_eq!((code, out.as_str()), (3, "out\n"), "{err}");
    assert!(err.starts_with("err\n"), "{err}");

    // A script through the shell; options after `--` belong to the command.
    let (code, out, _) = corral(&d, ws.path(), &["exec", "--shell", "seq 3 | tail -1"]);
    assert_eq!((code, out.trim_end().lines().last()), (0, Some("3")));
    let (code, out, _) = corral(&d, ws.path(), &["exec", "--", "ls", "-a", "."]);
    assert_eq!(code, 0);
    assert!(out.contains(".."), "{out}");

    // A timeout: 124, and it says so.
    let (code, _, err) = corral(
        &d,
        ws.path(),
        &["exec", "--timeout-ms", "300", "--", "sleep", "20"],
    );
    assert_eq!(code, 124, "{err}");
    assert!(err.contains("timed out"), "{err}");

    // The sandbox holds: a read-only session cannot write, and says the sandbox denied it;
    // workspace-write can.
    let (code, _, err) = corral(&d, ws.path(), &["exec", "--", "touch", "made"]);
    assert_ne!(code, 0);
    assert!(err.contains("sandbox denied"), "{err}");
    assert!(!ws.path().join("made").exists());
    let (code, _, err) = corral(
        &d,
        ws.path(),
        &["exec", "--mode", "workspace-write", "--", "touch", "made"],
    );
    assert_eq!(code, 0, "{err}");
    assert!(ws.path().join("made").exists());

    // --json: one object per chunk, then the end.
    let (code, out, _) = corral(&d, ws.path(), &["--json", "exec", "--", "echo", "hi"]);
    assert_eq!(code, 0);
    let events: Vec<serde_json::Value> = out.lines().map(json).collect();
    assert_eq!(events[0]["stream"], "stdout");
    assert_eq!(events[0]["data"], "hi\n");
    assert_eq!(events.last().unwrap()["exit_code"], 0);
}

#[tokio::test]
async fn sessions_and_ps_list_your_own_sessions_and_processes_only() {
    let d = Daemon::start(&[]).await;
    let socket = d.open_to_local_users();
    let ws = scratch();
    let (code, id, err) = corral(
        &d,
        ws.path(),
        &["open-session", "--mode", "workspace-write"],
    );
    assert_eq!(code, 0, "{err}");
    let id = id.trim().to_string();
    let (code, _, err) = corral(
        &d,
        ws.path(),
        &[
            "invoke",
            "exec_command",
            r#"{"cmd":"sleep 60","yield_time_ms":250}"#,
            "--session",
            &id,
        ],
    );
    assert_eq!(code, 0, "{err}");

    let (code, out, _) = corral(&d, ws.path(), &["--json", "sessions"]);
    assert_eq!(code, 0);
    let listed = json(&out);
    let sessions = listed["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 1, "{out}");
    assert_eq!(sessions[0]["session_id"], id.as_str());
    assert_eq!(sessions[0]["mode"], "workspace-write");
    assert_eq!(
        sessions[0]["cwd"],
        std::fs::canonicalize(ws.path()).unwrap().to_str().unwrap()
    );
    assert!(
        sessions[0]["tools"]
            .as_array()
            .unwrap()
            .contains(&"exec_command".into())
    );
    let (_, table, _) = corral(&d, ws.path(), &["sessions"]);
    assert!(
        table.starts_with("SESSION") && table.contains(&id),
        "{table}"
    );

    let (code, out, err) = corral(&d, ws.path(), &["--json", "ps"]);
    assert_eq!(code, 0, "{err}");
    let procs = json(&out)["processes"].as_array().unwrap().clone();
    assert_eq!(procs.len(), 1, "{out}");
    assert_eq!(procs[0]["session_id"], id.as_str());
    assert_eq!(procs[0]["running"], true);
    assert!(
        procs[0]["command"].to_string().contains("sleep 60"),
        "{out}"
    );
    let (_, table, _) = corral(&d, ws.path(), &["ps", "--session", &id]);
    assert!(
        table.contains("sleep 60") && table.contains("running"),
        "{table}"
    );
    // The model chose the command: an escape sequence in it is shown escaped, not obeyed.
    let (code, _, err) = corral(
        &d,
        ws.path(),
        &[
            "invoke",
            "exec_command",
            r#"{"cmd":"sleep 61 # \u001b]0;PWNED\u0007\u001b[2K","yield_time_ms":250}"#,
            "--session",
            &id,
        ],
    );
    assert_eq!(code, 0, "{err}");
    let (_, table, _) = corral(&d, ws.path(), &["ps", "--session", &id]);
    assert!(
        table.contains("sleep 61") && !table.contains('\u{1b}') && table.contains(r"\x1b]0;PWNED"),
        "{table:?}"
    );

    // Another user sees none of it, and cannot list the processes of the session by its id.
    let other = TestUser::create("cliother");
    let (code, out, err) = other.corral(&socket, &["--json", "sessions"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&out)["sessions"], serde_json::json!([]));
    let (code, _, err) = other.corral(&socket, &["ps", "--session", &id]);
    assert_eq!(code, 2);
    assert!(err.contains("NotFound"), "{err}");

    // A caller that is itself sandboxed (here: no_new_privs, which the daemon lacks) is refused
    // the list: a session id is all it takes to use a session.
    let out = Command::new("setpriv")
        .args(["--no-new-privs", "--"])
        .arg(client_binary())
        .args(["sessions", "--socket", d.target()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("PermissionDenied") && !err.contains(&id),
        "{err}"
    );

    let (code, _, _) = corral(&d, ws.path(), &["close-session", &id]);
    assert_eq!(code, 0);
    let (_, out, _) = corral(&d, ws.path(), &["--json", "sessions"]);
    assert_eq!(json(&out)["sessions"], serde_json::json!([]));
}

#[tokio::test]
async fn tools_and_capabilities_say_what_a_session_really_offers() {
    let d = Daemon::start(&[]).await;
    let ws = scratch();
    let names = |out: &str| -> Vec<String> {
        json(out)
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_string())
            .collect()
    };
    // A new session's default shell tool is unified exec.
    let (code, out, err) = corral(&d, ws.path(), &["--json", "tools"]);
    assert_eq!(code, 0, "{err}");
    let default = names(&out);
    assert_eq!(&default[..2], ["exec_command", "write_stdin"]);
    let (_, out, _) = corral(
        &d,
        ws.path(),
        &["--json", "tools", "--shell-tool", "shell-command"],
    );
    assert_eq!(names(&out)[0], "shell_command");

    // An open session's own set.
    let s = d
        .open_with(corral::api::OpenSessionRequest {
            cwd: ws.path().to_string_lossy().into_owned(),
            mode: corral::api::SandboxMode::ReadOnly as i32,
            shell_tool: corral::api::ShellTool::Shell as i32,
            update_plan: Some(false),
            ..Default::default()
        })
        .await;
    let (_, out, _) = corral(&d, ws.path(), &["--json", "tools", "--session", &s]);
    let session_tools = names(&out);
    assert_eq!(session_tools[0], "shell");
    assert!(!session_tools.contains(&"update_plan".to_string()));

    // capabilities: a summary by default, every field under --json.
    let (code, out, _) = corral(&d, ws.path(), &["capabilities"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("a new session offers exec_command, write_stdin, read_file"),
        "{out}"
    );
    assert!(
        out.contains("profiles:") && out.contains("read-only"),
        "{out}"
    );
    assert!(out.contains("idle ones close after 3600 s"), "{out}");
    assert!(serde_json::from_str::<serde_json::Value>(&out).is_err());
    let (_, out, _) = corral(&d, ws.path(), &["--json", "capabilities"]);
    let caps = json(&out);
    assert_eq!(caps["default_session_tools"][0], "exec_command");
    assert_eq!(caps["session_idle_timeout_seconds"], 3600);
    assert!(caps["max_sessions"].as_u64().unwrap() > 0);
    assert!(
        caps["profiles"]
            .as_array()
            .unwrap()
            .contains(&"workspace-write".into())
    );
}

#[tokio::test]
async fn invoke_takes_arguments_from_stdin_or_a_file_and_explains_a_unified_diff() {
    let d = Daemon::start(&[]).await;
    let ws = scratch();
    std::fs::write(ws.path().join("a.txt"), "old\n").unwrap();
    let patch = "*** Begin Patch\n*** Update File: a.txt\n@@\n-old\n+new\n*** End Patch\n";
    std::fs::write(ws.path().join("change.patch"), patch).unwrap();
    let (code, out, err) = corral(
        &d,
        ws.path(),
        &[
            "invoke",
            "apply_patch",
            "--freeform",
            "@change.patch",
            "--mode",
            "workspace-write",
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        std::fs::read_to_string(ws.path().join("a.txt")).unwrap(),
        "new\n"
    );
    // stdin: `-`.
    let (code, out, err) = corral_with_stdin(
        &d,
        ws.path(),
        &["invoke", "read_file", "-"],
        Some(r#"{"file_path":"a.txt"}"#),
    );
    assert_eq!((code, out.trim_end()), (0, "L1: new"), "{err}");

    // A unified diff (which starts with `--`) is taken as the argument, fails as Codex fails,
    // and the CLI says what format apply_patch wants.
    let diff = "--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-new\n+newer\n";
    let (code, out, err) = corral(
        &d,
        ws.path(),
        &[
            "invoke",
            "apply_patch",
            "--freeform",
            diff,
            "--mode",
            "workspace-write",
        ],
    );
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("*** Begin Patch"), "{out}");
    assert!(
        err.contains("looks like a unified diff") && err.contains("*** Update File: PATH"),
        "{err}"
    );
    // A missing @file is named.
    let (code, _, err) = corral(&d, ws.path(), &["invoke", "read_file", "@nope.json"]);
    assert_eq!(code, 2);
    assert!(err.contains("nope.json"), "{err}");

    // A result too large for one answer is a tool failure the model reads (exit 1), not an
    // error (exit 2).
    let line = format!("{}\n", "x".repeat(99));
    std::fs::write(ws.path().join("big.txt"), line.repeat(400_000)).unwrap();
    let (code, out, err) = corral(
        &d,
        ws.path(),
        &[
            "invoke",
            "read_file",
            r#"{"file_path":"big.txt","limit":100000000}"#,
        ],
    );
    assert_eq!(code, 1, "{err}");
    assert!(out.contains("ask for less"), "{out}");
}

#[tokio::test]
async fn cp_creates_parents_on_request_and_shows_progress_on_a_terminal() {
    let d = Daemon::start(&[]).await;
    let ws = scratch();
    let local = outside();
    std::fs::write(local.path().join("a.txt"), "payload").unwrap();
    let src = local.path().join("a.txt");
    let src = src.to_str().unwrap();
    let (code, _, err) = corral(&d, ws.path(), &["cp", src, ":deep/new/dir/a.txt"]);
    assert_eq!(code, 2);
    assert!(err.contains("corral cp -p"), "{err}");
    let (code, _, err) = corral(&d, ws.path(), &["cp", "-p", src, ":deep/new/dir/a.txt"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        std::fs::read_to_string(ws.path().join("deep/new/dir/a.txt")).unwrap(),
        "payload"
    );
    // Downloads too: the local parents are made.
    let dst = local.path().join("x/y/a.txt");
    let (code, _, err) = corral(
        &d,
        ws.path(),
        &[
            "cp",
            "--parents",
            ":deep/new/dir/a.txt",
            dst.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(std::fs::read_to_string(&dst).unwrap(), "payload");

    // Progress: only when stderr is a terminal (script(1) gives the command one), only for a
    // copy that takes a while. 600 MB of zeros through a debug build takes seconds.
    let big = local.path().join("big.bin");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(600_000_000)
        .unwrap();
    let line = format!(
        "{} cp {} :big.bin --socket {} 2>&1 >/dev/null",
        client_binary().display(),
        big.display(),
        d.target()
    );
    let out = Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .current_dir(ws.path())
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{shown}");
    assert!(
        shown.contains("copying: ") && shown.contains("MB/s"),
        "{shown:?}"
    );
    assert_eq!(
        std::fs::metadata(ws.path().join("big.bin")).unwrap().len(),
        600_000_000
    );
    // Without a terminal: no progress line.
    let (code, _, err) = corral(&d, ws.path(), &["cp", big.to_str().unwrap(), ":big2.bin"]);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("copying"), "{err}");
}

#[tokio::test]
async fn state_under_tmp_is_warned_about_and_exclude_slash_tmp_gets_past_it() {
    let state = tempfile::tempdir_in("/tmp").unwrap();
    let audit = state.path().join("audit.jsonl");
    let audit_flag = ["--audit-log", audit.to_str().unwrap()];
    // --check-config says it before the first start.
    let out = Command::new(CORRAL)
        .args(["serve", "--check-config"])
        .args(audit_flag)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("lies under /tmp") && err.contains("--exclude-slash-tmp"),
        "{err}"
    );
    let d = Daemon::start(&audit_flag).await;
    assert!(d.log_text().contains("lies under /tmp"), "{}", d.log_text());
    let ws = outside();
    // Without the flag: refused, naming the fix; with it: the session works.
    let (code, _, err) = corral(
        &d,
        ws.path(),
        &["exec", "--mode", "workspace-write", "--", "true"],
    );
    assert_eq!(code, 2);
    assert!(err.contains("exclude_slash_tmp"), "{err}");
    for args in [
        &[
            "exec",
            "--mode",
            "workspace-write",
            "--exclude-slash-tmp",
            "--",
            "touch",
            "ok",
        ][..],
        &[
            "open-session",
            "--mode",
            "workspace-write",
            "--exclude-slash-tmp",
        ][..],
        &[
            "invoke",
            "list_dir",
            r#"{"dir_path":"."}"#,
            "--mode",
            "workspace-write",
            "--exclude-slash-tmp",
        ][..],
    ] {
        let (code, _, err) = corral(&d, ws.path(), args);
        assert_eq!(code, 0, "{args:?}: {err}");
    }
    assert!(ws.path().join("ok").exists());
    let src = ws.path().join("ok");
    let (code, _, err) = corral(
        &d,
        ws.path(),
        &[
            "cp",
            "--exclude-slash-tmp",
            src.to_str().unwrap(),
            ":copied",
        ],
    );
    assert_eq!(code, 0, "{err}");
}

#[tokio::test]
async fn errors_say_what_and_where() {
    let d = Daemon::start(&[]).await;
    let ws = scratch();
    std::fs::create_dir(ws.path().join("dir")).unwrap();
    std::fs::write(ws.path().join("file"), "x").unwrap();
    let at = |name: &str| {
        std::fs::canonicalize(ws.path())
            .unwrap()
            .join(name)
            .display()
            .to_string()
    };

    // The wrong kind of file is the caller's mistake, not INTERNAL, and the path is named.
    let (code, _, err) = corral(&d, ws.path(), &["read-file", "dir"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("FailedPrecondition") && err.contains(&at("dir")),
        "{err}"
    );
    let (_, _, err) = corral(&d, ws.path(), &["list-dir", "file"]);
    assert!(
        err.contains("FailedPrecondition") && err.contains(&at("file")),
        "{err}"
    );
    let (_, _, err) = corral(&d, ws.path(), &["read-file", "nope.txt"]);
    assert!(
        err.contains("NotFound") && err.contains(&at("nope.txt")),
        "{err}"
    );
    // The model text through Invoke stays Codex's.
    let (code, out, _) = corral(
        &d,
        ws.path(),
        &["invoke", "read_file", r#"{"file_path":"dir"}"#],
    );
    assert_eq!(code, 1);
    assert_eq!(
        out.trim_end(),
        "failed to read file: Is a directory (os error 21)"
    );

    // --json: an error object.
    let (code, out, err) = corral(&d, ws.path(), &["--json", "read-file", "nope.txt"]);
    assert_eq!((code, out.as_str()), (2, ""));
    let e = json(&err);
    assert_eq!(e["error"]["code"], "NOT_FOUND");
    assert!(e["error"]["message"].as_str().unwrap().contains("nope.txt"));

    // Connecting: the reason, and a hint for a TCP address written without tcp:.
    let dir = outside();
    let missing = dir.path().join("none.sock");
    let run = |socket: &str| {
        let out = Command::new(client_binary())
            .args(["health", "--socket", socket])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = run(missing.to_str().unwrap());
    assert_eq!(code, Some(2));
    assert!(
        err.contains("no socket there") && err.contains("corral serve"),
        "{err}"
    );
    // A stale socket: the file is there, nothing listens.
    let stale = dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let (_, err) = run(stale.to_str().unwrap());
    assert!(err.contains("nothing listens"), "{err}");
    let (_, err) = run("127.0.0.1:7878");
    assert!(err.contains("did you mean tcp:127.0.0.1:7878?"), "{err}");
}

#[test]
fn help_lists_the_commands_own_options_before_the_connection_options() {
    let out = Command::new(CORRAL)
        .args(["read-file", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    let own = help.find("--offset").expect("--offset");
    let heading = help.find("Connection options").expect("heading");
    let socket = help.find("--socket").expect("--socket");
    assert!(own < heading && heading < socket, "{help}");
    // The arguments and options are described.
    assert!(
        help.contains("The first line to show") && help.contains("relative to the session"),
        "{help}"
    );
    let out = Command::new(CORRAL)
        .args(["invoke", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("`-` reads them from stdin"), "{help}");
}

/// `corral tools` without a session prints, byte for byte, what a session opened with default
/// options lists (issue 21 item 6): opened by `corral open-session` or by OpenSession with every
/// option unset, in both API shapes, and its names are capabilities' `default_session_tools`.
#[tokio::test]
async fn tools_without_a_session_are_a_default_sessions_tools() {
    let d = Daemon::start(&[]).await;
    let ws = scratch();
    let (code, cli_session, err) = corral(&d, ws.path(), &["open-session"]);
    assert_eq!(code, 0, "{err}");
    let cli_session = cli_session.trim().to_string();
    let api_session = d.open(ws.path(), corral::api::SandboxMode::ReadOnly).await;
    let (_, caps, _) = corral(&d, ws.path(), &["--json", "capabilities"]);
    let default_names = json(&caps)["default_session_tools"].clone();
    for format in ["responses", "chat"] {
        let (code, sessionless, err) =
            corral(&d, ws.path(), &["--json", "tools", "--format", format]);
        assert_eq!(code, 0, "{err}");
        for session in [&cli_session, &api_session] {
            let (code, out, err) = corral(
                &d,
                ws.path(),
                &["--json", "tools", "--format", format, "--session", session],
            );
            assert_eq!(code, 0, "{err}");
            assert_eq!(sessionless, out, "{format}");
        }
        // The human form is the same JSON, indented.
        let (_, pretty, _) = corral(&d, ws.path(), &["tools", "--format", format]);
        assert_eq!(json(&pretty), json(&sessionless));
        let names: Vec<_> = json(&sessionless)
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.get("name").unwrap_or(&t["function"]["name"]).clone())
            .collect();
        assert_eq!(serde_json::Value::from(names), default_names, "{format}");
    }
}
