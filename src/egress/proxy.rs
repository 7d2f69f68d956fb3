//! The proxy's server side: accepting within the connection bound, telling SOCKS5 from HTTP by
//! a connection's first byte, HTTP/1.1 with hyper, and the gate every request passes (HTTP or
//! SOCKS5) — a name, the rules, one resolution, the address check, and a connection to an
//! address that passed.

use super::addresses::Addresses;
use super::forward::{ProxyBody, Tunnel, forward, method_name, refuse, text};
use super::resolve::Resolver;
use super::rules::{Rules, Verdict, looks_like_ip};
use super::{DecisionSink, Report, socks};
use hyper::body::Incoming;
use hyper::ext::ReasonPhrase;
use hyper::server::conn::http1;
use hyper::{Method, Request, Response, StatusCode, header};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::{Instant, timeout, timeout_at};
use tokio_util::sync::CancellationToken;

/// The proxy's bounds. `Default` is what a session gets.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Client connections served at once (a tunnel holds its connection's slot). One more is
    /// accepted, answered `503` with a text (a SOCKS5 client: "general failure"), and closed.
    pub max_connections: usize,
    /// Time to send a request's head (also bounds an idle keep-alive connection). For SOCKS5,
    /// time from accepting the connection to the end of the handshake (greeting and request).
    pub header_timeout: Duration,
    /// Time to resolve the name, and then to connect to the origin.
    pub connect_timeout: Duration,
    /// A tunnel or forwarded request with no byte either way for this long is closed.
    pub idle_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 256,
            header_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
        }
    }
}

/// One session's egress proxy.
pub struct Proxy {
    /// Replaced whole by `set_rules`; each request reads one snapshot.
    rules: RwLock<Arc<Rules>>,
    addresses: Arc<Addresses>,
    resolver: Arc<dyn Resolver>,
    pub(super) limits: Limits,
    pub(super) on_decision: DecisionSink,
}

/// Why the gate gave no connection: for each protocol's answer (an HTTP status, a SOCKS5
/// reply code), and `why` for the client's text and the report.
pub(super) struct Refusal {
    pub kind: Refused,
    pub why: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Refused {
    /// Not a name, the rules, or the address check.
    Policy,
    /// The name has no address, or does not resolve.
    Unresolved,
    /// Resolving took longer than the connect timeout.
    ResolveTimeout,
    /// Connecting failed (the last permitted address's error).
    Connect(io::ErrorKind),
    /// Connecting took longer than the connect timeout.
    ConnectTimeout,
}

impl Refused {
    fn status(self) -> StatusCode {
        match self {
            Refused::Policy => StatusCode::FORBIDDEN,
            Refused::Unresolved | Refused::Connect(_) => StatusCode::BAD_GATEWAY,
            Refused::ResolveTimeout | Refused::ConnectTimeout => StatusCode::GATEWAY_TIMEOUT,
        }
    }
}

/// The tunnel a CONNECT on this connection opened, handed from the request handler to the
/// connection's task, which runs it once hyper lets go of the socket.
type PendingTunnel = Arc<Mutex<Option<Tunnel>>>;

impl Proxy {
    pub fn new(
        rules: Rules,
        addresses: Addresses,
        resolver: Arc<dyn Resolver>,
        limits: Limits,
        on_decision: DecisionSink,
    ) -> Proxy {
        Proxy {
            rules: RwLock::new(Arc::new(rules)),
            addresses: Arc::new(addresses),
            resolver,
            limits,
            on_decision,
        }
    }

    /// New requests follow `rules`; open tunnels and requests in flight keep what let them in.
    pub fn set_rules(&self, rules: Rules) {
        *self.rules.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(rules);
    }

    fn rules(&self) -> Arc<Rules> {
        self.rules
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Serves `listener` until `shutdown`; then ends every connection and tunnel (each reports
    /// its decision) and returns once they are gone.
    pub async fn serve(self: Arc<Self>, listener: TcpListener, shutdown: CancellationToken) {
        let slots = Arc::new(Semaphore::new(
            self.limits.max_connections.min(Semaphore::MAX_PERMITS),
        ));
        let mut connections = JoinSet::new();
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => match slots.clone().try_acquire_owned() {
                        Ok(slot) => {
                            connections.spawn(self.clone().connection(stream, slot, shutdown.clone()));
                        }
                        Err(_) => {
                            connections.spawn(turn_away(stream, self.limits.max_connections));
                        }
                    },
                    Err(e) => {
                        // Out of descriptors, most likely: let some connections end.
                        tracing::warn!("egress proxy: accepting a connection: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
            }
        }
        connections.shutdown().await;
    }

    async fn connection(
        self: Arc<Self>,
        stream: TcpStream,
        _slot: OwnedSemaphorePermit,
        shutdown: CancellationToken,
    ) {
        let _ = stream.set_nodelay(true);
        // The first byte tells the protocols apart: a SOCKS5 greeting starts with its version,
        // 5; an HTTP request with a method's letter. Peeked, so hyper reads the request whole.
        // The header timeout bounds the wait for it (and, for SOCKS5, the whole handshake; for
        // HTTP, hyper's own header timeout starts once the byte is there).
        let deadline = Instant::now() + self.limits.header_timeout;
        let mut first = [0u8; 1];
        let peeked = tokio::select! {
            peeked = timeout_at(deadline, stream.peek(&mut first)) => peeked,
            () = shutdown.cancelled() => return,
        };
        match peeked {
            Ok(Ok(1)) if first[0] == socks::VERSION => {
                tokio::select! {
                    () = socks::serve(&self, stream, deadline) => {}
                    () = shutdown.cancelled() => {}
                }
                return;
            }
            Ok(Ok(1)) => {}
            // Closed, failed, or silent for the whole header timeout.
            _ => return,
        }
        let pending = PendingTunnel::default();
        let service = {
            let (proxy, pending, shutdown) = (self.clone(), pending.clone(), shutdown.clone());
            hyper::service::service_fn(move |req| {
                let (proxy, pending, shutdown) = (proxy.clone(), pending.clone(), shutdown.clone());
                async move { Ok::<_, Infallible>(proxy.answer(req, &pending, shutdown).await) }
            })
        };
        let mut builder = http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(self.limits.header_timeout);
        let served = builder
            .serve_connection(TokioIo::new(stream), service)
            .with_upgrades();
        tokio::select! {
            ended = served => if let Err(e) = ended {
                tracing::debug!("egress proxy connection: {e}");
            },
            () = shutdown.cancelled() => return,
        }
        let tunnel = pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(tunnel) = tunnel {
            tokio::select! {
                () = tunnel.run(self.limits.idle_timeout) => {}
                () = shutdown.cancelled() => {}
            }
        }
    }

    async fn answer(
        &self,
        mut req: Request<Incoming>,
        pending: &PendingTunnel,
        shutdown: CancellationToken,
    ) -> Response<ProxyBody> {
        let mut report = Report::new(self.on_decision.clone(), method_name(req.method()));
        let uri = req.uri();
        let connect = req.method() == Method::CONNECT;
        let target = match (connect, uri.scheme_str(), uri.authority()) {
            (true, _, Some(a)) => a.port_u16().map(|p| (a.host().to_string(), p)),
            (false, Some("http"), Some(a)) => {
                Some((a.host().to_string(), a.port_u16().unwrap_or(80)))
            }
            _ => None,
        };
        let Some((host, port)) = target else {
            return not_a_proxy_request(&mut report, &req);
        };
        let upstream = match self.open(&mut report, &host, port).await {
            Ok(upstream) => upstream,
            Err(Refusal { kind, why }) => return refuse(&mut report, kind.status(), why),
        };
        if !connect {
            return forward(req, upstream, report, self.limits.idle_timeout, shutdown).await;
        }
        let upgrade = hyper::upgrade::on(&mut req);
        *pending.lock().unwrap_or_else(PoisonError::into_inner) = Some(Tunnel {
            upgrade,
            upstream,
            report,
        });
        let mut ok = Response::new(ProxyBody::Text(None));
        ok.extensions_mut()
            .insert(ReasonPhrase::from_static(b"Connection established"));
        ok
    }

    /// The gate: a name, the rules, one resolution, the address check; then a connection to
    /// the first address that passed (the one checked). Fills in the report's host, port, rule,
    /// `allowed` and address; a refusal's `why` is the caller's to tell and report.
    pub(super) async fn open(
        &self,
        report: &mut Report,
        host: &str,
        port: u16,
    ) -> Result<TcpStream, Refusal> {
        let refusal = |kind, why| Err(Refusal { kind, why });
        let host = host.to_ascii_lowercase();
        let host = host.strip_suffix('.').unwrap_or(&host).to_string();
        (report.decision.host, report.decision.port) = (host.clone(), port);
        if looks_like_ip(&host) {
            report.decision.rule = "not a name".to_string();
            let why = "connect by name; IP addresses are not allowed".to_string();
            return refusal(Refused::Policy, why);
        }
        let rules = self.rules();
        let Verdict { allowed, rule } = rules.decide(&host, port);
        if !allowed {
            let why = if rule == "no allow rule" {
                let allowed = rules.allowed_summary();
                format!("no allow rule matches (allowed: {allowed})")
            } else {
                format!("refused by rule `{rule}`")
            };
            report.decision.rule = rule;
            return refusal(Refused::Policy, why);
        }
        report.decision.rule = rule;
        let limit = self.limits.connect_timeout;
        let addrs = match timeout(limit, self.resolver.resolve(&host, port)).await {
            Ok(Ok(addrs)) if !addrs.is_empty() => addrs,
            Ok(Ok(_)) => return refusal(Refused::Unresolved, format!("{host} has no address")),
            Ok(Err(e)) => {
                let why = format!("{host} does not resolve: {e}");
                return refusal(Refused::Unresolved, why);
            }
            Err(_) => {
                let why = format!("resolving {host} timed out after {}", seconds(limit));
                return refusal(Refused::ResolveTimeout, why);
            }
        };
        let mut refused = None;
        let permitted: Vec<SocketAddr> = addrs
            .into_iter()
            .filter(|a| match self.addresses.check(*a) {
                Ok(()) => true,
                Err(why) => {
                    refused.get_or_insert((*a, why));
                    false
                }
            })
            .collect();
        if permitted.is_empty()
            && let Some((addr, why)) = refused
        {
            report.decision.address = Some(addr);
            let why = format!("it resolves to {}, {}", addr.ip(), described(why));
            return refusal(Refused::Policy, why);
        }
        report.decision.allowed = true;
        let deadline = Instant::now() + limit;
        let mut failure = Refusal {
            kind: Refused::Connect(io::ErrorKind::Other),
            why: String::new(),
        };
        for addr in permitted {
            report.decision.address = Some(addr);
            match timeout_at(deadline, TcpStream::connect(addr)).await {
                Ok(Ok(stream)) => {
                    let _ = stream.set_nodelay(true);
                    return Ok(stream);
                }
                Ok(Err(e)) => {
                    failure = Refusal {
                        kind: Refused::Connect(e.kind()),
                        why: format!("connecting to {addr}: {e}"),
                    };
                }
                Err(_) => {
                    failure = Refusal {
                        kind: Refused::ConnectTimeout,
                        why: format!("connecting to {addr} timed out after {}", seconds(limit)),
                    };
                    break;
                }
            }
        }
        Err(failure)
    }
}

/// An address check's reason as the end of `it resolves to 10.0.0.5, …`.
fn described(reason: &str) -> String {
    match reason {
        "the host's own address" | "corral's own listener" => reason.to_string(),
        "private range" => "an address in a private range".to_string(),
        "unspecified" => "an unspecified address".to_string(),
        _ => format!("a {reason} address"),
    }
}

fn seconds(d: Duration) -> String {
    format!("{} s", d.as_secs_f64())
}

/// A request sent *to* the proxy rather than through it (origin form, or an absolute URL
/// whose scheme it does not forward).
fn not_a_proxy_request(report: &mut Report, req: &Request<Incoming>) -> Response<ProxyBody> {
    report.decision.rule = "not a proxy request".to_string();
    report.decision.host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let why = match req.uri().scheme_str() {
        Some("https") => "send https:// through CONNECT (as HTTPS_PROXY does), not as a URL",
        Some(_) => "only http:// URLs are forwarded; other schemes go through CONNECT",
        None if req.method() == Method::CONNECT => "CONNECT needs host:port",
        None => {
            "this is an HTTP proxy: send requests through it (HTTP_PROXY / HTTPS_PROXY), with \
             an absolute URL or CONNECT host:port"
        }
    };
    report.decision.reason = why.to_string();
    text(
        StatusCode::BAD_REQUEST,
        format!("corral egress proxy: {why}"),
    )
}

/// A connection over the bound: answered without reading the request (a SOCKS5 client: its
/// handshake, then "general failure"), then closed; all within a second. Its request is not
/// served, so it reports no decision (the daemon's log has the message).
async fn turn_away(mut stream: TcpStream, max: usize) {
    // debug, not warn: a sandbox opening connections in a loop would flood the log.
    tracing::debug!("egress proxy: over {max} connections; a new one is turned away");
    let deadline = Instant::now() + Duration::from_secs(1);
    let mut first = [0u8; 1];
    if let Ok(Ok(1)) = timeout_at(deadline, stream.peek(&mut first)).await
        && first[0] == socks::VERSION
    {
        socks::turn_away(stream, deadline).await;
        return;
    }
    let body = format!("corral egress proxy: too many connections (at most {max}); retry later\n");
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n\
         content-length: {}\r\nx-corral-egress: error\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = timeout_at(deadline, stream.write_all(answer.as_bytes())).await;
    linger(stream, deadline).await;
}

/// Closes a connection that was answered: read what the client sent before closing (up to
/// 64 KiB, until `deadline`), as closing with unread bytes resets the connection and the
/// client might lose the answer.
pub(super) async fn linger(mut stream: TcpStream, deadline: Instant) {
    let _ = timeout_at(deadline, async {
        stream.shutdown().await?;
        let mut sink = [0u8; 4096];
        let mut total = 0;
        while total < 64 * 1024 {
            match stream.read(&mut sink).await? {
                0 => break,
                n => total += n,
            }
        }
        Ok::<_, io::Error>(())
    })
    .await;
}
