//! The thin CLI client: `corral read-file`, `list-dir`, `cp`, `exec`, `sessions`, `ps`,
//! `tools`, `invoke`, `health`, `capabilities`, and the fronts: MCP (`corral mcp`) and Codex's
//! exec-server protocol (`corral exec-server`).

mod approve;
mod cli;
mod connect;
mod cp;
mod exec;
mod exec_server;
mod handshake;
mod info;
mod inventory;
mod mcp;

pub use cli::{ClientCommand, Common, TOKEN_ENV, run};
pub use connect::{Connection, TcpAuth, connect, connect_with};

/// The largest message corral's clients accept (gRPC's default is 4 MiB; a read_file of a big
/// file is more). The daemon answers at most 32 MiB, so this is never the limit that bites.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;
