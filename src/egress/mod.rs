//! The egress proxy of network mode `proxy`: a sandbox keeps a network namespace with loopback
//! only, and its one way out is this proxy, run by the daemon outside the sandbox on a
//! listener whose socket lives in the sandbox's namespace. It speaks HTTP and, on the same
//! listener, SOCKS5 (`socks`) for TCP that is not HTTP.
//!
//! What it enforces, per request (`CONNECT host:port`, an absolute-form `GET http://…`, or a
//! SOCKS5 CONNECT to a name):
//! - the *name* against the domain rules (`rules`); an IP literal is refused (a rule allows a
//!   name, and an address would sidestep it);
//! - every address the name resolves to against the address policy (`addresses`), connecting
//!   only to an address that passed — the one it checked, resolved once, so a rebinding DNS
//!   answer cannot slip an internal address in between;
//! - bounds: concurrent connections, header read time, connect time, tunnel idleness.
//!
//! What it cannot see: inside a CONNECT tunnel (TLS), the SNI and `Host` the client sends to
//! the origin. An origin that serves several names on one address (a CDN) may be asked for a
//! name the rules do not allow ("domain fronting"); only intercepting TLS would stop that.
//!
//! Each request or tunnel is reported once, when it ends, as a `Decision` (`on_decision`).

pub mod addresses;
mod forward;
mod meter;
pub mod proxy;
pub mod resolve;
pub mod rules;
mod socks;

#[cfg(test)]
mod tests;

use meter::Meter;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the proxy did with one request or tunnel, for the audit log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Decision {
    /// The requested name, lowercase, without a trailing dot (as written if it is not a name).
    pub host: String,
    pub port: u16,
    /// The rules and the address check let it through. An allowed request can still fail
    /// (no address, upstream unreachable): `reason` then says how.
    pub allowed: bool,
    /// The deciding rule (`allow *.pypi.org`, `deny evil.test`, `no allow rule`), or what
    /// refused it before any rule was asked (`not a name`, `not a proxy request`: also a
    /// SOCKS5 client wanting authentication, BIND or UDP).
    pub rule: String,
    /// Why it was refused or failed, as the client was told (a SOCKS5 client is told only a
    /// reply code, which the reason names); empty when it was carried.
    pub reason: String,
    /// The upstream address connected to, or the refused address a name resolved to.
    pub address: Option<SocketAddr>,
    /// Bytes written to the upstream (for plain HTTP: the request as sent, head included).
    pub bytes_up: u64,
    /// Bytes read from the upstream.
    pub bytes_down: u64,
    /// From the request's arrival to the end of the tunnel or response.
    pub duration: Duration,
    /// `CONNECT`, `GET`, … (`OTHER` for an extension method), or `SOCKS5`.
    pub method: &'static str,
}

/// Where decisions go: the daemon's audit log.
pub type DecisionSink = Arc<dyn Fn(Decision) + Send + Sync>;

/// A decision in progress. It reports when dropped, so every path (a refusal, the end of a
/// response body, a tunnel cut by idleness or shutdown, a client that went away) reports
/// exactly once.
struct Report {
    decision: Decision,
    started: Instant,
    meter: Option<Arc<Meter>>,
    sink: DecisionSink,
}

impl Report {
    fn new(sink: DecisionSink, method: &'static str) -> Report {
        Report {
            decision: Decision {
                method,
                ..Decision::default()
            },
            started: Instant::now(),
            meter: None,
            sink,
        }
    }
}

impl Drop for Report {
    fn drop(&mut self) {
        let mut d = std::mem::take(&mut self.decision);
        d.duration = self.started.elapsed();
        if let Some(m) = &self.meter {
            (d.bytes_up, d.bytes_down) = (m.up(), m.down());
        }
        (self.sink)(d);
    }
}
