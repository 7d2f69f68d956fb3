//! The one way a call goes: admitted (the caller's session and rules), routed to its session's
//! worker, streamed under flow control, gated by approvals, audited, counted in flight.

pub mod admit;
pub mod approvals;
pub mod audit;
mod call;
pub mod inflight;
pub mod route;
pub(crate) mod stream_pump;
