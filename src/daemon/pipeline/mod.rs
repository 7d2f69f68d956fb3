//! The one way a call goes: routed to its session's worker, streamed under flow control, gated
//! by approvals, audited, counted in flight.

pub mod approvals;
pub mod audit;
pub mod inflight;
pub mod route;
pub(crate) mod stream_pump;
