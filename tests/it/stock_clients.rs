//! Stock gRPC clients on the Unix socket. gRPC C-core (Python, Ruby, C++, …), grpc-java and
//! others send the socket's path — raw, `unix:`-prefixed or percent-encoded — as the HTTP/2
//! `:authority`, which h2 answered with RST_STREAM PROTOCOL_ERROR before corral saw the call
//! (vendor/h2/PATCH.md). These tests put such authorities on the wire byte for byte against a
//! real `corral serve`. `http::Uri` cannot hold them, so the h2 client cannot send them: a relay
//! between the h2 client and the socket replaces the request's HEADERS block with one written
//! here, and the h2 client reads the answer.

use crate::common::{Daemon, scratch, session_env};
use bytes::{Bytes, BytesMut};
use corral::api;
use prost::Message;
use std::path::Path;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse, health_check_response};

/// What came back for one call.
#[derive(Debug)]
enum Outcome {
    /// The server answered: its grpc-status and the response message.
    Answered { grpc_status: String, message: Bytes },
    /// The server reset the stream (or closed the connection) with this HTTP/2 error code.
    Reset(h2::Reason),
}

/// The header block of a gRPC call to `path`, with `authority` as its :authority.
fn grpc_headers<'a>(path: &'a str, authority: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
}

/// One unary call on a new connection to `socket`: the request's header block is exactly
/// `headers` (pseudo-headers first), its message `request`.
async fn call(socket: &Path, headers: &[(&str, &str)], request: &[u8]) -> Outcome {
    tokio::time::timeout(
        Duration::from_secs(20),
        call_inner(socket, headers, request),
    )
    .await
    .expect("the call did not finish in 20 s")
}

async fn call_inner(socket: &Path, headers: &[(&str, &str)], request: &[u8]) -> Outcome {
    let server = tokio::net::UnixStream::connect(socket)
        .await
        .expect("connect");
    let (ours, theirs) = tokio::io::duplex(1 << 16);
    tokio::spawn(relay(theirs, server, hpack_literals(headers)));
    let (client, connection) = h2::client::handshake(ours).await.expect("handshake");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut client = client.ready().await.expect("ready");
    // A placeholder: the relay sends `headers` in place of this request's header block. One
    // request per connection, so the h2 client's HPACK state never refers to what it sent.
    let placeholder = http::Request::post("http://placeholder/").body(()).unwrap();
    let (response, mut body) = client
        .send_request(placeholder, false)
        .expect("send_request");
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(request.len() as u32).to_be_bytes());
    framed.extend_from_slice(request);
    body.send_data(framed.into(), true).expect("send_data");

    let reset = |e: h2::Error| Outcome::Reset(e.reason().unwrap_or_else(|| panic!("{e}")));
    let response = match response.await {
        Ok(r) => r,
        Err(e) => return reset(e),
    };
    assert_eq!(response.status(), 200, "{response:?}");
    let head = response.headers().clone();
    let mut recv = response.into_body();
    let mut data = BytesMut::new();
    while let Some(chunk) = recv.data().await {
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) => return reset(e),
        };
        let _ = recv.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    let trailers = match recv.trailers().await {
        Ok(t) => t.unwrap_or_default(),
        Err(e) => return reset(e),
    };
    // A trailers-only answer (an error) carries grpc-status in the headers.
    let grpc_status = trailers
        .get("grpc-status")
        .or_else(|| head.get("grpc-status"))
        .expect("grpc-status")
        .to_str()
        .unwrap()
        .to_string();
    let message = if data.is_empty() {
        Bytes::new()
    } else {
        // The length-prefixed message: uncompressed flag, 4-byte big-endian length, message.
        assert_eq!(data[0], 0, "compressed response");
        let len = u32::from_be_bytes(data[1..5].try_into().unwrap()) as usize;
        assert_eq!(data.len(), 5 + len, "one response message");
        data.freeze().slice(5..)
    };
    Outcome::Answered {
        grpc_status,
        message,
    }
}

/// Copies the h2 client's connection to the server, replacing the payload of its (single)
/// HEADERS frame with `block`; the server's bytes go back unchanged.
async fn relay(client: tokio::io::DuplexStream, server: tokio::net::UnixStream, block: Vec<u8>) {
    const PREFACE_LEN: usize = 24;
    const HEADERS: u8 = 0x1;
    const CONTINUATION: u8 = 0x9;
    const END_HEADERS: u8 = 0x4;
    const PADDED: u8 = 0x8;
    const PRIORITY: u8 = 0x20;
    let (mut from_client, mut to_client) = tokio::io::split(client);
    let (mut from_server, mut to_server) = server.into_split();
    tokio::spawn(async move {
        let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
        let _ = to_client.shutdown().await;
    });
    let up = async move {
        let mut preface = [0u8; PREFACE_LEN];
        from_client.read_exact(&mut preface).await?;
        to_server.write_all(&preface).await?;
        loop {
            // A frame: 24-bit length, type, flags, stream id; then the payload.
            let mut head = [0u8; 9];
            from_client.read_exact(&mut head).await?;
            let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
            let mut payload = vec![0u8; len];
            from_client.read_exact(&mut payload).await?;
            assert_ne!(head[3], CONTINUATION, "the request headers span frames");
            if head[3] == HEADERS {
                assert_eq!(
                    head[4] & (END_HEADERS | PADDED | PRIORITY),
                    END_HEADERS,
                    "a HEADERS frame with padding or priority, or continued"
                );
                payload = block.clone();
                head[..3].copy_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
            }
            to_server.write_all(&head).await?;
            to_server.write_all(&payload).await?;
        }
    };
    // Ends when the client closes its side.
    let _: std::io::Result<()> = up.await;
}

/// An HPACK header block of literal fields without indexing, new names, no Huffman coding
/// (RFC 7541 §6.2.2): the server decodes exactly `headers`, whatever bytes they hold.
fn hpack_literals(headers: &[(&str, &str)]) -> Vec<u8> {
    fn string(out: &mut Vec<u8>, s: &[u8]) {
        // The length as an integer with a 7-bit prefix (§5.1), H = 0 (§5.2).
        let mut n = s.len();
        if n < 127 {
            out.push(n as u8);
        } else {
            out.push(127);
            n -= 127;
            while n >= 128 {
                out.push((n % 128) as u8 | 0x80);
                n /= 128;
            }
            out.push(n as u8);
        }
        out.extend_from_slice(s);
    }
    let mut out = Vec::new();
    for (name, value) in headers {
        out.push(0x00);
        string(&mut out, name.as_bytes());
        string(&mut out, value.as_bytes());
    }
    out
}

/// A call that must have been answered with grpc-status 0; its response message.
fn answered(outcome: Outcome, what: &str) -> Bytes {
    match outcome {
        Outcome::Answered {
            grpc_status,
            message,
        } if grpc_status == "0" => message,
        other => panic!("{what}: {other:?}"),
    }
}

/// What stock clients put in :authority for a Unix socket, and authorities h2 cannot parse.
fn stock_authorities(socket: &Path) -> Vec<String> {
    let path = socket.to_str().unwrap();
    vec![
        // grpc-java, grpc-go before 1.34, Bazel: the path itself.
        path.to_string(),
        // The channel target as written.
        format!("unix:{path}"),
        format!("unix://{path}"),
        // gRPC C-core since 1.57 (Python grpcio, Ruby, C++): the path percent-encoded, without
        // its leading slash.
        path.trim_start_matches('/').replace('/', "%2F"),
        // Characters a URI authority cannot hold.
        "corral socket {\"x\"} <a|b> ^\\`".to_string(),
        // Not even a valid host:port.
        "localhost:port:8080".to_string(),
        "[::1".to_string(),
        String::new(),
    ]
}

#[tokio::test]
async fn health_check_is_served_whatever_the_authority() {
    let d = Daemon::start(&[]).await;
    let request = HealthCheckRequest {
        service: String::new(),
    }
    .encode_to_vec();
    // A valid authority, as corral's own clients send: the control.
    let mut authorities = vec!["localhost".to_string()];
    authorities.extend(stock_authorities(&d.socket));
    for authority in &authorities {
        let headers = grpc_headers("/grpc.health.v1.Health/Check", authority);
        let message = answered(
            call(&d.socket, &headers, &request).await,
            &format!("Health/Check with :authority {authority:?}"),
        );
        let status = HealthCheckResponse::decode(message).unwrap().status;
        assert_eq!(
            status,
            health_check_response::ServingStatus::Serving as i32,
            "{authority:?}"
        );
    }
}

#[tokio::test]
async fn corral_calls_work_with_the_socket_path_as_authority() {
    let d = Daemon::start(&[]).await;
    let work = scratch();
    std::fs::write(work.path().join("hello.txt"), "hello from a stock client\n").unwrap();
    for authority in stock_authorities(&d.socket) {
        let rpc = |path: &'static str, request: Vec<u8>| {
            let authority = authority.clone();
            let socket = d.socket.clone();
            async move {
                let headers = grpc_headers(path, &authority);
                answered(
                    call(&socket, &headers, &request).await,
                    &format!("{path} with :authority {authority:?}"),
                )
            }
        };
        let opened = rpc(
            "/corral.v1.Sessions/OpenSession",
            api::OpenSessionRequest {
                cwd: work.path().to_string_lossy().into_owned(),
                mode: api::SandboxMode::ReadOnly as i32,
                env: session_env(work.path()),
                ..Default::default()
            }
            .encode_to_vec(),
        )
        .await;
        let session_id = api::OpenSessionResponse::decode(opened).unwrap().session_id;
        assert!(!session_id.is_empty());

        let tools = rpc(
            "/corral.v1.Bridge/ListTools",
            api::ListToolsRequest {
                session_id: session_id.clone(),
                ..Default::default()
            }
            .encode_to_vec(),
        )
        .await;
        let names = api::ListToolsResponse::decode(tools).unwrap().names;
        assert!(names.iter().any(|n| n == "read_file"), "{names:?}");

        let read = rpc(
            "/corral.v1.Tools/ReadFile",
            api::ReadFileRequest {
                session_id: session_id.clone(),
                file_path: "hello.txt".into(),
                ..Default::default()
            }
            .encode_to_vec(),
        )
        .await;
        let text = api::ReadFileResponse::decode(read).unwrap().text;
        assert!(text.contains("hello from a stock client"), "{text:?}");

        rpc(
            "/corral.v1.Sessions/CloseSession",
            api::CloseSessionRequest { session_id }.encode_to_vec(),
        )
        .await;
    }
}

/// The leniency covers :authority alone: a request h2 finds malformed otherwise (or a CONNECT,
/// whose authority is its target) is still reset, and the daemon now says so in its log.
#[tokio::test]
async fn malformed_requests_are_still_refused_and_logged() {
    let d = Daemon::start(&[]).await;
    let socket = d.socket.to_str().unwrap();

    let no_method = vec![
        (":scheme", "http"),
        (":path", "/grpc.health.v1.Health/Check"),
        (":authority", "localhost"),
        ("content-type", "application/grpc"),
    ];
    let connect = vec![(":method", "CONNECT"), (":authority", socket)];
    let mut connection_header = grpc_headers("/grpc.health.v1.Health/Check", socket);
    connection_header.push(("connection", "keep-alive"));
    for (what, headers) in [
        ("no :method", no_method),
        ("CONNECT", connect),
        ("a connection-specific header", connection_header),
    ] {
        match call(&d.socket, &headers, b"").await {
            Outcome::Reset(reason) => assert_eq!(reason, h2::Reason::PROTOCOL_ERROR, "{what}"),
            other => panic!("{what}: not refused: {other:?}"),
        }
    }

    // The first refusal is logged at once (the second falls in the rate limit's interval).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = d.log_text();
        if log.contains("WARN")
            && log.contains("HTTP/2 refused a client's request or connection")
            && log.contains("malformed headers: missing method")
        {
            break;
        }
        assert!(Instant::now() < deadline, "no warning logged:\n{log}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
