//! Name resolution for the proxy, behind a trait so tests (and a daemon that pins names) can
//! answer without DNS. The proxy resolves once and connects to an address it checked; nothing
//! here is trusted beyond that.

use futures_util::future::BoxFuture;
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};

pub trait Resolver: Send + Sync + 'static {
    /// Every address `host` resolves to, with `port`.
    fn resolve(&self, host: &str, port: u16) -> BoxFuture<'static, io::Result<Vec<SocketAddr>>>;
}

/// The host's resolver (`getaddrinfo`, through `tokio::net::lookup_host`).
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemResolver;

impl Resolver for SystemResolver {
    fn resolve(&self, host: &str, port: u16) -> BoxFuture<'static, io::Result<Vec<SocketAddr>>> {
        let host = host.to_string();
        Box::pin(async move {
            Ok(tokio::net::lookup_host((host.as_str(), port))
                .await?
                .collect())
        })
    }
}

/// Fixed answers for some names (compared lowercase, without a trailing dot); other names go
/// to `fallback`, or do not resolve.
#[derive(Clone, Debug, Default)]
pub struct OverrideResolver {
    map: HashMap<String, Vec<IpAddr>>,
    fallback: Option<SystemResolver>,
}

impl OverrideResolver {
    pub fn new(map: HashMap<String, Vec<IpAddr>>, fallback: Option<SystemResolver>) -> Self {
        let map = map
            .into_iter()
            .map(|(name, ips)| (normal(&name), ips))
            .collect();
        OverrideResolver { map, fallback }
    }
}

fn normal(host: &str) -> String {
    let host = host.to_ascii_lowercase();
    host.strip_suffix('.').map(str::to_string).unwrap_or(host)
}

impl Resolver for OverrideResolver {
    fn resolve(&self, host: &str, port: u16) -> BoxFuture<'static, io::Result<Vec<SocketAddr>>> {
        if let Some(ips) = self.map.get(&normal(host)) {
            let addrs = ips.iter().map(|ip| SocketAddr::new(*ip, port)).collect();
            return Box::pin(async move { Ok(addrs) });
        }
        match self.fallback {
            Some(system) => system.resolve(host, port),
            None => {
                let e = io::Error::new(io::ErrorKind::NotFound, format!("no address for {host}"));
                Box::pin(async move { Err(e) })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn overrides_answer_in_any_case_and_others_do_not_resolve() {
        let ip: IpAddr = "127.0.0.7".parse().expect("ip");
        let r = OverrideResolver::new([("Up.Test".to_string(), vec![ip])].into(), None);
        let want = vec![SocketAddr::new(ip, 81)];
        assert_eq!(r.resolve("up.test", 81).await.expect("mapped"), want);
        assert_eq!(r.resolve("UP.TEST.", 81).await.expect("mapped"), want);
        let err = r.resolve("other.test", 81).await.expect_err("unmapped");
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }

    #[tokio::test]
    async fn the_system_resolver_reads_numeric_hosts() {
        let got = SystemResolver
            .resolve("127.0.0.1", 9)
            .await
            .expect("numeric");
        assert_eq!(got, vec!["127.0.0.1:9".parse().expect("addr")]);
    }
}
