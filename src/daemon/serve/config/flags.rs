//! The `corral serve` flags. Every setting has one, named as its config-file key, and its help
//! text shows the default that applies without flag or key (a test holds them to `load`).

use super::{ListenAddr, LogFormat};
use crate::daemon::caller::identity::RootCallers;
use clap::Args;
use std::path::PathBuf;

/// `corral serve` flags. Each one overrides the config-file key of the same name
/// (with `-` for `_`). The `[default: ...]` in each help text is what applies when neither the
/// flag nor the key is given (a unit test keeps them equal to what `Config::load` does).
#[derive(Debug, Clone, Default, Args)]
pub struct ServeArgs {
    /// TOML config file; every key below may be set there (flags win). [default: none]
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Check the configuration (file and flags), print the effective settings and exit: 0 if
    /// it is valid, 2 with the error otherwise. Binds nothing and starts nothing.
    #[arg(long)]
    pub check_config: bool,
    /// Where to listen: unix:PATH or tcp:HOST:PORT (any address with TLS, else loopback only).
    /// The socket's directory must be owned by root or this user and not group/world-writable.
    /// [default: $CORRAL_SOCKET, else unix:/run/corral/corral.sock as root, else
    /// unix:$XDG_RUNTIME_DIR/corral/corral.sock]
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<ListenAddr>,
    /// Permissions of the Unix socket file, octal: as root local users connect and run as
    /// themselves, identified by peer credentials. [default: 0666 as root, else 0600]
    #[arg(long, value_name = "OCTAL")]
    pub socket_mode: Option<String>,
    /// Log format on stderr: text (colours only on a terminal) or json (every line a JSON
    /// object). [default: text]
    #[arg(long, value_enum)]
    pub log_format: Option<LogFormat>,
    /// Log filter (tracing EnvFilter syntax), e.g. info or corral=debug. [default: info]
    #[arg(long, value_name = "FILTER")]
    pub log_level: Option<String>,
    /// Seconds a session may stay unused before it expires. [default: 3600]
    #[arg(long, value_name = "SECS")]
    pub session_idle_timeout: Option<u64>,
    /// Most sessions open at once; OpenSession beyond it is RESOURCE_EXHAUSTED.
    /// [default: 1024]
    #[arg(long, value_name = "N")]
    pub max_sessions: Option<u64>,
    /// Seconds in-flight calls get to finish after SIGTERM/SIGINT before they are cancelled.
    /// [default: 10]
    #[arg(long, value_name = "SECS")]
    pub shutdown_grace: Option<u64>,
    /// Seconds a ShellStream client may leave a command's output unread before the command is
    /// cancelled (until then it is paused). [default: 30]
    #[arg(long, value_name = "SECS")]
    pub stream_stall_timeout: Option<u64>,
    /// Sandbox layers that may be missing on this host (degraded mode): namespaces, identity,
    /// landlock, seccomp. Sandboxed calls otherwise fail closed when one cannot be applied.
    /// [default: none]
    #[arg(long, value_name = "LAYER", value_delimiter = ',')]
    pub allow_degraded: Option<Vec<String>>,
    /// Let calls that ask for escalation (`sandbox_permissions: "require_escalated"`) run in
    /// danger-full-access; otherwise such calls are refused. [default: off]
    #[arg(long)]
    pub allow_escalation: bool,
    /// A directory of sandbox profiles (`NAME.toml`) replacing or adding to the built-in
    /// read-only, workspace-write and danger-full-access profiles. [default: none]
    #[arg(long, value_name = "DIR")]
    pub profiles_dir: Option<PathBuf>,
    /// How root callers are treated: confined (sandboxed modes only), trusted (every mode,
    /// escalation too) or deny. [default: confined]
    #[arg(long, value_enum)]
    pub root_callers: Option<RootCallers>,
    /// Allow plain TCP on loopback: every local user could then act as the daemon's user.
    /// Only for development; use a Unix socket (peer credentials identify the caller).
    /// [default: off]
    #[arg(long)]
    pub insecure_loopback_tcp: bool,
    /// Audit log: a file (one JSON line per call; reopened on SIGHUP) or `-` for stdout.
    /// [default: off]
    #[arg(long, value_name = "FILE")]
    pub audit_log: Option<String>,
    /// TLS certificate chain (PEM) for TCP. With --tls-key, TCP may listen on any address and
    /// callers authenticate with a client certificate or a bearer token (see [tls] and
    /// [[tokens]] in the config file for the mappings to local users). [default: none]
    #[arg(long, value_name = "PEM")]
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM) for TCP. [default: none]
    #[arg(long, value_name = "PEM")]
    pub tls_key: Option<PathBuf>,
    /// CA bundle (PEM) that signs client certificates; enables mTLS. [default: none]
    #[arg(long, value_name = "PEM")]
    pub tls_client_ca: Option<PathBuf>,
    /// Serve Prometheus metrics on this address (HTTP `/metrics`); a non-loopback address
    /// needs metrics_public = true in the config file. [default: off]
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Also serve grpc.health.v1, and nothing else, over plain TCP on this address: what
    /// Kubernetes' native `grpc:` probe dials (it speaks neither TLS nor Unix sockets).
    /// [default: off]
    #[arg(long, value_name = "HOST:PORT")]
    pub health_listen: Option<std::net::SocketAddr>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::serve::config::Config;

    /// `corral serve --help` shows a default for every setting, and it is the one `load`
    /// applies when neither a flag nor a key is given.
    #[test]
    fn serve_help_shows_the_defaults_that_load_applies() {
        use clap::Args as _;
        let command = ServeArgs::augment_args(clap::Command::new("serve"));
        let cfg = Config::load(&ServeArgs {
            // Explicit, so the test does not depend on XDG_RUNTIME_DIR or the uid.
            listen: Some("unix:/run/corral/corral.sock".parse().unwrap()),
            ..Default::default()
        })
        .unwrap();
        let off = |on: bool| if on { "on" } else { "off" }.to_string();
        let none = |empty: bool| {
            assert!(empty, "a setting without flag or key is not empty");
            "none".to_string()
        };
        let expected: Vec<(&str, String)> = vec![
            ("config", none(cfg.config_file.is_none())),
            ("log_format", format!("{:?}", cfg.log_format).to_lowercase()),
            ("log_level", cfg.log_level.clone()),
            (
                "session_idle_timeout",
                cfg.session_idle_timeout.as_secs().to_string(),
            ),
            ("max_sessions", cfg.max_sessions.to_string()),
            ("shutdown_grace", cfg.shutdown_grace.as_secs().to_string()),
            (
                "stream_stall_timeout",
                cfg.stream_stall_timeout.as_secs().to_string(),
            ),
            ("allow_degraded", none(cfg.degraded_layers.is_empty())),
            ("allow_escalation", off(cfg.allow_escalation)),
            ("profiles_dir", "none".into()),
            (
                "root_callers",
                clap::ValueEnum::to_possible_value(&cfg.root_callers)
                    .unwrap()
                    .get_name()
                    .to_string(),
            ),
            ("insecure_loopback_tcp", "off".into()),
            ("audit_log", off(cfg.audit_log.is_some())),
            ("tls_cert", none(cfg.tls.cert.is_none())),
            ("tls_key", none(cfg.tls.key.is_none())),
            ("tls_client_ca", none(cfg.tls.client_ca.is_none())),
            ("metrics_listen", off(cfg.metrics_listen.is_some())),
            ("health_listen", off(cfg.health_listen.is_some())),
        ];
        let mut seen = 0;
        for arg in command.get_arguments() {
            let id = arg.get_id().as_str();
            if id == "check_config" {
                continue; // an action, not a setting
            }
            let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
            let shown = help
                .rsplit_once("[default: ")
                .and_then(|(_, d)| d.strip_suffix(']'))
                .unwrap_or_else(|| panic!("--{id}: its help shows no default: {help}"));
            match id {
                // They depend on who runs the daemon: both cases are named.
                "listen" => assert!(
                    shown.contains("unix:/run/corral/corral.sock as root")
                        && shown.contains("$XDG_RUNTIME_DIR/corral/corral.sock"),
                    "{shown}"
                ),
                "socket_mode" => {
                    assert!(
                        shown.contains(&format!("{:04o}", cfg.socket_mode)),
                        "{shown}"
                    )
                }
                _ => {
                    let want = expected
                        .iter()
                        .find(|(k, _)| *k == id)
                        .unwrap_or_else(|| panic!("--{id}: no expected default in this test"));
                    assert_eq!(shown, want.1, "--{id}");
                    seen += 1;
                }
            }
        }
        assert_eq!(seen, expected.len(), "a flag in this test no longer exists");
    }
}
