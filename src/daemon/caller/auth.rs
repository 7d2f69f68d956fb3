//! Authenticated TCP: TLS (rustls) with the caller identified by a client certificate (mTLS,
//! its subject CN or a SAN mapped to a local user) or by a bearer token (stored as its SHA-256
//! in the config, mapped to a local user). Unix-socket callers are identified by peer
//! credentials instead (see `identity`). Failures are UNAUTHENTICATED with no detail that would
//! help guessing.

use crate::daemon::error::CallError;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::path::PathBuf;

/// The `[tls]` table.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM certificate chain of the server.
    pub cert: Option<PathBuf>,
    /// PEM private key of the server.
    pub key: Option<PathBuf>,
    /// PEM CA bundle that signs client certificates; enables mTLS.
    pub client_ca: Option<PathBuf>,
    /// Which client certificates map to which local users.
    #[serde(default)]
    pub clients: Vec<ClientMapping>,
}

/// A client certificate → local user rule: the certificate's subject CN or one of its SANs
/// (DNS, email, URI) must equal `name`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClientMapping {
    pub name: String,
    pub user: String,
    /// May this credential open danger-full-access sessions and have calls escalated (H19)?
    /// The daemon cannot see a TCP caller's process, and a sandbox can read the files its user
    /// keeps credentials in: by default a credential alone buys only sandboxed sessions.
    #[serde(default)]
    pub allow_danger_full_access: bool,
}

/// A bearer token: its SHA-256 (hex) and the local user it acts as.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    /// A label for logs and the audit trail (never the token itself).
    pub name: String,
    pub sha256: String,
    pub user: String,
    /// As for [`ClientMapping::allow_danger_full_access`].
    #[serde(default)]
    pub allow_danger_full_access: bool,
}

/// The credentials a TCP caller may present.
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    pub clients: Vec<ClientMapping>,
    pub tokens: Vec<TokenConfig>,
}

/// Who a TCP caller authenticated as: the local user and the credential's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub user: String,
    /// `token:NAME` or `cert:NAME`.
    pub credential: String,
    /// The mapping allows danger-full-access and escalation.
    pub full_access: bool,
}

fn unauthenticated() -> CallError {
    // One message for every failure: nothing tells a guesser what was wrong.
    CallError::Unauthenticated(
        "authentication required: present a valid client certificate or token".into(),
    )
}

/// SHA-256 of a token, lowercase hex (how the config stores it).
pub fn token_hash(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Compares without an early exit, so timing does not reveal how much matched.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Credentials {
    /// Checks the configuration: hashes are 64 hex digits, names and users non-empty.
    pub fn validate(&self) -> Result<(), String> {
        for t in &self.tokens {
            if t.sha256.len() != 64 || !t.sha256.chars().all(|c| c.is_ascii_hexdigit()) {
                return Err(format!(
                    "tokens `{}`: sha256 must be 64 hex digits (the SHA-256 of the token, e.g. \
                     from `printf %s TOKEN | sha256sum`)",
                    t.name
                ));
            }
            if t.user.is_empty() {
                return Err(format!("tokens `{}`: user is required", t.name));
            }
        }
        for c in &self.clients {
            if c.name.is_empty() || c.user.is_empty() {
                return Err("tls.clients: every mapping needs a name and a user".into());
            }
        }
        Ok(())
    }

    /// Authenticates a TCP request: a bearer token wins; else the client certificate.
    pub fn authenticate<T>(&self, request: &tonic::Request<T>) -> Result<Principal, CallError> {
        if let Some(value) = request.metadata().get("authorization") {
            let token = value
                .to_str()
                .ok()
                .and_then(|v| v.strip_prefix("Bearer "))
                .ok_or_else(unauthenticated)?;
            let hash = token_hash(token);
            return self
                .tokens
                .iter()
                .find(|t| {
                    constant_time_eq(t.sha256.to_ascii_lowercase().as_bytes(), hash.as_bytes())
                })
                .map(|t| Principal {
                    user: t.user.clone(),
                    credential: format!("token:{}", t.name),
                    full_access: t.allow_danger_full_access,
                })
                .ok_or_else(unauthenticated);
        }
        let certs = request.peer_certs().ok_or_else(unauthenticated)?;
        let leaf = certs.first().ok_or_else(unauthenticated)?;
        let names = certificate_names(leaf.as_ref()).ok_or_else(unauthenticated)?;
        self.clients
            .iter()
            .find(|m| names.iter().any(|n| n == &m.name))
            .map(|m| Principal {
                user: m.user.clone(),
                credential: format!("cert:{}", m.name),
                full_access: m.allow_danger_full_access,
            })
            .ok_or_else(unauthenticated)
    }
}

/// The subject CN and the DNS, email and URI SANs of a DER certificate.
fn certificate_names(der: &[u8]) -> Option<Vec<String>> {
    use x509_parser::prelude::*;
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    let mut names: Vec<String> = cert
        .subject()
        .iter_common_name()
        .filter_map(|cn| cn.as_str().ok().map(str::to_string))
        .collect();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(s) | GeneralName::RFC822Name(s) | GeneralName::URI(s) => {
                    names.push(s.to_string())
                }
                _ => {}
            }
        }
    }
    Some(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_compared_by_hash() {
        let creds = Credentials {
            clients: Vec::new(),
            tokens: vec![TokenConfig {
                name: "ci".into(),
                sha256: token_hash("s3cret"),
                user: "root".into(),
                allow_danger_full_access: false,
            }],
        };
        assert!(creds.validate().is_ok());
        let mut req = tonic::Request::new(());
        req.metadata_mut()
            .insert("authorization", "Bearer s3cret".parse().unwrap());
        let principal = creds.authenticate(&req).unwrap();
        assert_eq!(principal.credential, "token:ci");
        // H19: unless its mapping says so, a credential buys sandboxed sessions only.
        assert!(!principal.full_access);
        let mut bad = tonic::Request::new(());
        bad.metadata_mut()
            .insert("authorization", "Bearer s3cre".parse().unwrap());
        let err = creds.authenticate(&bad).unwrap_err();
        assert!(matches!(err, CallError::Unauthenticated(_)));
        // The same answer whatever was wrong: nothing to learn from it.
        let none = creds.authenticate(&tonic::Request::new(())).unwrap_err();
        assert_eq!(err.message(), none.message());
        assert!(matches!(none, CallError::Unauthenticated(_)));
    }

    #[test]
    fn bad_hashes_are_refused_at_load() {
        let creds = Credentials {
            clients: Vec::new(),
            tokens: vec![TokenConfig {
                name: "x".into(),
                sha256: "abc".into(),
                user: "u".into(),
                allow_danger_full_access: false,
            }],
        };
        assert!(creds.validate().unwrap_err().contains("64 hex digits"));
    }
}
