//! Who is calling: the Unix socket's peer credentials, turned into the identity the session's
//! worker runs as (uid, primary gid and supplementary groups from the user and group databases).

use crate::sandbox::policy::Identity;
use nix::unistd::{Gid, Uid, User};
use std::ffi::CString;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use tonic::{Request, Status};

/// The caller of one RPC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    /// The calling process, when the transport tells (Unix sockets do).
    pub pid: Option<i32>,
    /// For authenticated TCP: the index of the credential used (see `Authenticator::name`).
    pub credential: Option<usize>,
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
    pub credentials: Option<crate::daemon::auth::Credentials>,
    /// Credential names seen so far, indexed by `Caller::credential` (for the audit log).
    names: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Authenticator {
    pub fn new(credentials: Option<crate::daemon::auth::Credentials>) -> Self {
        Self {
            credentials,
            names: Default::default(),
        }
    }

    /// The credential name behind `Caller::credential`.
    pub fn name(&self, index: usize) -> Option<String> {
        self.names
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(index)
            .cloned()
    }

    fn remember(&self, name: String) -> usize {
        let mut names = self.names.lock().unwrap_or_else(|p| p.into_inner());
        match names.iter().position(|n| *n == name) {
            Some(i) => i,
            None => {
                names.push(name);
                names.len() - 1
            }
        }
    }

    /// The caller of `request`.
    pub fn caller_of<T>(&self, request: &Request<T>) -> Result<Caller, Status> {
        if let Some(info) = request
            .extensions()
            .get::<tonic::transport::server::UdsConnectInfo>()
        {
            let cred = info.peer_cred.ok_or_else(|| {
                Status::unauthenticated("the Unix socket did not report the caller's credentials")
            })?;
            return Ok(Caller {
                uid: cred.uid(),
                gid: cred.gid(),
                pid: cred.pid(),
                credential: None,
            });
        }
        let Some(credentials) = &self.credentials else {
            // Plain TCP, allowed only by the operator's explicit insecure loopback flag.
            return Ok(Caller {
                uid: nix::unistd::geteuid().as_raw(),
                gid: nix::unistd::getegid().as_raw(),
                pid: None,
                credential: None,
            });
        };
        let principal = credentials.authenticate(request)?;
        let user = User::from_name(&principal.user)
            .map_err(|e| Status::internal(format!("cannot read the user database: {e}")))?
            .ok_or_else(|| {
                tracing::error!(credential = %principal.credential, user = %principal.user, "credential maps to an unknown user");
                Status::unauthenticated(
                    "authentication required: present a valid client certificate or token",
                )
            })?;
        Ok(Caller {
            uid: user.uid.as_raw(),
            gid: user.gid.as_raw(),
            pid: None,
            credential: Some(self.remember(principal.credential)),
        })
    }
}

/// The identity a caller's worker runs as. A root daemon becomes the caller; a daemon that is
/// not root can only serve its own user.
pub fn worker_identity(
    caller: Caller,
    root_callers: RootCallers,
) -> Result<Option<Identity>, Status> {
    let daemon_uid = nix::unistd::geteuid().as_raw();
    if caller.uid == 0 {
        return match root_callers {
            RootCallers::Deny => Err(Status::permission_denied(
                "root callers are refused by this daemon's root_callers rule (deny)",
            )),
            // Root stays uid 0; the sandbox drops every capability (spec/sandbox.md §3.4).
            _ => Ok(None),
        };
    }
    if daemon_uid != 0 {
        if caller.uid != daemon_uid {
            return Err(Status::permission_denied(format!(
                "this daemon runs as uid {daemon_uid} and can only serve that user (caller is \
                 uid {}); run corral as root to serve several users",
                caller.uid
            )));
        }
        return Ok(None);
    }
    let user = User::from_uid(Uid::from_raw(caller.uid))
        .map_err(|e| Status::internal(format!("cannot read the user database: {e}")))?
        .ok_or_else(|| {
            Status::permission_denied(format!(
                "uid {} has no entry in the user database; corral serves only known users",
                caller.uid
            ))
        })?;
    let name = CString::new(user.name.as_bytes())
        .map_err(|_| Status::internal("user name contains a NUL byte"))?;
    let mut groups: Vec<u32> = nix::unistd::getgrouplist(&name, user.gid)
        .map_err(|e| Status::internal(format!("cannot read the groups of {}: {e}", user.name)))?
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

/// Whether `identity` may read (and, if `write`, write) the directory `path` by its permission
/// bits — the default rule for a session's cwd and writable roots: only places the caller can
/// already use. `None` (root or the daemon's own user) may use anything the daemon may.
pub fn may_use(path: &Path, identity: Option<&Identity>, write: bool) -> bool {
    let Some(id) = identity else { return true };
    let Ok(meta) = std::fs::metadata(path) else {
        return false;
    };
    let mode = meta.mode();
    let (r, w, x) = if meta.uid() == id.uid {
        (0o400, 0o200, 0o100)
    } else if meta.gid() == id.gid || id.groups.contains(&meta.gid()) {
        (0o040, 0o020, 0o010)
    } else {
        (0o004, 0o002, 0o001)
    };
    let needed = if write { r | w | x } else { r | x };
    mode & needed == needed
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn permission_bits_decide_for_other_users() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        let me = nix::unistd::geteuid().as_raw();
        let stranger = Identity {
            uid: me + 4242,
            gid: 4242,
            groups: vec![4242],
        };
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert!(!may_use(p, Some(&stranger), false));
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(may_use(p, Some(&stranger), false));
        assert!(!may_use(p, Some(&stranger), true));
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(may_use(p, Some(&stranger), true));
        assert!(may_use(p, None, true));
    }
}
