//! H26: the surface the November 27 review did not reach, attacked here, each with a baseline
//! on the host first.

mod common;

use common::{Daemon, TestUser, connect_as, host_sh, scratch};
use corral::api;
use corral::api::SandboxMode;
use std::time::Duration;

/// Pushes a byte into the terminal's input (TIOCSTI) and asks the console for a selection
/// paste (TIOCLINUX 6); prints how each went.
const TTY_INJECT: &str = "import fcntl, termios
for name, req, arg in (('TIOCSTI', termios.TIOCSTI, b'x'), ('TIOCLINUX', 0x541C, bytes([6]))):
    try:
        fcntl.ioctl(0, req, arg)
        print(name, 'ok')
    except OSError as e:
        print(name, 'errno', e.errno)
";

/// TIOCSTI and TIOCLINUX through `exec_command {tty: true}`: a command on a terminal must not
/// be able to type into it (what the terminal's reader — the user — would then run).
#[tokio::test]
async fn h26_a_tty_command_cannot_inject_terminal_input() {
    let script = scratch();
    let file = script.path().join("inject.py");
    std::fs::write(&file, TTY_INJECT).unwrap();
    // Baseline: on the host, as this (root) user, on a pty from script(1), TIOCSTI works.
    let (_, host) = host_sh(&format!(
        "script -qec 'python3 {}' /dev/null",
        file.display()
    ));
    let host_ok = host.contains("TIOCSTI ok");
    if !host_ok {
        eprintln!("note: TIOCSTI is refused on this host already: {host}");
    }
    let d = Daemon::start(&[]).await;
    let id = d.open(script.path(), SandboxMode::WorkspaceWrite).await;
    let (out, _) = d
        .invoke(
            &id,
            "exec_command",
            &serde_json::json!({"cmd": format!("python3 {}", file.display()), "tty": true,
                "login": false, "yield_time_ms": 5000})
            .to_string(),
        )
        .await;
    assert!(out.contains("TIOCSTI errno 1"), "{out}");
    assert!(out.contains("TIOCLINUX errno 1"), "{out}");
    // The allowed path: the terminal itself works (a size query).
    let (out, _) = d
        .invoke(
            &id,
            "exec_command",
            r#"{"cmd":"stty size","tty":true,"login":false,"yield_time_ms":5000}"#,
        )
        .await;
    assert!(out.contains("24 80"), "{out}");
}

// ---------------------------------------------------------------------------------------------
// The metrics endpoint.
// ---------------------------------------------------------------------------------------------

/// A free TCP port on the loopback.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET path` on the metrics port, as the local user `user` (curl run through setpriv): TCP
/// carries no identity, so any local user gets what this gets.
fn scrape_as(user: &TestUser, port: u16, path: &str) -> String {
    let out = std::process::Command::new("setpriv")
        .args([
            "--reuid",
            &user.name,
            "--regid",
            &user.name,
            "--init-groups",
            "--",
            "curl",
            "-s",
            "--max-time",
            "10",
            &format!("http://127.0.0.1:{port}{path}"),
        ])
        .output()
        .expect("curl");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A bridge call on `bridge`'s connection (another user's, here).
async fn invoke_as(
    bridge: &mut api::bridge_client::BridgeClient<tonic::transport::Channel>,
    session: &str,
    name: &str,
    arguments: serde_json::Value,
) -> api::InvokeResponse {
    bridge
        .invoke(api::InvokeRequest {
            session_id: session.into(),
            name: name.into(),
            arguments: arguments.to_string(),
            call_id: "c".into(),
            freeform: false,
        })
        .await
        .unwrap()
        .into_inner()
}

/// The distinct `tool` label values in a Prometheus text body.
fn tool_labels(body: &str) -> std::collections::BTreeSet<String> {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split("tool=\"").nth(1))
        .filter_map(|rest| rest.split('"').next())
        .map(String::from)
        .collect()
}

/// The metrics endpoint shows another local user nothing of a user's calls (session ids,
/// paths, commands, user names, and tool names the caller chose: an unknown tool's name is
/// the caller's text, and each new name would be a new series kept for the daemon's life),
/// and it serves nothing but metrics: neither corral.v1 nor anything else over its plain TCP.
/// The health port (plain TCP too) serves no corral.v1 service.
#[tokio::test]
async fn h26_b_metrics_show_no_users_data_and_serve_nothing_else() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: other users need root (CI runs as root)");
        return;
    }
    let alice = TestUser::create("ma");
    let bob = TestUser::create("mb");
    let (port, health) = (free_port(), free_port());
    let d = Daemon::start(&[
        "--metrics-listen",
        &format!("127.0.0.1:{port}"),
        "--health-listen",
        &format!("127.0.0.1:{health}"),
    ])
    .await;
    d.open_to_local_users();
    let marker = "zq7secretmarker";
    let project = alice.dir.join(format!("project-{marker}"));
    std::fs::create_dir(&project).unwrap();
    std::fs::write(project.join(format!("notes-{marker}.txt")), "x\n").unwrap();
    std::os::unix::fs::chown(&project, Some(alice.uid), Some(alice.gid)).unwrap();
    let channel = connect_as(&d.socket, alice.uid, alice.gid).await.unwrap();
    let id = api::sessions_client::SessionsClient::new(channel.clone())
        .open_session(api::OpenSessionRequest {
            cwd: project.display().to_string(),
            mode: SandboxMode::WorkspaceWrite as i32,
            env: common::session_env(&project),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .session_id;
    let mut bridge = api::bridge_client::BridgeClient::new(channel.clone());
    let r = invoke_as(&mut bridge, &id,
        "exec_command",
        serde_json::json!({"cmd": format!("echo run-{marker}; touch made-{marker}"), "yield_time_ms": 5000}),
    )
    .await;
    assert!(r.output.contains(&format!("run-{marker}")), "{}", r.output);
    invoke_as(
        &mut bridge,
        &id,
        "read_file",
        serde_json::json!({"file_path": format!("notes-{marker}.txt")}),
    )
    .await;
    // A sandbox denial (counted, by tool).
    invoke_as(
        &mut bridge,
        &id,
        "exec_command",
        serde_json::json!({"cmd": format!("touch /etc/denied-{marker}"), "yield_time_ms": 5000}),
    )
    .await;
    // Tool names of the caller's choosing: one with the marker, then many.
    let r = invoke_as(
        &mut bridge,
        &id,
        &format!("mcp__{marker}__create_issue"),
        serde_json::json!({}),
    )
    .await;
    assert!(!r.success, "{}", r.output);
    for i in 0..40 {
        invoke_as(
            &mut bridge,
            &id,
            &format!("zzname{i}"),
            serde_json::json!({}),
        )
        .await;
    }

    // Baseline (the allowed path): bob reads the counters; alice's calls are counted.
    let body = scrape_as(&bob, port, "/metrics");
    assert!(
        body.contains(r#"corral_calls_total{tool="exec_command",outcome="ok"}"#),
        "{body}"
    );
    assert!(
        body.contains(r#"corral_calls_total{tool="read_file",outcome="ok"} 1"#),
        "{body}"
    );
    // Nothing of alice's.
    for secret in [
        id.as_str(),
        marker,
        alice.name.as_str(),
        alice.dir.to_str().unwrap(),
        "zzname",
    ] {
        assert!(!body.contains(secret), "{secret:?} visible to bob:\n{body}");
    }
    assert!(
        !body.contains("uid=\"") && !body.contains("user=\""),
        "{body}"
    );
    // A bounded set of series whatever callers name: the known tools, and one for the rest.
    let labels = tool_labels(&body);
    assert!(labels.len() <= 24, "{labels:?}");
    // Other paths on the port show the same metrics or nothing; never more.
    for path in ["/", "/debug", "/metrics?session=x", "/../etc/passwd"] {
        let other = scrape_as(&bob, port, path);
        assert!(
            !other.contains(marker) && !other.contains(&id),
            "{path}: {other}"
        );
        assert!(!other.contains("root:x:0:0"), "{path}: {other}");
    }
    // Neither port serves corral.v1 over plain TCP: OpenSession there is refused or fails.
    for (p, what) in [(port, "metrics"), (health, "health")] {
        let attempt = async {
            let ch = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{p}"))
                .unwrap()
                .connect()
                .await
                .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
            api::sessions_client::SessionsClient::new(ch)
                .open_session(api::OpenSessionRequest {
                    cwd: "/".into(),
                    mode: SandboxMode::DangerFullAccess as i32,
                    ..Default::default()
                })
                .await
        };
        let r = tokio::time::timeout(Duration::from_secs(10), attempt).await;
        match r {
            Err(_) => {}
            Ok(Err(s)) => {
                if p == health {
                    assert_eq!(s.code(), tonic::Code::Unimplemented, "{what}: {s:?}");
                }
            }
            Ok(Ok(r)) => panic!("{what} port opened a session: {:?}", r.into_inner()),
        }
    }
    // Alice's own session still works (the allowed path after the attempts).
    let r = invoke_as(
        &mut bridge,
        &id,
        "exec_command",
        serde_json::json!({"cmd": "echo still", "yield_time_ms": 5000}),
    )
    .await;
    assert!(r.output.contains("still"), "{}", r.output);
    assert!(project.join(format!("made-{marker}")).exists());
}
