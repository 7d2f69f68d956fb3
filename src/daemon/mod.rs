//! The daemon: gRPC services, sessions, configuration, and where calls are executed.
//! It authenticates and routes; it never touches user files itself.

pub mod approvals;
pub mod audit;
pub mod auth;
pub mod commands;
pub mod config;
pub mod environment;
pub mod executor;
pub mod files;
pub mod identity;
pub mod inflight;
pub mod listener;
pub mod metrics;
pub mod orphans;
pub mod peer;
pub mod policy;
pub mod pool;
pub mod processes;
pub mod resolver;
pub mod server;
pub mod service;
pub mod sessions;
pub mod socket;
mod start_rate;
pub mod startup;
pub mod status;
mod stream_pump;
mod worker_log;
