//! The daemon ↔ worker protocol's Rust face, neutral ground for both sides: the generated
//! `corral.worker.v1` messages, their framing on the socketpair, a new worker's spec, and the
//! path resolver's messages.

pub use crate::pb::corral::worker::v1::*;

pub mod frame;
pub mod resolve;
pub mod spec;

impl ToolFailure {
    /// A failure of class `kind` with its text, naming no field and no sandbox layer.
    pub fn of(kind: FailureKind, message: String) -> Self {
        Self {
            kind: kind as i32,
            message,
            setup: None,
            field: String::new(),
        }
    }
}
