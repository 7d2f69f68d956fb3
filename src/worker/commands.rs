//! How the worker runs a command: the shell tools' executor, wrapped in the sandbox-side checks
//! that only the worker can make — the protected-name watcher (spec/sandbox.md §3.3) and the
//! denial evidence it produces.

use crate::sandbox::policy::SandboxPolicy;
use crate::sandbox::watcher::{CallGuard, Guard, GuardReport};
use crate::tools::shell::capture::{CaptureBuffer, CaptureLimits};
use crate::tools::shell::{ExecOutcome, ExecRequest, OutputChunk};
use crate::tools::unified_exec::ProcessGuard;
use crate::tools::{CommandRunner, ToolError};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Runs commands inside the worker's sandbox.
pub struct SandboxedRunner {
    /// Paths whose creation is blocked (`<root>/.git|.codex|.agents|HEAD`, missing gitdirs)
    /// because they did not exist when the worker was built.
    pub protected_missing: Vec<PathBuf>,
    /// Whether the session is sandboxed (the denial heuristic never fires in danger-full-access).
    pub sandboxed: bool,
    /// The worker's guard (its inotify instance was created before seccomp); `None` when there
    /// is nothing to guard.
    pub guard: Option<Guard>,
    /// What the worker's mounts protect, to tell whether that is still everything (per call).
    pub protection: Protection,
}

/// The protection a worker was built with: its writable roots, the names protected at their
/// tops, and the paths it mounted read-only or guards.
#[derive(Debug, Clone, Default)]
pub struct Protection {
    pub roots: Vec<PathBuf>,
    pub names: Vec<String>,
    pub protected_paths: Vec<PathBuf>,
    pub protected_missing: Vec<PathBuf>,
}

impl Protection {
    pub fn of(policy: &SandboxPolicy) -> Self {
        Self {
            roots: policy.writable_roots.clone(),
            names: policy.protected_names.clone(),
            protected_paths: policy.protected_paths.clone(),
            protected_missing: policy.protected_missing.clone(),
        }
    }

    /// Protection is computed per call, not per worker (spec/sandbox.md §8.6 H1): recomputes
    /// what must be protected now and compares it with what this worker's mounts protect.
    /// `Err` names what changed; the daemon then builds a worker for the new state.
    pub fn check_current(&self) -> Result<(), String> {
        if self.roots.is_empty() {
            return Ok(());
        }
        let (protected, missing) = crate::sandbox::roots::protected_paths(&self.roots, &self.names)
            .map_err(|e| e.to_string())?;
        if let Some(p) = protected.iter().find(|p| !self.protected_paths.contains(p)) {
            return Err(format!(
                "{} appeared since the worker was built",
                p.display()
            ));
        }
        if let Some(p) = missing.iter().find(|p| !self.protected_missing.contains(p)) {
            return Err(format!("{} is newly guarded", p.display()));
        }
        Ok(())
    }
}

/// The outcome of one command plus the worker's own evidence.
pub struct RunReport {
    pub outcome: ExecOutcome,
    /// What the guard found: protected names taken away (or not), roots restored.
    pub guard: GuardReport,
}

impl SandboxedRunner {
    /// Runs `req` under the protected-name guard.
    pub fn run_checked(
        &self,
        req: &ExecRequest,
        on_chunk: &mut dyn FnMut(OutputChunk),
        cancel: &AtomicBool,
    ) -> Result<RunReport, ToolError> {
        let call = self.guard_call()?;
        let result = crate::tools::shell::run(req, on_chunk, cancel);
        let guard = call.map(|c| c.finish()).unwrap_or_default();
        let mut outcome = result?;
        if !guard.is_empty() {
            mark_blocked(&mut outcome, &guard, on_chunk);
        }
        Ok(RunReport { outcome, guard })
    }

    /// Starts guarding for a call that is not a command (apply_patch); `None` when the worker
    /// has nothing to guard.
    pub fn guard_call(&self) -> Result<Option<CallGuard>, ToolError> {
        self.refuse_if_stopped()?;
        let call = match &self.guard {
            Some(guard) => guard
                .begin(&self.protected_missing)
                .map(Some)
                .map_err(|e| {
                    ToolError::new(
                        crate::tools::ErrorKind::Internal,
                        format!("sandbox could not watch protected paths: {e}"),
                    )
                })?,
            None => None,
        };
        // `begin` reads the queued events first: one of them may just have stopped the sandbox.
        self.refuse_if_stopped()?;
        Ok(call)
    }

    /// H18: once a command made a protected path, the sandbox was stopped and nothing that
    /// writes runs in it again — a loop gets one guard latency per session, not one per call.
    pub fn refuse_if_stopped(&self) -> Result<(), ToolError> {
        match self.guard.as_ref().and_then(Guard::stopped) {
            Some(path) => Err(ToolError::new(
                crate::tools::ErrorKind::FailedPrecondition,
                crate::sandbox::watcher::stopped_message(&path),
            )),
            None => Ok(()),
        }
    }

    /// The protected path that stopped this worker's sandbox, if any (the daemon carries it to
    /// any worker that replaces this one).
    pub fn stopped(&self) -> Option<PathBuf> {
        self.guard.as_ref().and_then(Guard::stopped)
    }

    /// Ends a [`SandboxedRunner::guard_call`]: the guard's findings as one text, if any.
    pub fn guard_finish(&self, call: Option<CallGuard>) -> Option<String> {
        let report = call?.finish();
        (!report.is_empty()).then(|| report.lines().join("\n"))
    }

    pub fn sandbox_denied(&self, report: &RunReport) -> bool {
        !report.guard.is_empty() || report.outcome.likely_sandbox_denied(self.sandboxed)
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

    /// A long-lived process can act between calls, so it is guarded for its whole life.
    fn guard_process(&self) -> Result<Option<Box<dyn ProcessGuard>>, ToolError> {
        Ok(self
            .guard_call()?
            .map(|call| Box::new(LifeGuard(call)) as Box<dyn ProcessGuard>))
    }
}

/// One call's view of the worker's runner: remembers whether a command the call ran looked
/// denied by the sandbox, which the daemon needs to offer a retry without it
/// (spec/sandbox.md §5.2) and the model-facing text does not say.
pub struct DenialWitness {
    runner: Arc<SandboxedRunner>,
    denied: AtomicBool,
}

impl DenialWitness {
    pub fn new(runner: Arc<SandboxedRunner>) -> Self {
        Self {
            runner,
            denied: AtomicBool::new(false),
        }
    }

    /// A command of this call was (likely) denied by the sandbox.
    pub fn denied(&self) -> bool {
        self.denied.load(Ordering::Relaxed)
    }
}

impl CommandRunner for DenialWitness {
    fn run(
        &self,
        req: &ExecRequest,
        on_chunk: &mut dyn FnMut(OutputChunk),
        cancel: &AtomicBool,
    ) -> Result<ExecOutcome, ToolError> {
        let report = self.runner.run_checked(req, on_chunk, cancel)?;
        if self.runner.sandbox_denied(&report) {
            self.denied.store(true, Ordering::Relaxed);
        }
        Ok(report.outcome)
    }

    fn guard_process(&self) -> Result<Option<Box<dyn ProcessGuard>>, ToolError> {
        self.runner.guard_process()
    }

    fn process_exited(&self, exit_code: i32, denial_keyword: bool) {
        if crate::tools::shell::denial::is_likely_sandbox_denied(
            self.runner.sandboxed,
            exit_code,
            false,
            denial_keyword,
        ) {
            self.denied.store(true, Ordering::Relaxed);
        }
    }
}

/// The protected-name guard of one unified-exec process.
struct LifeGuard(CallGuard);

impl ProcessGuard for LifeGuard {
    fn poll(&mut self) -> Vec<String> {
        self.0.take_report().lines()
    }

    fn finish(self: Box<Self>) -> Vec<String> {
        self.0.finish().lines()
    }
}

/// A blocked creation makes the call fail: the output gets one line per finding and an exit
/// status of 0 becomes 1 (spec/sandbox.md §3.3).
fn mark_blocked(
    outcome: &mut ExecOutcome,
    guard: &GuardReport,
    on_chunk: &mut dyn FnMut(OutputChunk),
) {
    let mut notice = String::new();
    for line in guard.lines() {
        notice.push_str(&line);
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
        session_id: String::new(),
        cwd: cwd.to_path_buf(),
        env: vec![("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into())],
        network_disabled: false,
        shell: PathBuf::from("/bin/bash"),
        cancel: Default::default(),
        runner: std::sync::Arc::new(SandboxedRunner {
            protected_missing: Vec::new(),
            sandboxed: false,
            guard: None,
            protection: Protection::default(),
        }),
        timeout_ceiling_ms: u64::MAX,
        patch: crate::tools::apply_patch::PatchContext {
            cwd: cwd.to_path_buf(),
            writable_roots: vec![cwd.to_path_buf()],
            read_only: false,
            protected_names: vec![".git".into(), ".codex".into(), ".agents".into()],
            protected_paths: Vec::new(),
        },
        new_process_id: None,
        background_terminal_max_timeout_ms:
            crate::tools::unified_exec::DEFAULT_MAX_BACKGROUND_TERMINAL_TIMEOUT_MS,
    }
}
