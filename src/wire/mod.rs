//! The daemon ↔ worker protocol's Rust face, neutral ground for both sides: the generated
//! `corral.worker.v1` messages, their framing on the socketpair, a new worker's spec, and the
//! path resolver's messages.

pub use crate::pb::corral::worker::v1::*;

pub mod frame;
pub mod resolve;
pub mod spec;
