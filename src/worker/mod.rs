//! The worker side: a re-exec of the corral binary that confines itself, then runs one
//! policy's tool calls. `dispatch` converts between wire messages and the plain-Rust tools (the
//! one place where proto types meet tool types); `frame` is the socketpair framing.

pub mod commands;
pub mod confine;
pub mod dispatch;
pub mod files;
pub mod frame;
pub mod resolve;
pub mod serve;
pub mod threads;
