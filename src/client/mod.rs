//! The thin CLI client: `corral read-file`, `list-dir`, `tools`, `invoke`, `health`.

mod cli;
mod connect;

pub use cli::{ClientCommand, Common, run};
pub use connect::connect;
