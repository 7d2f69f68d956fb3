//! Prometheus metrics: off by default; when on, calls by tool and outcome, latency, workers and
//! sandbox denials, with no ids or paths in the labels.

use crate::common::{self, Daemon, scratch};
use corral::api::SandboxMode;
use std::io::{Read, Write};

fn scrape(port: u16) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    body
}

#[tokio::test]
async fn metrics_count_calls_denials_and_workers() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let d = Daemon::start(&["--metrics-listen", &format!("127.0.0.1:{port}")]).await;
    let cwd = scratch();
    std::fs::write(cwd.path().join("f.txt"), "x\n").unwrap();
    let id = d.open(cwd.path(), SandboxMode::ReadOnly).await;
    d.invoke(&id, "read_file", r#"{"file_path":"f.txt"}"#).await;
    // A write in a read-only session: a sandbox denial.
    let r = d.sh(&id, "echo x > f.txt").await;
    assert!(r.response.sandbox_denied, "{}", r.output);

    let body = scrape(port);
    assert!(
        body.contains(r#"corral_calls_total{tool="read_file",outcome="ok"} 1"#),
        "{body}"
    );
    assert!(
        body.contains(r#"corral_calls_total{tool="shell",outcome="denied"} 1"#),
        "{body}"
    );
    assert!(
        body.contains(r#"corral_sandbox_denials_total{tool="shell"} 1"#),
        "{body}"
    );
    assert!(
        body.contains("corral_call_duration_seconds_bucket"),
        "{body}"
    );
    assert!(body.contains("corral_workers"), "{body}");
    assert!(body.contains("corral_running_commands 0"), "{body}");
    assert!(!body.contains(&id), "session ids never appear in labels");
    assert!(
        !body.contains(cwd.path().to_str().unwrap()),
        "paths never appear in labels"
    );
}

#[test]
fn metrics_stay_on_loopback_unless_made_public() {
    let out = std::process::Command::new(common::CORRAL)
        .args([
            "serve",
            "--listen",
            "unix:/nonexistent/c.sock",
            "--metrics-listen",
            "0.0.0.0:9464",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("metrics_public"));
}
