//! The config file (`--config`, TOML): its keys, all optional and each named in an error, and
//! the re-reading of its policy on SIGHUP.

use super::LogFormat;
use crate::daemon::caller::auth::{TlsConfig, TokenConfig};
use crate::daemon::caller::identity::RootCallers;
use crate::daemon::caller::rules::PolicyConfig;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// The config file's keys (all optional).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub(super) struct FileConfig {
    pub(super) listen: Option<String>,
    pub(super) socket_mode: Option<String>,
    pub(super) log_format: Option<LogFormat>,
    pub(super) log_level: Option<String>,
    pub(super) session_idle_timeout: Option<u64>,
    pub(super) max_sessions: Option<u64>,
    pub(super) shutdown_grace: Option<u64>,
    pub(super) allow_degraded: Option<Vec<String>>,
    pub(super) allow_escalation: Option<bool>,
    pub(super) profiles_dir: Option<PathBuf>,
    pub(super) root_callers: Option<RootCallers>,
    pub(super) insecure_loopback_tcp: Option<bool>,
    pub(super) audit_log: Option<String>,
    pub(super) policy: Option<PolicyConfig>,
    pub(super) tls: Option<TlsConfig>,
    pub(super) tokens: Option<Vec<TokenConfig>>,
    pub(super) metrics_listen: Option<std::net::SocketAddr>,
    pub(super) metrics_public: Option<bool>,
    pub(super) health_listen: Option<std::net::SocketAddr>,
    /// Seconds a ShellStream client may leave output unread before its command is cancelled.
    pub(super) stream_stall_timeout: Option<u64>,
    /// The egress proxy of NETWORK_MODE_PROXY sessions.
    pub(super) egress: Option<crate::daemon::egress::EgressConfig>,
}

/// Re-reads the policy from the config file (SIGHUP); an error keeps the running policy.
pub fn reload_policy(path: &Path) -> Result<PolicyConfig, String> {
    let file = read_file_config(path)?;
    let policy = file.policy.unwrap_or_default();
    policy
        .validate()
        .map_err(|e| format!("config file {}: {e}", path.display()))?;
    Ok(policy)
}

pub(super) fn read_file_config(path: &Path) -> Result<FileConfig, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read config file {}: {e}", path.display()))?;
    toml::from_str(&text).map_err(|e| format!("config file {}: {e}", path.display()))
}
