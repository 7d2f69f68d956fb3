//! Is the process on the other end of the Unix socket itself sandboxed? A sandboxed command with
//! the network on may reach a corral daemon's socket; it must not obtain a less confined session
//! there (spec/sandbox.md §8.6 H7). A peer counts as sandboxed when it is more confined than the
//! daemon: `NoNewPrivs: 1` where the daemon has 0, a seccomp filter where the daemon has none (or
//! more filters than the daemon), or another pid or mount namespace than the daemon's.
//!
//! This fails closed: a peer that cannot be inspected (pid 0 because it lives in a pid namespace
//! the daemon cannot see, already exited, owned by another uid than the caller's credentials
//! say, unreadable) counts as sandboxed. TCP callers carry no pid and are not judged here: TCP
//! needs TLS or a token, which a sandbox does not have.

use crate::daemon::caller::identity::Caller;
use crate::daemon::error::CallError;
use crate::sandbox::confinement::corral_sandbox_of;
pub use crate::sandbox::confinement::is_sandboxed;

/// What the refusal says.
pub const SANDBOXED_PEER: &str = "the calling process is itself sandboxed (NoNewPrivs/seccomp/\
namespaces); danger-full-access and escalation are refused";

/// The refusal of a TCP credential whose mapping does not allow danger-full-access (H19).
pub const SANDBOXED_ONLY_CREDENTIAL: &str = "this TCP credential may open sandboxed sessions \
only: a token or client key alone could have been read by a sandbox; danger-full-access and \
escalation need `allow_danger_full_access = true` on its [[tokens]] or [[tls.clients]] entry in \
the daemon's config";

/// The one widening rule (H7, H19): why this caller may not have danger-full-access — open a
/// session in it, use one, have a call escalated, decide an approval — or `None` if it may.
/// Not a process that is itself sandboxed, and not a TCP credential whose mapping does not say
/// so (the daemon cannot see that caller's process).
pub fn full_access_refusal(caller: Caller) -> Option<&'static str> {
    if caller.credential_sandboxed_only {
        return Some(SANDBOXED_ONLY_CREDENTIAL);
    }
    is_sandboxed(caller.pid, caller.uid).then_some(SANDBOXED_PEER)
}

/// [`full_access_refusal`] as PERMISSION_DENIED.
pub fn refuse_if_sandboxed(caller: Caller) -> Result<(), CallError> {
    match full_access_refusal(caller) {
        Some(why) => Err(CallError::Denied(why.to_string())),
        None => Ok(()),
    }
}

/// H19, red team finding 3: a process inside a corral sandbox — any daemon's — opens no session
/// at all. Its own daemon's socket is masked from it; what it can reach is another daemon (a
/// per-user one on a non-default socket, say), which cannot know how wide the sandbox it runs
/// in is, so any session there could be wider (workspace-write rooted at `$HOME` from a
/// read-only sandbox). A process sandboxed by something else (a container) keeps the sandboxed
/// modes.
pub fn refuse_if_in_a_corral_sandbox(caller: Caller) -> Result<(), CallError> {
    let Some(pid) = caller.pid else {
        return Ok(());
    };
    // A danger-full-access session's commands run in a worker too, unconfined: not a sandbox.
    if !is_sandboxed(caller.pid, caller.uid) {
        return Ok(());
    }
    match corral_sandbox_of(pid) {
        Ok(Some(which)) => Err(CallError::Denied(format!(
            "the calling process runs inside a corral sandbox ({which}); a sandboxed command may \
             not open sessions, on this daemon or any other (spec/sandbox.md H19)"
        ))),
        Ok(None) => Ok(()),
        // Gone (a process that connected, handed the socket on and exited) or unreadable: it
        // cannot be told from a sandbox, so it is treated as one.
        Err(e) => Err(CallError::Denied(format!(
            "cannot inspect the calling process ({e}) to tell whether it runs inside a corral \
             sandbox; connect from a process that stays alive for its calls"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// H19: a caller that cannot be inspected (it connected, handed the socket on and exited)
    /// cannot be told from a sandboxed one, so it opens nothing.
    #[test]
    fn a_caller_that_is_gone_is_refused_sessions() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        child.wait().unwrap();
        let gone = Caller {
            uid: nix::unistd::geteuid().as_raw(),
            gid: 0,
            pid: Some(pid),
            credential: None,
            credential_sandboxed_only: false,
        };
        let e = refuse_if_in_a_corral_sandbox(gone).unwrap_err();
        assert!(matches!(e, CallError::Denied(_)));
        // This process (not in a sandbox) is not refused.
        let me = Caller {
            pid: Some(std::process::id() as i32),
            ..gone
        };
        assert!(refuse_if_in_a_corral_sandbox(me).is_ok());
    }
}
