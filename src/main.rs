//! The `corral` binary: `corral serve` runs the daemon; the other subcommands are the thin
//! client.

use clap::{Parser, Subcommand};
use corral::client::{self, ClientCommand};
use corral::{Config, LogFormat, ServeArgs};

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
    Serve(Box<ServeArgs>),
    #[command(flatten)]
    Client(ClientCommand),
    /// Internal: the confined sandbox worker the daemon starts.
    /// (Its spec arrives on the inherited socketpair, never in argv: other users can read argv.)
    #[command(name = "__worker", hide = true)]
    Worker,
    /// Internal: a worker started ahead, before its spec exists; it becomes `__worker` when the
    /// spec arrives (same length: the name is rewritten in place, see `worker::serve`).
    #[command(name = "__spare_", hide = true)]
    Spare,
    /// Internal: resolves a session's paths as the caller (request on stdin, answer on stdout).
    #[command(name = "__resolve", hide = true)]
    Resolve,
}

/// SIGPIPE in a CLI command. From stdout whose reader left: die of it, quietly, as a Unix filter
/// does. From the daemon's socket (a daemon that stopped mid-call): carry on, so that the write
/// fails with EPIPE and the command reports the daemon gone with its usual error and exit code.
/// SIGPIPE is sent to the writing thread, so the handler runs in it.
extern "C" fn on_sigpipe(_: libc::c_int) {
    let mut stdout = libc::pollfd {
        fd: 1,
        events: 0,
        revents: 0,
    };
    // SAFETY: poll, signal and raise are async-signal-safe; `stdout` lives for the call.
    unsafe {
        if libc::poll(&mut stdout, 1, 0) == 1 && stdout.revents & libc::POLLERR != 0 {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            libc::raise(libc::SIGPIPE);
        }
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve(*args),
        Command::Worker | Command::Spare => {
            std::process::ExitCode::from(corral::worker_main() as u8)
        }
        Command::Resolve => std::process::ExitCode::from(corral::resolve_main() as u8),
        Command::Client(cmd) => {
            // `corral list-dir . | head`: a reader that goes away ends the command quietly, as
            // for any Unix filter (Rust ignores SIGPIPE, so a print would panic). `corral mcp`
            // keeps it ignored: it closes the session it opened when its output breaks.
            if !matches!(cmd, ClientCommand::Mcp(_)) {
                // SAFETY: single-threaded here (no runtime yet); the handler only calls
                // async-signal-safe functions.
                let _ = unsafe {
                    nix::sys::signal::signal(
                        nix::sys::signal::Signal::SIGPIPE,
                        nix::sys::signal::SigHandler::Handler(on_sigpipe),
                    )
                };
            }
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
            // Do not wait for blocking-pool work: `corral mcp` stopped by a signal may still have
            // a read of its stdin (a terminal or socket) pending there, which never returns.
            rt.shutdown_background();
            std::process::ExitCode::from(code as u8)
        }
    }
}

fn serve(args: ServeArgs) -> std::process::ExitCode {
    corral::tune_allocator();
    // A config that --check-config passes also starts: both run the same checks.
    let config = match Config::load(&args).and_then(|c| c.check_files().map(|()| c)) {
        Ok(c) => c,
        Err(e) => {
            // The format the operator asked for on the command line, if any: the file's
            // setting may be what failed to load.
            report_as(args.log_format.unwrap_or(LogFormat::Text), &e);
            return std::process::ExitCode::from(2);
        }
    };
    if args.check_config {
        print_summary(&config);
        return std::process::ExitCode::SUCCESS;
    }
    let http2_refusals = init_logging(config.log_format, &config.log_level);
    // Before any thread exists: socket activation reads and clears LISTEN_* variables.
    let activated = match corral::from_socket_activation() {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("{e}");
            return std::process::ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("cannot start the async runtime: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    rt.spawn(http2_log::report(http2_refusals));
    match rt.block_on(corral::serve(config, activated)) {
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
    // Colours only for a person at a terminal: escape codes in a journal, a container log or
    // a file are noise (and NO_COLOR turns them off there too).
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let printer = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(colour)
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
    report_as(LogFormat::Text, message);
}

/// [`report`] in the given log format: with json, through the same JSON formatter as the
/// log lines, so that every line on stderr parses.
fn report_as(format: LogFormat, message: &str) {
    match format {
        LogFormat::Text => {
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "error: {message}");
        }
        LogFormat::Json => {
            let printer = tracing_subscriber::fmt()
                .json()
                .with_writer(std::io::stderr)
                .log_internal_errors(false)
                .finish();
            tracing::subscriber::with_default(printer, || tracing::error!("{message}"));
        }
    }
}

/// `--check-config`: the effective settings on stdout, `key: value` per line (or one JSON
/// object with --log-format json).
fn print_summary(config: &Config) {
    use std::io::Write;
    let rows = config.summary();
    let text = match config.log_format {
        LogFormat::Json => {
            let object: serde_json::Map<String, serde_json::Value> = rows
                .into_iter()
                .map(|(k, v)| (k.to_string(), serde_json::Value::String(v)))
                .collect();
            format!("{}\n", serde_json::Value::Object(object))
        }
        LogFormat::Text => {
            let mut text = String::from("configuration OK\n");
            for (key, value) in rows {
                text.push_str(&format!("  {:<10} {value}\n", format!("{key}:")));
            }
            text
        }
    };
    let _ = std::io::stdout().write_all(text.as_bytes());
    for warning in config.warnings() {
        let _ = writeln!(std::io::stderr(), "warning: {warning}");
    }
}
