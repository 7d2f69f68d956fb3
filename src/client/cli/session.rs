//! The session a command runs in: the one given with --session, or a temporary one opened from
//! the command's flags and closed afterwards; and the OpenSession request of `open-session`'s
//! (and `mcp`'s) flags.

use super::{Failure, ModeArg, NetworkArg, NetworkOpts, SessionOpts};
use crate::api::{self, sessions_client::SessionsClient};
use crate::client::connect::Connection;
use std::path::PathBuf;

/// The session to use: the given one, or a temporary one (closed afterwards).
pub(in crate::client) async fn open(
    channel: &Connection,
    opts: &SessionOpts,
) -> Result<(String, bool), Failure> {
    if let Some(id) = &opts.session {
        return Ok((id.clone(), false));
    }
    let cwd = match &opts.cwd {
        Some(dir) => {
            std::path::absolute(dir).map_err(|e| format!("--cwd {}: {e}", dir.display()))?
        }
        None => std::env::current_dir().map_err(|e| format!("current directory: {e}"))?,
    };
    let mode = match opts.mode {
        ModeArg::ReadOnly => api::SandboxMode::ReadOnly,
        ModeArg::WorkspaceWrite => api::SandboxMode::WorkspaceWrite,
        ModeArg::DangerFullAccess => api::SandboxMode::DangerFullAccess,
    };
    let resp = SessionsClient::new(channel.clone())
        .open_session(api::OpenSessionRequest {
            cwd: cwd.to_string_lossy().into_owned(),
            mode: mode as i32,
            approval_policy: opts
                .approval_policy
                .map_or(api::ApprovalPolicy::Unspecified, |p| p.api())
                as i32,
            exclude_slash_tmp: opts.exclude_slash_tmp,
            exclude_tmpdir_env_var: opts.exclude_tmpdir_env_var,
            ..Default::default()
        })
        .await?
        .into_inner();
    Ok((resp.session_id, true))
}

/// The OpenSession request of `open-session`'s (and `mcp`'s) flags.
pub(in crate::client) fn open_session_request(
    cwd: Option<PathBuf>,
    mode: ModeArg,
    writable_roots: &[PathBuf],
    network: &NetworkOpts,
    env: &[String],
) -> Result<api::OpenSessionRequest, String> {
    let cwd = absolute(cwd)?;
    let mut vars = std::collections::HashMap::new();
    for kv in env {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("--env {kv}: expected NAME=VALUE"))?;
        vars.insert(k.to_string(), v.to_string());
    }
    Ok(api::OpenSessionRequest {
        cwd: cwd.to_string_lossy().into_owned(),
        mode: mode_of(mode) as i32,
        writable_roots: writable_roots
            .iter()
            .map(|p| absolute(Some(p.clone())).map(|p| p.to_string_lossy().into_owned()))
            .collect::<Result<_, _>>()?,
        network_mode: match network.network {
            None => api::NetworkMode::Unspecified,
            Some(NetworkArg::Off) => api::NetworkMode::Off,
            Some(NetworkArg::On) => api::NetworkMode::On,
            Some(NetworkArg::Proxy) => api::NetworkMode::Proxy,
        } as i32,
        allow_domains: network.allow_domains.clone(),
        deny_domains: network.deny_domains.clone(),
        env: vars,
        ..Default::default()
    })
}

/// `dir` made absolute, or the current directory.
fn absolute(dir: Option<PathBuf>) -> Result<PathBuf, String> {
    match dir {
        Some(dir) => std::path::absolute(&dir).map_err(|e| format!("{}: {e}", dir.display())),
        None => std::env::current_dir().map_err(|e| format!("current directory: {e}")),
    }
}

fn mode_of(mode: ModeArg) -> api::SandboxMode {
    match mode {
        ModeArg::ReadOnly => api::SandboxMode::ReadOnly,
        ModeArg::WorkspaceWrite => api::SandboxMode::WorkspaceWrite,
        ModeArg::DangerFullAccess => api::SandboxMode::DangerFullAccess,
    }
}

pub(in crate::client) async fn close(channel: &Connection, id: &str, temporary: bool) {
    if temporary {
        let _ = SessionsClient::new(channel.clone())
            .close_session(api::CloseSessionRequest {
                session_id: id.to_string(),
            })
            .await;
    }
}
