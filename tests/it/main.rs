//! The black-box tests, one integration test binary: each module was a test binary of its own
//! (`tests/NAME.rs`), and each starts real `corral serve` daemons and calls them over gRPC.
//! One binary compiles and links the harness, the corral library and its dependencies once
//! instead of once per file, which was most of what rebuilding the tests cost.
//! Run one module with `cargo test --test it NAME::`.
//!
//! The tests of all the modules share one process and run side by side (libtest's threads),
//! so nothing here may change what the whole process shares — its environment, cwd, umask,
//! credentials, rlimits, signal handling, cgroup — and what a test finds host-wide (processes
//! by command line, users, cgroups, files in /tmp) must carry a name no other test uses.
//! Tests that need the machine to themselves stay binaries of their own beside this one:
//! `tests/hardening_race.rs`, `tests/hardening_fairness.rs`, `tests/hardening_pipeline.rs`.

#[path = "../common/mod.rs"]
mod common;

#[path = "../codex_support/mod.rs"]
mod codex_support;

mod apply_patch;
mod approvals;
mod audit;
mod cli;
mod codex_fidelity;
mod egress;
mod exec_server;
mod exec_server_limits;
mod exec_server_trace;
mod fail_closed;
mod faults;
mod files;
mod files_ops;
mod foundation;
mod grep;
mod hardening_bounds;
mod hardening_h24_review;
mod hardening_memory;
mod hardening_noway;
mod hardening_readonly;
mod hardening_setid;
mod hardening_surface;
mod hardening_workspace;
mod large_results;
mod mcp;
mod mcp_real_clients;
mod metrics;
mod multi_user;
mod operator;
mod policy;
mod processes;
mod profiles;
mod prompt_context;
mod sandbox_escape;
mod shell;
mod spawn;
mod stock_clients;
mod tls;
mod tool_sets;
mod unified_exec;
mod unprivileged;
