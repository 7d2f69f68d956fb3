//! What the proxy refuses, what the client reads, and what is reported.

use super::*;

#[tokio::test]
async fn a_denied_connect_gets_a_readable_403() {
    let h = start(
        rules(&["*.pythonhosted.org", "pypi.org"], &["bad.pypi.org"]),
        &[],
        &[],
        Limits::default(),
    )
    .await;
    let (_c, a) = h.connect("Evil.Test.:443").await;
    assert_eq!(a.status, 403);
    assert!(a.head.contains("x-corral-egress: denied"), "{}", a.head);
    assert_eq!(
        a.body,
        "corral egress proxy: evil.test:443 refused: no allow rule matches (allowed: \
         *.pythonhosted.org, pypi.org)\n"
    );
    let d = &h.decisions(1).await[0];
    assert_eq!(
        (d.host.as_str(), d.port, d.allowed),
        ("evil.test", 443, false)
    );
    assert_eq!((d.rule.as_str(), d.method), ("no allow rule", "CONNECT"));
    assert!(
        d.reason.starts_with("no allow rule matches"),
        "{}",
        d.reason
    );
    assert_eq!(d.address, None, "a refused name is not resolved");

    let (_c, a) = h.connect("bad.pypi.org:443").await;
    assert_eq!(a.status, 403);
    assert!(
        a.body
            .ends_with("bad.pypi.org:443 refused: refused by rule `deny bad.pypi.org`\n"),
        "{}",
        a.body
    );
    assert_eq!(h.decisions(2).await[1].rule, "deny bad.pypi.org");
}

#[tokio::test]
async fn an_ip_literal_is_refused_before_any_rule() {
    let h = start(
        rules(&["*.lab.test"], &[]),
        &[],
        &["127.0.0.0/8"],
        Limits::default(),
    )
    .await;
    for target in ["127.0.0.1:80", "[::1]:443", "2130706433:80"] {
        let (_c, a) = h.connect(target).await;
        assert_eq!(a.status, 403, "{target}");
        assert!(
            a.body
                .ends_with("refused: connect by name; IP addresses are not allowed\n"),
            "{target}: {}",
            a.body
        );
    }
    let decisions = h.decisions(3).await;
    assert!(
        decisions
            .iter()
            .all(|d| d.rule == "not a name" && !d.allowed)
    );
}

#[tokio::test]
async fn a_name_resolving_to_a_blocked_address_is_refused_though_the_rule_allows_it() {
    let h = start(
        rules(&["*.lab.test"], &[]),
        &[
            ("metadata.lab.test", &["169.254.169.254"]),
            ("local.lab.test", &["127.0.0.1"]),
            ("mapped.lab.test", &["::ffff:127.0.0.1"]),
        ],
        &[],
        Limits::default(),
    )
    .await;
    let (_c, a) = h.connect("metadata.lab.test:80").await;
    assert_eq!(a.status, 403);
    assert_eq!(
        a.body,
        "corral egress proxy: metadata.lab.test:80 refused: it resolves to 169.254.169.254, a \
         link-local (cloud metadata) address\n"
    );
    let (_c, a) = h.connect("local.lab.test:8080").await;
    assert!(
        a.body
            .ends_with("it resolves to 127.0.0.1, a loopback address\n"),
        "{}",
        a.body
    );
    let (_c, a) = h.connect("mapped.lab.test:8080").await;
    assert!(a.body.ends_with("a loopback address\n"), "{}", a.body);

    // Plain HTTP passes the same gate.
    let mut c = h.client().await;
    c.write_all(
        b"GET http://metadata.lab.test/latest/meta-data/ HTTP/1.1\r\nHost: metadata.lab.test\r\n\r\n",
    )
    .await
    .expect("send");
    let a = read_answer(&mut c).await;
    assert_eq!(a.status, 403);
    assert!(a.body.contains("link-local (cloud metadata)"), "{}", a.body);

    let d = h.decisions(4).await;
    assert_eq!(d[0].rule, "allow *.lab.test", "the rule allowed the name");
    assert!(!d[0].allowed);
    assert_eq!(
        d[0].address,
        Some("169.254.169.254:80".parse().expect("addr"))
    );
    assert_eq!((d[3].method, d[3].port), ("GET", 80));
}

#[tokio::test]
async fn corrals_own_listener_is_refused_even_inside_an_allowed_network() {
    let h = start(
        rules(&["*.lab.test"], &[]),
        &[("self.lab.test", &["127.0.0.1"])],
        &["127.0.0.0/8"],
        Limits::default(),
    )
    .await;
    // The harness puts the proxy's own listener in `never`; 127.0.0.0/8 is allowed.
    let (_c, a) = h.connect(&format!("self.lab.test:{}", h.addr.port())).await;
    assert_eq!(a.status, 403);
    assert!(
        a.body
            .ends_with("it resolves to 127.0.0.1, corral's own listener\n"),
        "{}",
        a.body
    );
}

#[tokio::test]
async fn only_a_permitted_address_is_connected_to() {
    let origin = echo_origin().await;
    let h = start(
        rules(&["mixed.test"], &[]),
        &[("mixed.test", &["169.254.169.254", "127.0.0.1"])],
        &["127.0.0.0/8"],
        Limits::default(),
    )
    .await;
    let (mut c, a) = h.connect(&format!("mixed.test:{}", origin.port())).await;
    assert_eq!(a.status, 200);
    echo_through(&mut c, b"hi").await;
    drop(c);
    let d = &h.decisions(1).await[0];
    assert_eq!(d.address, Some(origin), "the metadata address was skipped");
    assert!(d.allowed);
}

#[tokio::test]
async fn failures_after_the_gate_are_5xx_texts() {
    // A port nothing listens on: bound, read, and closed again.
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        l.local_addr().expect("addr")
    };
    let h = start(
        rules(&["*.lab.test"], &[]),
        &[("down.lab.test", &["127.0.0.1"])],
        &["127.0.0.0/8"],
        Limits::default(),
    )
    .await;
    let (_c, a) = h.connect("nowhere.lab.test:443").await;
    assert_eq!(a.status, 502);
    assert!(a.head.contains("x-corral-egress: error"), "{}", a.head);
    assert!(
        a.body.starts_with(
            "corral egress proxy: nowhere.lab.test:443 failed: nowhere.lab.test does not resolve"
        ),
        "{}",
        a.body
    );
    let (_c, a) = h.connect(&format!("down.lab.test:{}", closed.port())).await;
    assert_eq!(a.status, 502);
    assert!(
        a.body.contains(&format!("connecting to {closed}:")),
        "{}",
        a.body
    );
    let d = h.decisions(2).await;
    assert!(d[1].allowed, "the rules and the address allowed it");
    assert!(d[1].reason.starts_with("connecting to"), "{}", d[1].reason);
}

#[tokio::test]
async fn a_request_to_the_proxy_itself_is_told_how_to_use_it() {
    let h = start(rules(&["*.lab.test"], &[]), &[], &[], Limits::default()).await;
    let mut c = h.client().await;
    c.write_all(b"GET /index.html HTTP/1.1\r\nHost: up.test\r\n\r\n")
        .await
        .expect("send");
    let a = read_answer(&mut c).await;
    assert_eq!(a.status, 400);
    assert!(a.body.contains("this is an HTTP proxy"), "{}", a.body);
    c.write_all(b"GET https://up.test/ HTTP/1.1\r\nHost: up.test\r\n\r\n")
        .await
        .expect("send");
    let a = read_answer(&mut c).await;
    assert_eq!(a.status, 400);
    assert!(a.body.contains("through CONNECT"), "{}", a.body);
    let d = h.decisions(2).await;
    assert_eq!(
        (d[0].rule.as_str(), d[0].host.as_str()),
        ("not a proxy request", "up.test")
    );
}
