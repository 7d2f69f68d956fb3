//! `corral serve`: the gRPC server with health and reflection, idle-session expiry, and graceful
//! shutdown on SIGTERM/SIGINT.

use crate::api::{
    bridge_server::BridgeServer, files_server::FilesServer, processes_server::ProcessesServer,
    sessions_server::SessionsServer, tools_server::ToolsServer,
};
use crate::daemon::audit::Audit;
use crate::daemon::config::{Config, ListenAddr};
use crate::daemon::executor::Executor;
use crate::daemon::inflight::InFlight;
use crate::daemon::listener;
use crate::daemon::policy::PolicyConfig;
use crate::daemon::service::CorralService;
use crate::daemon::sessions::SessionStore;
use crate::pb::FILE_DESCRIPTOR_SET;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::signal::unix::{SignalKind, signal};
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tonic::transport::Server;

/// After the last call finished, how long its response may take to be written out.
const RESPONSE_FLUSH: Duration = Duration::from_millis(500);

/// Runs the daemon until SIGTERM or SIGINT.
/// `activated`: a listening socket from systemd socket activation, used instead of binding
/// (the unit then owns the socket file and its permissions).
pub async fn serve(
    config: Config,
    activated: Option<std::os::unix::net::UnixListener>,
) -> Result<(), String> {
    let mut activated = activated
        .map(tokio::net::UnixListener::from_std)
        .transpose()
        .map_err(|e| format!("socket activation: descriptor 3 is not a Unix socket: {e}"))?;
    let owns_socket_file = activated.is_none();
    let sessions = SessionStore::new(config.session_idle_timeout, config.max_sessions);
    if let Some(addr) = config.metrics_listen {
        crate::daemon::metrics::install(addr)?;
        tracing::info!(%addr, "serving Prometheus metrics");
    }
    let in_flight = InFlight::default();
    let tls_on = config.tls.cert.is_some() && matches!(config.listen, ListenAddr::Tcp(_));
    let audit = Audit::new(config.audit_log.as_deref())?;
    let policy = Arc::new(std::sync::RwLock::new(config.policy.clone()));
    tokio::spawn(reload_on_sighup(
        audit.clone(),
        policy.clone(),
        config.config_file.clone(),
    ));
    let executor = Executor::new(
        config.degraded_layers.clone(),
        config.state_paths(),
        config.profiles.clone(),
    );
    // Probe the host once: can a read-only sandbox be built here? Its report feeds
    // GetCapabilities and the health service (spec/sandbox.md §6).
    let probe = executor.probe().await;
    let notes = startup_notes(&probe, nix::unistd::geteuid().as_raw());
    let service = CorralService {
        sessions: sessions.clone(),
        executor: executor.clone(),
        in_flight: in_flight.clone(),
        host_layers: Arc::new(probe.clone()),
        allow_escalation: config.allow_escalation,
        root_callers: config.root_callers,
        audit: audit.clone(),
        auth: crate::daemon::identity::Authenticator::new(tls_on.then(|| {
            crate::daemon::auth::Credentials {
                clients: config.tls.clients.clone(),
                tokens: config.tokens.clone(),
            }
        })),
        policy: policy.clone(),
        running: Default::default(),
        stream_stall_timeout: config.stream_stall_timeout,
    };

    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<SessionsServer<CorralService>>()
        .await;
    match &probe {
        Ok(_) => {
            health_reporter
                .set_serving::<ToolsServer<CorralService>>()
                .await;
            health_reporter
                .set_serving::<BridgeServer<CorralService>>()
                .await;
            health_reporter
                .set_serving::<ProcessesServer<CorralService>>()
                .await;
            health_reporter
                .set_serving::<FilesServer<CorralService>>()
                .await;
        }
        Err(e) => {
            // Sandboxed calls would fail closed: say so before anyone calls.
            tracing::error!("the sandbox cannot be enforced on this host: {e}");
            health_reporter
                .set_not_serving::<ToolsServer<CorralService>>()
                .await;
            health_reporter
                .set_not_serving::<BridgeServer<CorralService>>()
                .await;
            health_reporter
                .set_not_serving::<ProcessesServer<CorralService>>()
                .await;
            health_reporter
                .set_not_serving::<FilesServer<CorralService>>()
                .await;
            health_reporter
                .set_service_status("", tonic_health::ServingStatus::NotServing)
                .await;
        }
    }

    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| format!("cannot build reflection v1: {e}"))?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()
        .map_err(|e| format!("cannot build reflection v1alpha: {e}"))?;

    let mut builder = Server::builder();
    if tls_on {
        builder = builder
            .tls_config(server_tls(&config)?)
            .map_err(|e| format!("tls: {e}"))?;
    }
    let router = builder
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(SessionsServer::new(service.clone()))
        .add_service(ToolsServer::new(service.clone()))
        .add_service(ProcessesServer::new(service.clone()))
        .add_service(FilesServer::new(service.clone()))
        .add_service(BridgeServer::new(service));

    let expiry = tokio::spawn(expire_idle_sessions(sessions, executor.clone()));
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let stopped = async {
        let _ = stop_rx.await;
    };

    // Handlers first: a SIGTERM that arrives as soon as the socket answers must already mean
    // "shut down cleanly", not the default action.
    let signals = ShutdownSignals::install()?;
    let server: tokio::task::JoinHandle<Result<(), tonic::transport::Error>> = match &config.listen
    {
        ListenAddr::Unix(path) => {
            let uds = match activated.take() {
                Some(l) => l,
                None => listener::bind_unix(path, config.socket_mode)?,
            };
            announce(&config.listen, &notes);
            tokio::spawn(router.serve_with_incoming_shutdown(UnixListenerStream::new(uds), stopped))
        }
        ListenAddr::Tcp(addr) => {
            let tcp = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
            let bound = ListenAddr::Tcp(tcp.local_addr().map_err(|e| e.to_string())?);
            announce(&bound, &notes);
            tokio::spawn(router.serve_with_incoming_shutdown(TcpListenerStream::new(tcp), stopped))
        }
    };

    let signal_name = signals.wait(server_finished(&server)).await;
    if let Some(name) = signal_name {
        tracing::info!(
            signal = name,
            grace_seconds = config.shutdown_grace.as_secs(),
            "shutting down: no new connections; waiting for in-flight calls"
        );
        let _ = stop_tx.send(());
        // Idle client connections do not hold shutdown up; calls in flight do, up to the grace.
        match tokio::time::timeout(config.shutdown_grace, in_flight.wait_idle()).await {
            Ok(()) => tracing::info!("all calls finished"),
            Err(_) => tracing::warn!(
                calls = in_flight.count(),
                "grace period over: cancelling the remaining calls"
            ),
        }
        // The last responses may still be on their way out: let the server finish by itself
        // for a moment (idle client connections keep it waiting), then stop it.
        let abort = server.abort_handle();
        if tokio::time::timeout(RESPONSE_FLUSH, server).await.is_err() {
            abort.abort();
        }
    } else {
        // The server stopped by itself: report why.
        match server.await {
            Ok(Err(e)) => return Err(format!("server failed: {e}")),
            Err(e) => return Err(format!("server task failed: {e}")),
            Ok(Ok(())) => {}
        }
    }
    expiry.abort();
    if let ListenAddr::Unix(path) = &config.listen
        && owns_socket_file
    {
        let _ = std::fs::remove_file(path);
    }
    tracing::info!("stopped");
    Ok(())
}

/// What a human starting the daemon must know beyond where it listens: whether sandboxed
/// sessions work here (and if not, the fix), which layers run degraded, and, for a daemon that is
/// not root, whom it serves and how it sandboxes.
fn startup_notes(probe: &Result<Vec<crate::api::Layer>, String>, uid: u32) -> Vec<String> {
    let layers = match probe {
        Err(e) => {
            return vec![format!(
                "sandboxed sessions are unavailable on this host: read-only and workspace-write \
                 calls fail with FAILED_PRECONDITION (danger-full-access still works): {e}"
            )];
        }
        Ok(layers) => layers,
    };
    let mut notes = Vec::new();
    if uid != 0 {
        notes.push(format!(
            "running as uid {uid}, not root: serving only uid {uid}; sandboxed sessions run in \
             an unprivileged user namespace"
        ));
    }
    let degraded: Vec<&str> = layers
        .iter()
        .filter(|l| l.status == crate::api::LayerStatus::Degraded as i32)
        .map(|l| l.name.as_str())
        .collect();
    if !degraded.is_empty() {
        notes.push(format!(
            "degraded mode: sandboxed sessions run without {} (see `corral capabilities`)",
            degraded.join(", ")
        ));
    }
    notes
}

fn announce(addr: &ListenAddr, notes: &[String]) {
    use std::io::Write;
    tracing::info!(listen = %addr, "corral is serving");
    let socket_flag = match addr {
        ListenAddr::Unix(p) => format!("--socket {}", p.display()),
        ListenAddr::Tcp(a) => format!("--socket tcp:{a}"),
    };
    // A human starting the daemon wants to know where it is and how to try it.
    // The binary's own path, so the hint works before corral is installed on PATH.
    let bin = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "corral".into());
    // Not eprintln!: it panics when stderr is a closed pipe, and the daemon must keep serving.
    let _ = writeln!(
        std::io::stderr(),
        "corral listening on {addr}\ntry: {bin} health {socket_flag}   or   {bin} list-dir {socket_flag} ."
    );
    for note in notes {
        let _ = writeln!(std::io::stderr(), "corral: {note}");
    }
}

/// Resolves when the server task ends on its own.
async fn server_finished<T>(handle: &tokio::task::JoinHandle<T>) {
    while !handle.is_finished() {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The SIGTERM and SIGINT handlers, installed before the daemon starts serving.
struct ShutdownSignals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl ShutdownSignals {
    fn install() -> Result<Self, String> {
        Ok(Self {
            term: signal(SignalKind::terminate()).map_err(|e| format!("SIGTERM handler: {e}"))?,
            int: signal(SignalKind::interrupt()).map_err(|e| format!("SIGINT handler: {e}"))?,
        })
    }

    /// Waits for SIGTERM or SIGINT (returning its name) or for `finished` (returning None).
    async fn wait(mut self, finished: impl Future<Output = ()>) -> Option<&'static str> {
        tokio::select! {
            _ = self.term.recv() => Some("SIGTERM"),
            _ = self.int.recv() => Some("SIGINT"),
            _ = finished => None,
        }
    }
}

async fn expire_idle_sessions(sessions: SessionStore, executor: Executor) {
    let period =
        (sessions.idle_timeout() / 4).clamp(Duration::from_millis(100), Duration::from_secs(30));
    let mut tick = tokio::time::interval(period);
    loop {
        tick.tick().await;
        for session in sessions.expire_idle() {
            tracing::info!(session = %session.id, "session expired after being idle");
            executor.close(&session).await;
        }
    }
}

/// SIGHUP: reopen the audit log (logrotate moved it away) and reload the policy from the config
/// file. An invalid config keeps the running policy and says why.
async fn reload_on_sighup(
    audit: Audit,
    policy: Arc<std::sync::RwLock<PolicyConfig>>,
    config_file: Option<std::path::PathBuf>,
) {
    let Ok(mut hup) = signal(SignalKind::hangup()) else {
        tracing::error!("cannot install the SIGHUP handler; the audit log will not be reopened");
        return;
    };
    while hup.recv().await.is_some() {
        match audit.reopen() {
            Ok(()) => tracing::info!("SIGHUP: audit log reopened"),
            Err(e) => tracing::error!("SIGHUP: {e}; still writing to the old file"),
        }
        if let Some(path) = &config_file {
            match crate::daemon::config::reload_policy(path) {
                Ok(new) => {
                    *policy.write().unwrap_or_else(|p| p.into_inner()) = new;
                    tracing::info!(config = %path.display(), "SIGHUP: policy reloaded");
                }
                Err(e) => tracing::error!("SIGHUP: {e}; keeping the previous policy"),
            }
        }
    }
}

/// The server's TLS settings: its certificate and key, and (mTLS) the CA for client
/// certificates — optional, because a caller may authenticate with a token instead.
fn server_tls(config: &Config) -> Result<tonic::transport::ServerTlsConfig, String> {
    let read = |p: &std::path::Path| {
        std::fs::read(p).map_err(|e| format!("tls: cannot read {}: {e}", p.display()))
    };
    let (Some(cert), Some(key)) = (&config.tls.cert, &config.tls.key) else {
        return Err("tls: both tls_cert and tls_key are needed".into());
    };
    let mut tls = tonic::transport::ServerTlsConfig::new().identity(
        tonic::transport::Identity::from_pem(read(cert)?, read(key)?),
    );
    if let Some(ca) = &config.tls.client_ca {
        tls = tls
            .client_ca_root(tonic::transport::Certificate::from_pem(read(ca)?))
            .client_auth_optional(true);
    }
    Ok(tls)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Layer, LayerStatus};

    fn layer(name: &str, status: LayerStatus) -> Layer {
        Layer {
            name: name.into(),
            status: status as i32,
            detail: String::new(),
        }
    }

    #[test]
    fn startup_notes_say_what_a_human_must_know() {
        let fine = Ok(vec![layer("landlock", LayerStatus::Enforced)]);
        assert!(startup_notes(&fine, 0).is_empty());
        let user = startup_notes(&fine, 1000);
        assert_eq!(user.len(), 1);
        assert!(
            user[0].contains("uid 1000, not root: serving only uid 1000"),
            "{user:?}"
        );
        let failed = startup_notes(
            &Err("sandbox unavailable: namespaces could not be applied: x. Fix it.".into()),
            1000,
        );
        assert_eq!(failed.len(), 1);
        assert!(
            failed[0].contains("FAILED_PRECONDITION")
                && failed[0].ends_with("namespaces could not be applied: x. Fix it."),
            "{failed:?}"
        );
        let degraded = Ok(vec![
            layer("namespaces", LayerStatus::Degraded),
            layer("landlock", LayerStatus::Enforced),
        ]);
        let notes = startup_notes(&degraded, 0);
        assert_eq!(
            notes,
            vec![
                "degraded mode: sandboxed sessions run without namespaces (see `corral capabilities`)"
            ]
        );
    }
}
