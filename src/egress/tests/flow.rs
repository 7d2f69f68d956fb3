//! What the proxy carries (tunnels, forwarded requests), rule changes, and its bounds.

use super::*;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// A proxy allowing `up.test` (and `web.test`), both mapped to 127.0.0.1, which is allowed.
async fn up(limits: Limits) -> Harness {
    start(
        rules(&["up.test", "web.test"], &[]),
        &[("up.test", &["127.0.0.1"]), ("web.test", &["127.0.0.1"])],
        &["127.0.0.0/8"],
        limits,
    )
    .await
}

#[tokio::test]
async fn an_allowed_connect_tunnels_bytes_and_reports_them() {
    let origin = echo_origin().await;
    let h = up(Limits::default()).await;
    let (mut c, a) = h.connect(&format!("UP.test:{}", origin.port())).await;
    assert_eq!(a.status, 200);
    assert!(
        a.head
            .starts_with("http/1.1 200 connection established\r\n"),
        "{}",
        a.head
    );
    // RFC 9110 §9.3.6: a 2xx answer to CONNECT has no Content-Length.
    assert!(!a.head.contains("content-length"), "{}", a.head);
    echo_through(&mut c, b"ping!").await;
    echo_through(&mut c, b"again").await;
    c.shutdown().await.expect("half-close");
    assert_eq!(read_to_close(&mut c).await, Ok(Vec::new()));
    let d = &h.decisions(1).await[0];
    assert_eq!((d.host.as_str(), d.port), ("up.test", origin.port()));
    assert!(d.allowed);
    assert_eq!((d.rule.as_str(), d.reason.as_str()), ("allow up.test", ""));
    assert_eq!((d.address, d.method), (Some(origin), "CONNECT"));
    assert_eq!((d.bytes_up, d.bytes_down), (10, 10));
}

/// An origin that records each request (head, then a `content-length` body) and answers
/// with hop-by-hop headers of its own.
async fn http_origin() -> (SocketAddr, mpsc::UnboundedReceiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                while !head.ends_with(b"\r\n\r\n") {
                    let Ok(b) = s.read_u8().await else { return };
                    head.push(b);
                }
                let mut text = String::from_utf8_lossy(&head).to_ascii_lowercase();
                let len: usize = text
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map_or(0, |v| v.trim().parse().unwrap_or(0));
                let mut body = vec![0; len];
                let _ = s.read_exact(&mut body).await;
                text.push_str(&String::from_utf8_lossy(&body));
                let _ = tx.send(text);
                let _ = s
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nKeep-Alive: timeout=5\r\n\
                          Connection: keep-alive, X-Secret-Hop\r\nX-Secret-Hop: 1\r\n\
                          X-Origin: yes\r\n\r\nhello",
                    )
                    .await;
                let _ = s.read_to_end(&mut Vec::new()).await;
            });
        }
    });
    (addr, rx)
}

#[tokio::test]
async fn an_absolute_form_request_is_forwarded_without_hop_by_hop_headers() {
    let (origin, mut seen) = http_origin().await;
    let h = up(Limits::default()).await;
    let port = origin.port();
    let mut c = h.client().await;
    let req = format!(
        "GET http://web.test:{port}/path?q=1 HTTP/1.1\r\nHost: elsewhere.test\r\n\
         Connection: keep-alive, X-Hop\r\nX-Hop: secret\r\nKeep-Alive: 5\r\n\
         Proxy-Authorization: Basic eHl6\r\nProxy-Connection: keep-alive\r\nTE: trailers\r\n\
         X-Kept: yes\r\n\r\n"
    );
    c.write_all(req.as_bytes()).await.expect("send");
    let a = read_answer(&mut c).await;
    assert_eq!((a.status, a.body.as_str()), (200, "hello"));
    assert!(a.head.contains("x-origin: yes"), "{}", a.head);
    for gone in ["x-secret-hop", "keep-alive:"] {
        assert!(
            !a.head.contains(gone),
            "{gone} reached the client: {}",
            a.head
        );
    }
    let got = seen.recv().await.expect("the origin saw the request");
    assert!(got.starts_with("get /path?q=1 http/1.1\r\n"), "{got}");
    assert!(
        got.contains(&format!("\r\nhost: web.test:{port}\r\n")),
        "{got}"
    );
    assert_eq!(got.matches("host:").count(), 1, "{got}");
    assert!(got.contains("\r\nx-kept: yes\r\n"), "{got}");
    for gone in ["x-hop", "keep-alive", "proxy-", "\r\nte:", "connection:"] {
        assert!(!got.contains(gone), "{gone} reached the origin: {got}");
    }

    // A body goes through too, on the same client connection.
    let req = format!(
        "POST http://web.test:{port}/up HTTP/1.1\r\nHost: web.test\r\nContent-Length: 3\r\n\r\nabc"
    );
    c.write_all(req.as_bytes()).await.expect("send");
    assert_eq!(read_answer(&mut c).await.status, 200);
    let posted = seen.recv().await.expect("the origin saw the POST");
    assert!(posted.ends_with("\r\n\r\nabc"), "{posted}");

    let d = h.decisions(2).await;
    assert_eq!(
        (d[0].method, d[0].allowed, d[0].address),
        ("GET", true, Some(origin))
    );
    assert_eq!(d[0].bytes_up, got.len() as u64, "the request as sent");
    assert!(d[0].bytes_down >= 5, "{}", d[0].bytes_down);
    assert_eq!(
        (d[1].method, d[1].rule.as_str()),
        ("POST", "allow web.test")
    );
}

#[tokio::test]
async fn new_rules_apply_to_the_next_connection_and_open_tunnels_keep_going() {
    let origin = echo_origin().await;
    let h = up(Limits::default()).await;
    let target = format!("up.test:{}", origin.port());
    let (mut open, a) = h.connect(&target).await;
    assert_eq!(a.status, 200);
    h.proxy.set_rules(rules(&["other.test"], &[]));
    let (_c, a) = h.connect(&target).await;
    assert_eq!(a.status, 403);
    assert!(a.body.contains("(allowed: other.test)"), "{}", a.body);
    echo_through(&mut open, b"still open").await;
}

#[tokio::test]
async fn connections_over_the_bound_are_answered_503_and_closed() {
    let origin = echo_origin().await;
    let limits = Limits {
        max_connections: 1,
        ..Limits::default()
    };
    let h = up(limits).await;
    let target = format!("up.test:{}", origin.port());
    let (first, a) = h.connect(&target).await;
    assert_eq!(a.status, 200);
    let mut second = h.client().await;
    second
        .write_all(format!("CONNECT {target} HTTP/1.1\r\n\r\n").as_bytes())
        .await
        .expect("send");
    let answer = read_to_close(&mut second).await.expect("closed");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 503 "), "{answer}");
    assert!(
        answer.ends_with("too many connections (at most 1); retry later\n"),
        "{answer}"
    );

    // The slot is free again once the tunnel ends.
    drop(first);
    h.decisions(1).await;
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (_c, a) = h.connect(&target).await;
        if a.status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "the slot was not released");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_client_sending_its_head_slowly_is_cut_off() {
    let limits = Limits {
        header_timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    let h = up(limits).await;
    let head = b"CONNECT up.test:443 HTTP/1.1\r\nHost: up.test:443\r\n\r\n".to_vec();
    let (took, _) = trickle_until_cut(h.client().await, head).await;
    assert!(took >= Duration::from_millis(250), "{took:?}");
    assert!(
        took < Duration::from_millis(2000),
        "{took:?}: an activity timer, not a deadline"
    );
    h.decisions(0).await;
}

#[tokio::test]
async fn an_idle_tunnel_is_closed() {
    let origin = echo_origin().await;
    let limits = Limits {
        idle_timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    let h = up(limits).await;
    let (mut c, a) = h.connect(&format!("up.test:{}", origin.port())).await;
    assert_eq!(a.status, 200);
    echo_through(&mut c, b"x").await;
    assert_eq!(read_to_close(&mut c).await, Ok(Vec::new()));
    let d = &h.decisions(1).await[0];
    assert!(d.reason.contains("without traffic"), "{}", d.reason);
    assert_eq!((d.bytes_up, d.bytes_down), (1, 1));
}

#[tokio::test]
async fn shutdown_ends_open_tunnels_and_reports_them() {
    let origin = echo_origin().await;
    let mut h = up(Limits::default()).await;
    let (mut c, a) = h.connect(&format!("up.test:{}", origin.port())).await;
    assert_eq!(a.status, 200);
    echo_through(&mut c, b"abc").await;
    h.shutdown.cancel();
    tokio::time::timeout(PATIENCE, &mut h.served)
        .await
        .expect("serve returns")
        .expect("join");
    assert!(read_to_close(&mut c).await.is_ok());
    let d = &h.decisions(1).await[0];
    assert_eq!((d.bytes_up, d.bytes_down), (3, 3));
    assert!(
        TcpStream::connect(h.addr).await.is_err(),
        "the listener is closed"
    );
}
