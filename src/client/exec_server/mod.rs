//! `corral exec-server`: Codex's exec-server protocol (JSON-RPC over WebSocket or stdio) as a
//! front of the daemon, so an unmodified `codex` started with `CODEX_EXEC_SERVER_URL` runs its
//! shell commands, patches and file reads inside corral's sandbox (DESIGN.md §5). Pinned to one
//! Codex release: `tests/codex/VERSION`.
//!
//! A client of the daemon like `corral mcp` (same socket rule, same identity: the user who
//! starts it); the daemon stays gRPC-only. Rooms: `transport` (WebSocket, stdio), `rpc` (the
//! envelope), `handlers` (the handshake and `process/*`), `fs` (`fs/*`), `sandbox` (Codex's
//! sandbox → a corral session), `sessions` (resumable sessions), `process` (seq numbers,
//! retention, notifications), `uri` (`file://` paths).

mod fs;
mod handlers;
mod process;
mod rpc;
mod sandbox;
mod sessions;
mod transport;
mod uri;

use clap::{Args, ValueEnum};
use handlers::Front;
use std::path::PathBuf;
use std::sync::Arc;

/// The channel to the daemon (with the TCP bearer token, when one is set).
type Channel = super::connect::Connection;

/// The widest sandbox the front opens for Codex.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MaxMode {
    ReadOnly,
    WorkspaceWrite,
    DangerFullAccess,
}

/// Options of `corral exec-server`.
#[derive(Debug, Clone, Args)]
pub struct ExecServerArgs {
    /// Where to serve: `ws://HOST:PORT` (loopback unless a token is set; port 0 picks one and
    /// prints it) or `stdio`.
    #[arg(long, default_value = "ws://127.0.0.1:0", value_name = "URL")]
    pub listen: String,
    /// The widest sandbox Codex may get through this front (the operator's policy still bounds
    /// it). workspace-write by default: a `--sandbox danger-full-access` Codex is refused.
    #[arg(long, value_enum, default_value_t = MaxMode::WorkspaceWrite)]
    pub max_mode: MaxMode,
    /// Require `Authorization: Bearer TOKEN` on WebSocket upgrades, where TOKEN's SHA-256 is
    /// this hex digest (repeatable). Required to listen on anything but loopback.
    #[arg(long = "token-sha256", value_name = "HEX")]
    pub token_sha256: Vec<String>,
}

/// Serves until the transport ends (stdio) or a termination signal arrives.
pub async fn serve(channel: Channel, args: ExecServerArgs) -> Result<i32, String> {
    init_logging();
    let mut auth = transport::Auth::default();
    for hex in &args.token_sha256 {
        auth.token_sha256.push(parse_digest(hex)?);
    }
    let cwd = std::env::current_dir().map_err(|e| format!("the current directory: {e}"))?;
    let user = nix::unistd::User::from_uid(nix::unistd::geteuid())
        .ok()
        .flatten();
    let home = user
        .as_ref()
        .map(|u| u.dir.clone())
        .unwrap_or_else(|| PathBuf::from("/"));
    let shell = user
        .as_ref()
        .map(|u| u.shell.clone())
        .filter(|s| s.is_absolute())
        .unwrap_or_else(|| PathBuf::from("/bin/sh"));
    let front = Arc::new(Front {
        channel,
        max: match args.max_mode {
            MaxMode::ReadOnly => sandbox::Mode::ReadOnly,
            MaxMode::WorkspaceWrite => sandbox::Mode::WorkspaceWrite,
            MaxMode::DangerFullAccess => sandbox::Mode::DangerFullAccess,
        },
        cwd,
        home,
        shell,
        registry: Arc::default(),
    });
    if args.listen == "stdio" {
        transport::serve_stdio(front.clone()).await;
        front.registry.close_all().await;
        return Ok(0);
    }
    let addr = args
        .listen
        .strip_prefix("ws://")
        .ok_or_else(|| {
            format!(
                "--listen {:?}: expected ws://HOST:PORT or stdio (wss:// is not served: put TLS \
                 in front, or use stdio over ssh)",
                args.listen
            )
        })?
        .trim_end_matches('/');
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("--listen {}: {e}", args.listen))?;
    let local = listener
        .local_addr()
        .map_err(|e| format!("--listen {}: {e}", args.listen))?;
    if !local.ip().is_loopback() && auth.token_sha256.is_empty() {
        return Err(format!(
            "--listen {}: not a loopback address, and no --token-sha256: anyone who reaches \
             the port would run commands as you. Listen on 127.0.0.1, or set a token",
            args.listen
        ));
    }
    // The one line on stdout: where Codex should connect (CODEX_EXEC_SERVER_URL).
    println!("ws://{local}");
    tracing::info!("corral exec-server listening on ws://{local}");
    let served = tokio::spawn(transport::serve_ws(front.clone(), listener, auth));
    shutdown_signal().await;
    served.abort();
    front.registry.close_all().await;
    Ok(0)
}

fn parse_digest(hex: &str) -> Result<[u8; 32], String> {
    let bad = || format!("--token-sha256 {hex:?}: expected 64 hexadecimal digits");
    if hex.len() != 64 {
        return Err(bad());
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(out)
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

/// Diagnostics on stderr (stdout carries the protocol under stdio, the URL otherwise).
fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("CORRAL_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .try_init();
}
