//! What `load` leaves to the moment of use, checked up front so that a config that passes
//! `--check-config` also starts: the TLS certificate, key and client CA hold what they should,
//! the audit log's directory exists, and the socket's directory is one the daemon accepts.

use super::{Config, ListenAddr};
use std::path::Path;

impl Config {
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
