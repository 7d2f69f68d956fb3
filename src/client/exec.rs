//! `corral exec -- CMD ARGS...`: one command in a session, its stdout and stderr written to
//! ours as they arrive (ShellStream), and its exit status as ours. Ctrl-C cancels the call,
//! which kills the command's whole process tree in the sandbox.

use super::cli::{Common, Failure, SessionOpts, close, open};
use super::connect::Connection;
use crate::api::{self, shell_stream_event::Event, tools_client::ToolsClient};
use clap::Args;
use serde_json::json;
use std::io::Write;

#[derive(Debug, Clone, Args)]
pub struct ExecArgs {
    /// The command and its arguments, run as an argv (no shell); put `--` before it when it
    /// has options of its own: `corral exec -- ls -la`.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<String>,
    /// Run COMMAND as a script of the user's login shell (`bash -lc 'COMMAND'`): pipes,
    /// redirections and globs work.
    #[arg(long)]
    pub shell: bool,
    /// Kill the command's process tree after this many milliseconds (default 10000; the
    /// daemon's policy may set a ceiling).
    #[arg(long, value_name = "MS")]
    pub timeout_ms: Option<u64>,
    /// The command's working directory, absolute or relative to the session's.
    #[arg(long, value_name = "DIR")]
    pub workdir: Option<String>,
    #[command(flatten)]
    pub session: SessionOpts,
}

/// Runs the command; the exit status is the command's.
pub(super) async fn run(
    common: &Common,
    channel: Connection,
    args: ExecArgs,
) -> Result<i32, Failure> {
    let (id, temporary) = open(&channel, &args.session).await?;
    let (command, script) = if args.shell {
        (Vec::new(), args.command.join(" "))
    } else {
        (args.command, String::new())
    };
    let request = api::ShellRequest {
        session_id: id.clone(),
        command,
        script,
        workdir: args.workdir.unwrap_or_default(),
        timeout_ms: args.timeout_ms,
        ..Default::default()
    };
    let result = tokio::select! {
        r = stream(common, &channel, request) => r,
        // Dropping the stream cancels the call: the daemon kills the process tree.
        _ = tokio::signal::ctrl_c() => {
            eprintln!("corral: interrupted; the command was stopped");
            Ok(130)
        }
    };
    close(&channel, &id, temporary).await;
    result
}

async fn stream(
    common: &Common,
    channel: &Connection,
    request: api::ShellRequest,
) -> Result<i32, Failure> {
    let mut events = ToolsClient::new(channel.clone())
        .max_decoding_message_size(super::MAX_MESSAGE_BYTES)
        .shell_stream(request)
        .await?
        .into_inner();
    let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
    while let Some(event) = events.message().await? {
        match event.event {
            Some(Event::Delta(delta)) => {
                let stderr = delta.stream == api::OutputStream::Stderr as i32;
                // A reader that went away (`| head`) ends us through SIGPIPE, as any filter.
                let written = if common.json {
                    let line = json!({
                        "stream": if stderr { "stderr" } else { "stdout" },
                        "data": String::from_utf8_lossy(&delta.data),
                    });
                    writeln!(out, "{line}").and_then(|()| out.flush())
                } else if stderr {
                    err.write_all(&delta.data).and_then(|()| err.flush())
                } else {
                    out.write_all(&delta.data).and_then(|()| out.flush())
                };
                written.map_err(|e| format!("writing the command's output: {e}"))?;
            }
            Some(Event::End(end)) => return Ok(finish(common, &end)),
            Some(Event::Approval(request)) => {
                return Err(format!(
                    "the command needs approval ({}); exec does not ask: use `corral invoke` \
                     with --approvals, or a session without an approval policy",
                    request.reason
                )
                .into());
            }
            Some(Event::Begin(_)) | None => {}
        }
    }
    Err("the daemon ended the stream without the command's result"
        .to_string()
        .into())
}

/// Reports how the command ended (what a person would otherwise not see) and returns its exit
/// status.
fn finish(common: &Common, end: &api::ShellResponse) -> i32 {
    if common.json {
        println!(
            "{}",
            json!({
                "exit_code": end.exit_code, "signal": end.signal, "timed_out": end.timed_out,
                "sandbox_denied": end.sandbox_denied, "duration_seconds": end.duration_seconds,
            })
        );
    } else if end.timed_out {
        eprintln!(
            "corral: timed out after {:.1} s; the command's process tree was killed (--timeout-ms \
             sets the limit)",
            end.duration_seconds
        );
    } else if end.sandbox_denied {
        eprintln!(
            "corral: the sandbox denied something the command tried (a session in \
             workspace-write mode, --mode workspace-write, may write its working directory)"
        );
    } else if end.signal != 0 {
        eprintln!("corral: the command was killed by signal {}", end.signal);
    }
    end.exit_code.clamp(0, 255)
}
