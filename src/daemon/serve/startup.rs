//! The start-up block: what an operator starting the daemon must see at once — version, the
//! effective configuration (`Config::summary`), the sandbox layers this host enforces, anything
//! that needs attention, and a client command that works against this very daemon. Plain
//! aligned text on stderr, or one JSON object per line with `log_format = "json"`.

use crate::api::{Layer, LayerStatus};
use crate::daemon::error::CallError;
use crate::daemon::serve::config::{Config, ListenAddr, LogFormat};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};

/// Prints the block for a daemon now serving on `bound` (the real address: a TCP port of 0 is
/// resolved). `probe` is the host's sandbox report.
pub fn announce(config: &Config, bound: &ListenAddr, probe: &Result<Vec<Layer>, CallError>) {
    let uid = nix::unistd::geteuid().as_raw();
    let mut notes = notes(probe, uid);
    notes.extend(config.warnings());
    let bin = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "corral".into());
    let (try_line, auth) = try_line(&bin, config, bound);
    let mut rows = config.summary();
    // The bound address (the configured one may say port 0).
    if let Some(listen) = rows.iter_mut().find(|(k, _)| *k == "listen") {
        listen.1 = bound.to_string();
    }
    rows.insert(4, ("layers", layers(probe)));
    match config.log_format {
        LogFormat::Json => {
            let field = |name: &str| {
                rows.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.as_str())
                    .unwrap_or_default()
            };
            tracing::info!(
                version = env!("CARGO_PKG_VERSION"),
                config = field("config"),
                listen = field("listen"),
                transport = field("transport"),
                health = field("health"),
                layers = field("layers"),
                policy = field("policy"),
                audit = field("audit"),
                metrics = field("metrics"),
                log = field("log"),
                "try" = try_line.as_str(),
                auth = auth.as_deref().unwrap_or(""),
                "corral is serving"
            );
            for note in &notes {
                tracing::warn!("{note}");
            }
        }
        LogFormat::Text => {
            use std::io::Write;
            let mut text = format!("corral {} serving on {bound}\n", env!("CARGO_PKG_VERSION"));
            rows.push(("try", try_line));
            if let Some(auth) = auth {
                rows.push(("auth", auth));
            }
            for (key, value) in rows {
                text.push_str(&format!("  {:<10} {value}\n", format!("{key}:")));
            }
            for note in &notes {
                text.push_str(&format!("corral: {note}\n"));
            }
            // Not eprintln!: it panics when stderr is a closed pipe, and the daemon must keep
            // serving.
            let _ = std::io::stderr().write_all(text.as_bytes());
        }
    }
}

/// What a human starting the daemon must know beyond the summary: whether sandboxed sessions
/// work here (and if not, the fix), which layers run degraded, and, for a daemon that is not
/// root, whom it serves and how it sandboxes.
pub fn notes(probe: &Result<Vec<Layer>, CallError>, uid: u32) -> Vec<String> {
    let layers = match probe {
        Err(e) => {
            return vec![format!(
                "sandboxed sessions are unavailable on this host: read-only and workspace-write \
                 calls fail with FAILED_PRECONDITION (danger-full-access still works): {e}"
            )];
        }
        Ok(layers) => layers,
    };
    let mut notes = Vec::new();
    if uid != 0 {
        notes.push(format!(
            "running as uid {uid}, not root: serving only uid {uid}; sandboxed sessions run in \
             an unprivileged user namespace"
        ));
    }
    let degraded: Vec<&str> = layers
        .iter()
        .filter(|l| l.status == LayerStatus::Degraded as i32)
        .map(|l| l.name.as_str())
        .collect();
    if !degraded.is_empty() {
        notes.push(format!(
            "degraded mode: sandboxed sessions run without {} (see `corral capabilities`)",
            degraded.join(", ")
        ));
    }
    notes
}

/// The layers in one line: "all 7 enforced (...)" or each layer with its status.
fn layers(probe: &Result<Vec<Layer>, CallError>) -> String {
    let layers = match probe {
        Err(_) => return "unavailable: sandboxed calls fail closed (see below)".into(),
        Ok(layers) => layers,
    };
    let names: Vec<&str> = layers.iter().map(|l| l.name.as_str()).collect();
    if layers
        .iter()
        .all(|l| l.status == LayerStatus::Enforced as i32)
    {
        return format!("all {} enforced ({})", layers.len(), names.join(", "));
    }
    layers
        .iter()
        .map(|l| {
            let status = match LayerStatus::try_from(l.status) {
                Ok(LayerStatus::Enforced) => "enforced",
                Ok(LayerStatus::Degraded) => "DEGRADED",
                Ok(LayerStatus::Unavailable) => "UNAVAILABLE",
                _ => "not applicable",
            };
            format!("{} {status}", l.name)
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `BIN health ADDR-FLAGS   or   BIN list-dir ADDR-FLAGS .`, runnable as printed (paths
/// shell-quoted), and for TLS a line saying how the second command authenticates.
fn try_line(bin: &str, config: &Config, bound: &ListenAddr) -> (String, Option<String>) {
    let mut flags = vec!["--socket".to_string()];
    let mut auth = None;
    match bound {
        ListenAddr::Unix(path) => flags.push(path.display().to_string()),
        ListenAddr::Tcp(addr) => {
            let dial = dial_address(*addr);
            flags.push(format!("tcp:{dial}"));
            if config.tls_enabled() {
                let cert = config.tls.cert.clone().unwrap_or_default();
                let hints = tls_hints(&cert, config.tls.client_ca.as_deref(), dial.ip());
                flags.push("--tls-ca".into());
                match &hints.ca {
                    Some(ca) => flags.push(ca.display().to_string()),
                    None => flags.push("CA.pem".into()),
                }
                if let Some(name) = hints.server_name {
                    flags.extend(["--tls-server-name".into(), name]);
                }
                let mut how = format!(
                    "list-dir needs a credential: {}=<a token whose SHA-256 is in [[tokens]]>",
                    crate::socket::TOKEN_ENV
                );
                if config.tls.client_ca.is_some() {
                    how.push_str(
                        ", or --tls-cert/--tls-key of a client certificate named in \
                         [[tls.clients]]",
                    );
                }
                if hints.ca.is_none() {
                    how.push_str(&format!(
                        "; CA.pem: the CA certificate that signed {}",
                        cert.display()
                    ));
                }
                auth = Some(how);
            }
        }
    }
    let flags: Vec<String> = flags.iter().map(|f| shell_word(f)).collect();
    let bin = shell_word(bin);
    let flags = flags.join(" ");
    (
        format!("{bin} health {flags}   or   {bin} list-dir {flags} ."),
        auth,
    )
}

/// Where a client on this machine dials a TCP listener: its address, or loopback of the same
/// family for a wildcard one (0.0.0.0 is no certificate's name).
fn dial_address(addr: SocketAddr) -> SocketAddr {
    let ip = match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, addr.port())
}

/// What a client needs to verify this daemon's certificate.
#[derive(Debug, PartialEq)]
struct TlsHints {
    /// A file whose certificates include the root of the server's chain: the certificate file
    /// itself when its chain ends in a self-issued certificate, else the client CA file when
    /// that CA issued the chain's last certificate. None when neither is known to be.
    ca: Option<PathBuf>,
    /// A DNS name from the certificate, when it does not list the dialled IP address.
    server_name: Option<String>,
}

fn tls_hints(cert: &Path, client_ca: Option<&Path>, dialled: IpAddr) -> TlsHints {
    use x509_parser::prelude::*;
    let mut hints = TlsHints {
        ca: None,
        server_name: None,
    };
    let Ok(chain) = crate::daemon::serve::config::pem_certificates(cert, "tls_cert") else {
        return hints;
    };
    let parsed: Vec<X509Certificate<'_>> =
        chain.iter().filter_map(|p| p.parse_x509().ok()).collect();
    let (Some(leaf), Some(top)) = (parsed.first(), parsed.last()) else {
        return hints;
    };
    if top.subject() == top.issuer() {
        hints.ca = Some(cert.to_path_buf());
    } else if let Some(ca_file) = client_ca
        && let Ok(cas) = crate::daemon::serve::config::pem_certificates(ca_file, "tls_client_ca")
        && cas
            .iter()
            .filter_map(|p| p.parse_x509().ok())
            .any(|ca| ca.subject() == top.issuer())
    {
        hints.ca = Some(ca_file.to_path_buf());
    }
    let mut ips = Vec::new();
    let mut dns = Vec::new();
    if let Ok(Some(san)) = leaf.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                GeneralName::IPAddress(bytes) => ips.push(bytes.to_vec()),
                GeneralName::DNSName(name) if !name.starts_with('*') => dns.push(name.to_string()),
                _ => {}
            }
        }
    }
    let dialled_bytes = match dialled {
        IpAddr::V4(ip) => ip.octets().to_vec(),
        IpAddr::V6(ip) => ip.octets().to_vec(),
    };
    if !ips.contains(&dialled_bytes) {
        hints.server_name = dns.into_iter().next();
    }
    hints
}

/// `word` as one shell word: unchanged when it is made of characters no shell treats
/// specially, else single-quoted.
fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-:,@%+=".contains(c));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(name: &str, status: LayerStatus) -> Layer {
        Layer {
            name: name.into(),
            status: status as i32,
            detail: String::new(),
        }
    }

    #[test]
    fn notes_say_what_a_human_must_know() {
        let fine = Ok(vec![layer("landlock", LayerStatus::Enforced)]);
        assert!(notes(&fine, 0).is_empty());
        let user = notes(&fine, 1000);
        assert_eq!(user.len(), 1);
        assert!(
            user[0].contains("uid 1000, not root: serving only uid 1000"),
            "{user:?}"
        );
        let failed = notes(
            &Err(CallError::Unmet(
                "sandbox unavailable: namespaces could not be applied: x. Fix it.".into(),
            )),
            1000,
        );
        assert_eq!(failed.len(), 1);
        assert!(
            failed[0].contains("FAILED_PRECONDITION")
                && failed[0].ends_with("namespaces could not be applied: x. Fix it."),
            "{failed:?}"
        );
        let degraded = Ok(vec![
            layer("namespaces", LayerStatus::Degraded),
            layer("landlock", LayerStatus::Enforced),
        ]);
        assert_eq!(
            notes(&degraded, 0),
            vec![
                "degraded mode: sandboxed sessions run without namespaces (see `corral capabilities`)"
            ]
        );
    }

    #[test]
    fn the_layer_line_names_every_layer_not_enforced() {
        let all = Ok(vec![
            layer("namespaces", LayerStatus::Enforced),
            layer("landlock", LayerStatus::Enforced),
        ]);
        assert_eq!(layers(&all), "all 2 enforced (namespaces, landlock)");
        let some = Ok(vec![
            layer("namespaces", LayerStatus::Degraded),
            layer("identity", LayerStatus::NotApplicable),
            layer("landlock", LayerStatus::Enforced),
        ]);
        assert_eq!(
            layers(&some),
            "namespaces DEGRADED, identity not applicable, landlock enforced"
        );
        assert!(layers(&Err(CallError::Unmet("x".into()))).starts_with("unavailable"));
    }

    #[test]
    fn wildcard_listeners_are_dialled_on_loopback() {
        assert_eq!(
            dial_address("0.0.0.0:7878".parse().unwrap()),
            "127.0.0.1:7878".parse().unwrap()
        );
        assert_eq!(
            dial_address("[::]:7878".parse().unwrap()),
            "[::1]:7878".parse().unwrap()
        );
        assert_eq!(
            dial_address("10.1.2.3:7878".parse().unwrap()),
            "10.1.2.3:7878".parse().unwrap()
        );
    }

    #[test]
    fn shell_words_survive_a_shell() {
        assert_eq!(
            shell_word("/run/corral/corral.sock"),
            "/run/corral/corral.sock"
        );
        assert_eq!(shell_word("tcp:127.0.0.1:7878"), "tcp:127.0.0.1:7878");
        assert_eq!(shell_word("/a dir/it's"), r"'/a dir/it'\''s'");
        assert_eq!(shell_word(""), "''");
        let out = std::process::Command::new("sh")
            .args([
                "-c",
                &format!("printf %s {}", shell_word("/a dir/it's $HOME `x`")),
            ])
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "/a dir/it's $HOME `x`"
        );
    }
}
