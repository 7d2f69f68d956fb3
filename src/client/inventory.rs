//! Finding things again: `corral sessions` (your open sessions) and `corral ps` (the processes
//! they keep). Only the caller's own are ever listed: the daemon filters by who calls.

use super::cli::{Common, Failure};
use super::connect::Connection;
use crate::api::{self, processes_client::ProcessesClient, sessions_client::SessionsClient};
use serde_json::json;

fn mode_name(mode: i32) -> &'static str {
    match api::SandboxMode::try_from(mode) {
        Ok(api::SandboxMode::ReadOnly) => "read-only",
        Ok(api::SandboxMode::WorkspaceWrite) => "workspace-write",
        Ok(api::SandboxMode::DangerFullAccess) => "danger-full-access",
        _ => "?",
    }
}

async fn list(channel: &Connection) -> Result<Vec<api::SessionInfo>, Failure> {
    Ok(SessionsClient::new(channel.clone())
        .list_sessions(api::ListSessionsRequest {})
        .await?
        .into_inner()
        .sessions)
}

/// `corral sessions`: id, mode, idle time, network and cwd of each open session.
/// `corral egress-log ID`: one line per decision of a proxied session's egress proxy.
pub(super) async fn egress_log(
    common: &Common,
    channel: Connection,
    id: String,
) -> Result<i32, Failure> {
    let log = SessionsClient::new(channel)
        .get_egress_log(api::GetEgressLogRequest { session_id: id })
        .await?
        .into_inner();
    if common.json {
        let rows: Vec<_> = log
            .decisions
            .iter()
            .map(|d| {
                json!({
                    "time_unix_ms": d.time_unix_ms, "method": d.method, "host": d.host,
                    "port": d.port, "allowed": d.allowed, "rule": d.rule, "reason": d.reason,
                    "address": d.address, "bytes_up": d.bytes_up, "bytes_down": d.bytes_down,
                    "duration_ms": d.duration_ms,
                })
            })
            .collect();
        println!("{}", json!({ "decisions": rows, "dropped": log.dropped }));
        return Ok(0);
    }
    if log.dropped > 0 {
        println!("({} older decisions no longer kept)", log.dropped);
    }
    for d in &log.decisions {
        // Host names and reasons come from what a sandboxed command sent: nothing raw reaches
        // the terminal.
        println!(
            "{:<7}  {:<7}  {}:{}  {}  up {} B, down {} B, {} ms{}",
            if d.allowed { "allowed" } else { "denied" },
            d.method,
            super::approve::visible(&d.host),
            d.port,
            super::approve::visible(&d.rule),
            d.bytes_up,
            d.bytes_down,
            d.duration_ms,
            if d.reason.is_empty() {
                String::new()
            } else {
                format!(" — {}", super::approve::visible(&d.reason))
            }
        );
    }
    Ok(0)
}

pub(super) async fn sessions(common: &Common, channel: Connection) -> Result<i32, Failure> {
    let sessions = list(&channel).await?;
    if common.json {
        let rows: Vec<_> = sessions
            .iter()
            .map(|s| {
                json!({
                    "session_id": s.session_id, "cwd": s.cwd, "mode": mode_name(s.mode),
                    "writable_roots": s.writable_roots, "network_access": s.network_access,
                    "network_mode": network_name(s),
                    "profile": s.profile, "tools": s.tools, "idle_seconds": s.idle_seconds,
                })
            })
            .collect();
        println!("{}", json!({ "sessions": rows }));
        return Ok(0);
    }
    if sessions.is_empty() {
        eprintln!("no open sessions");
        return Ok(0);
    }
    let width = sessions
        .iter()
        .map(|s| s.session_id.len())
        .max()
        .unwrap_or(0);
    let mut text = format!(
        "{:<width$}  {:<18}  {:>6}  {:<7}  CWD\n",
        "SESSION", "MODE", "IDLE", "NETWORK"
    );
    for s in &sessions {
        text.push_str(&format!(
            "{:<width$}  {:<18}  {:>6}  {:<7}  {}\n",
            s.session_id,
            mode_name(s.mode),
            format!("{}s", s.idle_seconds),
            network_name(s),
            // A path is the user's, but may hold anything: nothing reaches the terminal raw.
            super::approve::visible(&s.cwd)
        ));
    }
    print!("{text}");
    Ok(0)
}

/// `corral ps`: the processes of one session, or of all of yours.
pub(super) async fn processes(
    common: &Common,
    channel: Connection,
    session: Option<String>,
) -> Result<i32, Failure> {
    let ids = match session {
        Some(id) => vec![id],
        None => list(&channel)
            .await?
            .into_iter()
            .map(|s| s.session_id)
            .collect(),
    };
    let mut rows = Vec::new();
    for id in ids {
        let listed = ProcessesClient::new(channel.clone())
            .list_processes(api::ListProcessesRequest {
                session_id: id.clone(),
            })
            .await?
            .into_inner();
        rows.extend(listed.processes.into_iter().map(|p| (id.clone(), p)));
    }
    let state = |p: &api::ProcessInfo| -> String {
        match &p.state {
            Some(s) if s.running => "running".into(),
            Some(s) => match s.exit_code {
                Some(code) => format!("exited {code}"),
                None => "exited".into(),
            },
            None => "?".into(),
        }
    };
    if common.json {
        let rows: Vec<_> = rows
            .iter()
            .map(|(id, p)| {
                json!({
                    "session_id": id, "process_id": p.process_id, "command": p.command,
                    "tty": p.tty, "escalated": p.escalated,
                    "running": p.state.as_ref().is_some_and(|s| s.running),
                    "exit_code": p.state.as_ref().and_then(|s| s.exit_code),
                    "output_bytes": p.state.as_ref().map_or(0, |s| s.output_bytes),
                })
            })
            .collect();
        println!("{}", json!({ "processes": rows }));
        return Ok(0);
    }
    if rows.is_empty() {
        eprintln!("no processes");
        return Ok(0);
    }
    let width = rows.iter().map(|(id, _)| id.len()).max().unwrap_or(0);
    let mut text = format!(
        "{:<width$}  {:>7}  {:<10}  {:<3}  {:<7}  COMMAND\n",
        "SESSION", "PROCESS", "STATE", "TTY", "SANDBOX"
    );
    for (id, p) in &rows {
        text.push_str(&format!(
            "{:<width$}  {:>7}  {:<10}  {:<3}  {:<7}  {}\n",
            id,
            p.process_id,
            state(p),
            if p.tty { "yes" } else { "no" },
            if p.escalated { "OUTSIDE" } else { "yes" },
            // The model chose the command: escape sequences in it must not drive the terminal.
            super::approve::visible_words(&super::approve::shell_words(&p.command))
        ));
    }
    print!("{text}");
    Ok(0)
}

/// A session's network as the CLI names it.
fn network_name(s: &api::SessionInfo) -> &'static str {
    match api::NetworkMode::try_from(s.network_mode) {
        Ok(api::NetworkMode::Proxy) => "proxy",
        _ if s.network_access => "on",
        _ => "off",
    }
}
