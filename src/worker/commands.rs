//! How the worker runs a command: the shell tools' executor, wrapped in the sandbox-side checks
//! that only the worker can make — the protected-name watcher (spec/sandbox.md §3.3) and the
//! denial evidence it produces.

use crate::sandbox::watcher::{ProtectedNameWatcher, blocked_message};
use crate::tools::shell::capture::{CaptureBuffer, CaptureLimits};
use crate::tools::shell::{ExecOutcome, ExecRequest, OutputChunk};
use crate::tools::{CommandRunner, ToolError};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

/// Runs commands inside the worker's sandbox.
pub struct SandboxedRunner {
    /// `<root>/.git|.codex|.agents` that did not exist when the session opened.
    pub protected_missing: Vec<PathBuf>,
    /// Whether the session is sandboxed (the denial heuristic never fires in danger-full-access).
    pub sandboxed: bool,
}

/// The outcome of one command plus the worker's own evidence.
pub struct RunReport {
    pub outcome: ExecOutcome,
    /// Protected names the command created and the worker removed.
    pub blocked: Vec<PathBuf>,
}

impl SandboxedRunner {
    /// Runs `req` under the protected-name watcher.
    pub fn run_checked(
        &self,
        req: &ExecRequest,
        on_chunk: &mut dyn FnMut(OutputChunk),
        cancel: &AtomicBool,
    ) -> Result<RunReport, ToolError> {
        let watcher = if self.protected_missing.is_empty() {
            None
        } else {
            Some(
                ProtectedNameWatcher::start_for(&self.protected_missing).map_err(|e| {
                    ToolError::new(
                        crate::tools::ErrorKind::Internal,
                        format!("sandbox could not watch protected paths: {e}"),
                    )
                })?,
            )
        };
        let result = crate::tools::shell::run(req, on_chunk, cancel);
        let blocked = watcher.map(|w| w.stop()).unwrap_or_default();
        let mut outcome = result?;
        if !blocked.is_empty() {
            mark_blocked(&mut outcome, &blocked, on_chunk);
        }
        Ok(RunReport { outcome, blocked })
    }

    pub fn sandbox_denied(&self, report: &RunReport) -> bool {
        !report.blocked.is_empty() || report.outcome.likely_sandbox_denied(self.sandboxed)
    }
}

impl CommandRunner for SandboxedRunner {
    fn run(
        &self,
        req: &ExecRequest,
        on_chunk: &mut dyn FnMut(OutputChunk),
        cancel: &AtomicBool,
    ) -> Result<ExecOutcome, ToolError> {
        self.run_checked(req, on_chunk, cancel).map(|r| r.outcome)
    }
}

/// A blocked creation makes the call fail: the output gets one line per removed path and an exit
/// status of 0 becomes 1 (spec/sandbox.md §3.3).
fn mark_blocked(
    outcome: &mut ExecOutcome,
    blocked: &[PathBuf],
    on_chunk: &mut dyn FnMut(OutputChunk),
) {
    let mut notice = String::new();
    for path in blocked {
        notice.push_str(&blocked_message(path));
        notice.push('\n');
    }
    on_chunk(OutputChunk::Stderr(notice.as_bytes().to_vec()));
    // Rebuild the arrival-order capture with the notice at its end. When the output overflowed
    // the capture windows the notice goes to stderr's capture only; the flag below still marks
    // the call as denied.
    if let Some(mut bytes) = outcome.combined.complete_bytes() {
        bytes.extend_from_slice(notice.as_bytes());
        let mut buf = CaptureBuffer::new(CaptureLimits::WITH_TEXT);
        buf.push(&bytes);
        outcome.combined = buf.finish();
    }
    if let Some(mut bytes) = outcome.stderr.complete_bytes() {
        bytes.extend_from_slice(notice.as_bytes());
        let mut buf = CaptureBuffer::new(CaptureLimits::RAW);
        buf.push(&bytes);
        outcome.stderr = buf.finish();
    }
    if outcome.exit_code == 0 {
        outcome.exit_code = 1;
    }
}

/// A context for unit tests: an unsandboxed runner in `cwd`.
#[cfg(test)]
pub fn test_context(cwd: &std::path::Path) -> crate::tools::ToolContext {
    crate::tools::ToolContext {
        cwd: cwd.to_path_buf(),
        env: vec![("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into())],
        network_disabled: false,
        shell: PathBuf::from("/bin/bash"),
        cancel: Default::default(),
        runner: std::sync::Arc::new(SandboxedRunner {
            protected_missing: Vec::new(),
            sandboxed: false,
        }),
        timeout_ceiling_ms: u64::MAX,
        patch: crate::tools::apply_patch::PatchContext {
            cwd: cwd.to_path_buf(),
            writable_roots: vec![cwd.to_path_buf()],
            read_only: false,
            protected_names: vec![".git".into(), ".codex".into(), ".agents".into()],
            protected_paths: Vec::new(),
        },
    }
}
