//! The proxy end to end, in process: a proxy on 127.0.0.1, origins on 127.0.0.1, names mapped
//! to them by an `OverrideResolver`, clients speaking raw HTTP/1.1 so the bytes on each wire
//! are what the test asserts. `gate` covers refusals, `flow` what is carried and the bounds,
//! `socks` SOCKS5 on the same listener.

mod flow;
mod gate;
mod socks;

use super::Decision;
use super::addresses::{Addresses, Net};
use super::proxy::{Limits, Proxy};
use super::resolve::OverrideResolver;
use super::rules::Rules;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Long enough for a loaded machine; every wait below ends as soon as its event happens.
const PATIENCE: Duration = Duration::from_secs(10);

pub struct Harness {
    pub proxy: Arc<Proxy>,
    pub addr: SocketAddr,
    decisions: Arc<Mutex<Vec<Decision>>>,
    pub shutdown: CancellationToken,
    pub served: JoinHandle<()>,
}

pub fn rules(allow: &[&str], deny: &[&str]) -> Rules {
    let own = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    Rules::new(&own(allow), &own(deny)).expect("valid rules")
}

/// A proxy serving on an ephemeral port, its own listener in `never` (as the daemon will
/// have it). `names` maps names to addresses; `nets` are the allowed networks.
pub async fn start(
    rules: Rules,
    names: &[(&str, &[&str])],
    nets: &[&str],
    limits: Limits,
) -> Harness {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let nets: Vec<Net> = nets.iter().map(|n| n.parse().expect("net")).collect();
    let map: HashMap<String, Vec<IpAddr>> = names
        .iter()
        .map(|(n, ips)| {
            let ips = ips.iter().map(|ip| ip.parse().expect("ip")).collect();
            (n.to_string(), ips)
        })
        .collect();
    let decisions = Arc::new(Mutex::new(Vec::new()));
    let sink = {
        let decisions = decisions.clone();
        Arc::new(move |d: Decision| decisions.lock().expect("lock").push(d))
    };
    let proxy = Arc::new(Proxy::new(
        rules,
        Addresses::new(false, &nets, vec![addr]),
        Arc::new(OverrideResolver::new(map, None)),
        limits,
        sink,
    ));
    let shutdown = CancellationToken::new();
    let served = tokio::spawn(proxy.clone().serve(listener, shutdown.clone()));
    Harness {
        proxy,
        addr,
        decisions,
        shutdown,
        served,
    }
}

impl Harness {
    /// Waits until `n` decisions were reported, and returns them.
    pub async fn decisions(&self, n: usize) -> Vec<Decision> {
        let waited = tokio::time::timeout(PATIENCE, async {
            loop {
                let got = self.decisions.lock().expect("lock").clone();
                if got.len() >= n {
                    return got;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        let got = waited.await.expect("decisions reported");
        assert_eq!(got.len(), n, "exactly {n} decisions: {got:#?}");
        got
    }

    pub async fn client(&self) -> TcpStream {
        TcpStream::connect(self.addr)
            .await
            .expect("connect to the proxy")
    }

    /// Sends `CONNECT target` on a new connection and reads the answer's head and body.
    pub async fn connect(&self, target: &str) -> (TcpStream, Answer) {
        let mut c = self.client().await;
        let req = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n");
        c.write_all(req.as_bytes()).await.expect("send CONNECT");
        let answer = read_answer(&mut c).await;
        (c, answer)
    }
}

pub struct Answer {
    pub status: u16,
    /// Status line and headers, lowercase.
    pub head: String,
    pub body: String,
}

/// Reads one response: the head, then a `content-length` body (none for a CONNECT's 200).
pub async fn read_answer(c: &mut TcpStream) -> Answer {
    let read = async {
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let b = c.read_u8().await.expect("a response head");
            head.push(b);
        }
        let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
        let status = head
            .get(9..12)
            .and_then(|s| s.parse().ok())
            .expect("a status code");
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map_or(0, |v| v.trim().parse().expect("a length"));
        let mut body = vec![0; len];
        c.read_exact(&mut body).await.expect("the body");
        Answer {
            status,
            head,
            body: String::from_utf8_lossy(&body).into_owned(),
        }
    };
    tokio::time::timeout(PATIENCE, read)
        .await
        .expect("an answer in time")
}

/// An origin that echoes what it reads on each connection, until its client closes.
pub async fn echo_origin() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

/// Writes `bytes` through an open tunnel and reads as many back.
pub async fn echo_through(c: &mut TcpStream, bytes: &[u8]) {
    c.write_all(bytes).await.expect("write into the tunnel");
    let mut back = vec![0; bytes.len()];
    tokio::time::timeout(PATIENCE, c.read_exact(&mut back))
        .await
        .expect("echo in time")
        .expect("echo");
    assert_eq!(back, bytes);
}

/// Sends `bytes` one every 50 ms (never idle, never done) and reads until the proxy cuts the
/// connection off: how long that took and what came back.
pub async fn trickle_until_cut(c: TcpStream, bytes: Vec<u8>) -> (Duration, Vec<u8>) {
    let (mut r, mut w) = c.into_split();
    tokio::spawn(async move {
        for b in bytes {
            if w.write_all(&[b]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let started = std::time::Instant::now();
    let mut got = Vec::new();
    tokio::time::timeout(PATIENCE, r.read_to_end(&mut got))
        .await
        .expect("cut off in time")
        .ok();
    (started.elapsed(), got)
}

/// Reads until the peer closes; `Err` if it does not within `PATIENCE`.
pub async fn read_to_close(c: &mut TcpStream) -> Result<Vec<u8>, &'static str> {
    let mut all = Vec::new();
    match tokio::time::timeout(PATIENCE, c.read_to_end(&mut all)).await {
        Ok(_) => Ok(all),
        Err(_) => Err("the proxy kept the connection open"),
    }
}
