//! The worker side: runs tool calls for one session. `dispatch` converts between the wire
//! messages and the plain-Rust tools (the one place where proto types meet tool types).

pub mod dispatch;
