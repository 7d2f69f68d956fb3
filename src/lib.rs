//! corral: a sandboxed tool-execution daemon serving coding-agent tools over gRPC.
//!
//! Layers (DESIGN.md §4): `tools` is plain Rust (arguments in, text out); `sandbox` confines a
//! process; `worker` runs tools inside a confined process; `bridge` is the model-facing surface;
//! `daemon` composes them behind gRPC; `client` is the thin CLI client.

pub mod bridge;
pub mod client;
pub mod daemon;
pub mod sandbox;
pub mod tools;
pub mod worker;

/// Generated protobuf and gRPC code; module nesting mirrors the proto packages.
pub mod pb {
    pub mod corral {
        // Generated oneofs hold messages inline; ShellStreamEvent's `end` is far larger than
        // its other events, which is prost's layout, not ours to box.
        #[allow(clippy::large_enum_variant)]
        pub mod v1 {
            tonic::include_proto!("corral.v1");
        }
        pub mod worker {
            pub mod v1 {
                tonic::include_proto!("corral.worker.v1");
            }
        }
    }
    /// The encoded descriptor set of every corral proto, for server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("corral_descriptor");
}

/// The public API types (`corral.v1`).
pub use pb::corral::v1 as api;
/// The daemon ↔ worker frames (`corral.worker.v1`).
pub use pb::corral::worker::v1 as wire;
