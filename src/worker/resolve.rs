//! The path resolver: a short-lived, confined re-exec of the corral binary (`corral __resolve`)
//! that turns a session's requested paths into its effective policy **as the caller**.
//!
//! The root daemon never opens, stats, canonicalises or reads a path a caller chose
//! (spec/sandbox.md §8.6 H5, H15): a FIFO named `commondir` would block it, `/dev/zero` would
//! fill its memory, and root's view of the filesystem would tell a caller about paths it cannot
//! see. So the daemon starts this helper instead, sends the request on stdin and reads the
//! answer on stdout. The helper takes the caller's uid, gid and groups, drops every capability
//! and sets no_new_privs before it touches a single path; what it resolves, pins and refuses is
//! exactly what the caller itself could see. The daemon bounds it in time and output.

use crate::sandbox::policy::SandboxPolicy;
use crate::sandbox::roots::{PolicyError, SessionParams, build_policy};
use crate::wire::resolve::{ResolveAnswer, ResolveRefusal, ResolveRequest};
use std::io::{Read, Write};
use std::path::Path;

/// Largest request accepted on stdin (a session's parameters).
pub const MAX_REQUEST_BYTES: u64 = 1024 * 1024;

/// Entry point of `corral __resolve`; returns the process exit status.
pub fn resolve_main() -> i32 {
    let answer = run();
    let bytes = serde_json::to_vec(&answer).unwrap_or_default();
    let mut out = std::io::stdout().lock();
    if out.write_all(&bytes).and_then(|_| out.flush()).is_err() {
        return 1;
    }
    0
}

fn run() -> ResolveAnswer {
    let mut raw = Vec::new();
    std::io::stdin()
        .take(MAX_REQUEST_BYTES)
        .read_to_end(&mut raw)
        .map_err(|e| ResolveRefusal::Helper(format!("cannot read the request: {e}")))?;
    let req: ResolveRequest = serde_json::from_slice(&raw)
        .map_err(|e| ResolveRefusal::Helper(format!("bad request: {e}")))?;
    become_caller(&req.params)?;
    // Resolve first (a missing or non-directory cwd is the caller's mistake: INVALID_ARGUMENT,
    // as the caller sees it), then the caller's access to what exists.
    let policy = build_policy(&req.params).map_err(|e| match e {
        PolicyError::Cwd { .. } => ResolveRefusal::Invalid {
            field: "cwd".into(),
            message: e.to_string(),
        },
        PolicyError::InvalidRoot { .. } => ResolveRefusal::Invalid {
            field: "writable_roots".into(),
            message: e.to_string(),
        },
        PolicyError::WritableSymlink { .. }
        | PolicyError::WritableDotDot { .. }
        | PolicyError::Inspect { .. } => ResolveRefusal::Unenforceable(e.to_string()),
    })?;
    check_access(&req.params)?;
    Ok(policy)
}

/// Takes the caller's identity (when the daemon is root) and keeps no privilege at all.
fn become_caller(params: &SessionParams) -> Result<(), ResolveRefusal> {
    let helper = |e: crate::sandbox::error::LayerError| ResolveRefusal::Helper(e.message);
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if root {
        crate::sandbox::caps::keep_capabilities_across_uid_change().map_err(helper)?;
    }
    // apply_identity needs only the identity; the rest of the policy is irrelevant here.
    let carrier = SandboxPolicy {
        mode: params.mode,
        cwd: params.cwd.clone(),
        writable_roots: Vec::new(),
        protected_paths: Vec::new(),
        protected_missing: Vec::new(),
        network: false,
        masked_paths: Vec::new(),
        identity: params.identity.clone(),
        limits: params.limits.clone(),
        skipped_roots: Vec::new(),
        root_ids: Vec::new(),
        protected_names: Vec::new(),
        sandbox_generation: 0,
        egress: None,
    };
    crate::sandbox::identity::apply_identity(&carrier).map_err(helper)?;
    if root {
        crate::sandbox::caps::drop_all_capabilities().map_err(helper)?;
    }
    crate::sandbox::caps::set_no_new_privs().map_err(helper)?;
    Ok(())
}

/// The default rule for a session's paths: the cwd is a directory the caller can enter and
/// list, and in workspace-write every requested root that exists is one it can write. Checked
/// with the kernel's own access decision for this (already dropped) identity.
fn check_access(params: &SessionParams) -> Result<(), ResolveRefusal> {
    let usable = |p: &Path, mode: libc::c_int| {
        let Ok(c) = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()) else {
            return false;
        };
        // SAFETY: a valid C string; access has no other effect.
        unsafe { libc::access(c.as_ptr(), mode) == 0 }
    };
    if !usable(&params.cwd, libc::R_OK | libc::X_OK) {
        return Err(ResolveRefusal::Denied(format!(
            "cwd {} is not accessible to the caller",
            params.cwd.display()
        )));
    }
    if params.mode == crate::sandbox::policy::Mode::WorkspaceWrite {
        for root in std::iter::once(&params.cwd).chain(&params.writable_roots) {
            if root.is_dir() && !usable(root, libc::R_OK | libc::W_OK | libc::X_OK) {
                return Err(ResolveRefusal::Denied(format!(
                    "{} is not writable by the caller; a session may only write where its \
                     owner can",
                    root.display()
                )));
            }
        }
    }
    Ok(())
}
