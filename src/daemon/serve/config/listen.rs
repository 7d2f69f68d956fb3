//! Where the daemon listens: a Unix socket or a TCP address (`unix:PATH`, `tcp:HOST:PORT`),
//! parsed the same from a flag and from the config file, and the address used when neither
//! names one (the socket rule shared with the clients).

use std::path::PathBuf;

/// Where the daemon listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    /// A Unix socket path (the default transport; peer credentials identify the caller).
    Unix(PathBuf),
    /// A TCP address; only loopback addresses until authenticated TCP exists.
    Tcp(std::net::SocketAddr),
}

impl std::str::FromStr for ListenAddr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err("unix: needs a socket path, e.g. unix:/run/corral/corral.sock".into());
            }
            // Absolute from the start: the `try:` line, the state paths and the masks then
            // name the socket wherever they are read from.
            let path = std::path::absolute(path)
                .map_err(|e| format!("unix:{path}: cannot make the path absolute: {e}"))?;
            return Ok(ListenAddr::Unix(path));
        }
        if let Some(addr) = s.strip_prefix("tcp:") {
            let addr: std::net::SocketAddr = addr
                .parse()
                .map_err(|e| format!("tcp:{addr} is not HOST:PORT ({e})"))?;
            return Ok(ListenAddr::Tcp(addr));
        }
        Err(format!(
            "listen address `{s}` must start with unix: or tcp: (e.g. unix:/run/corral/corral.sock, tcp:127.0.0.1:7878)"
        ))
    }
}

impl std::fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ListenAddr::Unix(p) => write!(f, "unix:{}", p.display()),
            ListenAddr::Tcp(a) => write!(f, "tcp:{a}"),
        }
    }
}

/// Where the daemon listens without `--listen` or a `listen` key: the socket rule
/// (`socket::choose`), i.e. `CORRAL_SOCKET`, else `$XDG_RUNTIME_DIR/corral/corral.sock`,
/// else `/run/corral/corral.sock` as root. A daemon that is not root and has neither refuses to
/// start rather than falling back to `/tmp`.
pub fn default_listen() -> Result<ListenAddr, String> {
    let address = crate::socket::choose(None, crate::socket::Side::Daemon)?;
    if address.starts_with("unix:") || address.starts_with("tcp:") {
        return address
            .parse()
            .map_err(|e| format!("{}: {e}", crate::socket::SOCKET_ENV));
    }
    // Clients accept a bare socket path in CORRAL_SOCKET, so the daemon does too.
    Ok(ListenAddr::Unix(PathBuf::from(address)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses_parse() {
        assert_eq!(
            "unix:/x/y.sock".parse::<ListenAddr>().unwrap(),
            ListenAddr::Unix("/x/y.sock".into())
        );
        // A relative socket path is made absolute (the `try:` line works from anywhere).
        assert_eq!(
            "unix:rel.sock".parse::<ListenAddr>().unwrap(),
            ListenAddr::Unix(std::env::current_dir().unwrap().join("rel.sock"))
        );
        assert!("tcp:127.0.0.1:9".parse::<ListenAddr>().is_ok());
        assert!(
            "tcp:nohost"
                .parse::<ListenAddr>()
                .unwrap_err()
                .contains("HOST:PORT")
        );
        assert!(
            "/x.sock"
                .parse::<ListenAddr>()
                .unwrap_err()
                .contains("unix: or tcp:")
        );
    }
}
