//! Operator policy: modes, session counts and timeout ceilings per rule; refusals name the rule;
//! SIGHUP reloads a valid config and keeps the old one when the new one is invalid.

use crate::common::{self, Daemon, outside, scratch};
use corral::api::{self, SandboxMode};
use std::time::{Duration, Instant};

const STRICT: &str =
    "[policy.default]\nmodes = [\"read-only\"]\nmax_sessions = 2\ntimeout_ceiling_ms = 500\n";

fn hup(d: &Daemon) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.pid() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
}

#[tokio::test]
async fn policy_limits_modes_sessions_and_timeouts_and_reloads_on_sighup() {
    let conf_dir = outside();
    let conf = conf_dir.path().join("corral.toml");
    std::fs::write(&conf, STRICT).unwrap();
    let d = Daemon::start(&["--config", conf.to_str().unwrap()]).await;
    let cwd = scratch();

    let err = d
        .try_open(cwd.path(), SandboxMode::WorkspaceWrite)
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
    assert!(
        err.message().contains("policy rule `policy.default`"),
        "{}",
        err.message()
    );

    let id = d.try_open(cwd.path(), SandboxMode::ReadOnly).await.unwrap();
    d.try_open(cwd.path(), SandboxMode::ReadOnly).await.unwrap();
    let err = d
        .try_open(cwd.path(), SandboxMode::ReadOnly)
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted);
    assert!(
        err.message().contains("policy.default"),
        "{}",
        err.message()
    );

    // A typed call may not ask beyond the ceiling; a model's request is clamped to it.
    let err = d
        .tools()
        .await
        .shell(api::ShellRequest {
            session_id: id.clone(),
            command: vec!["true".into()],
            timeout_ms: Some(5_000),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
    assert!(
        err.message().contains("policy rule `policy.default`"),
        "{}",
        err.message()
    );
    let started = Instant::now();
    let (out, ok) = d
        .invoke(
            &id,
            "shell",
            r#"{"command":["sleep","5"],"timeout_ms":5000}"#,
        )
        .await;
    assert!(!ok);
    assert!(out.contains(r#""exit_code":124"#), "{out}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "not clamped: {:?}",
        started.elapsed()
    );

    // A valid reload takes effect.
    std::fs::write(
        &conf,
        "[policy.default]\nmodes = [\"read-only\", \"workspace-write\"]\n",
    )
    .unwrap();
    hup(&d);
    tokio::time::sleep(Duration::from_millis(400)).await;
    d.try_open(cwd.path(), SandboxMode::WorkspaceWrite)
        .await
        .unwrap();
    // An invalid reload keeps the running policy and says why.
    std::fs::write(
        &conf,
        "[policy.default]\nmodes = [\"read-only\"]\nmax_sessions = 0\n",
    )
    .unwrap();
    hup(&d);
    tokio::time::sleep(Duration::from_millis(400)).await;
    d.try_open(cwd.path(), SandboxMode::WorkspaceWrite)
        .await
        .unwrap();
    assert!(
        d.log_text().contains("keeping the previous policy"),
        "{}",
        d.log_text()
    );
    assert!(
        d.log_text()
            .contains("max_sessions must be greater than zero")
    );
}

#[test]
fn an_invalid_policy_stops_the_daemon_at_start() {
    let conf_dir = outside();
    let conf = conf_dir.path().join("corral.toml");
    std::fs::write(&conf, "[policy.users.bob]\nroots_under = [\"relative\"]\n").unwrap();
    let out = std::process::Command::new(common::CORRAL)
        .args([
            "serve",
            "--listen",
            "unix:/nonexistent/c.sock",
            "--config",
            conf.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("policy.users.bob.roots_under") && err.contains(conf.to_str().unwrap()),
        "{err}"
    );
}

#[tokio::test]
async fn policy_limits_concurrent_commands_and_sets_rlimits() {
    let conf_dir = outside();
    let conf = conf_dir.path().join("corral.toml");
    std::fs::write(
        &conf,
        "[policy.default]\nmax_concurrent_commands = 1\nmax_open_files = 100\n",
    )
    .unwrap();
    let d = Daemon::start(&["--config", conf.to_str().unwrap()]).await;
    let cwd = scratch();
    let id = d.open(cwd.path(), SandboxMode::ReadOnly).await;

    let r = d.sh(&id, "ulimit -n").await;
    assert_eq!(r.output, "100\n");

    let mut tools = d.tools().await;
    let sid = id.clone();
    let long = tokio::spawn(async move {
        tools
            .shell(api::ShellRequest {
                session_id: sid,
                command: vec!["sleep".into(), "1".into()],
                ..Default::default()
            })
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let err = d
        .tools()
        .await
        .shell(api::ShellRequest {
            session_id: id.clone(),
            command: vec!["true".into()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted);
    assert!(
        err.message().contains("policy.default"),
        "{}",
        err.message()
    );
    long.await.unwrap().unwrap();
    // The slot is free again.
    assert_eq!(d.sh(&id, "true").await.exit_code, 0);
}
