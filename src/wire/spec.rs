//! What the daemon hands a new worker: the descriptor of its socketpair, its spec (the first
//! frame), the argument a spare starts with, and the streaming window both sides keep to.

use crate::sandbox::policy::SandboxPolicy;
use crate::sandbox::report::Layer;
use std::os::fd::RawFd;
use std::path::PathBuf;

/// The descriptor the daemon passes the request socket on.
pub const WORKER_FD: RawFd = 3;

/// Output delta bytes one streaming call may have sent and not yet had credited by the daemon
/// (spec/sandbox.md H6). Large enough to keep a local stream at full speed, small enough that
/// many stalled streams stay far below the daemon's memory budget.
pub const STREAM_WINDOW_BYTES: u64 = 1024 * 1024;

/// What the daemon tells a new worker: the first frame on its socketpair, as JSON (never in
/// argv, which every local user can read in /proc; spec/sandbox.md §8.6 H15).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct WorkerSpec {
    pub policy: SandboxPolicy,
    /// Layers the operator allows to be missing.
    pub degraded: Vec<Layer>,
    /// The worker before this one for the same policy died, perhaps in the middle of a write:
    /// writes look for the stagings and patch temporaries it left (their locks died with it).
    #[serde(default)]
    pub replaces_a_dead_worker: bool,
    /// The worker this one replaces was stopped by a command that made this protected path
    /// (H18): so is this one, from the start.
    #[serde(default)]
    pub stopped_by: Option<PathBuf>,
}

/// The argument a spare worker is started with (pool/spare.rs), as long as `__worker`.
pub const SPARE_ARG: &str = "__spare_";
