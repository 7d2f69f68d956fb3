//! What a tool call knows about its session: plain data, filled in by the worker.

use crate::tools::ToolError;
use crate::tools::shell::{ExecOutcome, ExecRequest, OutputChunk};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

/// Runs commands for the shell tools. The worker implements it (adding its sandbox-side checks,
/// such as the protected-name watcher); tools only format what it returns.
pub trait CommandRunner: Send + Sync {
    fn run(
        &self,
        req: &ExecRequest,
        on_chunk: &mut dyn FnMut(OutputChunk),
        cancel: &AtomicBool,
    ) -> Result<ExecOutcome, ToolError>;

    /// Starts the sandbox's watch over a long-lived process (unified exec), held for the
    /// process's whole life; `None` when there is nothing to watch.
    fn guard_process(
        &self,
    ) -> Result<Option<Box<dyn crate::tools::unified_exec::ProcessGuard>>, ToolError> {
        Ok(None)
    }

    /// A unified-exec process ended with `exit_code` while its exec_command call waited;
    /// `denial_keyword`: its output had a sandbox-denial keyword. The worker records a likely
    /// sandbox denial, which the daemon may offer to retry (spec/sandbox.md §5.2).
    fn process_exited(&self, _exit_code: i32, _denial_keyword: bool) {}
}

/// The session facts a tool needs. The sandbox already confines the process; these fields let
/// tools resolve paths, build commands and report refusals in the model's terms.
#[derive(Clone)]
pub struct ToolContext {
    /// The session the call belongs to (unified-exec processes are kept per session).
    pub session_id: String,
    /// The session's working directory (absolute).
    pub cwd: PathBuf,
    /// The environment commands receive (the session's, exactly).
    pub env: Vec<(String, String)>,
    /// The network is off: commands get `CODEX_SANDBOX_NETWORK_DISABLED=1`.
    pub network_disabled: bool,
    /// The session's shell for `shell_command`.
    pub shell: PathBuf,
    /// Set when the caller cancelled the call.
    pub cancel: Arc<AtomicBool>,
    /// Runs commands.
    pub runner: Arc<dyn CommandRunner>,
    /// The longest command timeout the caller's policy allows (ms); longer requests are clamped.
    pub timeout_ceiling_ms: u64,
    /// Where apply_patch may write (the session's writable roots and protected paths).
    pub patch: crate::tools::apply_patch::PatchContext,
    /// The id a process this call starts gets (drawn by the daemon); `None`: draw one.
    pub new_process_id: Option<i32>,
    /// The ceiling of an empty write_stdin poll (ms): the session's, or Codex's default.
    pub background_terminal_max_timeout_ms: u64,
}

impl ToolContext {
    /// A command's timeout request clamped to the policy ceiling (the default also obeys it).
    pub fn clamp_timeout(&self, requested: Option<u64>) -> Option<u64> {
        let wanted = requested.unwrap_or(crate::tools::shell::DEFAULT_EXEC_COMMAND_TIMEOUT_MS);
        if wanted > self.timeout_ceiling_ms {
            Some(self.timeout_ceiling_ms)
        } else {
            requested
        }
    }

    /// The shell tools' view of the session.
    pub fn exec_context(&self) -> crate::tools::shell::SessionExecContext {
        crate::tools::shell::SessionExecContext {
            cwd: self.cwd.clone(),
            env: self.env.clone(),
            network_disabled: self.network_disabled,
        }
    }
}

impl std::fmt::Debug for ToolContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolContext")
            .field("cwd", &self.cwd)
            .field("network_disabled", &self.network_disabled)
            .finish_non_exhaustive()
    }
}
