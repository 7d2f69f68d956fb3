//! What an operator sees: the start-up block (and the `try:` line in it, run as printed), logs
//! without colour codes off a terminal, `--log-format json` making every stderr line JSON,
//! `serve --check-config`, `serve --help` with defaults, and the health-only TCP listener for
//! Kubernetes probes.

use crate::common::{CORRAL, Daemon, outside, scratch};
use corral::api;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The rows of the start-up block: `  key:   value` lines.
fn block_row<'a>(log: &'a str, key: &str) -> &'a str {
    log.lines()
        .find_map(|l| l.strip_prefix("  ")?.strip_prefix(key)?.strip_prefix(':'))
        .map(str::trim)
        .unwrap_or_else(|| panic!("no `{key}:` row in the start-up block:\n{log}"))
}

#[tokio::test]
async fn the_start_up_block_says_what_runs_and_its_try_line_works() {
    let state = outside();
    let audit = state.path().join("audit.log");
    let config = state.path().join("corral.toml");
    std::fs::write(
        &config,
        "[policy.default]\nmodes = [\"read-only\", \"workspace-write\"]\n[policy.users.nobody]\n\
         max_sessions = 2\n",
    )
    .unwrap();
    let d = Daemon::start(&[
        "--config",
        config.to_str().unwrap(),
        "--audit-log",
        audit.to_str().unwrap(),
    ])
    .await;
    let log = d.log_text();
    assert!(
        log.starts_with(&format!(
            "corral {} serving on unix:{}\n",
            env!("CARGO_PKG_VERSION"),
            d.socket.display()
        )),
        "{log}"
    );
    assert_eq!(block_row(&log, "config"), config.display().to_string());
    assert_eq!(
        block_row(&log, "listen"),
        format!("unix:{}", d.socket.display())
    );
    assert!(block_row(&log, "transport").contains("peer credentials"));
    let layers = block_row(&log, "layers");
    for name in ["namespaces", "landlock", "seccomp", "limits"] {
        assert!(layers.contains(name), "{layers}");
    }
    let policy = block_row(&log, "policy");
    assert!(
        policy.contains("modes read-only, workspace-write by default")
            && policy.contains("escalation off")
            && policy.contains("1 user and 0 group rule(s)"),
        "{policy}"
    );
    assert_eq!(block_row(&log, "audit"), audit.display().to_string());
    assert_eq!(block_row(&log, "metrics"), "off");

    // The try: line, exactly as printed, run by a shell.
    let work = scratch();
    std::fs::write(work.path().join("marker.txt"), "x").unwrap();
    let line = block_row(&log, "try").to_string();
    let commands: Vec<&str> = line.split("   or   ").collect();
    assert_eq!(commands.len(), 2, "{line}");
    let run = |command: &str| {
        Command::new("sh")
            .args(["-c", command])
            .current_dir(work.path())
            .env_remove("CORRAL_SOCKET")
            .output()
            .unwrap()
    };
    let health = run(commands[0]);
    assert_eq!(
        String::from_utf8_lossy(&health.stdout).trim(),
        "SERVING",
        "{line}: {}",
        String::from_utf8_lossy(&health.stderr)
    );
    let list = run(commands[1]);
    assert!(
        list.status.success() && String::from_utf8_lossy(&list.stdout).contains("marker.txt"),
        "{line}: {}",
        String::from_utf8_lossy(&list.stderr)
    );
    // stderr is a file here: not one colour escape, in the block or in the log lines the
    // calls above produced.
    let log = d.log_text();
    assert!(log.contains("session opened"), "{log}");
    assert!(
        !log.contains('\x1b'),
        "escape codes in a log file:\n{log:?}"
    );
}

#[tokio::test]
async fn log_format_json_makes_every_stderr_line_a_json_object() {
    let work = scratch();
    let mut d = Daemon::start(&["--log-format", "json"]).await;
    let id = d.open(work.path(), api::SandboxMode::ReadOnly).await;
    let (_, ok) = d.invoke(&id, "shell", r#"{"command":["true"]}"#).await;
    assert!(ok);
    // A refused call logs too.
    let refused = d
        .try_open(Path::new("/nonexistent/dir"), api::SandboxMode::ReadOnly)
        .await;
    assert!(refused.is_err());
    assert!(d.terminate().success());
    let log = d.log_text();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .ok()
                .filter(|v| v.is_object())
                .unwrap_or_else(|| panic!("not a JSON object: {l:?}\nin:\n{log}"))
        })
        .collect();
    assert!(lines.len() >= 4, "{log}");
    // The start-up block is one of them, with every row as a field.
    let start = lines
        .iter()
        .find(|v| v["fields"]["message"] == "corral is serving")
        .unwrap_or_else(|| panic!("no start-up event:\n{log}"));
    assert_eq!(start["fields"]["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(
        start["fields"]["listen"],
        format!("unix:{}", d.socket.display())
    );
    for field in [
        "config",
        "transport",
        "health",
        "layers",
        "policy",
        "audit",
        "metrics",
        "try",
    ] {
        assert!(
            start["fields"][field]
                .as_str()
                .is_some_and(|v| !v.is_empty()),
            "{field} missing: {start}"
        );
    }
    assert!(lines.iter().any(|v| v["fields"]["message"] == "stopped"));

    // So is a configuration error, reported before logging is set up.
    let out = Command::new(CORRAL)
        .args(["serve", "--log-format", "json", "--max-sessions", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    let line: serde_json::Value = serde_json::from_str(err.trim()).unwrap_or_else(|e| {
        panic!("{e}: {err:?}");
    });
    assert_eq!(line["level"], "ERROR");
    assert!(
        line["fields"]["message"]
            .as_str()
            .unwrap()
            .contains("max_sessions")
    );
}

#[test]
fn check_config_validates_without_binding_anything() {
    let dir = outside();
    let socket_dir = dir.path().join("not-yet");
    let socket = socket_dir.join("c.sock");
    let config = dir.path().join("corral.toml");
    std::fs::write(
        &config,
        "max_sessions = 7\naudit_log = \"-\"\n[policy.groups.ci]\nmax_sessions = 3\n",
    )
    .unwrap();
    let check = |extra: &[&str]| {
        let out = Command::new(CORRAL)
            .args(["serve", "--check-config", "--config"])
            .arg(&config)
            .arg("--listen")
            .arg(format!("unix:{}", socket.display()))
            .args(extra)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };

    // Valid: the effective settings (file and flags merged), and nothing created.
    let (code, out, err) = check(&["--shutdown-grace", "3"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.starts_with("configuration OK\n"), "{out}");
    assert_eq!(
        block_row(&out, "listen"),
        format!("unix:{}", socket.display())
    );
    assert!(
        block_row(&out, "policy").contains("0 user and 1 group rule(s); at most 7 sessions"),
        "{out}"
    );
    assert_eq!(block_row(&out, "audit"), "stdout");
    assert!(
        !socket_dir.exists(),
        "--check-config created the socket directory"
    );
    // --log-format json: one JSON object.
    let (code, out, _) = check(&["--log-format", "json"]);
    assert_eq!(code, Some(0));
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["audit"], "stdout");

    // Invalid: exit 2 with the reason, from the file, a flag, or a file it names.
    std::fs::write(&config, "max_sesions = 7\n").unwrap();
    let (code, _, err) = check(&[]);
    assert_eq!(code, Some(2));
    assert!(err.contains("max_sesions"), "{err}");
    std::fs::write(&config, "").unwrap();
    let (code, _, err) = check(&["--allow-degraded", "capabilities"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("allow_degraded"), "{err}");
    let not_pem = dir.path().join("cert.pem");
    std::fs::write(&not_pem, "not a certificate").unwrap();
    let (code, _, err) = check(&[
        "--tls-cert",
        not_pem.to_str().unwrap(),
        "--tls-key",
        not_pem.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(2));
    assert!(err.contains("holds no PEM certificate"), "{err}");
    let (code, _, err) = check(&["--audit-log", "/nonexistent-dir/audit.log"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("audit_log"), "{err}");
    // A socket directory others may write is refused now, not at start.
    let open_dir = dir.path().join("open");
    std::fs::create_dir(&open_dir).unwrap();
    std::fs::set_permissions(
        &open_dir,
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let out = Command::new(CORRAL)
        .args(["serve", "--check-config", "--listen"])
        .arg(format!("unix:{}/c.sock", open_dir.display()))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not writable by group or others"));
}

#[tokio::test]
async fn check_config_leaves_a_running_daemon_alone() {
    let d = Daemon::start(&[]).await;
    let out = Command::new(CORRAL)
        .args(["serve", "--check-config", "--listen"])
        .arg(format!("unix:{}", d.socket.display()))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    // Still the same daemon, still answering on the same socket.
    assert!(d.socket.exists());
    let caps = d
        .sessions()
        .await
        .get_capabilities(api::GetCapabilitiesRequest {})
        .await;
    assert!(caps.is_ok());
}

#[test]
fn serve_help_shows_each_default() {
    let out = Command::new(CORRAL)
        .args(["serve", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for shown in [
        "--session-idle-timeout <SECS>",
        "[default: 3600]",
        "[default: 1024]",
        "[default: text]",
        "[default: info]",
        "[default: confined]",
        "--check-config",
        "--health-listen <HOST:PORT>",
    ] {
        assert!(help.contains(shown), "`{shown}` not in:\n{help}");
    }
    assert!(!help.contains('\x1b'), "colours in help sent to a pipe");
}

#[tokio::test]
async fn health_listen_serves_the_health_service_alone_over_plain_tcp() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let d = Daemon::start(&["--health-listen", &addr]).await;
    assert!(
        block_row(&d.log_text(), "health").contains(&format!("plain TCP {addr}")),
        "{}",
        d.log_text()
    );
    // What a kubelet `grpc:` probe does: grpc.health.v1 Check over plain HTTP/2.
    let deadline = Instant::now() + Duration::from_secs(10);
    let channel = loop {
        match tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
        {
            Ok(c) => break c,
            Err(e) => {
                assert!(Instant::now() < deadline, "{e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    let status = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .status;
    assert_eq!(
        status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    // Nothing but health there: the corral.v1 services are not served without identity.
    let err = api::sessions_client::SessionsClient::new(channel)
        .open_session(api::OpenSessionRequest {
            cwd: "/".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unimplemented, "{err:?}");
    // The CLI's health check works there too (what an exec probe would run).
    let out = Command::new(CORRAL)
        .args(["health", "--socket", &format!("tcp:{addr}")])
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).trim()
        ),
        (Some(0), "SERVING")
    );
}

/// A worker's own stderr is relayed into the daemon's log in its format, bounded in rate. A
/// danger-full-access command can write to its worker's stderr (nothing confines it), which
/// makes the worker "say" lines here; a confined command cannot reach it at all.
#[tokio::test]
async fn a_workers_stderr_becomes_json_log_lines_at_a_bounded_rate() {
    let work = scratch();
    let mut d = Daemon::start(&["--log-format", "json", "--root-callers", "trusted"]).await;
    let say = |tag: &str| {
        format!(
            "for i in $(seq 1 500); do echo \"{tag}-$i\"; done > /proc/$PPID/fd/2 && echo wrote"
        )
    };
    let confined = d.open(work.path(), api::SandboxMode::WorkspaceWrite).await;
    let r = d.sh(&confined, &say("confined-says")).await;
    assert!(!r.output.contains("wrote"), "{}", r.output);
    let open = d
        .open(work.path(), api::SandboxMode::DangerFullAccess)
        .await;
    let r = d.sh(&open, &say("worker-says")).await;
    assert!(r.output.contains("wrote"), "{}", r.output);
    assert!(d.terminate().success());
    let log = d.log_text();
    let mut relayed = Vec::new();
    for l in log.lines() {
        let v: serde_json::Value = serde_json::from_str(l)
            .ok()
            .filter(|v: &serde_json::Value| v.is_object())
            .unwrap_or_else(|| panic!("not a JSON object: {l:?}\nin:\n{log}"));
        let message = v["fields"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(!message.contains("confined-says"), "{l}");
        if message.contains("worker-says") || message.contains("dropped") {
            assert!(v["fields"]["worker"].as_u64().is_some(), "{l}");
            relayed.push(message);
        }
    }
    assert!(
        relayed.iter().any(|m| m.starts_with("worker-says-1")),
        "{relayed:?}\n{log}"
    );
    // 500 lines at once: the burst, and a count of the rest.
    assert!(
        (50..=60).contains(&relayed.len()),
        "{} lines relayed: {relayed:?}",
        relayed.len()
    );
    assert!(
        relayed.iter().any(|m| m.contains("lines dropped")),
        "{relayed:?}"
    );
}
