//! What a tool call knows about its session: plain data, filled in by the worker.

use std::path::PathBuf;

/// The session facts a tool needs. The sandbox already confines the process; these fields let
/// tools resolve paths and report refusals in the model's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolContext {
    /// The session's working directory (absolute).
    pub cwd: PathBuf,
}
