//! The worker side: a re-exec of the corral binary that confines itself, then runs one
//! policy's tool calls. `dispatch` converts between wire messages and the plain-Rust tools (the
//! one place where proto types meet tool types); the socketpair framing and the spec are in `wire`.

pub mod commands;
pub mod confine;
pub mod dispatch;
pub mod files;
pub mod resolve;
pub mod serve;
pub mod threads;
