//! The `corral` binary: `corral serve` runs the daemon; the other subcommands are the thin
//! client.

use clap::{Parser, Subcommand};
use corral::client::{self, ClientCommand};
use corral::daemon::config::{Config, LogFormat, ServeArgs};

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
    let config = match Config::load(&args) {
        Ok(c) => c,
        Err(e) => {
            report(&e);
            return std::process::ExitCode::from(2);
        }
    };
    init_logging(config.log_format, &config.log_level);
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
    match rt.block_on(corral::daemon::server::serve(config, activated)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            std::process::ExitCode::from(1)
        }
    }
}

fn init_logging(format: LogFormat, level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // A closed stderr (the terminal or log pipe went away) must not take the daemon down:
        // tracing-subscriber would otherwise report the failed write with eprintln!, which
        // panics on EPIPE. Lost log lines are the lesser evil.
        .log_internal_errors(false);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// `error: MESSAGE` on stderr; a closed stderr is ignored (eprintln! would panic on EPIPE).
fn report(message: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "error: {message}");
}
