//! Runs a session's calls. Every call goes through here, so where tools run (in a confined
//! worker) is decided in one place.

use crate::daemon::sessions::Session;
use crate::tools::ToolContext;
use crate::wire::{worker_reply::Result as Reply, worker_request::Call};
use crate::worker::dispatch;

/// Runs calls for sessions.
#[derive(Clone, Default)]
pub struct Executor {}

impl Executor {
    pub fn new() -> Self {
        Self {}
    }

    /// Runs one call to completion on a blocking thread.
    pub async fn call(&self, session: &Session, call: Call) -> Result<Reply, tonic::Status> {
        let ctx = ToolContext {
            cwd: session.cwd.clone(),
        };
        tokio::task::spawn_blocking(move || dispatch::execute(&ctx, call))
            .await
            .map_err(|e| tonic::Status::internal(format!("tool call failed: {e}")))
    }
}
