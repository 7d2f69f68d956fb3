//! `corral serve`: the gRPC server with health and reflection, idle-session expiry, and graceful
//! shutdown on SIGTERM/SIGINT.

use crate::api::{
    bridge_server::BridgeServer, files_server::FilesServer, processes_server::ProcessesServer,
    sessions_server::SessionsServer, tools_server::ToolsServer,
};
use crate::daemon::caller::rules::PolicyConfig;
use crate::daemon::pipeline::admit::CorralService;
use crate::daemon::pipeline::audit::Audit;
use crate::daemon::pipeline::inflight::InFlight;
use crate::daemon::pipeline::route::Executor;
use crate::daemon::serve::config::{Config, ListenAddr};
use crate::daemon::serve::listener;
use crate::daemon::serve::startup;
use crate::daemon::session::sessions::SessionStore;
use crate::pb::FILE_DESCRIPTOR_SET;
use crate::sync::RwLockExt;
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
    // Commands of a worker that dies are re-parented here rather than to init, to be killed
    // (orphans.rs).
    if let Err(e) = crate::daemon::workers::orphans::become_subreaper() {
        tracing::warn!(
            "cannot become a child subreaper ({e}): commands of a danger-full-access worker \
             that dies may outlive it"
        );
    }
    let sessions = SessionStore::new(config.session_idle_timeout, config.max_sessions);
    if let Some(addr) = config.metrics_listen {
        crate::daemon::metrics::install(addr)?;
        tracing::info!(%addr, "serving Prometheus metrics");
    }
    let in_flight = InFlight::default();
    let tls_on = config.tls_enabled();
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
    )
    .with_socket_dir(config.socket_dir());
    // Probe the host once: can a read-only sandbox be built here? Its report feeds
    // GetCapabilities and the health service (spec/sandbox.md §6).
    let probe = executor.probe().await;
    // Workers and path resolvers started ahead, so the next OpenSession does not wait for the
    // binary to exec.
    executor.prewarm();
    let egress = config.egress.settings()?;
    for addr in [config.health_listen, config.metrics_listen]
        .into_iter()
        .flatten()
    {
        egress.add_listener(addr);
    }
    let service = CorralService {
        sessions: sessions.clone(),
        executor: executor.clone(),
        in_flight: in_flight.clone(),
        host_layers: Arc::new(probe.clone()),
        allow_escalation: config.allow_escalation,
        root_callers: config.root_callers,
        audit: audit.clone(),
        auth: crate::daemon::caller::identity::Authenticator::new(tls_on.then(|| {
            crate::daemon::caller::auth::Credentials {
                clients: config.tls.clients.clone(),
                tokens: config.tokens.clone(),
            }
        })),
        policy: policy.clone(),
        running: Default::default(),
        stream_stall_timeout: config.stream_stall_timeout,
        egress: egress.clone(),
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
        .add_service(health_service.clone())
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(SessionsServer::new(service.clone()))
        .add_service(ToolsServer::new(service.clone()))
        .add_service(ProcessesServer::new(service.clone()))
        .add_service(FilesServer::new(service.clone()))
        .add_service(BridgeServer::new(service));

    // Kubernetes' `grpc:` probe speaks neither TLS nor Unix sockets: the health service, and
    // nothing else, on a plain TCP port of its own. Bound before the main listener, so the
    // start-up block is printed only once everything it lists is up.
    let health_only = match config.health_listen {
        Some(addr) => {
            let tcp = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| format!("cannot listen on {addr} (health_listen): {e}"))?;
            // Anyone on the network may connect: few streams per connection, none long-lived
            // (a probe's Check takes milliseconds; a Watch would otherwise be held forever).
            Some(tokio::spawn(
                Server::builder()
                    .max_concurrent_streams(8)
                    .timeout(Duration::from_secs(10))
                    .add_service(health_service.clone())
                    .serve_with_incoming(TcpListenerStream::new(tcp)),
            ))
        }
        None => None,
    };
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
            startup::announce(&config, &config.listen, &probe);
            tokio::spawn(router.serve_with_incoming_shutdown(UnixListenerStream::new(uds), stopped))
        }
        ListenAddr::Tcp(addr) => {
            let tcp = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
            let local = tcp.local_addr().map_err(|e| e.to_string())?;
            egress.add_listener(local);
            let bound = ListenAddr::Tcp(local);
            startup::announce(&config, &bound, &probe);
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
    // No call is left: stop the workers, and with them every command.
    executor.shutdown().await;
    if let Some(health) = health_only {
        health.abort();
    }
    if let ListenAddr::Unix(path) = &config.listen
        && owns_socket_file
    {
        let _ = std::fs::remove_file(path);
    }
    tracing::info!("stopped");
    Ok(())
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
            match crate::daemon::serve::config::reload_policy(path) {
                Ok(new) => {
                    *policy.write_locked() = new;
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
