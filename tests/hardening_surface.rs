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

// ---------------------------------------------------------------------------------------------
// `corral mcp`: the same rules as gRPC.
// ---------------------------------------------------------------------------------------------

/// A `bash` script that runs `corral --socket SOCKET mcp ARGS` as an MCP client would: the
/// handshake, then one `tools/call` of `tool` with `arguments`; it keeps stdin open until the
/// call's answer arrived (or the front failed; at most 20 s), then prints `rc=N` and everything the front wrote.
fn mcp_script(socket: &str, args: &str, tool: &str, arguments: serde_json::Value) -> String {
    let init = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "h26", "version": "1"}}});
    let inited = serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let call = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": tool, "arguments": arguments}});
    for m in [&init, &inited, &call] {
        assert!(!m.to_string().contains('\''), "quote-free JSON: {m}");
    }
    format!(
        "out=$(mktemp); {{ printf '%s\\n' '{init}' '{inited}' '{call}'; for i in $(seq 200); do \
         grep -q -e '\"id\":2' -e '^error' \"$out\" && break; sleep 0.1; done; }} | {CORRAL} --socket {socket} \
         mcp {args} > \"$out\" 2>&1; echo rc=$?; cat \"$out\"; rm -f \"$out\"",
        CORRAL = common::CORRAL
    )
}

/// H19 through the MCP front: a sandboxed command that reaches another daemon's socket (B, on
/// a non-default path inside its writable root) cannot use `corral mcp` there to get a wider
/// session — danger-full-access, or workspace-write rooted outside its own roots — nor
/// escalate a call in a session whose id it was given. Baseline: the same MCP exchange from
/// the host writes the mark through B each time.
#[tokio::test]
async fn h26_c_mcp_front_gives_a_sandbox_no_wider_session() {
    let a = Daemon::start(&[]).await;
    let ws = common::outside();
    let b_socket = ws.path().join("b/corral.sock");
    std::fs::create_dir(ws.path().join("b")).unwrap();
    let _b = Daemon::start_at(
        &b_socket,
        &["--root-callers", "trusted", "--allow-escalation"],
        &[],
        std::process::Stdio::null(),
    )
    .await;
    let b = b_socket.to_str().unwrap().to_string();
    let marks = common::outside();
    let mark = marks.path().join("escaped");
    let m = marks.path().to_str().unwrap().to_string();
    let touch =
        serde_json::json!({"cmd": format!("touch {}", mark.display()), "yield_time_ms": 5000});
    let escalated = serde_json::json!({"cmd": format!("touch {}", mark.display()),
        "sandbox_permissions": "require_escalated", "justification": "h26", "yield_time_ms": 5000});
    let (code, ro, err) = {
        let o = std::process::Command::new(common::CORRAL)
            .args([
                "--socket",
                &b,
                "open-session",
                "--mode",
                "read-only",
                "--cwd",
                &m,
            ])
            .output()
            .unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).trim().to_string(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    assert_eq!(code, Some(0), "{err}");
    let attempts = [
        (
            "danger-full-access",
            format!("--mode danger-full-access --cwd {m}"),
            &touch,
        ),
        (
            "workspace-write outside",
            format!("--mode workspace-write --exclude-slash-tmp --cwd {m}"),
            &touch,
        ),
        ("escalation", format!("--session {ro}"), &escalated),
    ];
    // Baselines on the host: each exchange writes the mark through B.
    for (what, args, arguments) in &attempts {
        let (_, out) = host_sh(&mcp_script(&b, args, "exec_command", (*arguments).clone()));
        assert!(out.contains("rc=0"), "{what}: {out}");
        assert!(mark.exists(), "{what}: the host's MCP exchange ran: {out}");
        std::fs::remove_file(&mark).unwrap();
    }
    // The same exchanges from inside a workspace-write sandbox of daemon A, network on (with
    // the network off, the sandbox cannot even connect to B's socket).
    let session = a
        .open_with(api::OpenSessionRequest {
            cwd: ws.path().display().to_string(),
            mode: SandboxMode::WorkspaceWrite as i32,
            network_access: true,
            env: common::session_env(ws.path()),
            ..Default::default()
        })
        .await;
    for (what, args, arguments) in &attempts {
        let r = a
            .sh(
                &session,
                &mcp_script(&b, args, "exec_command", (*arguments).clone()),
            )
            .await;
        // B's refusal, not a failure to reach it: H19's message for a new session, an error
        // result of the call for the escalation.
        assert!(
            r.output.contains("inside a corral sandbox")
                || (r.output.contains(r#""id":2"#) && r.output.contains(r#""isError":true"#)),
            "{what}: B must have answered with a refusal: {}",
            r.output
        );
        assert!(
            !mark.exists(),
            "{what}: a sandbox wrote outside its roots through B's MCP front: {}",
            r.output
        );
    }
    // The allowed path from the sandbox: the read-only session whose id it was given, used
    // through B's MCP front within that session's limits.
    let r = a
        .sh(
            &session,
            &mcp_script(
                &b,
                &format!("--session {ro}"),
                "exec_command",
                serde_json::json!({"cmd": "echo allowed-through-b", "yield_time_ms": 5000}),
            ),
        )
        .await;
    assert!(r.output.contains("rc=0"), "{}", r.output);
    assert!(r.output.contains("allowed-through-b"), "{}", r.output);
}

/// The MCP front gets the gRPC answer, word for word: a root caller (`root_callers =
/// confined`, the default) is refused danger-full-access by `corral mcp` as by OpenSession, and
/// an escalated exec_command in a session the front opened gets the same refusal as the same
/// call through Invoke; nothing is written on the host. The allowed path: a workspace-write
/// session through the front writes in its root.
#[tokio::test]
async fn h26_d_mcp_front_gets_the_same_policy_refusals_as_grpc() {
    let d = Daemon::start(&[]).await;
    let ws = common::outside();
    let w = ws.path().to_str().unwrap().to_string();
    let marks = common::outside();
    let mark = marks.path().join("escalated");
    // Baseline: this (root) process can write the mark.
    let (code, _) = host_sh(&format!("touch {0} && rm {0}", mark.display()));
    assert_eq!(code, 0);
    // gRPC first.
    let refused = d
        .try_open(ws.path(), SandboxMode::DangerFullAccess)
        .await
        .expect_err("root_callers = confined refuses danger-full-access");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    let (_, out) = host_sh(&mcp_script(
        d.target(),
        &format!("--mode danger-full-access --cwd {w}"),
        "exec_command",
        serde_json::json!({"cmd": format!("touch {}", mark.display())}),
    ));
    assert!(out.contains("rc=2"), "{out}");
    assert!(
        out.contains(&format!("PermissionDenied: {}", refused.message())),
        "the front's refusal is the gRPC one ({}): {out}",
        refused.message()
    );
    assert!(!mark.exists());
    // An escalated call: Invoke's answer, then the front's.
    let escalated = serde_json::json!({"cmd": format!("touch {}", mark.display()),
        "sandbox_permissions": "require_escalated", "justification": "h26", "yield_time_ms": 5000});
    let grpc_session = d.open(ws.path(), SandboxMode::WorkspaceWrite).await;
    let (grpc_text, ok) = d
        .invoke(&grpc_session, "exec_command", &escalated.to_string())
        .await;
    assert!(!ok, "{grpc_text}");
    assert!(!mark.exists(), "{grpc_text}");
    let (_, out) = host_sh(&mcp_script(
        d.target(),
        &format!("--mode workspace-write --cwd {w}"),
        "exec_command",
        escalated.clone(),
    ));
    assert!(!mark.exists(), "the front escalated: {out}");
    let answer: serde_json::Value = out
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|m| m["id"] == 2)
        .unwrap_or_else(|| panic!("no answer: {out}"));
    assert_eq!(answer["result"]["isError"], true, "{out}");
    assert_eq!(
        answer["result"]["content"][0]["text"], grpc_text,
        "the front answers as Invoke does"
    );
    // The allowed path through the front.
    let made = ws.path().join("made-through-mcp");
    let (_, out) = host_sh(&mcp_script(
        d.target(),
        &format!("--mode workspace-write --cwd {w}"),
        "exec_command",
        serde_json::json!({"cmd": "touch made-through-mcp", "yield_time_ms": 5000}),
    ));
    assert!(out.contains("rc=0") && made.exists(), "{out}");
}
