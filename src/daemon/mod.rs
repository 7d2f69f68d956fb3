//! The daemon: gRPC services, sessions, configuration, and where calls are executed.
//! It authenticates and routes; it never touches user files itself.
//!
//! Its wings follow a call's way in: `serve` assembles the daemon (configuration, listener,
//! server, start-up report); `rpc` holds the gRPC faces; `pipeline` is the one way a call
//! goes (admission, routing to a worker, streaming, approvals, audit); `session` holds what a
//! session owns; `workers` the confined processes that run calls; `caller` who is calling and
//! what their rule allows.

pub mod caller;
pub mod egress;
pub mod error;
pub mod metrics;
pub mod pipeline;
pub mod rpc;
pub mod serve;
pub mod session;
pub mod workers;
