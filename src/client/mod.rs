//! The thin CLI client: `corral read-file`, `list-dir`, `cp`, `tools`, `invoke`, `health`.

mod cli;
mod connect;
mod cp;

pub use cli::{ClientCommand, Common, run};
pub use connect::connect;

/// The largest message corral's clients accept (gRPC's default is 4 MiB; a read_file of a big
/// file is more). The daemon answers at most 32 MiB, so this is never the limit that bites.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;
