//! What happens after the gate let a request through: a CONNECT tunnel, or a plain-HTTP
//! request forwarded to its origin and its response streamed back; and the proxy's own texts.

use super::Report;
use super::meter::{Meter, Metered};
use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::upgrade::OnUpgrade;
use hyper::{Request, Response, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// A response body: the proxy's own text, or an origin's body streamed through. The latter
/// holds the request's report, which is sent when the body ends or the client drops it.
pub enum ProxyBody {
    Text(Option<Bytes>),
    Upstream {
        body: Incoming,
        _report: Box<Report>,
    },
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            ProxyBody::Text(text) => Poll::Ready(text.take().map(|t| Ok(Frame::data(t)))),
            ProxyBody::Upstream { body, .. } => Pin::new(body).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ProxyBody::Text(text) => text.is_none(),
            ProxyBody::Upstream { body, .. } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ProxyBody::Text(text) => {
                SizeHint::with_exact(text.as_ref().map_or(0, |t| t.len() as u64))
            }
            ProxyBody::Upstream { body, .. } => body.size_hint(),
        }
    }
}

/// A text response from the proxy itself; `X-Corral-Egress` says `denied` (a policy refusal)
/// or `error` (anything else the proxy could not do).
pub fn text(status: StatusCode, message: String) -> Response<ProxyBody> {
    let tag = if status == StatusCode::FORBIDDEN {
        "denied"
    } else {
        "error"
    };
    let mut r = Response::new(ProxyBody::Text(Some(Bytes::from(format!("{message}\n")))));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert("x-corral-egress", HeaderValue::from_static(tag));
    r
}

/// The refusal or failure of a request whose target is known: the report keeps `why`, the
/// client reads `corral egress proxy: host:port refused: why` (`failed:` unless 403).
pub fn refuse(report: &mut Report, status: StatusCode, why: String) -> Response<ProxyBody> {
    let verb = if status == StatusCode::FORBIDDEN {
        "refused"
    } else {
        "failed"
    };
    let d = &report.decision;
    let message = format!("corral egress proxy: {}:{} {verb}: {why}", d.host, d.port);
    report.decision.reason = why;
    text(status, message)
}

/// An allowed CONNECT: the upstream socket, waiting for hyper to hand over the client's.
pub struct Tunnel {
    pub upgrade: OnUpgrade,
    pub upstream: TcpStream,
    pub report: Report,
}

/// Each direction of a tunnel copies through a buffer this size: tokio's default 8 KiB made a
/// CONNECT download cost the daemon twice the CPU of a forwarded plain-HTTP one (docs/
/// BENCHMARKS.md §11). At most 2 × this per connection, and a session has at most
/// `Limits::max_connections`.
const TUNNEL_BUFFER: usize = 64 * 1024;

impl Tunnel {
    /// Waits for the client's socket, then carries the tunnel.
    pub async fn run(self, idle: Duration) {
        let Tunnel {
            upgrade,
            upstream,
            mut report,
        } = self;
        let mut client = match upgrade.await {
            Ok(upgraded) => TokioIo::new(upgraded),
            Err(e) => {
                report.decision.reason = format!("the client left before the tunnel opened: {e}");
                return;
            }
        };
        carry(&mut client, upstream, &mut report, idle).await;
    }
}

/// Copies both ways between an open tunnel's client and upstream (counted on the report's
/// meter) until either side closes or nothing moves for `idle`.
pub async fn carry<C>(client: &mut C, upstream: TcpStream, report: &mut Report, idle: Duration)
where
    C: AsyncRead + AsyncWrite + Unpin,
{
    let meter = Meter::new();
    report.meter = Some(meter.clone());
    let mut upstream = Metered::new(upstream, meter.clone());
    tokio::select! {
        copied = tokio::io::copy_bidirectional_with_sizes(
            client,
            &mut upstream,
            TUNNEL_BUFFER,
            TUNNEL_BUFFER,
        ) => {
            // A reset at the end of a tunnel is how many clients close; not worth a reason.
            if let Err(e) = copied {
                tracing::debug!("egress tunnel to {}: {e}", report.decision.host);
            }
        }
        () = meter.idle(idle) => {
            report.decision.reason =
                format!("the tunnel was closed after {} s without traffic", idle.as_secs());
        }
    }
}

/// Forwards an absolute-form request over `upstream` in origin form and streams the response
/// back. The report is sent when the response body ends.
pub async fn forward(
    req: Request<Incoming>,
    upstream: TcpStream,
    mut report: Report,
    idle: Duration,
    shutdown: CancellationToken,
) -> Response<ProxyBody> {
    let meter = Meter::new();
    report.meter = Some(meter.clone());
    let io = TokioIo::new(Metered::new(upstream, meter.clone()));
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(io).await {
        Ok(pair) => pair,
        Err(e) => {
            return refuse(
                &mut report,
                StatusCode::BAD_GATEWAY,
                format!("HTTP to the origin: {e}"),
            );
        }
    };
    // The client connection ends when the response body is done and `sender` is gone; the
    // idle bound also covers an origin that never answers, and a client that stops sending.
    tokio::spawn(async move {
        tokio::select! {
            ended = conn => if let Err(e) = ended {
                tracing::debug!("egress upstream connection: {e}");
            },
            () = meter.idle(idle) => {}
            () = shutdown.cancelled() => {}
        }
    });
    let (mut parts, body) = req.into_parts();
    // RFC 9112 §3.2.2: the target's authority replaces any Host header. A differing Host would
    // ask a shared origin (a CDN) for a site the rules never saw.
    let d = &report.decision;
    let authority = match parts.uri.port_u16() {
        Some(port) => format!("{}:{port}", d.host),
        None => d.host.clone(),
    };
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let (Ok(host), Ok(path)) = (HeaderValue::from_str(&authority), path.parse::<Uri>()) else {
        let why = "the request target cannot be rewritten in origin form".to_string();
        return refuse(&mut report, StatusCode::BAD_REQUEST, why);
    };
    strip_hop_by_hop(&mut parts.headers);
    parts.headers.insert(header::HOST, host);
    parts.uri = path;
    parts.version = hyper::Version::HTTP_11;
    let response = match sender.send_request(Request::from_parts(parts, body)).await {
        Ok(r) => r,
        Err(e) => {
            let why = format!("the origin did not answer: {e}");
            return refuse(&mut report, StatusCode::BAD_GATEWAY, why);
        }
    };
    let (mut parts, body) = response.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    // The client's hop is HTTP/1.1 whatever the origin spoke; hyper frames the body for it.
    parts.version = hyper::Version::HTTP_11;
    Response::from_parts(
        parts,
        ProxyBody::Upstream {
            body,
            _report: Box::new(report),
        },
    )
}

/// Removes the headers that describe one hop, not the message (RFC 9110 §7.6.1): those named
/// in `Connection`, the fixed list, and every `Proxy-*` (credentials meant for this proxy).
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in [
        header::CONNECTION,
        HeaderName::from_static("keep-alive"),
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
    ] {
        headers.remove(name);
    }
    let proxy: Vec<HeaderName> = headers
        .keys()
        .filter(|k| k.as_str().starts_with("proxy-"))
        .cloned()
        .collect();
    for name in proxy {
        headers.remove(name);
    }
}

/// `CONNECT` for a tunnel, else the method's name if it is a standard one.
pub fn method_name(method: &hyper::Method) -> &'static str {
    const KNOWN: [&str; 9] = [
        "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
    ];
    KNOWN
        .into_iter()
        .find(|k| *k == method.as_str())
        .unwrap_or("OTHER")
}
