//! How the effective configuration is made: each setting from its flag, else its config-file
//! key, else its default; then checked as a whole (TLS and TCP, tokens, modes, layers, the
//! policy), with errors that name the file and the key.

use super::file::{FileConfig, read_file_config};
use super::listen::default_listen;
use super::{Config, ListenAddr, LogFormat, ServeArgs};
use crate::daemon::caller::identity::RootCallers;
use crate::sandbox::profile::ProfileSet;
use crate::sandbox::report::Layer;
use std::time::Duration;

impl Config {
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
        let egress = file.egress.clone().unwrap_or_default();
        // Checked now, naming the key; the listeners are filled in when they are bound.
        egress.settings()?;
        Ok(Config {
            egress,
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

#[cfg(test)]
mod tests {
    use super::*;

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
