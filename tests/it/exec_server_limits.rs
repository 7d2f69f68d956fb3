//! `corral exec-server` under bad clients: a frame over the 64 MiB message limit closes that
//! connection only; a client that never reads its notifications stalls only itself (its
//! outbox is bounded), while another connection is served at once.

use crate::common::{self, Daemon, scratch};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;

async fn front(d: &Daemon, cwd: &Path) -> (tokio::process::Child, String) {
    let mut child = tokio::process::Command::new(common::CORRAL)
        .args([
            "--socket",
            &format!("unix:{}", d.socket.display()),
            "exec-server",
        ])
        .current_dir(cwd)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let url = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    (child, url)
}

async fn connect(url: &str) -> WebSocketStream<TcpStream> {
    let tcp = TcpStream::connect(url.trim_start_matches("ws://"))
        .await
        .unwrap();
    tokio_tungstenite::client_async(url, tcp).await.unwrap().0
}

async fn ask(ws: &mut WebSocketStream<TcpStream>, id: u64, method: &str, params: Value) -> Value {
    ws.send(Message::text(
        json!({"id": id, "method": method, "params": params}).to_string(),
    ))
    .await
    .unwrap();
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(20), ws.next())
            .await
            .expect("an answer within 20 s")
            .expect("open")
            .unwrap();
        if let Message::Text(t) = msg {
            let v: Value = serde_json::from_str(&t).unwrap();
            if v["id"] == json!(id) {
                return v;
            }
        }
    }
}

fn sandbox(ws: &Path) -> Value {
    let root = url::Url::from_file_path(ws).unwrap().to_string();
    json!({
        "permissions": {"type": "managed", "network": "restricted", "file_system": {
            "type": "restricted", "entries": [
                {"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"},
                {"path": {"type": "special", "value": {"kind": "project_roots"}}, "access": "write"},
            ]}},
        "cwd": root, "workspaceRoots": [root],
    })
}

#[tokio::test]
async fn an_oversized_frame_closes_only_its_connection() {
    let d = Daemon::start(&[]).await;
    let ws = scratch();
    let (_front, url) = front(&d, ws.path()).await;
    let mut big = connect(&url).await;
    let payload = "x".repeat(65 * 1024 * 1024);
    let _ = big.send(Message::text(payload)).await;
    // The front ends that connection rather than buffering past its limit.
    let closed = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match big.next().await {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return true,
                Some(Ok(_)) => continue,
            }
        }
    })
    .await;
    assert_eq!(closed, Ok(true), "the oversized connection stays open");
    // Another connection is served.
    let mut ok = connect(&url).await;
    let r = ask(&mut ok, 1, "initialize", json!({"clientName": "t"})).await;
    assert!(r["result"]["sessionId"].is_string(), "{r}");
}

#[tokio::test]
async fn a_client_that_never_reads_stalls_only_itself() {
    let d = Daemon::start(&[]).await;
    let ws = scratch();
    let ws_path = std::fs::canonicalize(ws.path()).unwrap();
    let (front_child, url) = front(&d, &ws_path).await;
    let front_pid = front_child.id().unwrap();
    let cwd = url::Url::from_file_path(&ws_path).unwrap().to_string();
    // The stalled client: a process that prints 200 MB, and no reads at all after its start.
    let mut stalled = connect(&url).await;
    ask(
        &mut stalled,
        1,
        "initialize",
        json!({"clientName": "stalled"}),
    )
    .await;
    let r = ask(
        &mut stalled,
        2,
        "process/start",
        json!({"processId": "flood", "argv": ["/bin/sh", "-c", "head -c 200000000 /dev/zero | tr '\\0' x"],
            "cwd": cwd, "env": {}, "tty": false, "sandbox": sandbox(&ws_path)}),
    )
    .await;
    assert!(r.get("result").is_some(), "{r}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Another client: started, answered and its process done within a few seconds.
    let mut other = connect(&url).await;
    let t = Instant::now();
    ask(&mut other, 1, "initialize", json!({"clientName": "other"})).await;
    ask(
        &mut other,
        2,
        "process/start",
        json!({"processId": "quick", "argv": ["echo", "served"], "cwd": cwd, "env": {},
            "tty": false, "sandbox": sandbox(&ws_path)}),
    )
    .await;
    let r = ask(
        &mut other,
        3,
        "process/read",
        json!({"processId": "quick", "afterSeq": 0, "waitMs": 10000}),
    )
    .await;
    assert!(r["result"]["chunks"][0]["chunk"].as_str().is_some(), "{r}");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    // The front holds a bounded share of the 200 MB the stalled client did not read.
    let status = std::fs::read_to_string(format!("/proc/{front_pid}/status")).unwrap();
    let rss_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert!(rss_kib < 120 * 1024, "the front holds {rss_kib} KiB");
    drop(stalled);
}

/// H19 on the WebSocket transport: a command in a network-on corral sandbox reaches the front's
/// loopback port, but gets no session through it (the front would open one as its own user,
/// wider than the sandbox). Baseline: the same upgrade from the host is accepted.
#[tokio::test]
async fn a_sandboxed_process_gets_no_session_through_the_front() {
    let d = Daemon::start(&[]).await;
    let ws = scratch();
    let (_front, url) = front(&d, ws.path()).await;
    let addr = url.trim_start_matches("ws://").to_string();
    let (host, port) = addr.rsplit_once(':').unwrap();
    let upgrade = format!(
        "import socket; s = socket.create_connection(('{host}', {port})); \
         s.sendall(b'GET / HTTP/1.1\\r\\nHost: x\\r\\nConnection: Upgrade\\r\\nUpgrade: websocket\\r\\n\
         Sec-WebSocket-Version: 13\\r\\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\\r\\n\\r\\n'); \
         print(s.recv(4096).decode().splitlines()[0])"
    );
    let (code, out) = common::host_sh(&format!("python3 -c \"{upgrade}\""));
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("101"), "baseline: the host's upgrade {out}");
    let id = d
        .open_with(corral::api::OpenSessionRequest {
            cwd: ws.path().to_string_lossy().into_owned(),
            mode: corral::api::SandboxMode::ReadOnly as i32,
            network_access: true,
            ..Default::default()
        })
        .await;
    let r = d.sh(&id, &format!("python3 -c \"{upgrade}\"")).await;
    assert!(r.output.contains("403"), "{}", r.output);
    assert!(!r.output.contains("101"), "{}", r.output);
}
