//! The effective sandbox policy of one worker: the mode turned into concrete, checked rules.
//!
//! This is the single description every layer reads (namespaces, identity, Landlock, seccomp,
//! limits). It is computed in the daemon from the session parameters (spec/sandbox.md §1–2),
//! serialised to the worker, and applied there before the worker reads its first request.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The three modes (spec/sandbox.md §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    ReadOnly,
    WorkspaceWrite,
    DangerFullAccess,
}

impl Mode {
    pub fn is_sandboxed(self) -> bool {
        !matches!(self, Mode::DangerFullAccess)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Mode::ReadOnly => "read-only",
            Mode::WorkspaceWrite => "workspace-write",
            Mode::DangerFullAccess => "danger-full-access",
        }
    }
}

/// Who the worker runs as (the session owner).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups, set with setgroups.
    pub groups: Vec<u32>,
}

/// Resource limits applied to the worker and inherited by every command (setrlimit).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ResourceLimits {
    /// RLIMIT_CORE: 0, so no core dump leaks memory contents.
    pub core_bytes: u64,
    /// RLIMIT_NPROC: fork-bomb ceiling (per uid).
    pub processes: u64,
    /// RLIMIT_NOFILE.
    pub open_files: u64,
    /// RLIMIT_FSIZE: largest file a command may write.
    pub file_size_bytes: u64,
    /// Memory the worker and all its commands may use together (spec/sandbox.md §8.6 H11):
    /// a memory cgroup's limit where the daemon can create one. Default: half the host's RAM.
    #[serde(default = "crate::sandbox::cgroup::default_limit_bytes")]
    pub memory_bytes: u64,
    /// Memory all workers of the same user may use together (H21): the limit of the user's
    /// parent cgroup. Default: half the host's RAM, so no one user can bring the host into
    /// global OOM.
    #[serde(default = "crate::sandbox::cgroup::default_limit_bytes")]
    pub user_memory_bytes: u64,
    /// RLIMIT_DATA: set to `memory_bytes` by the daemon only when no memory cgroup can be made
    /// (a per-process fallback; unlimited otherwise).
    #[serde(default = "unlimited")]
    pub data_bytes: u64,
}

fn unlimited() -> u64 {
    u64::MAX
}

impl Default for ResourceLimits {
    fn default() -> Self {
        Self {
            core_bytes: 0,
            processes: 4096,
            open_files: 4096,
            file_size_bytes: 16 * 1024 * 1024 * 1024,
            memory_bytes: crate::sandbox::cgroup::default_limit_bytes(),
            user_memory_bytes: crate::sandbox::cgroup::default_limit_bytes(),
            data_bytes: unlimited(),
        }
    }
}

/// Everything a worker needs to confine itself. All paths are absolute and canonical.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SandboxPolicy {
    pub mode: Mode,
    /// The session's working directory.
    pub cwd: PathBuf,
    /// Directories writable in workspace-write (spec/sandbox.md §2.2), existing and canonical.
    /// Empty in read-only and danger-full-access.
    pub writable_roots: Vec<PathBuf>,
    /// Existing protected paths inside writable roots, made read-only (spec/sandbox.md §2.3).
    pub protected_paths: Vec<PathBuf>,
    /// Names whose creation directly inside a writable root is blocked (`.git`, `.codex`, `.agents`, `.aws`)
    /// because they did not exist when the session opened.
    pub protected_missing: Vec<PathBuf>,
    /// Whether the network is on. Always true in danger-full-access.
    pub network: bool,
    /// Paths hidden from the sandbox: corral's own state and container-runtime sockets (§2.7, §2.8).
    pub masked_paths: Vec<PathBuf>,
    /// The uid/gid/groups to run as; `None` keeps the daemon's own identity.
    pub identity: Option<Identity>,
    pub limits: ResourceLimits,
    /// Requested writable roots that did not exist and were skipped (spec/sandbox.md §2.2); listed
    /// in the `OpenSession` response and the audit log. Informational: no layer reads it.
    #[serde(default)]
    pub skipped_roots: Vec<PathBuf>,
    /// Each writable root's identity `(st_dev, st_ino)`, pinned when the session opened, in the
    /// order of `writable_roots`. Every worker built for the policy binds exactly these inodes or
    /// refuses to start, so a root cannot be redirected by renaming or replacing its parents
    /// (spec/sandbox.md §8.6 H4). Part of the pool key through `Hash`.
    #[serde(default)]
    pub root_ids: Vec<(u64, u64)>,
    /// The names protected at the top of every writable root (the profile's), kept so the
    /// worker can recompute protection before every call.
    #[serde(default)]
    pub protected_names: Vec<String>,
    /// Sessions with equal policies share one worker. A session opened while that worker is
    /// stopped (a command of another session made a protected path, H18) gets the next
    /// generation — a sandbox of its own — instead of joining the stopped one. Part of the pool
    /// key; no layer reads it.
    #[serde(default)]
    pub sandbox_generation: u32,
    /// A `proxy`-mode session's egress: the network stays off (`network` is false: a private
    /// network namespace with loopback only) but for one TCP port on that loopback, where corral
    /// places its egress proxy's listener. Part of the pool key: the session is in it, so every
    /// proxied session has a worker (and a proxy with its rules) of its own.
    #[serde(default)]
    pub egress: Option<Egress>,
}

/// See [`SandboxPolicy::egress`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Egress {
    /// The port of the proxy's listener on the sandbox's loopback: the one TCP connect allowed.
    pub port: u16,
    /// The session whose rules the proxy applies.
    pub session: String,
}

/// How a sandbox reaches the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Net {
    /// Not at all: a private network namespace with loopback only, no IP sockets.
    Off,
    /// Only through corral's egress proxy, on the sandbox's own loopback.
    Proxy,
    /// The host's network (as Codex's `network_access`).
    On,
}

impl SandboxPolicy {
    pub fn net(&self) -> Net {
        match (self.network, &self.egress) {
            (true, _) => Net::On,
            (false, Some(_)) => Net::Proxy,
            (false, None) => Net::Off,
        }
    }
}

#[cfg(test)]
impl SandboxPolicy {
    /// A policy of `mode` at `cwd` with nothing else: no roots, no network, no limits.
    pub(crate) fn bare(mode: Mode, cwd: &str) -> SandboxPolicy {
        SandboxPolicy {
            mode,
            cwd: cwd.into(),
            writable_roots: vec![],
            protected_paths: vec![],
            protected_missing: vec![],
            network: false,
            masked_paths: vec![],
            skipped_roots: vec![],
            root_ids: vec![],
            protected_names: vec![],
            sandbox_generation: 0,
            identity: None,
            limits: ResourceLimits::default(),
            egress: None,
        }
    }
}
