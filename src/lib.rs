//! corral: a sandboxed tool-execution daemon serving coding-agent tools over gRPC.
//!
//! Layers (docs/ARCHITECTURE.md, DESIGN.md §4): `tools` is plain Rust (arguments in, text
//! out); `sandbox` confines a process; `worker` runs tools inside a confined process; `wire`
//! is what daemon and worker say to each other; `bridge` is the model-facing surface; `daemon`
//! composes them behind gRPC; `client` is the thin CLI client and its fronts (MCP,
//! exec-server). Only the entry points below are public: everything else is crate-private, so
//! the compiler reports what nothing uses.

mod calls;
pub mod client;
mod daemon;
mod egress;
mod sandbox;
mod socket;
mod sync;
pub mod tools;
mod wire;
mod worker;

// The binary's entry points: `corral serve`, the worker and resolver re-execs.
pub use daemon::serve::config::{Config, LogFormat, ServeArgs};
pub use daemon::serve::listener::from_socket_activation;
pub use daemon::serve::server::serve;
pub use wire::frame::tune_allocator;
pub use worker::resolve::resolve_main;
pub use worker::serve::worker_main;

/// What the fuzz targets (`fuzz/`) drive: the worker socketpair's frame decoder and the
/// model-call entry point. Not an API.
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::calls::{ContentItem, InvokeOutcome, intercepts_apply_patch, invoke};
    pub use crate::wire::frame;
    pub use crate::wire::{WorkerReply, WorkerRequest};
}

// What the black-box tests check against the daemon's own rules.
pub use daemon::caller::auth::token_hash;
pub use sandbox::cgroup::default_limit_bytes;
pub use socket::check_client;

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
