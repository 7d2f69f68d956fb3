//! Opening a gRPC channel to the daemon over a Unix socket or TCP.

use hyper_util::rt::TokioIo;
use std::path::PathBuf;
use tonic::transport::{Channel, Endpoint, Uri};

/// Connects to `target`: a socket path, `unix:PATH`, or `tcp:HOST:PORT`. A Unix socket must
/// pass `daemon::socket::check_client` (owned by root or this user, in a trusted directory).
pub async fn connect(target: &str) -> Result<Channel, String> {
    if let Some(addr) = target.strip_prefix("tcp:") {
        return Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| format!("bad address {addr}: {e}"))?
            .connect()
            .await
            .map_err(|e| format!("cannot connect to tcp:{addr}: {e}"));
    }
    let path = PathBuf::from(target.strip_prefix("unix:").unwrap_or(target));
    let shown = path.display().to_string();
    // Never talk to an impostor: a socket another user could have planted is refused.
    crate::daemon::socket::check_client(&path, nix::unistd::geteuid().as_raw())?;
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
            format!(
                "cannot connect to {shown}: {e} (is `corral serve` running there? see --socket)"
            )
        })
}
