//! Confinement of a worker process: the policy (mode → concrete rules) and one module per
//! layer, each named after what it protects. Knows nothing of tools or gRPC.
//!
//! Order of application (spec/sandbox.md §3.1), see `worker::confine`:
//! [user namespace, when not root →] namespaces → identity → caps → no_new_privs → landlock →
//! seccomp → limits.

pub mod caps;
pub mod cgroup;
pub mod confinement;
pub mod error;
mod git_exec;
pub mod identity;
pub mod landlock;
pub mod limits;
pub mod masks;
pub mod namespaces;
mod notify;
pub mod policy;
pub mod profile;
pub mod report;
pub mod roots;
pub mod seccomp;
pub mod userns;
pub mod watcher;

#[cfg(test)]
mod testutil;
