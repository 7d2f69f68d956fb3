//! The one way a call goes: admitted (the caller's session and rules), routed to its session's
//! worker, streamed under flow control, gated by approvals, audited, counted in flight.

pub mod admit;
pub mod approvals;
pub mod audit;
pub mod call;
mod decide;
pub mod inflight;
mod open;
pub mod route;
pub(crate) mod stream_pump;
pub mod transfer;
