//! What every call of this worker shares, drawn once from its spec: the command runner, the
//! shell, the network switch, the default working directory and apply_patch's view of the
//! policy; and the `ToolContext` each call gets from it.

use crate::sandbox::policy::SandboxPolicy;
use crate::tools::ToolContext;
use crate::wire::CallContext;
use crate::worker::commands::SandboxedRunner;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

/// apply_patch's view of the policy: its own up-front checks mirror what the sandbox enforces,
/// so a refused patch gets Codex's rejection text instead of a half-applied I/O error.
pub(super) fn patch_rules(policy: &SandboxPolicy) -> crate::tools::apply_patch::PatchContext {
    use crate::sandbox::policy::Mode;
    let unconfined = policy.mode == Mode::DangerFullAccess;
    crate::tools::apply_patch::PatchContext {
        cwd: policy.cwd.clone(),
        writable_roots: if unconfined {
            vec![PathBuf::from("/")]
        } else {
            policy.writable_roots.clone()
        },
        read_only: policy.mode == Mode::ReadOnly,
        protected_names: if unconfined {
            Vec::new()
        } else {
            // The names guarded or protected directly at the top of a root (`.git`, `.codex`,
            // `.agents`, git-directory markers such as `HEAD`).
            let mut names: Vec<String> = policy
                .protected_paths
                .iter()
                .chain(&policy.protected_missing)
                .filter(|p| {
                    p.parent()
                        .is_some_and(|dir| policy.writable_roots.iter().any(|r| r == dir))
                })
                .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                .collect();
            names.sort();
            names.dedup();
            names
        },
        protected_paths: if unconfined {
            Vec::new()
        } else {
            // Existing protected paths, plus guarded ones deeper than a root's top (a `.git`
            // file's gitdir that does not exist yet).
            policy
                .protected_paths
                .iter()
                .chain(policy.protected_missing.iter().filter(|p| {
                    !p.parent()
                        .is_some_and(|dir| policy.writable_roots.iter().any(|r| r == dir))
                }))
                .cloned()
                .collect()
        },
    }
}

/// What every call of this worker shares.
pub(super) struct WorkerState {
    pub(super) runner: Arc<SandboxedRunner>,
    pub(super) shell: PathBuf,
    pub(super) network_disabled: bool,
    pub(super) default_cwd: PathBuf,
    pub(super) patch_rules: crate::tools::apply_patch::PatchContext,
}

impl WorkerState {
    pub(super) fn context(
        &self,
        call: Option<&CallContext>,
        cancel: Arc<AtomicBool>,
    ) -> ToolContext {
        let cwd = call
            .map(|c| PathBuf::from(&c.cwd))
            .filter(|p| p.is_absolute())
            .unwrap_or_else(|| self.default_cwd.clone());
        let mut patch = self.patch_rules.clone();
        patch.cwd = cwd.clone();
        ToolContext {
            session_id: call.map(|c| c.session_id.clone()).unwrap_or_default(),
            timeout_ceiling_ms: call
                .map(|c| c.timeout_ceiling_ms)
                .filter(|t| *t > 0)
                .unwrap_or(u64::MAX),
            patch,
            cwd,
            env: call
                .map(|c| c.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
                .unwrap_or_default(),
            network_disabled: self.network_disabled,
            shell: self.shell.clone(),
            cancel,
            runner: self.runner.clone(),
            new_process_id: call.map(|c| c.new_process_id).filter(|id| *id != 0),
            background_terminal_max_timeout_ms: call
                .map(|c| c.background_terminal_max_timeout_ms)
                .filter(|ms| *ms > 0)
                .unwrap_or(crate::tools::unified_exec::DEFAULT_MAX_BACKGROUND_TERMINAL_TIMEOUT_MS),
        }
    }
}
