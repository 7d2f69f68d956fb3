//! The daemon's configuration: a TOML file (`--config`) whose every key also has a flag; flags
//! win over the file, the file over the defaults.

use crate::daemon::caller::auth::{TlsConfig, TokenConfig};
use crate::daemon::caller::identity::RootCallers;
use crate::daemon::caller::rules::PolicyConfig;
use crate::sandbox::profile::ProfileSet;
use crate::sandbox::report::Layer;
use clap::Args;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where the daemon listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    /// A Unix socket path (the default transport; peer credentials identify the caller).
    Unix(PathBuf),
    /// A TCP address; only loopback addresses until authenticated TCP exists.
    Tcp(std::net::SocketAddr),
}

impl std::str::FromStr for ListenAddr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err("unix: needs a socket path, e.g. unix:/run/corral/corral.sock".into());
            }
            // Absolute from the start: the `try:` line, the state paths and the masks then
            // name the socket wherever they are read from.
            let path = std::path::absolute(path)
                .map_err(|e| format!("unix:{path}: cannot make the path absolute: {e}"))?;
            return Ok(ListenAddr::Unix(path));
        }
        if let Some(addr) = s.strip_prefix("tcp:") {
            let addr: std::net::SocketAddr = addr
                .parse()
                .map_err(|e| format!("tcp:{addr} is not HOST:PORT ({e})"))?;
            return Ok(ListenAddr::Tcp(addr));
        }
        Err(format!(
            "listen address `{s}` must start with unix: or tcp: (e.g. unix:/run/corral/corral.sock, tcp:127.0.0.1:7878)"
        ))
    }
}

impl std::fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ListenAddr::Unix(p) => write!(f, "unix:{}", p.display()),
            ListenAddr::Tcp(a) => write!(f, "tcp:{a}"),
        }
    }
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

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

/// The config file's keys (all optional).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
struct FileConfig {
    listen: Option<String>,
    socket_mode: Option<String>,
    log_format: Option<LogFormat>,
    log_level: Option<String>,
    session_idle_timeout: Option<u64>,
    max_sessions: Option<u64>,
    shutdown_grace: Option<u64>,
    allow_degraded: Option<Vec<String>>,
    allow_escalation: Option<bool>,
    profiles_dir: Option<PathBuf>,
    root_callers: Option<RootCallers>,
    insecure_loopback_tcp: Option<bool>,
    audit_log: Option<String>,
    policy: Option<PolicyConfig>,
    tls: Option<TlsConfig>,
    tokens: Option<Vec<TokenConfig>>,
    metrics_listen: Option<std::net::SocketAddr>,
    metrics_public: Option<bool>,
    health_listen: Option<std::net::SocketAddr>,
    /// Seconds a ShellStream client may leave output unread before its command is cancelled.
    stream_stall_timeout: Option<u64>,
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

    /// Defaults ← config file ← flags. Errors name the file and the key.
    pub fn load(args: &ServeArgs) -> Result<Config, String> {
        let file = match &args.config {
            Some(path) => read_file_config(path)?,
            None => FileConfig::default(),
        };
        let listen = match (&args.listen, &file.listen) {
            (Some(l), _) => l.clone(),
            (None, Some(s)) => s.parse().map_err(|e| format!("config key `listen`: {e}"))?,
            (None, None) => default_listen()?,
        };
        let mut tls = file.tls.clone().unwrap_or_default();
        tls.cert = args.tls_cert.clone().or(tls.cert);
        tls.key = args.tls_key.clone().or(tls.key);
        tls.client_ca = args.tls_client_ca.clone().or(tls.client_ca);
        let tokens = file.tokens.clone().unwrap_or_default();
        let tls_on = match (&tls.cert, &tls.key) {
            (Some(_), Some(_)) => true,
            (None, None) => false,
            _ => return Err("tls: both tls_cert and tls_key are needed".into()),
        };
        crate::daemon::caller::auth::Credentials {
            clients: tls.clients.clone(),
            tokens: tokens.clone(),
        }
        .validate()?;
        if let ListenAddr::Tcp(addr) = &listen
            && !tls_on
        {
            if !addr.ip().is_loopback() {
                return Err(format!(
                    "refusing to listen on {addr}: plain TCP is only allowed on a loopback \
                     address; configure tls_cert and tls_key for authenticated TCP"
                ));
            }
            if !(args.insecure_loopback_tcp || file.insecure_loopback_tcp.unwrap_or(false)) {
                return Err(format!(
                    "refusing plain TCP on {addr}: it carries no caller identity, so any local \
                     user could act as this daemon's user. Use a Unix socket, configure \
                     tls_cert and tls_key, or pass --insecure-loopback-tcp for development"
                ));
            }
        }
        if !tls_on && (!tokens.is_empty() || !tls.clients.is_empty()) {
            return Err(
                "tokens and tls.clients need TLS (tls_cert and tls_key): a bearer \
                        token sent over plain TCP could be read by anyone on the path"
                    .into(),
            );
        }
        let mode_text = args
            .socket_mode
            .clone()
            .or(file.socket_mode)
            // As root, local users may connect: peer credentials say who they are and each
            // runs as themselves. Otherwise only the daemon's own user may.
            .unwrap_or_else(|| {
                if nix::unistd::geteuid().is_root() {
                    "0666"
                } else {
                    "0600"
                }
                .into()
            });
        let socket_mode = u32::from_str_radix(mode_text.trim_start_matches("0o"), 8)
            .ok()
            .filter(|m| *m <= 0o777)
            .ok_or_else(|| format!("socket_mode `{mode_text}` is not an octal mode like 0600"))?;
        let max_sessions = args.max_sessions.or(file.max_sessions).unwrap_or(1024);
        if max_sessions == 0 {
            return Err("max_sessions must be greater than zero".into());
        }
        let idle = args
            .session_idle_timeout
            .or(file.session_idle_timeout)
            .unwrap_or(3600);
        if idle == 0 {
            return Err("session_idle_timeout must be greater than zero".into());
        }
        let mut degraded_layers = Vec::new();
        for name in args
            .allow_degraded
            .clone()
            .or(file.allow_degraded)
            .unwrap_or_default()
        {
            let layer = Layer::ORDER
                .into_iter()
                .find(|l| l.as_str() == name)
                .filter(|l| l.can_be_degraded())
                .ok_or_else(|| {
                    format!(
                        "allow_degraded: `{name}` is not a layer that may be degraded \
                         (namespaces, identity, landlock, seccomp)"
                    )
                })?;
            degraded_layers.push(layer);
        }
        let profiles_dir = args.profiles_dir.clone().or(file.profiles_dir);
        let profiles = ProfileSet::load(profiles_dir.as_deref())?;
        let policy = file.policy.clone().unwrap_or_default();
        policy.validate().map_err(|e| match &args.config {
            Some(path) => format!("config file {}: {e}", path.display()),
            None => e,
        })?;
        let metrics_listen = args.metrics_listen.or(file.metrics_listen);
        if let Some(addr) = metrics_listen
            && !addr.ip().is_loopback()
            && !file.metrics_public.unwrap_or(false)
        {
            return Err(format!(
                "metrics_listen {addr} is not a loopback address; set metrics_public = true in \
                 the config file to expose metrics beyond this machine"
            ));
        }
        let stream_stall_timeout = match args.stream_stall_timeout.or(file.stream_stall_timeout) {
            Some(0) => return Err("stream_stall_timeout must be greater than zero".into()),
            Some(secs) => Duration::from_secs(secs),
            None => crate::daemon::pipeline::admit::DEFAULT_STREAM_STALL_TIMEOUT,
        };
        Ok(Config {
            health_listen: args.health_listen.or(file.health_listen),
            stream_stall_timeout,
            metrics_listen,
            tls,
            tokens,
            policy,
            audit_log: args.audit_log.clone().or(file.audit_log),
            root_callers: args
                .root_callers
                .or(file.root_callers)
                .unwrap_or(RootCallers::Confined),
            profiles,
            allow_escalation: args.allow_escalation || file.allow_escalation.unwrap_or(false),
            degraded_layers,
            config_file: args.config.clone(),
            listen,
            socket_mode,
            log_format: args
                .log_format
                .or(file.log_format)
                .unwrap_or(LogFormat::Text),
            log_level: args
                .log_level
                .clone()
                .or(file.log_level)
                .unwrap_or_else(|| "info".into()),
            session_idle_timeout: Duration::from_secs(idle),
            max_sessions: usize::try_from(max_sessions).unwrap_or(usize::MAX),
            shutdown_grace: Duration::from_secs(
                args.shutdown_grace.or(file.shutdown_grace).unwrap_or(10),
            ),
        })
    }
}

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

    /// TLS serves the TCP listener (a certificate and key are set, and the daemon listens on
    /// TCP).
    pub fn tls_enabled(&self) -> bool {
        self.tls.cert.is_some()
            && self.tls.key.is_some()
            && matches!(self.listen, ListenAddr::Tcp(_))
    }

    /// What `load` leaves to the moment they are used, checked up front so that a config that
    /// passes `--check-config` also starts: the TLS files hold what they should, the audit
    /// log's directory exists, and the socket's directory (if it exists yet) is one the daemon
    /// will accept. Reads files; binds and creates nothing.
    pub fn check_files(&self) -> Result<(), String> {
        if let Some(cert) = &self.tls.cert {
            let chain = pem_certificates(cert, "tls_cert")?;
            // rustls clients (the CLI and tonic clients among them) refuse a CA certificate
            // as a server's, with a cryptic CaUsedAsEndEntity: say so at start instead.
            if chain[0].parse_x509().is_ok_and(|leaf| leaf.is_ca()) {
                return Err(format!(
                    "tls_cert: the first certificate in {} is a CA certificate \
                     (basicConstraints CA:TRUE), which TLS clients refuse as a server's; issue \
                     one with CA:FALSE (e.g. openssl req -x509 ... -addext \
                     basicConstraints=critical,CA:FALSE)",
                    cert.display()
                ));
            }
        }
        if let Some(ca) = &self.tls.client_ca {
            pem_certificates(ca, "tls_client_ca")?;
        }
        if let Some(key) = &self.tls.key {
            let text = std::fs::read(key)
                .map_err(|e| format!("tls_key: cannot read {}: {e}", key.display()))?;
            let has_key = x509_parser::pem::Pem::iter_from_buffer(&text)
                .any(|p| p.is_ok_and(|p| p.label.ends_with("PRIVATE KEY")));
            if !has_key {
                return Err(format!(
                    "tls_key: {} holds no PEM private key (-----BEGIN PRIVATE KEY-----)",
                    key.display()
                ));
            }
        }
        if let Some(log) = self.audit_log.as_deref().filter(|l| *l != "-") {
            let dir = Path::new(log)
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            if !dir.is_dir() {
                return Err(format!(
                    "audit_log: the directory of {log} does not exist; create {} first",
                    dir.display()
                ));
            }
        }
        if let ListenAddr::Unix(socket) = &self.listen
            && socket.parent().is_some_and(|d| d.is_dir())
        {
            crate::socket::check_dir(socket, nix::unistd::geteuid().as_raw())?;
        }
        Ok(())
    }
}

/// The certificates in a PEM file (at least one, each parsed); errors name the key and file.
pub fn pem_certificates(path: &Path, key: &str) -> Result<Vec<x509_parser::pem::Pem>, String> {
    let text =
        std::fs::read(path).map_err(|e| format!("{key}: cannot read {}: {e}", path.display()))?;
    let mut certs = Vec::new();
    for pem in x509_parser::pem::Pem::iter_from_buffer(&text) {
        let pem = pem.map_err(|e| format!("{key}: {} is not valid PEM: {e}", path.display()))?;
        if pem.label != "CERTIFICATE" {
            continue;
        }
        pem.parse_x509().map_err(|e| {
            format!(
                "{key}: a certificate in {} does not parse: {e}",
                path.display()
            )
        })?;
        certs.push(pem);
    }
    if certs.is_empty() {
        return Err(format!(
            "{key}: {} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            path.display()
        ));
    }
    Ok(certs)
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

fn read_file_config(path: &Path) -> Result<FileConfig, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read config file {}: {e}", path.display()))?;
    toml::from_str(&text).map_err(|e| format!("config file {}: {e}", path.display()))
}

/// Where the daemon listens without `--listen` or a `listen` key: the socket rule
/// (`socket::choose`), i.e. `CORRAL_SOCKET`, else `$XDG_RUNTIME_DIR/corral/corral.sock`,
/// else `/run/corral/corral.sock` as root. A daemon that is not root and has neither refuses to
/// start rather than falling back to `/tmp`.
pub fn default_listen() -> Result<ListenAddr, String> {
    let address = crate::socket::choose(None, crate::socket::Side::Daemon)?;
    if address.starts_with("unix:") || address.starts_with("tcp:") {
        return address
            .parse()
            .map_err(|e| format!("{}: {e}", crate::socket::SOCKET_ENV));
    }
    // Clients accept a bare socket path in CORRAL_SOCKET, so the daemon does too.
    Ok(ListenAddr::Unix(PathBuf::from(address)))
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

    #[test]
    fn listen_addresses_parse() {
        assert_eq!(
            "unix:/x/y.sock".parse::<ListenAddr>().unwrap(),
            ListenAddr::Unix("/x/y.sock".into())
        );
        // A relative socket path is made absolute (the `try:` line works from anywhere).
        assert_eq!(
            "unix:rel.sock".parse::<ListenAddr>().unwrap(),
            ListenAddr::Unix(std::env::current_dir().unwrap().join("rel.sock"))
        );
        assert!("tcp:127.0.0.1:9".parse::<ListenAddr>().is_ok());
        assert!(
            "tcp:nohost"
                .parse::<ListenAddr>()
                .unwrap_err()
                .contains("HOST:PORT")
        );
        assert!(
            "/x.sock"
                .parse::<ListenAddr>()
                .unwrap_err()
                .contains("unix: or tcp:")
        );
    }

    #[test]
    fn plain_tcp_needs_the_insecure_flag() {
        let args = ServeArgs {
            listen: Some("tcp:127.0.0.1:7878".parse().unwrap()),
            ..Default::default()
        };
        assert!(
            Config::load(&args)
                .unwrap_err()
                .contains("--insecure-loopback-tcp")
        );
        let args = ServeArgs {
            insecure_loopback_tcp: true,
            ..args
        };
        assert!(Config::load(&args).is_ok());
    }

    #[test]
    fn non_loopback_tcp_is_refused() {
        let args = ServeArgs {
            listen: Some("tcp:0.0.0.0:7878".parse().unwrap()),
            ..Default::default()
        };
        assert!(Config::load(&args).unwrap_err().contains("loopback"));
        let args = ServeArgs {
            tls_cert: Some("/x.pem".into()),
            ..args
        };
        assert!(
            Config::load(&args)
                .unwrap_err()
                .contains("both tls_cert and tls_key")
        );
    }

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

    #[test]
    fn flags_win_over_the_file_and_unknown_keys_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, "max_sessions = 5\nsession_idle_timeout = 7\n").unwrap();
        let args = ServeArgs {
            config: Some(file.clone()),
            max_sessions: Some(9),
            // Explicit, so the test does not depend on XDG_RUNTIME_DIR or the uid.
            listen: Some("unix:/run/corral/corral.sock".parse().unwrap()),
            ..Default::default()
        };
        let cfg = Config::load(&args).unwrap();
        assert_eq!(cfg.max_sessions, 9);
        assert_eq!(cfg.session_idle_timeout, Duration::from_secs(7));
        std::fs::write(&file, "max_sesions = 5\n").unwrap();
        let err = Config::load(&args).unwrap_err();
        assert!(err.contains("max_sesions"), "{err}");
    }
}
