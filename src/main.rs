//! The `corral` binary: `corral serve` runs the daemon; the other subcommands are the thin
//! client.

use clap::{Parser, Subcommand};
use corral::client::{self, ClientCommand};
use corral::daemon::config::{Config, LogFormat, ServeArgs};

mod http2_log;

#[derive(Debug, Parser)]
#[command(
    name = "corral",
    version,
    about = "Sandboxed tool-execution daemon for coding agents"
)]
struct Cli {
    #[command(flatten)]
    common: client::Common,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the daemon.
    Serve(ServeArgs),
    #[command(flatten)]
    Client(ClientCommand),
    /// Internal: the confined sandbox worker the daemon starts.
    /// (Its spec arrives on the inherited socketpair, never in argv: other users can read argv.)
    #[command(name = "__worker", hide = true)]
    Worker,
    /// Internal: resolves a session's paths as the caller (request on stdin, answer on stdout).
    #[command(name = "__resolve", hide = true)]
    Resolve,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve(args),
        Command::Worker => std::process::ExitCode::from(corral::worker::serve::worker_main() as u8),
        Command::Resolve => {
            std::process::ExitCode::from(corral::worker::resolve::resolve_main() as u8)
        }
        Command::Client(cmd) => {
            let common = cli.common;
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    report(&format!("cannot start the async runtime: {e}"));
                    return std::process::ExitCode::from(2);
                }
            };
            let code = rt.block_on(client::run(common, cmd));
            std::process::ExitCode::from(code as u8)
        }
    }
}

fn serve(args: ServeArgs) -> std::process::ExitCode {
    corral::worker::frame::tune_allocator();
    let config = match Config::load(&args) {
        Ok(c) => c,
        Err(e) => {
            report(&e);
            return std::process::ExitCode::from(2);
        }
    };
    let http2_refusals = init_logging(config.log_format, &config.log_level);
    // Before any thread exists: socket activation reads and clears LISTEN_* variables.
    let activated = match corral::daemon::listener::from_socket_activation() {
        Ok(l) => l,
        Err(e) => {
            report(&e);
            return std::process::ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            report(&format!("cannot start the async runtime: {e}"));
            return std::process::ExitCode::from(2);
        }
    };
    rt.spawn(http2_log::report(http2_refusals));
    match rt.block_on(corral::daemon::server::serve(config, activated)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            std::process::ExitCode::from(1)
        }
    }
}

/// Installs the log subscriber: the --log-level filter for what is printed, and beside it the
/// HTTP/2 refusal watch (which sees h2's debug events whatever that filter says). Returns what
/// [`http2_log::report`] logs from.
fn init_logging(
    format: LogFormat,
    level: &str,
) -> tokio::sync::mpsc::UnboundedReceiver<http2_log::Refusal> {
    use tracing_subscriber::{
        Layer, Registry, filter, layer::SubscriberExt, util::SubscriberInitExt,
    };
    let filter = tracing_subscriber::EnvFilter::try_new(level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let printer = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        // A closed stderr (the terminal or log pipe went away) must not take the daemon down:
        // tracing-subscriber would otherwise report the failed write with eprintln!, which
        // panics on EPIPE. Lost log lines are the lesser evil.
        .log_internal_errors(false);
    let printer: Box<dyn Layer<Registry> + Send + Sync> = match format {
        LogFormat::Text => Box::new(printer),
        LogFormat::Json => Box::new(printer.json()),
    };
    let (watch, refusals) = http2_log::watch();
    let watched = filter::filter_fn(http2_log::watched)
        .with_max_level_hint(tracing::level_filters::LevelFilter::DEBUG);
    tracing_subscriber::registry()
        .with(printer.with_filter(filter))
        .with(watch.with_filter(watched))
        .init();
    refusals
}

/// `error: MESSAGE` on stderr; a closed stderr is ignored (eprintln! would panic on EPIPE).
fn report(message: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "error: {message}");
}
