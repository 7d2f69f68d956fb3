//! The exec-server's two transports, as Codex's own server offers them: WebSocket (one JSON
//! message per text frame; `GET /readyz` on the same port; an upgrade that carries an `Origin`
//! header — a browser page — is refused) and stdio (one JSON message per line, for Codex's
//! `program = …` environments, e.g. over ssh). Each connection becomes a pair of channels for
//! `handlers::serve_connection`.

use super::handlers::{Front, OUTBOX, serve_connection};
use super::rpc::MAX_MESSAGE_BYTES;
use futures_util::{SinkExt, StreamExt};
use hyper::body::Incoming as Body;
use hyper::{Request, Response, StatusCode, header};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Message, handshake::derive_accept_key};

/// Who may connect over WebSocket: anyone who reaches a loopback listener, or the holder of a
/// bearer token whose SHA-256 is configured (required off loopback).
#[derive(Clone, Default)]
pub struct Auth {
    pub token_sha256: Vec<[u8; 32]>,
}

impl Auth {
    fn allows(&self, request: &Request<Body>) -> bool {
        if self.token_sha256.is_empty() {
            return true;
        }
        let Some(token) = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
        else {
            return false;
        };
        let digest: [u8; 32] = Sha256::digest(token.trim().as_bytes()).into();
        // Every configured digest is compared whole, in constant time.
        self.token_sha256.iter().fold(false, |found, want| {
            found
                | (want
                    .iter()
                    .zip(digest)
                    .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                    == 0)
        })
    }
}

/// Serves WebSocket connections on `listener` until the task is dropped.
pub async fn serve_ws(front: Arc<Front>, listener: TcpListener, auth: Auth) {
    loop {
        let Ok(local) = listener.local_addr() else {
            return;
        };
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("accepting a connection: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let (front, auth) = (front.clone(), auth.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let (front, auth) = (front.clone(), auth.clone());
                async move { Ok::<_, std::convert::Infallible>(answer(front, auth, local, peer, req)) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades();
            if let Err(e) = conn.await {
                tracing::debug!("connection from {peer}: {e}");
            }
        });
    }
}

/// H19 on this transport: a process inside a sandbox (a corral command with the network on, or
/// any process more confined than this front) gets no session through it — the front would
/// open it as this front's user, wider than the sandbox the caller runs in. A connection from
/// this machine is traced to its process the way the kernel lists it (`/proc/net/tcp` names the
/// peer socket's inode, `/proc/*/fd` the process holding it) and judged by the daemon's own
/// rule (`peer::is_sandboxed`); a peer that cannot be traced is refused. Connections from other
/// hosts need the bearer token instead.
fn local_peer_may_connect(local: SocketAddr, peer: SocketAddr) -> Result<(), String> {
    if !peer.ip().is_loopback() {
        return Ok(());
    }
    let uid = nix::unistd::geteuid().as_raw();
    // Only this user's processes' descriptors are readable to a front that is not root; a
    // root front checks the owner (is_sandboxed refuses another uid).
    match loopback_peer_pid(local, peer) {
        Some(pid) if !crate::sandbox::confinement::is_sandboxed(Some(pid), uid) => Ok(()),
        Some(pid) => Err(format!(
            "the connecting process ({pid}) runs in a sandbox; a sandboxed process gets no \
             session through this front (spec/sandbox.md H19)"
        )),
        None => Err(format!(
            "this front serves only uid {uid}'s processes on this machine: the connecting \
             process is not one of them, or cannot be told (over IPv4 loopback)"
        )),
    }
}

/// The pid of the process holding the TCP socket whose address is `peer` and whose remote is
/// `local` (IPv4 only). `None` if no such socket or process is found.
fn loopback_peer_pid(local: SocketAddr, peer: SocketAddr) -> Option<i32> {
    let (SocketAddr::V4(local), SocketAddr::V4(peer)) = (local, peer) else {
        return None;
    };
    let hex = |a: std::net::SocketAddrV4| {
        format!(
            "{:08X}:{:04X}",
            u32::from_le_bytes(a.ip().octets()),
            a.port()
        )
    };
    let (want_local, want_remote) = (hex(peer), hex(local));
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let inode = table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        (f.get(1) == Some(&want_local.as_str()) && f.get(2) == Some(&want_remote.as_str()))
            .then(|| f.get(9).map(|i| i.to_string()))
            .flatten()
    })?;
    let target = format!("socket:[{inode}]");
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == target.as_str()) {
                return Some(pid);
            }
        }
    }
    None
}

fn plain(status: StatusCode, text: &str) -> Response<String> {
    let mut r = Response::new(format!("{text}\n"));
    *r.status_mut() = status;
    r
}

/// The HTTP side: `/readyz`, the refusals, and the upgrade.
fn answer(
    front: Arc<Front>,
    auth: Auth,
    local: SocketAddr,
    peer: SocketAddr,
    req: Request<Body>,
) -> Response<String> {
    if req.uri().path() == "/readyz" && req.method() == hyper::Method::GET {
        return plain(StatusCode::OK, "ready");
    }
    if req.headers().contains_key(header::ORIGIN) {
        return plain(
            StatusCode::FORBIDDEN,
            "WebSocket upgrades with an Origin header (from a browser page) are refused",
        );
    }
    if !auth.allows(&req) {
        return plain(StatusCode::UNAUTHORIZED, "a valid bearer token is required");
    }
    if let Err(why) = local_peer_may_connect(local, peer) {
        return plain(StatusCode::FORBIDDEN, &why);
    }
    let upgrade = req
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    let Some(key) = req.headers().get(header::SEC_WEBSOCKET_KEY).cloned() else {
        return plain(StatusCode::BAD_REQUEST, "this is a WebSocket endpoint");
    };
    if !upgrade {
        return plain(StatusCode::BAD_REQUEST, "this is a WebSocket endpoint");
    }
    tokio::spawn(async move {
        match hyper::upgrade::on(req).await {
            Ok(upgraded) => {
                let config = WebSocketConfig::default()
                    .max_message_size(Some(MAX_MESSAGE_BYTES))
                    .max_frame_size(Some(MAX_MESSAGE_BYTES));
                let ws = WebSocketStream::from_raw_socket(
                    TokioIo::new(upgraded),
                    Role::Server,
                    Some(config),
                )
                .await;
                run_ws(front, ws).await;
            }
            Err(e) => tracing::warn!("upgrading the connection from {peer}: {e}"),
        }
    });
    let mut r = Response::new(String::new());
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = r.headers_mut();
    h.insert(
        header::UPGRADE,
        header::HeaderValue::from_static("websocket"),
    );
    h.insert(
        header::CONNECTION,
        header::HeaderValue::from_static("Upgrade"),
    );
    if let Ok(accept) = header::HeaderValue::from_str(&derive_accept_key(key.as_bytes())) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
    }
    r
}

async fn run_ws<S>(front: Arc<Front>, ws: WebSocketStream<S>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sink, mut stream) = ws.split();
    let (in_tx, in_rx) = mpsc::channel::<String>(OUTBOX);
    let (out_tx, mut out_rx) = mpsc::channel::<Value>(OUTBOX);
    let writer = tokio::spawn(async move {
        while let Some(v) = out_rx.recv().await {
            if sink.send(Message::text(v.to_string())).await.is_err() {
                break;
            }
        }
        let _ = sink.close().await;
    });
    let reader = tokio::spawn(async move {
        while let Some(msg) = stream.next().await {
            let text = match msg {
                Ok(Message::Text(t)) => t.to_string(),
                Ok(Message::Binary(b)) => match String::from_utf8(b.to_vec()) {
                    Ok(t) => t,
                    Err(_) => continue,
                },
                Ok(Message::Close(_)) | Err(_) => break,
                Ok(_) => continue,
            };
            if in_tx.send(text).await.is_err() {
                break;
            }
        }
    });
    serve_connection(front, in_rx, out_tx).await;
    reader.abort();
    let _ = writer.await;
}

/// Serves one connection on stdin/stdout, one message per line.
pub async fn serve_stdio(front: Arc<Front>) {
    let (in_tx, in_rx) = mpsc::channel::<String>(OUTBOX);
    let (out_tx, mut out_rx) = mpsc::channel::<Value>(OUTBOX);
    let writer = tokio::spawn(async move {
        let mut out = tokio::io::stdout();
        while let Some(v) = out_rx.recv().await {
            let mut line = v.to_string();
            line.push('\n');
            if out.write_all(line.as_bytes()).await.is_err() || out.flush().await.is_err() {
                break;
            }
        }
    });
    let reader = tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(tokio::io::stdin());
        let mut line = Vec::new();
        loop {
            line.clear();
            // Bounded: a line past the message limit is refused, not buffered without end.
            let mut limited = (&mut lines).take(MAX_MESSAGE_BYTES as u64 + 1);
            match tokio::io::AsyncBufReadExt::read_until(&mut limited, b'\n', &mut line).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            if line.len() > MAX_MESSAGE_BYTES {
                tracing::warn!("a message over {MAX_MESSAGE_BYTES} bytes; closing");
                break;
            }
            let text = String::from_utf8_lossy(&line).trim().to_string();
            if text.is_empty() {
                continue;
            }
            if in_tx.send(text).await.is_err() {
                break;
            }
        }
    });
    serve_connection(front, in_rx, out_tx).await;
    reader.abort();
    let _ = writer.await;
}
