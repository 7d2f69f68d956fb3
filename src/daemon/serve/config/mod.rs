//! The daemon's configuration: a TOML file (`--config`) whose every key also has a flag; flags
//! win over the file, the file over the defaults.
//!
//! This file is the effective [`Config`] and what follows from it (corral's own state paths,
//! the warnings an operator must hear, whether TLS serves). The rest, one room each:
//! - `flags`: the `corral serve` flags ([`ServeArgs`]), each help text naming its default;
//! - `file`: the config file's keys, read at start and re-read for the policy (SIGHUP);
//! - `listen`: where the daemon listens ([`ListenAddr`]) and where by default;
//! - `load`: defaults ← config file ← flags, validated, into a `Config`;
//! - `summary`: the effective settings as an operator reads them (start-up, `--check-config`);
//! - `check`: what `load` leaves to the moment of use (the TLS files, the audit log's and the
//!   socket's directories), checked up front.

mod check;
mod file;
mod flags;
mod listen;
mod load;
mod summary;

pub use check::pem_certificates;
pub use file::reload_policy;
pub use flags::ServeArgs;
pub use listen::ListenAddr;

use crate::daemon::caller::auth::{TlsConfig, TokenConfig};
use crate::daemon::caller::identity::RootCallers;
use crate::daemon::caller::rules::PolicyConfig;
use crate::sandbox::profile::ProfileSet;
use crate::sandbox::report::Layer;
use serde::Deserialize;
use std::path::PathBuf;
use std::time::Duration;

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

/// The effective configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: ListenAddr,
    pub socket_mode: u32,
    pub log_format: LogFormat,
    pub log_level: String,
    pub session_idle_timeout: Duration,
    pub max_sessions: usize,
    pub shutdown_grace: Duration,
    /// Layers allowed to be missing (explicit operator choice).
    pub degraded_layers: Vec<Layer>,
    /// The config file, if any (part of corral's own state, hidden from sandboxes).
    pub config_file: Option<PathBuf>,
    /// Escalated calls may run in danger-full-access.
    pub allow_escalation: bool,
    /// The sandbox profiles (built-ins plus the operator's directory).
    pub profiles: ProfileSet,
    /// How root callers are treated.
    pub root_callers: RootCallers,
    /// The audit log target (a path or `-`), if any.
    pub audit_log: Option<String>,
    /// The operator policy (`[policy]` tables of the config file).
    pub policy: PolicyConfig,
    /// TLS for TCP (certificate, key, client CA, certificate → user mappings).
    pub tls: TlsConfig,
    /// Bearer tokens (hashed) → users.
    pub tokens: Vec<TokenConfig>,
    /// Where Prometheus metrics are served, if anywhere.
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// How long a ShellStream client may stop reading before its call is cancelled.
    pub stream_stall_timeout: Duration,
    /// Where grpc.health.v1 alone is served over plain TCP (Kubernetes probes), if anywhere.
    pub health_listen: Option<std::net::SocketAddr>,
    /// The egress proxy's `[egress]` table (checked at start-up).
    pub egress: crate::daemon::egress::EgressConfig,
}

impl Config {
    /// The directory of the Unix socket the daemon listens on (canonical when it exists).
    pub fn socket_dir(&self) -> Option<PathBuf> {
        match &self.listen {
            ListenAddr::Unix(socket) => socket
                .parent()
                .map(|dir| std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf())),
            _ => None,
        }
    }

    /// corral's own state: the socket's directory and the config file. Masked in every sandbox;
    /// no writable root may contain it (spec/sandbox.md §2.2, §2.8).
    pub fn state_paths(&self) -> Vec<PathBuf> {
        let mut paths: Vec<PathBuf> = self.socket_dir().into_iter().collect();
        if let Some(file) = &self.config_file {
            paths.push(std::fs::canonicalize(file).unwrap_or_else(|_| file.clone()));
        }
        for key in [&self.tls.key, &self.tls.cert].into_iter().flatten() {
            paths.push(std::fs::canonicalize(key).unwrap_or_else(|_| key.clone()));
        }
        if let Some(log) = self.audit_log.as_deref().filter(|l| *l != "-") {
            let log = PathBuf::from(log);
            paths.push(std::fs::canonicalize(&log).unwrap_or(log));
        }
        // A path inside another is hidden with it (and a mount on it would fail).
        let all = paths.clone();
        paths.retain(|p| !all.iter().any(|q| q != p && p.starts_with(q)));
        paths.dedup();
        paths
    }

    /// What an operator must hear before the first session: state under /tmp, which every
    /// workspace-write session gets as a writable root by default, and no root may contain
    /// corral's own state, so each such session would be refused.
    pub fn warnings(&self) -> Vec<String> {
        self.state_paths()
            .iter()
            .filter(|p| p.starts_with("/tmp"))
            .map(|p| {
                format!(
                    "corral's own state {} lies under /tmp: every workspace-write session (which \
                     gets /tmp as a writable root) will be refused unless it excludes /tmp \
                     (exclude_slash_tmp, `--exclude-slash-tmp`); keep state elsewhere, e.g. \
                     /var/log/corral or /run/corral",
                    p.display()
                )
            })
            .collect()
    }

    /// TLS serves the TCP listener (a certificate and key are set, and the daemon listens on
    /// TCP).
    pub fn tls_enabled(&self) -> bool {
        self.tls.cert.is_some()
            && self.tls.key.is_some()
            && matches!(self.listen, ListenAddr::Tcp(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_under_tmp_is_warned_about() {
        let args = |audit: &str| ServeArgs {
            listen: Some("unix:/run/corral-t/corral.sock".parse().unwrap()),
            audit_log: Some(audit.into()),
            ..ServeArgs::default()
        };
        let warned = Config::load(&args("/tmp/x/audit.jsonl"))
            .unwrap()
            .warnings();
        assert_eq!(warned.len(), 1, "{warned:?}");
        assert!(warned[0].contains("/tmp/x/audit.jsonl lies under /tmp"));
        assert!(
            Config::load(&args("/var/log/corral/audit.jsonl"))
                .unwrap()
                .warnings()
                .is_empty()
        );
    }
}
