//! Hardening against reaching other daemons and impostors (spec/sandbox.md §8.6 H7, H16, H17) and a
//! daemon that survives its stderr closing. Real daemons, real CLI processes; each attack is
//! attempted, its effect on the host checked, and the allowed path shown to still work.
//! Needs root (CI runs as root); skipped with a note otherwise.

use crate::common::{self, CORRAL, Daemon};
use corral::api;
use std::os::unix::fs::{PermissionsExt, chown};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

fn root() -> bool {
    let ok = nix::unistd::geteuid().is_root();
    if !ok {
        eprintln!("skipped: these tests need root (CI runs as root)");
    }
    ok
}

/// Runs `cmd` to completion, but kills it and fails after 20 s: a daemon that should have refused
/// to start would otherwise serve forever and hang the test.
fn output_within(cmd: &mut Command) -> std::process::Output {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(out) => out.expect("wait"),
        Err(_) => {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            panic!("{cmd:?} was still running after 20 s (it should have refused to start)");
        }
    }
}

/// Runs `WRAPPER... corral ARGS` on the host; returns (status, stdout, stderr).
fn cli(wrapper: &[&str], args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = match wrapper.split_first() {
        Some((program, rest)) => {
            let mut c = Command::new(program);
            c.args(rest).arg(CORRAL);
            c
        }
        None => Command::new(CORRAL),
    };
    let out = cmd
        .args(args)
        .env_remove("CORRAL_SOCKET")
        .envs(env.iter().copied())
        .output()
        .expect("run the corral CLI");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
        String::from_utf8_lossy(&out.stderr).trim().to_string(),
    )
}

/// Runs `bash -c script` in a session with a generous timeout (the script runs the CLI).
async fn sh(d: &Daemon, session: &str, script: &str) -> String {
    d.shell(api::ShellRequest {
        session_id: session.into(),
        command: vec!["bash".into(), "-c".into(), script.into()],
        timeout_ms: Some(60_000),
        ..Default::default()
    })
    .await
    .output
}

fn open_dfa_args<'a>(cwd: &'a str, socket: &'a str) -> Vec<&'a str> {
    vec![
        "open-session",
        "--mode",
        "danger-full-access",
        "--cwd",
        cwd,
        "--socket",
        socket,
    ]
}

// ---------------------------------------------------------------------------------------------
// H7: a sandboxed caller gets no danger-full-access and no escalation.

#[tokio::test]
async fn h7_a_caller_under_no_new_privs_or_in_its_own_namespaces_is_refused_dfa() {
    if !root() {
        return;
    }
    // Root callers may use danger-full-access here, so only the peer check can refuse.
    let d = Daemon::start(&["--root-callers", "trusted"]).await;
    let cwd = common::outside();
    let cwd = cwd.path().to_str().unwrap();
    let args = open_dfa_args(cwd, d.target());

    // Baseline: the same caller without a wrapper gets its session.
    let (code, id, err) = cli(&[], &args, &[]);
    assert_eq!(code, 0, "unwrapped caller must be served: {err}");
    assert_eq!(id.len(), 32, "a session id: {id}");

    for wrapper in [
        &["setpriv", "--no-new-privs"][..],
        &["unshare", "--pid", "--fork", "--mount-proc"][..],
        &["unshare", "--mount"][..],
    ] {
        let (code, out, err) = cli(wrapper, &args, &[]);
        assert_eq!(code, 2, "{wrapper:?}: must be refused, got {out} {err}");
        assert!(
            err.contains("PermissionDenied") && err.contains("itself sandboxed"),
            "{wrapper:?}: {err}"
        );
        // The sandboxed modes stay available to a sandboxed caller.
        let (code, _, err) = cli(
            wrapper,
            &[
                "open-session",
                "--mode",
                "read-only",
                "--cwd",
                cwd,
                "--socket",
                d.target(),
            ],
            &[],
        );
        assert_eq!(code, 0, "{wrapper:?}: read-only must still work: {err}");
    }
}

#[tokio::test]
async fn h7_a_sandboxed_session_cannot_get_dfa_or_escalation_from_a_second_daemon() {
    if !root() {
        return;
    }
    // The daemon hosting the attacker's sandbox.
    let a = Daemon::start(&["--root-callers", "trusted"]).await;
    let ws = common::scratch();
    let cwd = ws.path().to_str().unwrap().to_string();
    // A second daemon, reachable from the sandbox: its socket lies in the session's cwd (the
    // default socket directories are masked, see the next test).
    let b_socket = ws.path().join("b/corral.sock");
    let _b = Daemon::start_at(
        &b_socket,
        &["--root-callers", "trusted", "--allow-escalation"],
        &[],
        Stdio::null(),
    )
    .await;
    let b = b_socket.to_str().unwrap().to_string();
    // Where an unconfined command would leave its mark (invisible to the sandbox's writes).
    let marks = common::outside();
    let mark = marks.path().join("escaped");
    let mark_s = mark.to_str().unwrap().to_string();
    let escalate =
        format!(r#"{{"command":["touch","{mark_s}"],"with_escalated_permissions":true}}"#);

    // Baselines on the host: B serves danger-full-access, and escalation really runs.
    let (code, _, err) = cli(&[], &open_dfa_args(&cwd, &b), &[]);
    assert_eq!(code, 0, "host caller gets DFA from B: {err}");
    let (code, ro, err) = cli(
        &[],
        &[
            "open-session",
            "--mode",
            "read-only",
            "--cwd",
            &cwd,
            "--socket",
            &b,
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = cli(
        &[],
        &[
            "invoke",
            "shell",
            &escalate,
            "--session",
            &ro,
            "--socket",
            &b,
            "--json",
        ],
        &[],
    );
    assert_eq!(code, 0, "host escalation runs: {out} {err}");
    assert!(mark.exists(), "the escalated host command ran: {out}");
    std::fs::remove_file(&mark).unwrap();

    // The attack, from inside a network-on workspace-write session of daemon A.
    let session = a
        .open_with(api::OpenSessionRequest {
            cwd: cwd.clone(),
            mode: api::SandboxMode::WorkspaceWrite as i32,
            network_access: true,
            env: common::session_env(ws.path()),
            ..Default::default()
        })
        .await;
    let out = sh(
        &a,
        &session,
        &format!(
            "{CORRAL} open-session --mode danger-full-access --cwd {cwd} --socket {b}; echo rc=$?"
        ),
    )
    .await;
    assert!(out.contains("rc=2"), "DFA must be refused: {out}");
    assert!(out.contains("inside a corral sandbox"), "{out}");
    // H19 (red team finding 3): B opens no session at all for a process in a corral sandbox —
    // not workspace-write rooted where the sandbox may not write (here: outside it), nor even
    // read-only. Nothing is written on the host.
    let home = common::outside();
    let target = home.path().join("written-from-b");
    let out = sh(
        &a,
        &session,
        &format!(
            "{CORRAL} exec --mode workspace-write --exclude-slash-tmp --cwd {0} --socket {b} \
             -- touch {1}; \
             echo rc=$?; {CORRAL} open-session --mode read-only --cwd {cwd} --socket {b}; \
             echo rc=$?",
            home.path().display(),
            target.display()
        ),
    )
    .await;
    assert_eq!(out.matches("rc=2").count(), 2, "{out}");
    assert!(out.contains("inside a corral sandbox"), "{out}");
    assert!(
        !target.exists(),
        "a sandbox wrote outside its roots through B"
    );
    // The allowed path on the host: the same exec through B works.
    let (code, _, err) = cli(
        &[],
        &[
            "--socket",
            &b,
            "exec",
            "--mode",
            "workspace-write",
            // B's socket (its state) lies under /tmp here.
            "--exclude-slash-tmp",
            "--cwd",
            home.path().to_str().unwrap(),
            "--",
            "touch",
            target.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(target.exists());
    // An escalated call on a session the host opened on B (its id given to the sandbox) is
    // refused and leaves no mark on the host.
    let out = sh(
        &a,
        &session,
        &format!(
            "{CORRAL} invoke shell '{escalate}' --session {ro} --socket {b} --json; echo rc=$?"
        ),
    )
    .await;
    assert!(out.contains("rc="), "B is reachable: {out}");
    assert!(
        out.contains("\"success\":false") && out.contains("escalat"),
        "escalation must be refused: {out}"
    );
    assert!(
        !mark.exists(),
        "an escalated command ran for a sandboxed caller"
    );

    // A process the host runs outside the sandbox (an escalated exec_command on B) is
    // danger-full-access too: the sandbox, given its session and process ids, cannot write to
    // it (review finding: write_stdin reached an escalated shell).
    let (code, ww, err) = cli(
        &[],
        &[
            "open-session",
            "--mode",
            "workspace-write",
            "--exclude-slash-tmp",
            "--cwd",
            home.path().to_str().unwrap(),
            "--socket",
            &b,
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = cli(
        &[],
        &[
            "invoke",
            "exec_command",
            r#"{"cmd":"bash --norc","sandbox_permissions":"require_escalated","tty":true,"yield_time_ms":500}"#,
            "--session",
            &ww,
            "--socket",
            &b,
        ],
        &[],
    );
    assert_eq!(code, 0, "{out} {err}");
    let pid: i32 = out
        .split("session ID ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a running escalated shell: {out}"));
    let write = |file: &Path| {
        serde_json::json!({"session_id": pid, "chars": format!("touch {}\n", file.display()),
            "yield_time_ms": 1000})
        .to_string()
    };
    let from_sandbox = marks.path().join("from-sandbox");
    let out = sh(
        &a,
        &session,
        &format!(
            "{CORRAL} invoke write_stdin '{}' --session {ww} --socket {b}; echo rc=$?",
            write(&from_sandbox)
        ),
    )
    .await;
    assert!(
        out.contains("rc=2") && out.contains("PermissionDenied"),
        "{out}"
    );
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        !from_sandbox.exists(),
        "the sandbox drove an escalated shell"
    );
    // Baseline: the host itself may.
    let from_host = marks.path().join("from-host");
    let (code, out, err) = cli(
        &[],
        &[
            "invoke",
            "write_stdin",
            &write(&from_host),
            "--session",
            &ww,
            "--socket",
            &b,
        ],
        &[],
    );
    assert_eq!(code, 0, "{out} {err}");
    assert!(from_host.exists(), "{out}");
}

#[tokio::test]
async fn h7_default_corral_socket_directories_are_masked() {
    if !root() {
        return;
    }
    let uid = nix::unistd::geteuid().as_raw();
    let dir = PathBuf::from(format!("/run/user/{uid}/corral"));
    let created = !dir.exists();
    std::fs::create_dir_all(&dir).unwrap();
    let probe = dir.join(format!("probe-{}", std::process::id()));
    std::fs::write(&probe, "visible\n").unwrap();
    struct Cleanup(PathBuf, PathBuf, bool);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
            if self.2 {
                let _ = std::fs::remove_dir(&self.1);
            }
        }
    }
    let _cleanup = Cleanup(probe.clone(), dir.clone(), created);
    let probe_s = probe.display().to_string();

    // Baseline: the host sees the file.
    let (code, _) = common::host_sh(&format!("test -f {probe_s}"));
    assert_eq!(code, 0);
    let ws = common::scratch();
    let script = format!(
        "echo entries=$(ls -A {} | wc -l); cat {probe_s} 2>/dev/null; echo cat=$?",
        dir.display()
    );
    let session_req = || api::OpenSessionRequest {
        cwd: ws.path().to_string_lossy().into_owned(),
        mode: api::SandboxMode::WorkspaceWrite as i32,
        network_access: true,
        env: common::session_env(ws.path()),
        ..Default::default()
    };
    let d = Daemon::start(&[]).await;
    let session = d.open_with(session_req()).await;
    let ran = d.sh(&session, &script).await;
    assert!(
        ran.output.contains("entries=0") && ran.output.contains("cat=1"),
        "the per-user corral directory is visible in the sandbox: {}",
        ran.output
    );
    assert!(!ran.output.contains("visible"), "{}", ran.output);

    // A daemon whose own state directory holds that directory (it listens right in
    // /run/user/UID): the two masks nest, and sandboxes must still start.
    let socket = PathBuf::from(format!("/run/user/{uid}/noway-{}.sock", std::process::id()));
    let outer = Daemon::start_at(&socket, &[], &[], Stdio::null()).await;
    let channel = corral::client::connect(outer.target()).await.unwrap();
    let id = api::sessions_client::SessionsClient::new(channel.clone())
        .open_session(session_req())
        .await
        .expect("a sandbox with nested masks must start")
        .into_inner()
        .session_id;
    let r = api::tools_client::ToolsClient::new(channel)
        .shell(api::ShellRequest {
            session_id: id,
            command: vec!["bash".into(), "-c".into(), script.clone()],
            ..Default::default()
        })
        .await
        .expect("shell")
        .into_inner();
    let out = String::from_utf8_lossy(&r.stdout.unwrap_or_default().head).into_owned();
    assert!(out.contains("cat=1") && !out.contains("visible"), "{out}");
    drop(outer);
    assert!(!socket.exists());
    // Host-side: the masks hid the directory without touching it.
    assert!(probe.exists());
}

// ---------------------------------------------------------------------------------------------
// H17: no socket in a directory another user could write or own.

#[tokio::test]
async fn h17_the_daemon_refuses_to_listen_in_an_untrusted_directory() {
    if !root() {
        return;
    }
    let open = common::outside();
    std::fs::set_permissions(open.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let theirs = common::outside();
    chown(theirs.path(), Some(65534), Some(65534)).unwrap();
    for (dir, says) in [(open.path(), "0777"), (theirs.path(), "uid 65534")] {
        let socket = dir.join("corral.sock");
        let out = output_within(Command::new(CORRAL).args([
            "serve",
            "--listen",
            &format!("unix:{}", socket.display()),
        ]));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "must refuse {}: {err}",
            dir.display()
        );
        assert!(
            err.contains(&dir.display().to_string()) && err.contains(says),
            "the error names the directory and why: {err}"
        );
        assert!(!socket.exists(), "no socket was created");
    }
    // The same daemon listens fine in a private directory of its own.
    let private = common::outside();
    let mut ok = Daemon::start_at(&private.path().join("c.sock"), &[], &[], Stdio::null()).await;
    assert!(ok.terminate().success());
}

#[tokio::test]
async fn h17_a_daemon_that_is_not_root_needs_a_runtime_dir_and_never_uses_tmp() {
    if !root() {
        return;
    }
    let bin = common::client_binary();
    let fallback = Path::new("/tmp/corral-65534");
    let _ = std::fs::remove_dir_all(fallback);
    let out = output_within(
        Command::new("setpriv")
            .args([
                "--reuid",
                "65534",
                "--regid",
                "65534",
                "--clear-groups",
                "--",
            ])
            .arg(bin)
            .arg("serve")
            .env_remove("XDG_RUNTIME_DIR")
            .env_remove("CORRAL_SOCKET")
            .current_dir("/"),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("XDG_RUNTIME_DIR") && err.contains("--listen"),
        "{err}"
    );
    assert!(!fallback.exists(), "the daemon fell back to /tmp");
}

#[tokio::test]
async fn h17_the_cli_refuses_a_socket_another_user_could_have_planted() {
    if !root() {
        return;
    }
    let dir = common::outside();
    let socket = dir.path().join("corral.sock");
    let d = Daemon::start_at(&socket, &[], &[], Stdio::null()).await;
    let s = d.target().to_string();
    let dir_s = dir.path().display().to_string();
    let mode = format!(
        "{:04o}",
        std::fs::metadata(dir.path()).unwrap().permissions().mode() & 0o7777
    );

    // Baseline: flag and CORRAL_SOCKET both reach it.
    let (code, out, err) = cli(&[], &["health", "--socket", &s], &[]);
    assert_eq!((code, out.as_str()), (0, "SERVING"), "{err}");
    let (code, out, err) = cli(&[], &["health"], &[("CORRAL_SOCKET", &s)]);
    assert_eq!((code, out.as_str()), (0, "SERVING"), "CORRAL_SOCKET: {err}");

    // The directory now belongs to another user: refused, by flag and by environment.
    chown(dir.path(), Some(65534), None).unwrap();
    for (args, env) in [
        (vec!["health", "--socket", s.as_str()], vec![]),
        (vec!["health"], vec![("CORRAL_SOCKET", s.as_str())]),
    ] {
        let (code, out, err) = cli(&[], &args, &env);
        assert_eq!(code, 2, "must be refused: {out} {err}");
        assert!(
            err.contains(&dir_s) && err.contains("uid 65534") && err.contains(&mode),
            "the error names the directory, its owner and mode: {err}"
        );
    }
    chown(dir.path(), Some(0), None).unwrap();

    // Group-writable directory: refused.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o770)).unwrap();
    let (code, _, err) = cli(&[], &["health", "--socket", &s], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("0770"), "{err}");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();

    // The socket file itself owned by another user: refused.
    chown(&socket, Some(65534), None).unwrap();
    let (code, _, err) = cli(&[], &["health", "--socket", &s], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("impostor"), "{err}");
    chown(&socket, Some(0), None).unwrap();

    // Trusted again: works.
    let (code, out, err) = cli(&[], &["health", "--socket", &s], &[]);
    assert_eq!((code, out.as_str()), (0, "SERVING"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// H16: a sane default environment, nothing of the daemon's.

async fn env_of(d: &Daemon, cwd: &Path, env: &[(&str, &str)]) -> Vec<(String, String)> {
    let channel = corral::client::connect(d.target()).await.unwrap();
    let id = api::sessions_client::SessionsClient::new(channel.clone())
        .open_session(api::OpenSessionRequest {
            cwd: cwd.to_string_lossy().into_owned(),
            mode: api::SandboxMode::ReadOnly as i32,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .session_id;
    let r = api::tools_client::ToolsClient::new(channel)
        .shell(api::ShellRequest {
            session_id: id,
            command: vec!["/usr/bin/env".into()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.exit_code, 0);
    let out = String::from_utf8_lossy(&r.stdout.unwrap_or_default().head).into_owned();
    let mut vars: Vec<(String, String)> = out
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    vars.sort();
    vars
}

#[tokio::test]
async fn h16_commands_get_a_sane_default_environment_and_no_daemon_secrets() {
    if !root() {
        return;
    }
    let dir = common::outside();
    let d = Daemon::start_at(
        &dir.path().join("c.sock"),
        &[],
        &[("SECRET_TOKEN", "x"), ("PATH", "/opt/daemon-only/bin:.:")],
        Stdio::null(),
    )
    .await;
    let ws = common::scratch();
    let me = nix::unistd::User::from_uid(nix::unistd::geteuid())
        .unwrap()
        .unwrap();
    let mut want: Vec<(String, String)> = [
        ("CODEX_SANDBOX_NETWORK_DISABLED", "1".to_string()),
        ("HOME", me.dir.display().to_string()),
        ("LANG", "C.UTF-8".to_string()),
        ("LOGNAME", me.name.clone()),
        (
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
        ),
        ("SHELL", me.shell.display().to_string()),
        ("USER", me.name.clone()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    want.sort();
    let got = env_of(&d, ws.path(), &[]).await;
    assert_eq!(got, want, "exactly the defaults");
    let path = &got.iter().find(|(k, _)| k == "PATH").unwrap().1;
    assert!(
        path.split(':')
            .all(|p| !p.is_empty() && p != "." && p.starts_with('/')),
        "{path}"
    );
    assert!(!got.iter().any(|(k, _)| k == "SECRET_TOKEN"));

    // A session's own entry replaces only that entry.
    let got = env_of(&d, ws.path(), &[("PATH", "/bin"), ("EXTRA", "1")]).await;
    let mut want2: Vec<(String, String)> = want
        .iter()
        .map(|(k, v)| {
            if k == "PATH" {
                (k.clone(), "/bin".to_string())
            } else {
                (k.clone(), v.clone())
            }
        })
        .chain([("EXTRA".to_string(), "1".to_string())])
        .collect();
    want2.sort();
    assert_eq!(got, want2);
}

// ---------------------------------------------------------------------------------------------
// The daemon outlives its stderr.

#[tokio::test]
async fn a_closed_stderr_does_not_take_the_daemon_down() {
    if !root() {
        return;
    }
    let dir = common::outside();
    let socket = dir.path().join("c.sock");
    let (reader, writer) = std::io::pipe().unwrap();
    let mut d =
        Daemon::start_at(&socket, &["--log-level", "debug"], &[], Stdio::from(writer)).await;
    // Baseline: it was logging into the pipe.
    let mut reader = reader;
    let mut first = [0u8; 16];
    let n = std::io::Read::read(&mut reader, &mut first).unwrap();
    assert!(n > 0, "the daemon writes to stderr");
    drop(reader);

    let ws = common::scratch();
    let s = d.target().to_string();
    let cwd = ws.path().to_str().unwrap();
    // Open sessions and run calls: every one of them logs.
    for _ in 0..3 {
        let (code, id, err) = cli(&[], &["open-session", "--cwd", cwd, "--socket", &s], &[]);
        assert_eq!(code, 0, "{err}");
        let (code, out, err) = cli(
            &[],
            &[
                "invoke",
                "shell",
                r#"{"command":["echo","still here"]}"#,
                "--session",
                &id,
                "--socket",
                &s,
            ],
            &[],
        );
        assert_eq!(code, 0, "{err}");
        assert!(out.contains("still here"), "{out}");
    }
    let (code, out, err) = cli(&[], &["health", "--socket", &s], &[]);
    assert_eq!((code, out.as_str()), (0, "SERVING"), "{err}");
    let status = d.terminate();
    assert_eq!(status.code(), Some(0), "clean exit: {status:?}");
    assert!(!socket.exists(), "the socket file was removed");
}
