//! NETWORK_MODE_PROXY through a real daemon (issue 23): a proxied session's commands reach the
//! hosts its rules allow through corral's egress proxy, and nothing else — not a denied name,
//! not the same server by address, not the cloud metadata address or corral's own listener
//! even when an allowed name resolves there. Every decision is on the audit log.
//!
//! All on loopback: the test daemon's `[egress.hosts]` answers the test names, its
//! `allowed_networks` lets the proxy reach 127.0.0.0/8 (where the test's server is), so what
//! refuses the metadata address and corral's listener is the proxy's own rule.

use crate::common::{self, Daemon, outside, scratch};
use corral::api::{self, SandboxMode};
use std::io::{Read, Write};
use std::net::TcpListener;

/// A tiny HTTP server on 127.0.0.2: answers every request with `hello from upstream` and the
/// request's head (so a test can see what the proxy sent).
fn upstream() -> u16 {
    let listener = TcpListener::bind("127.0.0.2:0").expect("bind 127.0.0.2");
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            std::thread::spawn(move || {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && conn.read(&mut byte).unwrap_or(0) == 1 {
                    head.push(byte[0]);
                }
                let body = format!("hello from upstream\n{}", String::from_utf8_lossy(&head));
                let _ = write!(
                    conn,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
    port
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Stage {
    daemon: Daemon,
    session: String,
    port: u16,
    health: u16,
    audit: std::path::PathBuf,
    _dirs: (tempfile::TempDir, tempfile::TempDir),
}

async fn stage(allow: &[&str], deny: &[&str]) -> Stage {
    let port = upstream();
    let health = free_port();
    let state = outside();
    let config = state.path().join("corral.toml");
    std::fs::write(
        &config,
        r#"
[egress]
allowed_networks = ["127.0.0.0/8"]

[egress.hosts]
"allowed.test" = ["127.0.0.2"]
"also.allowed.test" = ["127.0.0.2"]
"denied.test" = ["127.0.0.2"]
"meta.test" = ["169.254.169.254"]
"mapped.test" = ["::ffff:169.254.169.254"]
"corral.test" = ["127.0.0.1"]
"#,
    )
    .unwrap();
    let audit = state.path().join("audit.jsonl");
    let daemon = Daemon::start(&[
        "--config",
        config.to_str().unwrap(),
        "--audit-log",
        audit.to_str().unwrap(),
        "--health-listen",
        &format!("127.0.0.1:{health}"),
    ])
    .await;
    let cwd = scratch();
    let session = daemon
        .open_with(api::OpenSessionRequest {
            cwd: cwd.path().to_string_lossy().into_owned(),
            mode: SandboxMode::ReadOnly as i32,
            network_mode: api::NetworkMode::Proxy as i32,
            allow_domains: allow.iter().map(|s| s.to_string()).collect(),
            deny_domains: deny.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        })
        .await;
    Stage {
        daemon,
        session,
        port,
        health,
        audit,
        _dirs: (state, cwd),
    }
}

#[tokio::test]
async fn allowed_hosts_are_reached_through_the_proxy_and_nothing_else() {
    let s = stage(
        &[
            "allowed.test",
            "*.allowed.test",
            "meta.test",
            "mapped.test",
            "corral.test",
        ],
        &["also.allowed.test"],
    )
    .await;
    let (d, id, port) = (&s.daemon, &s.session, s.port);

    // curl, plain HTTP (absolute-form) and through a CONNECT tunnel.
    let ran = d
        .sh(id, &format!("curl -sS http://allowed.test:{port}/x"))
        .await;
    assert_eq!(ran.exit_code, 0, "{}", ran.output);
    assert!(
        ran.output.starts_with("hello from upstream"),
        "{}",
        ran.output
    );
    assert!(
        ran.output.contains("GET /x HTTP/1.1"),
        "origin-form upstream: {}",
        ran.output
    );
    assert!(
        !ran.output.to_ascii_lowercase().contains("proxy-"),
        "{}",
        ran.output
    );
    let ran = d
        .sh(
            id,
            &format!("curl -sS --proxytunnel http://allowed.test:{port}/t"),
        )
        .await;
    assert_eq!(ran.exit_code, 0, "{}", ran.output);
    assert!(
        ran.output.starts_with("hello from upstream"),
        "{}",
        ran.output
    );

    // Other TCP: SOCKS5 on the same port, names resolved by the proxy.
    let ran = d
        .sh(
            id,
            &format!("curl -sS --noproxy '' --socks5-hostname 127.0.0.1:3128 http://allowed.test:{port}/s"),
        )
        .await;
    assert!(
        ran.output.starts_with("hello from upstream"),
        "{}",
        ran.output
    );
    let ran = d
        .sh(
            id,
            &format!(
                "curl -sS --noproxy '' --socks5-hostname 127.0.0.1:3128 http://denied.test:{port}/"
            ),
        )
        .await;
    assert_ne!(ran.exit_code, 0, "{}", ran.output);
    assert!(
        !ran.output.contains("hello from upstream"),
        "{}",
        ran.output
    );

    // Python (urllib reads the proxy variables) and Node (its http module, pointed at the
    // proxy the variables name).
    let ran = d
        .sh(
            id,
            &format!(
                "python3 -c \"import urllib.request;print(urllib.request.urlopen('http://allowed.test:{port}/py').read().decode())\""
            ),
        )
        .await;
    assert_eq!(ran.exit_code, 0, "{}", ran.output);
    assert!(
        ran.output.starts_with("hello from upstream"),
        "{}",
        ran.output
    );
    let node = format!(
        "const u=new URL(process.env.HTTP_PROXY);require('http').get({{host:u.hostname,port:u.port,path:'http://allowed.test:{port}/node'}},r=>{{r.setEncoding('utf8');r.on('data',c=>process.stdout.write(c))}}).on('error',e=>{{console.error(e.message);process.exit(1)}})"
    );
    let ran = d.sh(id, &format!("node -e \"{node}\"")).await;
    assert_eq!(ran.exit_code, 0, "{}", ran.output);
    assert!(
        ran.output.starts_with("hello from upstream"),
        "{}",
        ran.output
    );

    // Refusals an agent can read: no rule, a deny rule, an address that is never reachable
    // even though the rule allows the name.
    let refused =
        |host: &str, port: u16| format!("curl -sS -w '\\n%{{http_code}}' http://{host}:{port}/");
    let ran = d.sh(id, &refused("denied.test", port)).await;
    assert!(ran.output.ends_with("403"), "{}", ran.output);
    assert!(ran.output.contains("denied.test"), "{}", ran.output);
    let ran = d.sh(id, &refused("also.allowed.test", port)).await;
    assert!(
        ran.output.ends_with("403") && ran.output.contains("deny"),
        "{}",
        ran.output
    );
    for host in ["meta.test", "mapped.test"] {
        let ran = d.sh(id, &refused(host, 80)).await;
        assert!(ran.output.ends_with("403"), "{host}: {}", ran.output);
        assert!(
            ran.output.contains("169.254.169.254"),
            "{host}: {}",
            ran.output
        );
    }
    let ran = d.sh(id, &refused("corral.test", s.health)).await;
    assert!(ran.output.ends_with("403"), "{}", ran.output);
    assert!(ran.output.contains("corral"), "{}", ran.output);
    // A CONNECT to an address is refused too: names only.
    let ran = d
        .sh(
            id,
            &format!("curl -sS --proxytunnel http://127.0.0.2:{port}/ 2>&1; echo rc=$?"),
        )
        .await;
    assert!(
        !ran.output.contains("hello from upstream"),
        "{}",
        ran.output
    );

    // The same server by address, around the proxy: no route, and no DNS inside.
    for script in [
        format!("curl -sS --noproxy '*' --max-time 5 http://127.0.0.2:{port}/"),
        format!("exec 3<>/dev/tcp/127.0.0.2/{port}"),
        format!("curl -sS --noproxy '*' --max-time 5 http://allowed.test:{port}/"),
        format!("python3 -c \"import socket;socket.create_connection(('127.0.0.2',{port}),5)\""),
    ] {
        let ran = d.sh(id, &script).await;
        assert_ne!(ran.exit_code, 0, "{script}: {}", ran.output);
        assert!(
            !ran.output.contains("hello from upstream"),
            "{script}: {}",
            ran.output
        );
    }
    // Nor can a command serve, or reach a port on its loopback other than the proxy's.
    let ran = d
        .sh(
            id,
            "python3 -c \"import socket;s=socket.socket();s.bind(('127.0.0.1',8080))\"",
        )
        .await;
    assert_ne!(ran.exit_code, 0, "{}", ran.output);

    // The model is told, as Codex tells it: the rules in the environment context.
    let env = environment_context(d, id).await;
    assert!(
        env.contains(
            "  <network enabled=\"true\">\n    <allowed>allowed.test</allowed>\n    <allowed>*.allowed.test</allowed>"
        ) && env.contains("    <denied>also.allowed.test</denied>\n  </network>"),
        "{env}"
    );

    // New rules for the next connections, through the CLI as a person types them.
    cli(
        d,
        &format!("set-network-rules {id} --allow-domain denied.test"),
    );
    let ran = d
        .sh(id, &format!("curl -sS http://denied.test:{port}/"))
        .await;
    assert!(
        ran.output.starts_with("hello from upstream"),
        "{}",
        ran.output
    );
    let ran = d.sh(id, &refused("allowed.test", port)).await;
    assert!(
        ran.output.ends_with("403"),
        "no longer allowed: {}",
        ran.output
    );
    let env = environment_context(d, id).await;
    assert!(
        env.contains(
            "<network enabled=\"true\">\n    <allowed>denied.test</allowed>\n  </network>"
        ),
        "{env}"
    );

    // And queryable per session.
    let log = d
        .sessions()
        .await
        .get_egress_log(api::GetEgressLogRequest {
            session_id: id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        log.decisions.iter().any(|e| e.host == "meta.test"
            && !e.allowed
            && e.address.starts_with("169.254.169.254")),
        "{log:?}"
    );
    assert!(
        log.decisions.iter().any(|e| e.host == "allowed.test"
            && e.allowed
            && e.method == "CONNECT"
            && e.bytes_down > 20),
        "{log:?}"
    );

    assert!(
        log.decisions
            .iter()
            .any(|e| e.method == "SOCKS5" && e.allowed && e.host == "allowed.test")
            && log
                .decisions
                .iter()
                .any(|e| e.method == "SOCKS5" && !e.allowed && e.host == "denied.test"),
        "{log:?}"
    );
    let out = cli(d, &format!("egress-log {id}"));
    assert!(
        out.lines().any(|l| l.starts_with("denied")
            && l.contains("meta.test:80")
            && l.contains("169.254.169.254")),
        "{out}"
    );

    // Every decision is on the audit log, with the rule that made it; so is the rule change.
    let log = std::fs::read_to_string(&s.audit).unwrap();
    assert!(
        log.lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .any(|v| v["tool"] == "set_network_rules"
                && v["outcome"] == "ok"
                && v["session"] == id.as_str()
                && v["targets"][0] == "allow denied.test"),
        "{log}"
    );
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|v: &serde_json::Value| v["tool"] == "egress")
        .collect();
    let allowed = lines.iter().filter(|v| v["outcome"] == "allowed").count();
    assert!(allowed >= 4, "{log}");
    let denied: Vec<&serde_json::Value> =
        lines.iter().filter(|v| v["outcome"] == "denied").collect();
    assert!(denied.len() >= 5, "{log}");
    assert!(denied.iter().all(|v| v["session"] == id.as_str()), "{log}");
    assert!(
        denied
            .iter()
            .any(|v| v["targets"][0] == format!("denied.test:{port}")
                && v["egress"]["rule"] == "no allow rule"),
        "{log}"
    );
    assert!(
        lines
            .iter()
            .any(|v| v["outcome"] == "allowed" && v["bytes_out"].as_u64() > Some(20)),
        "{log}"
    );
}

#[tokio::test]
async fn bad_rules_and_contradictions_are_refused_naming_the_field() {
    let d = Daemon::start(&[]).await;
    let cwd = scratch();
    let open = |mode: SandboxMode, net: api::NetworkMode, allow: &[&str], access: bool| {
        api::OpenSessionRequest {
            cwd: cwd.path().to_string_lossy().into_owned(),
            mode: mode as i32,
            network_mode: net as i32,
            network_access: access,
            allow_domains: allow.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    };
    let field = |s: &tonic::Status| {
        use tonic_types::StatusExt;
        s.get_details_bad_request().unwrap().field_violations[0]
            .field
            .clone()
    };
    let cases = [
        (
            open(
                SandboxMode::ReadOnly,
                api::NetworkMode::Proxy,
                &["ok.test", "*"],
                false,
            ),
            "allow_domains[1]",
        ),
        (
            open(
                SandboxMode::ReadOnly,
                api::NetworkMode::Proxy,
                &["*.com"],
                false,
            ),
            "allow_domains[0]",
        ),
        (
            open(
                SandboxMode::ReadOnly,
                api::NetworkMode::Proxy,
                &["https://x.test"],
                false,
            ),
            "allow_domains[0]",
        ),
        (
            open(SandboxMode::ReadOnly, api::NetworkMode::Proxy, &[], true),
            "network_mode",
        ),
        (
            open(
                SandboxMode::DangerFullAccess,
                api::NetworkMode::Proxy,
                &[],
                false,
            ),
            "network_mode",
        ),
        (
            open(
                SandboxMode::ReadOnly,
                api::NetworkMode::On,
                &["x.test"],
                false,
            ),
            "allow_domains",
        ),
    ];
    for (req, want) in cases {
        let err = d.try_open_with(req.clone()).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{req:?}: {err:?}");
        assert_eq!(field(&err), want, "{req:?}: {}", err.message());
    }
    // Rules exist only for a proxied session; a malformed one changes nothing.
    let plain = d.open(cwd.path(), SandboxMode::ReadOnly).await;
    let err = d
        .sessions()
        .await
        .set_network_rules(api::SetNetworkRulesRequest {
            session_id: plain,
            allow_domains: vec!["x.test".into()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    // Proxy mode with no allow rule opens, and reaches nothing.
    let id = d
        .open_with(open(
            SandboxMode::ReadOnly,
            api::NetworkMode::Proxy,
            &[],
            false,
        ))
        .await;
    let ran = d
        .sh(&id, "curl -sS -w '\\n%{http_code}' http://example.com/")
        .await;
    assert!(ran.output.ends_with("403"), "{}", ran.output);
    let err = d
        .sessions()
        .await
        .set_network_rules(api::SetNetworkRulesRequest {
            session_id: id.clone(),
            allow_domains: vec!["*.com".into()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(field(&err), "allow_domains[0]", "{err:?}");
}

/// The session's environment context, as GetPromptContext gives it.
async fn environment_context(d: &Daemon, id: &str) -> String {
    d.bridge()
        .await
        .get_prompt_context(api::GetPromptContextRequest {
            session_id: id.to_string(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .environment_context
}

#[tokio::test]
async fn the_operator_bounds_what_a_session_may_allow() {
    let state = outside();
    let config = state.path().join("corral.toml");
    std::fs::write(
        &config,
        "[egress]\npermitted_domains = [\"pypi.org:443\", \"*.pythonhosted.org\"]\n",
    )
    .unwrap();
    let d = Daemon::start(&["--config", config.to_str().unwrap()]).await;
    let cwd = scratch();
    let open = |allow: &[&str]| api::OpenSessionRequest {
        cwd: cwd.path().to_string_lossy().into_owned(),
        mode: SandboxMode::ReadOnly as i32,
        network_mode: api::NetworkMode::Proxy as i32,
        allow_domains: allow.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    let id = d
        .open_with(open(&["pypi.org:443", "files.pythonhosted.org"]))
        .await;
    for (allow, at) in [
        (vec!["pypi.org"], "allow_domains[0]"), // any port is wider than 443
        (
            vec!["files.pythonhosted.org", "pythonhosted.org"],
            "allow_domains[1]",
        ), // the apex
        (vec!["evil.test"], "allow_domains[0]"),
    ] {
        let err = d.try_open_with(open(&allow)).await.unwrap_err();
        assert_eq!(
            err.code(),
            tonic::Code::InvalidArgument,
            "{allow:?}: {err:?}"
        );
        assert!(err.message().contains("permits"), "{}", err.message());
        use tonic_types::StatusExt;
        assert_eq!(
            err.get_details_bad_request().unwrap().field_violations[0].field,
            at
        );
        // Nor may an open session widen itself later.
        let err = d
            .sessions()
            .await
            .set_network_rules(api::SetNetworkRulesRequest {
                session_id: id.clone(),
                allow_domains: allow.iter().map(|s| s.to_string()).collect(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(
            err.code(),
            tonic::Code::InvalidArgument,
            "{allow:?}: {err:?}"
        );
    }
    // A bound that would permit everything is a configuration error the daemon names.
    let bad = state.path().join("bad.toml");
    std::fs::write(&bad, "[egress]\npermitted_domains = [\"*\"]\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_corral"))
        .args(["serve", "--config", bad.to_str().unwrap(), "--check-config"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && text.contains("egress.permitted_domains"),
        "{text}"
    );
}

/// Runs `corral COMMAND --socket … ARGS` as a person would type it; its output, after it
/// succeeded.
fn cli(d: &Daemon, command_and_args: &str) -> String {
    let (command, args) = command_and_args
        .split_once(' ')
        .unwrap_or((command_and_args, ""));
    let (code, out) = common::host_sh(&format!(
        "{} {command} --socket {} {args} 2>&1",
        common::client_binary().display(),
        d.target()
    ));
    assert_eq!(code, 0, "{command_and_args}: {out}");
    out
}
