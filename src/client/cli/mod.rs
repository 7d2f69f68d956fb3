//! Client subcommands. Readable output by default, `--json` for scripts; an error is one line
//! on stderr and exit status 2; a tool that reports failure exits 1.
//!
//! This file is the dispatch: [`run`] connects and hands each command to the code that does it
//! (the small ones inline). The rooms around it: `args.rs` holds clap's definitions of the
//! commands and shared options, `failure.rs` how a command fails, `session.rs` the session a
//! command runs in (given, or temporary).

mod args;
mod failure;
mod session;

use crate::api::{
    self, bridge_client::BridgeClient, sessions_client::SessionsClient, tools_client::ToolsClient,
};
use crate::client::connect::connect_with;
use crate::client::{
    MAX_MESSAGE_BYTES, approve, cp, exec, exec_server, handshake, info, inventory, mcp,
};
use serde_json::json;

pub use args::{
    ClientCommand, Common, FormatArg, ModeArg, NetworkArg, NetworkOpts, SessionOpts, ShellToolArg,
    TOKEN_ENV,
};
pub(super) use failure::{Failure, status_text};
pub(super) use session::{close, open, open_session_request};

/// Runs a client command; returns the process exit status.
pub async fn run(common: Common, command: ClientCommand) -> i32 {
    let stdio_front = stdio_front(&command);
    match execute(&common, command).await {
        Ok(code) => code,
        Err(failure) => {
            if common.json {
                eprintln!("{}", failure.json());
            } else {
                eprintln!("error: {}", failure.text());
            }
            // A client that started the front sees stderr nowhere: its `initialize` is
            // answered with the reason, whatever failed (the daemon, the session, an option).
            if let Some((protocol, name)) = stdio_front
                && failure.before_handshake
            {
                let reason = format!("{name} cannot start: {}", failure.text());
                handshake::refuse(protocol, &reason).await;
            }
            2
        }
    }
}

/// The protocol and name of a front that serves its client on stdin/stdout, if `command` is one.
fn stdio_front(command: &ClientCommand) -> Option<(handshake::Protocol, &'static str)> {
    use handshake::Protocol;
    match command {
        ClientCommand::Mcp(_) => Some((Protocol::Mcp, "corral mcp")),
        ClientCommand::ExecServer(args) if args.listen == "stdio" => {
            Some((Protocol::ExecServer, "corral exec-server"))
        }
        _ => None,
    }
}

async fn execute(common: &Common, command: ClientCommand) -> Result<i32, Failure> {
    // The socket rule shared with `corral serve`: --socket > CORRAL_SOCKET > this user's daemon
    // (if one is listening) > the system daemon, which serves every local user as themselves.
    let target = crate::socket::choose(common.socket.as_deref(), crate::socket::Side::Client)?;
    let channel = connect_with(&target, &common.tcp_auth(&target)?).await?;
    match command {
        ClientCommand::Cp(args) => Ok(cp::run(common, channel, args).await?),
        ClientCommand::Health => info::health(common, channel).await,
        ClientCommand::Capabilities => info::capabilities(common, channel).await,
        ClientCommand::Tools {
            format,
            session,
            shell_tool,
        } => info::tools(common, channel, format, session, shell_tool).await,
        ClientCommand::Sessions => inventory::sessions(common, channel).await,
        ClientCommand::EgressLog { id } => inventory::egress_log(common, channel, id).await,
        ClientCommand::Ps { session } => inventory::processes(common, channel, session).await,
        ClientCommand::Exec(args) => exec::run(common, channel, args).await,
        ClientCommand::OpenSession {
            cwd,
            mode,
            writable_roots,
            network,
            env,
            approval_policy,
            exclude_slash_tmp,
            exclude_tmpdir_env_var,
        } => {
            let mut request = open_session_request(cwd, mode, &writable_roots, &network, &env)?;
            request.exclude_slash_tmp = exclude_slash_tmp;
            request.exclude_tmpdir_env_var = exclude_tmpdir_env_var;
            if let Some(p) = approval_policy {
                request.approval_policy = p.api() as i32;
            }
            let resp = SessionsClient::new(channel)
                .open_session(request)
                .await?
                .into_inner();
            if common.json {
                println!(
                    "{}",
                    json!({"session_id": resp.session_id, "writable_roots": resp.writable_roots,
                        "skipped_writable_roots": resp.skipped_writable_roots})
                );
            } else {
                println!("{}", resp.session_id);
            }
            Ok(0)
        }
        ClientCommand::SetNetworkRules {
            id,
            allow_domains,
            deny_domains,
        } => {
            SessionsClient::new(channel)
                .set_network_rules(api::SetNetworkRulesRequest {
                    session_id: id,
                    allow_domains,
                    deny_domains,
                })
                .await?;
            Ok(0)
        }
        ClientCommand::CloseSession { id } => {
            SessionsClient::new(channel)
                .close_session(api::CloseSessionRequest { session_id: id })
                .await?;
            Ok(0)
        }
        ClientCommand::ReadFile {
            path,
            offset,
            limit,
            session,
        } => {
            let (id, temporary) = open(&channel, &session).await?;
            let result = ToolsClient::new(channel.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .read_file(api::ReadFileRequest {
                    session_id: id.clone(),
                    file_path: path,
                    offset,
                    limit,
                    ..Default::default()
                })
                .await;
            close(&channel, &id, temporary).await;
            let resp = result?.into_inner();
            if common.json {
                let lines: Vec<_> = resp
                    .lines
                    .iter()
                    .map(|l| json!({"number": l.number, "text": l.text}))
                    .collect();
                println!(
                    "{}",
                    json!({"path": resp.path, "lines": lines, "text": resp.text})
                );
            } else {
                println!("{}", resp.text);
            }
            Ok(0)
        }
        ClientCommand::ListDir {
            path,
            offset,
            limit,
            depth,
            session,
        } => {
            let (id, temporary) = open(&channel, &session).await?;
            let result = ToolsClient::new(channel.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .list_dir(api::ListDirRequest {
                    session_id: id.clone(),
                    dir_path: path,
                    offset,
                    limit,
                    depth,
                })
                .await;
            close(&channel, &id, temporary).await;
            let resp = result?.into_inner();
            if common.json {
                let entries: Vec<_> = resp
                    .entries
                    .iter()
                    .map(|e| json!({"relative_path": e.relative_path, "name": e.name, "depth": e.depth,
                        "kind": api::EntryKind::try_from(e.kind).map(|k| k.as_str_name()).unwrap_or("?")}))
                    .collect();
                println!(
                    "{}",
                    json!({"absolute_path": resp.absolute_path, "entries": entries,
                        "more_entries": resp.more_entries, "text": resp.text})
                );
            } else {
                println!("{}", resp.text);
            }
            Ok(0)
        }
        ClientCommand::Invoke {
            name,
            arguments,
            call_id,
            freeform,
            approvals,
            session,
        } => {
            let arguments = argument_text(&arguments)?;
            let (id, temporary) = open(&channel, &session).await?;
            let result = BridgeClient::new(channel.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .invoke(api::InvokeRequest {
                    session_id: id.clone(),
                    name: name.clone(),
                    arguments: arguments.clone(),
                    call_id,
                    freeform,
                })
                .await;
            // An approval request is answered (asked on the terminal) before the session goes.
            let result = match result {
                Ok(resp) => approve::settle(&channel, &id, resp.into_inner(), approvals)
                    .await
                    .map_err(Failure::from),
                Err(s) => Err(Failure::from(s)),
            };
            close(&channel, &id, temporary).await;
            let resp = result?;
            if common.json {
                println!(
                    "{}",
                    json!({"call_id": resp.call_id, "output": resp.output, "success": resp.success})
                );
            } else {
                println!("{}", resp.output);
            }
            if !resp.success
                && let Some(hint) = patch_hint(&name, &arguments, freeform)
            {
                eprintln!("hint: {hint}");
            }
            Ok(if resp.success { 0 } else { 1 })
        }
        ClientCommand::Mcp(args) => mcp::serve(channel, args).await,
        ClientCommand::ExecServer(args) => Ok(exec_server::serve(channel, args).await?),
    }
}

/// The ARGUMENTS of `invoke`: `-` is stdin, `@FILE` a file's contents, anything else itself.
/// A patch or a long script then need not fit in argv, nor survive the shell's quoting.
fn argument_text(arguments: &str) -> Result<String, String> {
    use std::io::Read;
    if arguments == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| format!("reading the arguments from stdin: {e}"))?;
        return Ok(text);
    }
    match arguments.strip_prefix('@') {
        Some(file) => std::fs::read_to_string(file)
            .map_err(|e| format!("reading the arguments from {file}: {e}")),
        None => Ok(arguments.to_string()),
    }
}

/// What to tell a person whose apply_patch failed because of the input's format: Codex's
/// patch grammar is not a unified diff, and its freeform form is not JSON.
fn patch_hint(name: &str, arguments: &str, freeform: bool) -> Option<&'static str> {
    if !crate::calls::takes_a_patch(name) {
        return None;
    }
    let text = if freeform {
        arguments.to_string()
    } else {
        serde_json::from_str::<serde_json::Value>(arguments)
            .ok()
            .and_then(|v| v.get("input").and_then(|i| i.as_str()).map(String::from))
            .unwrap_or_else(|| arguments.to_string())
    };
    let unified = text
        .lines()
        .any(|l| l.starts_with("diff --git ") || l.starts_with("+++ ") || l.starts_with("@@ -"))
        && !text.contains("*** Begin Patch");
    if unified {
        return Some(
            "this looks like a unified diff; apply_patch takes Codex's patch format: \
             `*** Begin Patch`, then `*** Update File: PATH` (or Add/Delete File), `@@` hunks \
             of ` `/`-`/`+` lines, and `*** End Patch` (README, \"The CLI client\")",
        );
    }
    if !freeform && text.trim_start().starts_with("*** Begin Patch") {
        return Some(
            "a raw patch is a freeform input: add --freeform (or pass {\"input\": PATCH} as JSON)",
        );
    }
    None
}
