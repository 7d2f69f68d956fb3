//! corral: a sandboxed tool-execution daemon serving coding-agent tools over gRPC.
//!
//! Layers (DESIGN.md §4): `tools` is plain Rust (arguments in, text out); `sandbox` confines a
//! process; `worker` runs tools inside a confined process; `bridge` is the model-facing surface;
//! `daemon` composes them behind gRPC; `client` is the thin CLI client.

pub mod bridge;
pub mod client;
pub mod daemon;
pub mod sandbox;
pub mod socket;
pub mod tools;
pub mod wire;
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

/// A gRPC status code's canonical name (`NOT_FOUND`), as every gRPC library spells it: the
/// audit log's outcomes and the CLI's JSON errors.
pub fn grpc_code_name(code: tonic::Code) -> String {
    let name = format!("{code:?}");
    // CamelCase → SCREAMING_SNAKE_CASE.
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}
