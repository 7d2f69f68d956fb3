//! Who is calling: the Unix socket's peer credentials, turned into the identity the session's
//! worker runs as (uid, primary gid and supplementary groups from the user and group databases).

use crate::daemon::error::CallError;
use crate::sandbox::policy::Identity;
use crate::sync::LockExt;
use nix::unistd::{Gid, Uid, User};
use std::ffi::CString;
use tonic::Request;

/// The caller of one RPC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    /// The calling process, when the transport tells (Unix sockets do).
    pub pid: Option<i32>,
    /// For authenticated TCP: the index of the credential used (see `Authenticator::name`).
    pub credential: Option<usize>,
    /// An authenticated TCP caller whose credential's mapping does not allow
    /// danger-full-access (H19): it may have it from a file a sandbox read.
    pub credential_sandboxed_only: bool,
}

/// How root callers are treated (an explicit operator rule, not default trust).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum RootCallers {
    /// Root may use the sandboxed modes only; it runs confined, with every capability dropped.
    Confined,
    /// Root may use every mode, danger-full-access and escalation included.
    Trusted,
    /// Root callers are refused.
    Deny,
}

/// Identifies callers: Unix sockets by peer credentials; TCP by TLS client certificate or
/// bearer token when TLS is configured, else (explicit insecure loopback mode) as the daemon's
/// own user.
#[derive(Debug, Clone, Default)]
pub struct Authenticator {
    /// `Some` when TCP is served over TLS: who may authenticate, and as whom.
    pub credentials: Option<crate::daemon::caller::auth::Credentials>,
    /// Credential names seen so far, indexed by `Caller::credential` (for the audit log).
    names: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Authenticator {
    pub fn new(credentials: Option<crate::daemon::caller::auth::Credentials>) -> Self {
        Self {
            credentials,
            names: Default::default(),
        }
    }

    /// The credential name behind `Caller::credential`.
    pub fn name(&self, index: usize) -> Option<String> {
        self.names.locked().get(index).cloned()
    }

    fn remember(&self, name: String) -> usize {
        let mut names = self.names.locked();
        match names.iter().position(|n| *n == name) {
            Some(i) => i,
            None => {
                names.push(name);
                names.len() - 1
            }
        }
    }

    /// The caller of `request`.
    pub fn caller_of<T>(&self, request: &Request<T>) -> Result<Caller, CallError> {
        if let Some(info) = request
            .extensions()
            .get::<tonic::transport::server::UdsConnectInfo>()
        {
            let cred = info.peer_cred.ok_or_else(|| {
                CallError::Unauthenticated(
                    "the Unix socket did not report the caller's credentials".into(),
                )
            })?;
            return Ok(Caller {
                uid: cred.uid(),
                gid: cred.gid(),
                pid: cred.pid(),
                credential: None,
                credential_sandboxed_only: false,
            });
        }
        let Some(credentials) = &self.credentials else {
            // Plain TCP, allowed only by the operator's explicit insecure loopback flag.
            return Ok(Caller {
                uid: nix::unistd::geteuid().as_raw(),
                gid: nix::unistd::getegid().as_raw(),
                pid: None,
                credential: None,
                credential_sandboxed_only: false,
            });
        };
        let principal = credentials.authenticate(request)?;
        let user = User::from_name(&principal.user)
            .map_err(|e| CallError::Internal(format!("cannot read the user database: {e}")))?
            .ok_or_else(|| {
                tracing::error!(credential = %principal.credential, user = %principal.user, "credential maps to an unknown user");
                CallError::Unauthenticated(
                    "authentication required: present a valid client certificate or token".into(),
                )
            })?;
        Ok(Caller {
            uid: user.uid.as_raw(),
            gid: user.gid.as_raw(),
            pid: None,
            credential: Some(self.remember(principal.credential)),
            credential_sandboxed_only: !principal.full_access,
        })
    }
}

/// The identity a caller's worker runs as. A root daemon becomes the caller; a daemon that is
/// not root serves its own uid only — root included, which it could not become, and which
/// must not get its agent's files written as another user.
pub fn worker_identity(
    caller: Caller,
    root_callers: RootCallers,
) -> Result<Option<Identity>, CallError> {
    worker_identity_of(nix::unistd::geteuid().as_raw(), caller, root_callers)
}

fn worker_identity_of(
    daemon_uid: u32,
    caller: Caller,
    root_callers: RootCallers,
) -> Result<Option<Identity>, CallError> {
    if daemon_uid != 0 {
        if caller.uid != daemon_uid {
            return Err(CallError::Denied(format!(
                "this daemon runs as uid {daemon_uid}, not root, and serves only uid \
                 {daemon_uid} (caller is uid {}); start your own corral daemon, or run corral as \
                 root to serve several users",
                caller.uid
            )));
        }
        return Ok(None);
    }
    if caller.uid == 0 {
        return match root_callers {
            RootCallers::Deny => Err(CallError::Denied(
                "root callers are refused by this daemon's root_callers rule (deny)".into(),
            )),
            // Root stays uid 0; the sandbox drops every capability (spec/sandbox.md §3.4).
            _ => Ok(None),
        };
    }
    let user = User::from_uid(Uid::from_raw(caller.uid))
        .map_err(|e| CallError::Internal(format!("cannot read the user database: {e}")))?
        .ok_or_else(|| {
            CallError::Denied(format!(
                "uid {} has no entry in the user database; corral serves only known users",
                caller.uid
            ))
        })?;
    let name = CString::new(user.name.as_bytes())
        .map_err(|_| CallError::Internal("user name contains a NUL byte".into()))?;
    let mut groups: Vec<u32> = nix::unistd::getgrouplist(&name, user.gid)
        .map_err(|e| CallError::Internal(format!("cannot read the groups of {}: {e}", user.name)))?
        .into_iter()
        .map(Gid::as_raw)
        .collect();
    groups.sort_unstable();
    groups.dedup();
    Ok(Some(Identity {
        uid: caller.uid,
        gid: user.gid.as_raw(),
        groups,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(uid: u32) -> Caller {
        Caller {
            uid,
            gid: uid,
            pid: Some(1),
            credential: None,
            credential_sandboxed_only: false,
        }
    }

    #[test]
    fn a_daemon_that_is_not_root_serves_only_its_own_uid() {
        for root_callers in [
            RootCallers::Confined,
            RootCallers::Trusted,
            RootCallers::Deny,
        ] {
            assert_eq!(
                worker_identity_of(1000, caller(1000), root_callers).unwrap(),
                None
            );
            for other in [0, 1001] {
                let err = worker_identity_of(1000, caller(other), root_callers).unwrap_err();
                assert!(matches!(err, CallError::Denied(_)));
                assert!(
                    err.message().contains("serves only uid 1000")
                        && err.message().contains(&format!("caller is uid {other}")),
                    "{}",
                    err.message()
                );
            }
        }
    }

    #[test]
    fn a_root_daemon_keeps_root_callers_as_root_or_refuses_them() {
        assert_eq!(
            worker_identity_of(0, caller(0), RootCallers::Confined).unwrap(),
            None
        );
        let err = worker_identity_of(0, caller(0), RootCallers::Deny).unwrap_err();
        assert!(matches!(err, CallError::Denied(_)));
    }
}
