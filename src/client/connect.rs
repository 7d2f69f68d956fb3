//! Opening a gRPC channel to the daemon over a Unix socket or TCP (plain on loopback, or TLS
//! with a client certificate and/or a bearer token).

use hyper_util::rt::TokioIo;
use std::path::{Path, PathBuf};
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity, Uri};

/// How to reach a `tcp:` daemon: TLS is on when a CA is given (the daemon's certificate must
/// chain to it); a client certificate (mTLS) and a bearer token are the two ways to
/// authenticate. None of it applies to Unix sockets, where peer credentials say who calls.
#[derive(Debug, Clone, Default)]
pub struct TcpAuth {
    /// PEM CA bundle the daemon's certificate must chain to.
    pub ca: Option<PathBuf>,
    /// PEM client certificate and key (mTLS).
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// The name the daemon's certificate must carry, when not HOST of `tcp:HOST:PORT`.
    pub server_name: Option<String>,
    /// Sent as `authorization: Bearer TOKEN` on every call.
    pub token: Option<String>,
}

impl TcpAuth {
    fn any_tls(&self) -> bool {
        self.ca.is_some() || self.cert.is_some() || self.key.is_some() || self.server_name.is_some()
    }
}

/// Adds the bearer token, if any, to every request.
#[derive(Debug, Clone, Default)]
pub struct Bearer(Option<AsciiMetadataValue>);

impl Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// A channel to the daemon that carries the caller's token, if any.
pub type Connection = InterceptedService<Channel, Bearer>;

/// Connects to `target`: a socket path, `unix:PATH`, or `tcp:HOST:PORT` (plain). A Unix socket
/// must pass `socket::check_client` (owned by root or this user, in a trusted
/// directory).
pub async fn connect(target: &str) -> Result<Channel, String> {
    Ok(open(target, &TcpAuth::default()).await?.0)
}

/// [`connect`] with the TLS settings and token for a `tcp:` target. Refuses combinations that
/// would not do what the caller meant: TLS settings for a Unix socket, a token over plain TCP
/// (anyone on the path could read it), half a client certificate.
pub async fn connect_with(target: &str, auth: &TcpAuth) -> Result<Connection, String> {
    let (channel, bearer) = open(target, auth).await?;
    Ok(InterceptedService::new(channel, bearer))
}

async fn open(target: &str, auth: &TcpAuth) -> Result<(Channel, Bearer), String> {
    let Some(addr) = target.strip_prefix("tcp:") else {
        if auth.any_tls() {
            return Err(format!(
                "--tls-ca, --tls-cert, --tls-key and --tls-server-name are for tcp: addresses; \
                 {target} is a Unix socket, where the kernel says who you are"
            ));
        }
        // The token is not sent over a Unix socket: peer credentials identify the caller.
        return Ok((connect_unix(target).await?, Bearer::default()));
    };
    let bearer = match &auth.token {
        None => Bearer::default(),
        Some(_) if auth.ca.is_none() => {
            return Err(format!(
                "a token (--token or CORRAL_TOKEN) is only sent over TLS, and tcp:{addr} is \
                 plain TCP: pass --tls-ca with the CA that signed the daemon's certificate"
            ));
        }
        Some(token) => {
            let value: AsciiMetadataValue = MetadataValue::try_from(format!("Bearer {token}"))
                .map_err(|_| {
                    "the token (--token or CORRAL_TOKEN) has characters a header cannot carry"
                        .to_string()
                })?;
            Bearer(Some(value))
        }
    };
    let channel = match &auth.ca {
        None if auth.any_tls() => {
            return Err(
                "--tls-cert, --tls-key and --tls-server-name need --tls-ca (the CA that signed \
                 the daemon's certificate), which turns TLS on"
                    .into(),
            );
        }
        None => Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| format!("bad address tcp:{addr}: {e}"))?
            .connect()
            .await
            .map_err(|e| format!("cannot connect to tcp:{addr}: {}", chain(&e)))?,
        Some(ca) => {
            let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(ca)?));
            if let Some(name) = &auth.server_name {
                tls = tls.domain_name(name.clone());
            }
            match (&auth.cert, &auth.key) {
                (Some(cert), Some(key)) => {
                    tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
                }
                (None, None) => {}
                _ => return Err("--tls-cert and --tls-key go together".into()),
            }
            Endpoint::from_shared(format!("https://{addr}"))
                .map_err(|e| format!("bad address tcp:{addr}: {e}"))?
                .tls_config(tls)
                .map_err(|e| format!("tls: {}", chain(&e)))?
                .connect()
                .await
                .map_err(|e| format!("cannot connect to tcp:{addr} over TLS: {}", chain(&e)))?
        }
    };
    Ok((channel, bearer))
}

async fn connect_unix(target: &str) -> Result<Channel, String> {
    let path = PathBuf::from(target.strip_prefix("unix:").unwrap_or(target));
    let shown = path.display().to_string();
    // `--socket 127.0.0.1:7878` is a TCP address written without its scheme, not a file.
    if !target.starts_with("unix:") && looks_like_host_port(target) && !path.exists() {
        return Err(format!(
            "cannot connect to {shown}: no socket file by that name; did you mean tcp:{target}?"
        ));
    }
    // Never talk to an impostor: a socket another user could have planted is refused.
    crate::socket::check_client(&path, nix::unistd::geteuid().as_raw())?;
    // The URI is required by the API but unused: the connector below dials the socket.
    Endpoint::from_static("http://corral.invalid")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }))
        .await
        .map_err(|e| {
            let why = match io_cause(&e).map(std::io::Error::kind) {
                Some(std::io::ErrorKind::NotFound) => {
                    "no socket there: is `corral serve` running? (see --socket)".to_string()
                }
                Some(std::io::ErrorKind::ConnectionRefused) => {
                    "connection refused: the socket is there but nothing listens (a daemon that \
                     stopped without removing it?); start `corral serve`"
                        .to_string()
                }
                Some(std::io::ErrorKind::PermissionDenied) => {
                    "permission denied: you may not connect to this socket (see --socket)".into()
                }
                _ => format!(
                    "{} (is `corral serve` running there? see --socket)",
                    chain(&e)
                ),
            };
            format!("cannot connect to {shown}: {why}")
        })
}

/// `HOST:PORT` with no `/`: what a person means by a TCP address.
fn looks_like_host_port(target: &str) -> bool {
    !target.contains('/')
        && target
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
}

/// The operating system's error behind a transport error, if there is one.
fn io_cause<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a std::io::Error> {
    let mut current = Some(error);
    while let Some(e) = current {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return Some(io);
        }
        current = e.source();
    }
    None
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// An error with its causes: tonic's transport error alone says only "transport error".
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
}
