//! The path resolver's messages: what the daemon asks `corral __resolve` on its stdin and what
//! the helper answers on its stdout (see `worker::resolve`).

use crate::sandbox::policy::SandboxPolicy;
use crate::sandbox::roots::SessionParams;
use serde::{Deserialize, Serialize};

/// What the daemon asks.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ResolveRequest {
    pub params: SessionParams,
}

/// Why a session's paths were refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ResolveRefusal {
    /// A requested path is wrong (missing cwd, not a directory): INVALID_ARGUMENT naming the
    /// request field (`cwd`, `writable_roots`).
    Invalid { field: String, message: String },
    /// The caller may not use a path it named: PERMISSION_DENIED.
    Denied(String),
    /// A protection cannot be enforced (writable symlink, unreadable pointer): FAILED_PRECONDITION.
    Unenforceable(String),
    /// The helper itself could not run as the caller: INTERNAL.
    Helper(String),
}

/// The helper's answer.
pub type ResolveAnswer = Result<SandboxPolicy, ResolveRefusal>;
