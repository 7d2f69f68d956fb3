//! The effective settings as an operator reads them, at start and from `--check-config`: one
//! row each for where the config came from, how callers reach and authenticate, health, the
//! policy in one line, the audit log, metrics and logging.

use super::{Config, ListenAddr, LogFormat};
use std::path::Path;

impl Config {
    /// The effective settings an operator wants to see at start and from `--check-config`, as
    /// (name, value) rows: where the config came from, how callers reach and authenticate,
    /// the policy in one line, and where the audit log and metrics go.
    pub fn summary(&self) -> Vec<(&'static str, String)> {
        let config = match &self.config_file {
            Some(path) => path.display().to_string(),
            None => "none (built-in defaults and flags)".into(),
        };
        let transport = match &self.listen {
            ListenAddr::Unix(_) => format!(
                "Unix socket, mode {:04o} when the daemon binds it; peer credentials say who \
                 calls",
                self.socket_mode
            ),
            ListenAddr::Tcp(_) if self.tls_enabled() => {
                let mut ways = Vec::new();
                if let Some(ca) = &self.tls.client_ca {
                    ways.push(format!(
                        "client certificates signed by {} ({} mapped to users)",
                        ca.display(),
                        self.tls.clients.len()
                    ));
                }
                if !self.tokens.is_empty() {
                    ways.push(format!("bearer tokens ({})", self.tokens.len()));
                }
                let ways = if ways.is_empty() {
                    "nothing: every call is UNAUTHENTICATED until [[tokens]], or tls_client_ca \
                     with [[tls.clients]], are configured"
                        .to_string()
                } else {
                    ways.join(" or ")
                };
                format!(
                    "TLS with {}; callers authenticate with {ways}",
                    self.tls.cert.as_deref().unwrap_or(Path::new("")).display()
                )
            }
            ListenAddr::Tcp(_) => {
                "plain TCP on loopback (insecure_loopback_tcp): no caller identity, every call \
                 runs as this daemon's user"
                    .into()
            }
        };
        let health = match self.health_listen {
            Some(addr) => format!(
                "grpc.health.v1 on the listen address, and alone on plain TCP {addr} (probes)"
            ),
            None => "grpc.health.v1 on the listen address".into(),
        };
        let rule = self.policy.rule_for(None, &[]);
        let modes: Vec<&str> = rule.modes.iter().map(|m| m.as_str()).collect();
        let degraded: Vec<&str> = self.degraded_layers.iter().map(|l| l.as_str()).collect();
        let root = clap::ValueEnum::to_possible_value(&self.root_callers)
            .map(|v| v.get_name().to_string())
            .unwrap_or_default();
        let policy = format!(
            "modes {} by default; escalation {}; root callers {root}; degraded layers allowed: \
             {}; {} user and {} group rule(s); at most {} sessions ({} per user by default), \
             idle after {} s",
            modes.join(", "),
            if self.allow_escalation && rule.allow_escalation {
                "allowed"
            } else if self.allow_escalation {
                "allowed only where a rule says so"
            } else {
                "off"
            },
            if degraded.is_empty() {
                "none".to_string()
            } else {
                degraded.join(", ")
            },
            self.policy.users.len(),
            self.policy.groups.len(),
            self.max_sessions,
            rule.max_sessions,
            self.session_idle_timeout.as_secs(),
        );
        let audit = match self.audit_log.as_deref() {
            None => "off".to_string(),
            Some("-") => "stdout".to_string(),
            Some(path) => path.to_string(),
        };
        let metrics = match self.metrics_listen {
            Some(addr) => format!("http://{addr}/metrics"),
            None => "off".into(),
        };
        let log = format!(
            "{} on stderr, level {}",
            match self.log_format {
                LogFormat::Text => "text",
                LogFormat::Json => "json",
            },
            self.log_level
        );
        vec![
            ("config", config),
            ("listen", self.listen.to_string()),
            ("transport", transport),
            ("health", health),
            ("policy", policy),
            ("audit", audit),
            ("metrics", metrics),
            ("log", log),
        ]
    }
}
