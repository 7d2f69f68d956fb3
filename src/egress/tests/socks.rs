//! SOCKS5 on the proxy's listener: what it carries, what it refuses with which reply code and
//! what is reported, its bounds, and HTTP beside it.

use super::*;
use tokio::time::Instant;

const CONNECT: u8 = 1;

/// A proxy allowing `up.test` and `*.lab.test`; names mapped as in the other tests.
async fn socks_proxy(limits: Limits) -> Harness {
    start(
        rules(&["up.test", "*.lab.test"], &["bad.lab.test"]),
        &[
            ("up.test", &["127.0.0.1"]),
            ("metadata.lab.test", &["169.254.169.254"]),
            ("down.lab.test", &["127.0.0.1"]),
        ],
        &["127.0.0.0/8"],
        limits,
    )
    .await
}

/// Greets with `methods` on a new connection; the proxy's choice.
async fn greet(h: &Harness, methods: &[u8]) -> (TcpStream, [u8; 2]) {
    let mut c = h.client().await;
    let mut hello = vec![5, methods.len() as u8];
    hello.extend_from_slice(methods);
    c.write_all(&hello).await.expect("send the greeting");
    let mut chosen = [0u8; 2];
    tokio::time::timeout(PATIENCE, c.read_exact(&mut chosen))
        .await
        .expect("a method in time")
        .expect("a method");
    (c, chosen)
}

/// A request's address part: ATYP and the address.
fn by_name(name: &str) -> Vec<u8> {
    let mut a = vec![3, name.len() as u8];
    a.extend_from_slice(name.as_bytes());
    a
}

/// Greets, sends `command` for `address` and `port`, and reads the reply: its code (the
/// bound address must be 0.0.0.0:0).
async fn request(h: &Harness, command: u8, address: &[u8], port: u16) -> (TcpStream, u8) {
    let (mut c, chosen) = greet(h, &[0]).await;
    assert_eq!(chosen, [5, 0], "no authentication");
    let mut req = vec![5, command, 0];
    req.extend_from_slice(address);
    req.extend_from_slice(&port.to_be_bytes());
    c.write_all(&req).await.expect("send the request");
    let mut reply = [0u8; 10];
    tokio::time::timeout(PATIENCE, c.read_exact(&mut reply))
        .await
        .expect("a reply in time")
        .expect("a reply");
    assert_eq!(
        [reply[0], reply[2], reply[3]],
        [5, 0, 1],
        "VER, RSV, IPv4 bound address"
    );
    assert_eq!(reply[4..], [0; 6], "bound to 0.0.0.0:0");
    (c, reply[1])
}

/// Refused: `code`, then the connection is closed.
async fn refused(h: &Harness, command: u8, address: &[u8], port: u16, code: u8) {
    let (mut c, got) = request(h, command, address, port).await;
    assert_eq!(got, code);
    assert_eq!(read_to_close(&mut c).await, Ok(Vec::new()), "closed after");
}

#[tokio::test]
async fn a_socks5_connect_by_name_tunnels_bytes_and_reports_them() {
    let origin = echo_origin().await;
    let h = socks_proxy(Limits::default()).await;
    let (mut c, code) = request(&h, CONNECT, &by_name("UP.test."), origin.port()).await;
    assert_eq!(code, 0, "succeeded");
    echo_through(&mut c, b"ping!").await;
    echo_through(&mut c, b"again").await;
    c.shutdown().await.expect("half-close");
    assert_eq!(read_to_close(&mut c).await, Ok(Vec::new()));
    let d = &h.decisions(1).await[0];
    assert_eq!((d.host.as_str(), d.port), ("up.test", origin.port()));
    assert!(d.allowed);
    assert_eq!((d.rule.as_str(), d.reason.as_str()), ("allow up.test", ""));
    assert_eq!((d.address, d.method), (Some(origin), "SOCKS5"));
    assert_eq!((d.bytes_up, d.bytes_down), (10, 10));
}

#[tokio::test]
async fn a_denied_name_is_refused_with_0x02_and_reported() {
    let h = socks_proxy(Limits::default()).await;
    refused(&h, CONNECT, &by_name("evil.test"), 443, 2).await;
    refused(&h, CONNECT, &by_name("bad.lab.test"), 443, 2).await;
    let d = h.decisions(2).await;
    assert_eq!(
        (d[0].host.as_str(), d[0].port, d[0].allowed, d[0].method),
        ("evil.test", 443, false, "SOCKS5")
    );
    assert_eq!(d[0].rule, "no allow rule");
    assert_eq!(
        d[0].reason,
        "no allow rule matches (allowed: up.test, *.lab.test) (SOCKS5 reply 0x02, connection \
         not allowed by ruleset)"
    );
    assert_eq!(d[0].address, None, "a refused name is not resolved");
    assert_eq!(d[1].rule, "deny bad.lab.test");
    assert!(
        d[1].reason
            .starts_with("refused by rule `deny bad.lab.test` (SOCKS5 reply 0x02"),
        "{}",
        d[1].reason
    );
}

#[tokio::test]
async fn an_address_instead_of_a_name_is_refused_as_not_a_name() {
    let h = socks_proxy(Limits::default()).await;
    let v6 = {
        let mut a = vec![4];
        a.extend_from_slice(&std::net::Ipv6Addr::LOCALHOST.octets());
        a
    };
    refused(&h, CONNECT, &[1, 127, 0, 0, 1], 80, 2).await;
    refused(&h, CONNECT, &v6, 443, 2).await;
    refused(&h, CONNECT, &by_name("127.0.0.1"), 80, 2).await;
    refused(&h, CONNECT, &by_name("a b.lab.test"), 80, 2).await;
    let d = h.decisions(4).await;
    let hosts: Vec<&str> = d.iter().map(|d| d.host.as_str()).collect();
    assert_eq!(hosts, ["127.0.0.1", "::1", "127.0.0.1", "a b.lab.test"]);
    assert!(
        d.iter()
            .all(|d| d.rule == "not a name" && !d.allowed && d.address.is_none())
    );
    assert!(
        d[0].reason.starts_with(
            "connect by name; IP addresses are not allowed (use socks5h://, which has the proxy \
             resolve names) (SOCKS5 reply 0x02"
        ),
        "{}",
        d[0].reason
    );
    assert!(
        d[3].reason.starts_with("`a b.lab.test` is not a host name"),
        "{}",
        d[3].reason
    );
}

#[tokio::test]
async fn a_name_resolving_to_a_blocked_address_is_refused_with_0x02() {
    let h = socks_proxy(Limits::default()).await;
    refused(&h, CONNECT, &by_name("metadata.lab.test"), 80, 2).await;
    let d = &h.decisions(1).await[0];
    assert_eq!(d.rule, "allow *.lab.test", "the rule allowed the name");
    assert!(!d.allowed);
    assert_eq!(d.address, Some("169.254.169.254:80".parse().expect("addr")));
    assert!(
        d.reason.starts_with(
            "it resolves to 169.254.169.254, a link-local (cloud metadata) address (SOCKS5 \
             reply 0x02"
        ),
        "{}",
        d.reason
    );
}

#[tokio::test]
async fn failures_after_the_gate_have_their_reply_codes() {
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        l.local_addr().expect("addr")
    };
    let h = socks_proxy(Limits::default()).await;
    refused(&h, CONNECT, &by_name("nowhere.lab.test"), 443, 4).await;
    refused(&h, CONNECT, &by_name("down.lab.test"), closed.port(), 5).await;
    let d = h.decisions(2).await;
    assert!(
        d[0].reason.starts_with("nowhere.lab.test does not resolve"),
        "{}",
        d[0].reason
    );
    assert!(
        d[0].reason
            .ends_with("(SOCKS5 reply 0x04, host unreachable)")
    );
    assert!(d[1].allowed, "the rules and the address allowed it");
    assert!(
        d[1].reason
            .starts_with(&format!("connecting to {closed}: ")),
        "{}",
        d[1].reason
    );
    assert!(
        d[1].reason
            .ends_with("(SOCKS5 reply 0x05, connection refused)")
    );
}

#[tokio::test]
async fn bind_and_udp_associate_are_not_supported() {
    let h = socks_proxy(Limits::default()).await;
    refused(&h, 2, &by_name("up.test"), 80, 7).await;
    refused(&h, 3, &[1, 0, 0, 0, 0], 0, 7).await;
    let d = h.decisions(2).await;
    assert_eq!(
        (d[0].rule.as_str(), d[0].host.as_str()),
        ("not a proxy request", "up.test")
    );
    assert_eq!(
        d[0].reason,
        "SOCKS5 BIND is not supported; only CONNECT (SOCKS5 reply 0x07, command not supported)"
    );
    assert!(
        d[1].reason
            .starts_with("SOCKS5 UDP ASSOCIATE is not supported"),
        "{}",
        d[1].reason
    );
    assert!(d.iter().all(|d| !d.allowed && d.method == "SOCKS5"));
}

#[tokio::test]
async fn a_client_offering_only_username_password_gets_no_acceptable_method() {
    let h = socks_proxy(Limits::default()).await;
    let (mut c, chosen) = greet(&h, &[2]).await;
    assert_eq!(chosen, [5, 0xff]);
    assert_eq!(read_to_close(&mut c).await, Ok(Vec::new()), "closed after");
    let d = &h.decisions(1).await[0];
    assert_eq!(
        (d.rule.as_str(), d.method),
        ("not a proxy request", "SOCKS5")
    );
    assert_eq!(
        d.reason,
        "the SOCKS5 client offered no method this proxy accepts (offered: username/password; \
         it takes only no authentication) (SOCKS5 reply 0xff, no acceptable methods)"
    );
}

#[tokio::test]
async fn a_slow_socks_handshake_is_cut_off() {
    let limits = Limits {
        header_timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    let h = socks_proxy(limits).await;
    let mut handshake = vec![5, 1, 0, 5, CONNECT, 0];
    handshake.extend_from_slice(&by_name("up.test"));
    handshake.extend_from_slice(&80u16.to_be_bytes());
    let (took, got) = trickle_until_cut(h.client().await, handshake).await;
    assert!(took >= Duration::from_millis(250), "{took:?}");
    assert!(took < Duration::from_millis(2000), "{took:?}: a deadline");
    assert_eq!(got, [5, 0], "only the method was chosen");
    h.decisions(0).await;

    // A connection that sends nothing is closed in the same time.
    let mut silent = h.client().await;
    let started = Instant::now();
    assert_eq!(read_to_close(&mut silent).await, Ok(Vec::new()));
    assert!(started.elapsed() < Duration::from_millis(2000));
}

#[tokio::test]
async fn http_on_the_same_listener_is_served_whole() {
    let origin = echo_origin().await;
    let h = socks_proxy(Limits::default()).await;
    let (mut tunnel, code) = request(&h, CONNECT, &by_name("up.test"), origin.port()).await;
    assert_eq!(code, 0);
    // The first byte of each HTTP request was only peeked: hyper parses the method.
    let (mut connect, a) = h.connect(&format!("up.test:{}", origin.port())).await;
    assert_eq!(a.status, 200);
    echo_through(&mut connect, b"http").await;
    let mut get = h.client().await;
    get.write_all(b"GET /x HTTP/1.1\r\nHost: up.test\r\n\r\n")
        .await
        .expect("send");
    let a = read_answer(&mut get).await;
    assert_eq!(a.status, 400);
    assert!(a.body.contains("this is an HTTP proxy"), "{}", a.body);
    echo_through(&mut tunnel, b"socks").await;
    drop((tunnel, connect, get));
    let d = h.decisions(3).await;
    let methods: Vec<&str> = d.iter().map(|d| d.method).collect();
    for m in ["SOCKS5", "CONNECT", "GET"] {
        assert!(methods.contains(&m), "{methods:?}");
    }
}

#[tokio::test]
async fn over_the_bound_a_socks5_client_gets_a_general_failure() {
    let origin = echo_origin().await;
    let limits = Limits {
        max_connections: 1,
        ..Limits::default()
    };
    let h = socks_proxy(limits).await;
    let (_first, code) = request(&h, CONNECT, &by_name("up.test"), origin.port()).await;
    assert_eq!(code, 0);
    refused(&h, CONNECT, &by_name("up.test"), origin.port(), 1).await;
}

/// curl itself, if the machine has it: `--socks5-hostname` (what `ALL_PROXY=socks5h://` makes
/// it do) through the proxy to a tiny HTTP server, and a refused name.
#[tokio::test]
async fn curl_reaches_an_allowed_name_through_socks5h() {
    const RESPONSE: &[u8] =
        b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\nhello\n";
    let Ok(version) = tokio::process::Command::new("curl")
        .arg("--version")
        .output()
        .await
    else {
        eprintln!("no curl: skipped");
        return;
    };
    assert!(version.status.success());
    let server = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = server.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = server.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                while !head.ends_with(b"\r\n\r\n") {
                    let Ok(b) = s.read_u8().await else { return };
                    head.push(b);
                }
                let _ = s.write_all(RESPONSE).await;
            });
        }
    });
    let h = socks_proxy(Limits::default()).await;
    let curl = |url: String| {
        let mut cmd = tokio::process::Command::new("curl");
        for var in ["http_proxy", "https_proxy", "all_proxy", "no_proxy"] {
            cmd.env_remove(var).env_remove(var.to_ascii_uppercase());
        }
        cmd.args(["-sS", "--max-time", "10", "--socks5-hostname"])
            .arg(h.addr.to_string())
            .arg(url);
        cmd.output()
    };
    let out = curl(format!("http://up.test:{port}/"))
        .await
        .expect("run curl");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(out.stdout, b"hello\n");
    let out = curl(format!("http://evil.test:{port}/"))
        .await
        .expect("run curl");
    assert!(!out.status.success());
    let d = h.decisions(2).await;
    assert_eq!((d[0].host.as_str(), d[0].allowed), ("up.test", true));
    assert_eq!(d[0].method, "SOCKS5");
    assert_eq!(d[0].bytes_down, RESPONSE.len() as u64);
    assert_eq!((d[1].host.as_str(), d[1].allowed), ("evil.test", false));
}
