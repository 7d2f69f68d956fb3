//! SOCKS5 (RFC 1928) on the proxy's listener, for TCP that is not HTTP. `Proxy::connection`
//! hands over a connection whose first byte is 5, the SOCKS version; everything else is HTTP.
//!
//! What is served: "no authentication" (the listener is on the sandbox's own loopback, so
//! there is no one else to tell apart), `CONNECT`, and a target given by name (ATYP 3): clients
//! must resolve remotely (`socks5h://`, curl's `--socks5-hostname`), as the rules are by name.
//! An address literal is refused like an HTTP request's (`not a name`); BIND and UDP ASSOCIATE
//! are not supported. The name then passes the same gate as a CONNECT (`Proxy::open`), and the
//! tunnel is carried, metered and reported the same way, with method `SOCKS5`.
//!
//! The handshake is read with exact reads (never past the request: what the client sends next
//! belongs to the tunnel), each part bounded by the protocol (at most 255 methods, a name of
//! at most 255 bytes), and all of it within the header timeout. A reply code is all a SOCKS5
//! client is told, so each refusal's reason in the report says exactly why, and names the code.

use super::Report;
use super::forward::carry;
use super::proxy::{Proxy, Refused, linger};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Duration, Instant, timeout_at};

pub const VERSION: u8 = 0x05;

const NO_AUTHENTICATION: u8 = 0x00;
const NO_ACCEPTABLE_METHOD: u8 = 0xFF;

const CONNECT: u8 = 0x01;
const BIND: u8 = 0x02;
const UDP_ASSOCIATE: u8 = 0x03;

const IPV4: u8 = 0x01;
const DOMAINNAME: u8 = 0x03;
const IPV6: u8 = 0x04;

/// Reply codes (RFC 1928 §6).
const SUCCEEDED: u8 = 0x00;
const GENERAL_FAILURE: u8 = 0x01;
const NOT_ALLOWED: u8 = 0x02;
const NETWORK_UNREACHABLE: u8 = 0x03;
const HOST_UNREACHABLE: u8 = 0x04;
const CONNECTION_REFUSED: u8 = 0x05;
const TTL_EXPIRED: u8 = 0x06;
const COMMAND_NOT_SUPPORTED: u8 = 0x07;
const ADDRESS_TYPE_NOT_SUPPORTED: u8 = 0x08;

/// How long a refused client is given to take its reply before the connection is closed.
const LINGER: Duration = Duration::from_secs(1);

/// A request's target as sent.
#[derive(Debug, PartialEq, Eq)]
enum Target {
    /// The name's bytes, as sent (not yet known to be a host name).
    Name(Vec<u8>),
    Address(IpAddr),
}

#[derive(Debug, PartialEq, Eq)]
struct Request {
    command: u8,
    target: Target,
    port: u16,
}

#[derive(Debug, PartialEq, Eq)]
enum Handshake {
    /// "no authentication" was agreed and a request read.
    Request(Request),
    /// The client offered these methods, none of them "no authentication"; it was told so.
    NoMethod(Vec<u8>),
}

/// Serves one SOCKS5 connection: the handshake until `deadline`, then the gate and the tunnel.
pub async fn serve(proxy: &Proxy, mut client: TcpStream, deadline: Instant) {
    let request = match timeout_at(deadline, handshake(&mut client)).await {
        Ok(Ok(Handshake::Request(request))) => request,
        Ok(Ok(Handshake::NoMethod(offered))) => {
            let mut report = Report::new(proxy.on_decision.clone(), "SOCKS5");
            report.decision.rule = "not a proxy request".to_string();
            report.decision.reason = format!(
                "the SOCKS5 client offered no method this proxy accepts (offered: {}; it takes \
                 only no authentication) (SOCKS5 reply 0xff, no acceptable methods)",
                methods(&offered)
            );
            drop(report);
            linger(client, Instant::now() + LINGER).await;
            return;
        }
        // Not SOCKS5 as RFC 1928 has it; like a request hyper cannot parse, not reported.
        Ok(Err(e)) => {
            tracing::debug!("egress proxy: SOCKS5 handshake: {e}");
            return;
        }
        Err(_) => {
            tracing::debug!("egress proxy: SOCKS5 handshake not done within the header timeout");
            return;
        }
    };
    let mut report = Report::new(proxy.on_decision.clone(), "SOCKS5");
    report.decision.port = request.port;
    if request.command != CONNECT {
        report.decision.host = match &request.target {
            Target::Name(name) => name.to_ascii_lowercase().escape_ascii().to_string(),
            Target::Address(ip) => ip.to_string(),
        };
        report.decision.rule = "not a proxy request".to_string();
        let why = match request.command {
            BIND => "SOCKS5 BIND is not supported; only CONNECT".to_string(),
            UDP_ASSOCIATE => {
                "SOCKS5 UDP ASSOCIATE is not supported; only CONNECT (TCP)".to_string()
            }
            other => format!("SOCKS5 command {other:#04x} is not supported; only CONNECT"),
        };
        return refuse(client, report, COMMAND_NOT_SUPPORTED, why).await;
    }
    let name: String = match request.target {
        // ASCII: a byte is a char.
        Target::Name(name) if is_host_name(&name) => name.iter().map(|&b| char::from(b)).collect(),
        Target::Name(name) => {
            report.decision.host = name.escape_ascii().to_string();
            report.decision.rule = "not a name".to_string();
            let why = format!("`{}` is not a host name", report.decision.host);
            return refuse(client, report, NOT_ALLOWED, why).await;
        }
        Target::Address(ip) => {
            report.decision.host = ip.to_string();
            report.decision.rule = "not a name".to_string();
            let why = "connect by name; IP addresses are not allowed (use socks5h://, which has \
                       the proxy resolve names)"
                .to_string();
            return refuse(client, report, NOT_ALLOWED, why).await;
        }
    };
    let upstream = match proxy.open(&mut report, &name, request.port).await {
        Ok(upstream) => upstream,
        Err(refusal) => return refuse(client, report, code(refusal.kind), refusal.why).await,
    };
    if let Err(e) = client.write_all(&reply(SUCCEEDED)).await {
        report.decision.reason = format!("the client left before the tunnel opened: {e}");
        return;
    }
    carry(
        &mut client,
        upstream,
        &mut report,
        proxy.limits.idle_timeout,
    )
    .await;
}

/// A SOCKS5 client over the connection bound: its handshake (within `deadline`), "general
/// failure", closed. Not reported, as an HTTP client's 503 is not.
pub async fn turn_away(mut client: TcpStream, deadline: Instant) {
    if let Ok(Ok(Handshake::Request(_))) = timeout_at(deadline, handshake(&mut client)).await {
        let _ = timeout_at(deadline, client.write_all(&reply(GENERAL_FAILURE))).await;
    }
    linger(client, deadline).await;
}

/// Sends reply `code`, reports `why` (naming the code), and closes.
async fn refuse(mut client: TcpStream, mut report: Report, code: u8, why: String) {
    report.decision.reason = format!("{why} (SOCKS5 reply {code:#04x}, {})", meaning(code));
    let deadline = Instant::now() + LINGER;
    let _ = timeout_at(deadline, client.write_all(&reply(code))).await;
    drop(report);
    linger(client, deadline).await;
}

/// The reply to a refusal by the gate.
fn code(kind: Refused) -> u8 {
    match kind {
        Refused::Policy => NOT_ALLOWED,
        Refused::Unresolved | Refused::ResolveTimeout => HOST_UNREACHABLE,
        Refused::Connect(io::ErrorKind::ConnectionRefused) => CONNECTION_REFUSED,
        Refused::Connect(io::ErrorKind::NetworkUnreachable) => NETWORK_UNREACHABLE,
        Refused::Connect(_) => HOST_UNREACHABLE,
        Refused::ConnectTimeout => TTL_EXPIRED,
    }
}

/// A reply code's meaning, as RFC 1928 names it.
fn meaning(code: u8) -> &'static str {
    match code {
        SUCCEEDED => "succeeded",
        GENERAL_FAILURE => "general SOCKS server failure",
        NOT_ALLOWED => "connection not allowed by ruleset",
        NETWORK_UNREACHABLE => "network unreachable",
        HOST_UNREACHABLE => "host unreachable",
        CONNECTION_REFUSED => "connection refused",
        TTL_EXPIRED => "TTL expired",
        COMMAND_NOT_SUPPORTED => "command not supported",
        ADDRESS_TYPE_NOT_SUPPORTED => "address type not supported",
        _ => "unassigned",
    }
}

/// A reply with the bound address 0.0.0.0:0: clients of CONNECT do not use it, and the
/// proxy's own addresses are none of the sandbox's business.
fn reply(code: u8) -> [u8; 10] {
    [VERSION, code, 0x00, IPV4, 0, 0, 0, 0, 0, 0]
}

/// The methods a client offered, for a report: `username/password, GSSAPI`.
fn methods(offered: &[u8]) -> String {
    if offered.is_empty() {
        return "none".to_string();
    }
    let name = |m: &u8| match *m {
        0x01 => "GSSAPI".to_string(),
        0x02 => "username/password".to_string(),
        m => format!("method {m:#04x}"),
    };
    offered.iter().map(name).collect::<Vec<_>>().join(", ")
}

/// Letters, digits, `-`, `_` and `.`: what a DNS name can be written with. Anything else
/// (a space, a NUL, `/`, `:` of an IPv6 address) is refused before the rules are asked.
fn is_host_name(name: &[u8]) -> bool {
    !name.is_empty()
        && name
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Method negotiation, then the request (RFC 1928 §3, §4), reading exactly what they hold.
/// An `Err` is a client that does not speak SOCKS5 (or left); a reply is sent where the
/// RFC has one.
async fn handshake<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S) -> io::Result<Handshake> {
    let [version, count] = read_array(s).await?;
    if version != VERSION {
        return Err(bad(format!("version {version} in the greeting")));
    }
    let mut offered = vec![0u8; usize::from(count)];
    s.read_exact(&mut offered).await?;
    if !offered.contains(&NO_AUTHENTICATION) {
        s.write_all(&[VERSION, NO_ACCEPTABLE_METHOD]).await?;
        return Ok(Handshake::NoMethod(offered));
    }
    s.write_all(&[VERSION, NO_AUTHENTICATION]).await?;
    let [version, command, _reserved, kind] = read_array(s).await?;
    if version != VERSION {
        return Err(bad(format!("version {version} in the request")));
    }
    let target = match kind {
        IPV4 => Target::Address(IpAddr::V4(Ipv4Addr::from(read_array::<_, 4>(s).await?))),
        IPV6 => Target::Address(IpAddr::V6(Ipv6Addr::from(read_array::<_, 16>(s).await?))),
        DOMAINNAME => {
            let [len] = read_array(s).await?;
            let mut name = vec![0u8; usize::from(len)];
            s.read_exact(&mut name).await?;
            Target::Name(name)
        }
        other => {
            s.write_all(&reply(ADDRESS_TYPE_NOT_SUPPORTED)).await?;
            return Err(bad(format!("address type {other}")));
        }
    };
    let port = u16::from_be_bytes(read_array(s).await?);
    Ok(Handshake::Request(Request {
        command,
        target,
        port,
    }))
}

async fn read_array<S: AsyncRead + Unpin, const N: usize>(s: &mut S) -> io::Result<[u8; N]> {
    let mut buf = [0u8; N];
    s.read_exact(&mut buf).await?;
    Ok(buf)
}

fn bad(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("not SOCKS5: {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the handshake over an in-memory pipe: what the proxy read, and what it answered.
    async fn shake(sent: &[u8]) -> (io::Result<Handshake>, Vec<u8>) {
        let (mut proxy_side, mut client) = tokio::io::duplex(1024);
        client.write_all(sent).await.expect("send");
        client.shutdown().await.expect("end of what is sent");
        let got = handshake(&mut proxy_side).await;
        drop(proxy_side);
        let mut answered = Vec::new();
        client.read_to_end(&mut answered).await.expect("read");
        (got, answered)
    }

    #[tokio::test]
    async fn requests_are_read_exactly() {
        let mut sent = vec![5, 2, 2, 0, 5, 1, 0, 3, 7];
        sent.extend_from_slice(b"up.test");
        sent.extend_from_slice(&[0x01, 0xbb]);
        let (got, answered) = shake(&sent).await;
        let want = Request {
            command: CONNECT,
            target: Target::Name(b"up.test".to_vec()),
            port: 443,
        };
        assert_eq!(got.expect("parsed"), Handshake::Request(want));
        assert_eq!(answered, [5, 0], "no authentication chosen");

        let (got, _) = shake(&[
            5, 1, 0, 5, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 22,
        ])
        .await;
        let want = Request {
            command: BIND,
            target: Target::Address(Ipv6Addr::LOCALHOST.into()),
            port: 22,
        };
        assert_eq!(got.expect("parsed"), Handshake::Request(want));
    }

    #[tokio::test]
    async fn what_is_not_socks5_is_an_error() {
        let (got, answered) = shake(&[5, 1, 2]).await;
        assert_eq!(got.expect("negotiated"), Handshake::NoMethod(vec![2]));
        assert_eq!(answered, [5, 0xff]);
        let (got, answered) = shake(&[5, 1, 0, 5, 1, 0, 9]).await;
        assert!(
            got.expect_err("bad type")
                .to_string()
                .contains("address type 9")
        );
        assert_eq!(answered[2..], reply(ADDRESS_TYPE_NOT_SUPPORTED));
        let (got, _) = shake(&[5, 1, 0, 4, 1, 0, 3]).await;
        assert!(
            got.expect_err("bad version")
                .to_string()
                .contains("version 4")
        );
        let (got, _) = shake(&[5, 1, 0, 5, 1, 0, 3, 9, b'a']).await;
        assert_eq!(
            got.expect_err("cut short").kind(),
            io::ErrorKind::UnexpectedEof
        );
    }

    #[test]
    fn gate_refusals_map_to_reply_codes() {
        assert_eq!(code(Refused::Policy), NOT_ALLOWED);
        assert_eq!(code(Refused::Unresolved), HOST_UNREACHABLE);
        assert_eq!(code(Refused::ResolveTimeout), HOST_UNREACHABLE);
        let refused = Refused::Connect(io::ErrorKind::ConnectionRefused);
        assert_eq!(code(refused), CONNECTION_REFUSED);
        assert_eq!(
            code(Refused::Connect(io::ErrorKind::Other)),
            HOST_UNREACHABLE
        );
        assert_eq!(code(Refused::ConnectTimeout), TTL_EXPIRED);
        assert!(is_host_name(b"Up-1.x_y.test."));
        for not in [&b""[..], b"a b.test", b"::1", b"a\0.test", b"a/b.test"] {
            assert!(!is_host_name(not), "{not:?}");
        }
        assert_eq!(
            methods(&[2, 1, 0x80]),
            "username/password, GSSAPI, method 0x80"
        );
    }
}
