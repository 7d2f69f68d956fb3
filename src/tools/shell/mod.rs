//! The `shell` and `shell_command` tools (spec/tools.md §6): arguments, how a call becomes an
//! [`ExecRequest`], and the model-facing texts of their errors. Running is in `exec.rs`, the
//! process-tree bookkeeping in `proctree.rs`, capture in `capture.rs`, truncation in
//! `truncate.rs` and the output formats in `format.rs`.
//!
//! Nothing here knows about gRPC or the sandbox: the caller (the worker, already confined) decides
//! escalation and approval, then calls [`run`] and one of the formatters.

pub mod capture;
pub mod denial;
pub mod exec;
pub mod format;
pub mod pinned_cwd;
pub mod proctree;
mod spawn;
pub mod truncate;

use std::ffi::CStr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::{ErrorKind, ToolError, resolve_path};

pub use capture::{CAPTURE_HEAD_BYTES, CAPTURE_TAIL_BYTES, Captured, MAX_TRUNCATION_BUDGET};
pub use exec::{
    DEFAULT_EXEC_COMMAND_TIMEOUT_MS, EXEC_TIMEOUT_EXIT_CODE, ExecOutcome, ExecRequest,
    IO_DRAIN_TIMEOUT_MS, OutputChunk, run,
};
pub use format::{shell_command_output_text, shell_output_text};
pub use proctree::{become_subreaper, is_subreaper};
pub use truncate::{TruncationPolicy, formatted_truncate_text, truncate_text};

/// The environment variable set when the session's network is off (§6.1).
pub const NETWORK_DISABLED_ENV_VAR: &str = "CODEX_SANDBOX_NETWORK_DISABLED";

/// `sandbox_permissions` (§1): whether the command asks to run outside the sandbox.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxPermissions {
    #[default]
    UseDefault,
    RequireEscalated,
}

/// Arguments of `shell` and `container.exec`. Unknown keys are ignored (§0.3).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ShellArgs {
    /// argv, executed directly.
    pub command: Vec<String>,
    pub workdir: Option<String>,
    /// Codex also accepts the key `timeout` (`#[serde(alias = "timeout")]`).
    #[serde(alias = "timeout")]
    pub timeout_ms: Option<u64>,
    pub sandbox_permissions: Option<SandboxPermissions>,
    /// Older Codex's boolean; `true` means `sandbox_permissions: "require_escalated"`.
    pub with_escalated_permissions: Option<bool>,
    pub justification: Option<String>,
    /// Accepted and ignored.
    pub prefix_rule: Option<Vec<String>>,
}

/// Arguments of `shell_command`. Unknown keys are ignored (§0.3).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ShellCommandArgs {
    /// A script for the session's shell.
    pub command: String,
    /// Login-shell semantics (`-lc`); default true.
    pub login: Option<bool>,
    pub workdir: Option<String>,
    #[serde(alias = "timeout")]
    pub timeout_ms: Option<u64>,
    pub sandbox_permissions: Option<SandboxPermissions>,
    pub with_escalated_permissions: Option<bool>,
    pub justification: Option<String>,
    pub prefix_rule: Option<Vec<String>>,
}

impl ShellArgs {
    /// Parses a call's `arguments` (`failed to parse function arguments: …` on error).
    pub fn parse(arguments: &str) -> Result<Self, ToolError> {
        crate::tools::parse_arguments(arguments)
    }

    /// Whether the call asks for escalation (either spelling).
    pub fn requests_escalation(&self) -> bool {
        requests_escalation(self.sandbox_permissions, self.with_escalated_permissions)
    }

    /// The argv to run; an empty `command` is an error (corral's wording, §6.1).
    pub fn argv(&self) -> Result<Vec<String>, ToolError> {
        if self.command.is_empty() {
            return Err(ToolError::invalid("command must not be empty"));
        }
        Ok(self.command.clone())
    }
}

impl ShellCommandArgs {
    /// Parses a call's `arguments` (`failed to parse function arguments: …` on error).
    pub fn parse(arguments: &str) -> Result<Self, ToolError> {
        crate::tools::parse_arguments(arguments)
    }

    /// Whether the call asks for escalation (either spelling).
    pub fn requests_escalation(&self) -> bool {
        requests_escalation(self.sandbox_permissions, self.with_escalated_permissions)
    }

    /// `[shell, "-lc"|"-c", script]`; fails if a login shell is asked for explicitly and the
    /// session forbids it (an absent `login` then means a non-login shell).
    pub fn argv(&self, shell: &str, allow_login_shell: bool) -> Result<Vec<String>, ToolError> {
        let login = match self.login {
            Some(true) if !allow_login_shell => return Err(login_shell_disabled()),
            Some(login) => login,
            None => allow_login_shell,
        };
        Ok(shell_command_argv(shell, &self.command, login))
    }
}

fn requests_escalation(perms: Option<SandboxPermissions>, legacy: Option<bool>) -> bool {
    perms == Some(SandboxPermissions::RequireEscalated) || legacy == Some(true)
}

/// `[shell, "-lc", script]` or `[shell, "-c", script]` (§6.1).
pub fn shell_command_argv(shell: &str, script: &str, login: bool) -> Vec<String> {
    let flag = if login { "-lc" } else { "-c" };
    vec![shell.to_string(), flag.to_string(), script.to_string()]
}

/// The session's default shell: the user's login shell from the password database if it
/// exists, else `/bin/bash`, else `/bin/sh` (§6.1).
pub fn default_user_shell() -> PathBuf {
    if let Some(shell) = passwd_shell().filter(|s| s.is_file()) {
        return shell;
    }
    if Path::new("/bin/bash").is_file() {
        return PathBuf::from("/bin/bash");
    }
    PathBuf::from("/bin/sh")
}

/// The current user's `pw_shell`, if any.
fn passwd_shell() -> Option<PathBuf> {
    // SAFETY: getpwuid_r fills `pwd` with pointers into `buf`, which outlives their use here;
    // the result pointer is null unless an entry was found.
    unsafe {
        let mut pwd: libc::passwd = std::mem::zeroed();
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        let mut buf = vec![0u8; 16 * 1024];
        let rc = libc::getpwuid_r(
            libc::getuid(),
            &mut pwd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut result,
        );
        if rc != 0 || result.is_null() || pwd.pw_shell.is_null() {
            return None;
        }
        let shell = CStr::from_ptr(pwd.pw_shell).to_str().ok()?;
        (!shell.is_empty()).then(|| PathBuf::from(shell))
    }
}

/// What the session contributes to every command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionExecContext {
    /// The session's working directory; `workdir` is resolved against it (§0.4).
    pub cwd: PathBuf,
    /// The session's environment, exactly.
    pub env: Vec<(String, String)>,
    /// Adds `CODEX_SANDBOX_NETWORK_DISABLED=1` (§6.1).
    pub network_disabled: bool,
}

/// Builds the request for a call: `workdir` resolved against the session cwd, the default
/// timeout of 10 s, the session environment plus the network flag.
pub fn exec_request(
    argv: Vec<String>,
    workdir: Option<&str>,
    timeout_ms: Option<u64>,
    session: &SessionExecContext,
) -> ExecRequest {
    let cwd = match workdir {
        Some(w) => resolve_path(&session.cwd, w),
        None => session.cwd.clone(),
    };
    let mut env: Vec<(String, String)> = session
        .env
        .iter()
        .filter(|(k, _)| !(session.network_disabled && k == NETWORK_DISABLED_ENV_VAR))
        .cloned()
        .collect();
    if session.network_disabled {
        env.push((NETWORK_DISABLED_ENV_VAR.to_string(), "1".to_string()));
    }
    ExecRequest {
        argv,
        cwd,
        env,
        timeout: Duration::from_millis(timeout_ms.unwrap_or(DEFAULT_EXEC_COMMAND_TIMEOUT_MS)),
    }
}

/// ``login shell is disabled by config; omit `login` or set it to false.`` (§6.1).
pub fn login_shell_disabled() -> ToolError {
    ToolError::invalid("login shell is disabled by config; omit `login` or set it to false.")
}

/// Escalation requested under a policy that forbids it (§6.1); `policy` is the Debug name
/// (`UnlessTrusted`, `OnFailure`, `Never`).
pub fn escalation_refused(policy: &str) -> ToolError {
    ToolError::new(
        ErrorKind::PermissionDenied,
        format!(
            "approval policy is {policy}; reject command \u{2014} you should not ask for escalated permissions if the approval policy is {policy}"
        ),
    )
}

/// The user declined the command (§6.1).
pub fn rejected_by_user() -> ToolError {
    ToolError::new(ErrorKind::PermissionDenied, "exec command rejected by user")
}

/// A payload of the wrong kind (§0.3): `unsupported payload for shell handler: {tool}` or
/// `unsupported payload for shell_command handler: {tool}`.
pub fn unsupported_payload(handler: &str, tool: &str) -> ToolError {
    ToolError::invalid(format!("unsupported payload for {handler} handler: {tool}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_shell_args_and_ignores_unknown_keys() {
        let a = ShellArgs::parse(
            r#"{"command":["ls","-l"],"workdir":"sub","timeout_ms":5,"extra":{"x":1},"prefix_rule":["ls"]}"#,
        )
        .unwrap();
        assert_eq!(a.command, ["ls", "-l"]);
        assert_eq!(a.workdir.as_deref(), Some("sub"));
        assert_eq!(a.timeout_ms, Some(5));
        assert!(!a.requests_escalation());
        let a = ShellArgs::parse(r#"{"command":["x"],"timeout":7}"#).unwrap();
        assert_eq!(a.timeout_ms, Some(7));
    }

    #[test]
    fn escalation_spellings() {
        let a = ShellArgs::parse(
            r#"{"command":["x"],"sandbox_permissions":"require_escalated","justification":"why?"}"#,
        )
        .unwrap();
        assert!(a.requests_escalation());
        let a = ShellArgs::parse(r#"{"command":["x"],"with_escalated_permissions":true}"#).unwrap();
        assert!(a.requests_escalation());
        let a = ShellCommandArgs::parse(r#"{"command":"x","sandbox_permissions":"use_default"}"#)
            .unwrap();
        assert!(!a.requests_escalation());
    }

    #[test]
    fn parse_errors() {
        assert_eq!(
            ShellArgs::parse("{}").unwrap_err().message,
            "failed to parse function arguments: missing field `command` at line 1 column 2"
        );
        let e = ShellArgs::parse(r#"{"command":["x"],"timeout_ms":-1}"#).unwrap_err();
        assert!(
            e.message
                .starts_with("failed to parse function arguments: invalid value"),
            "{}",
            e.message
        );
        let e = ShellCommandArgs::parse(r#"{"command":["x"]}"#).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(
            ShellArgs::parse(r#"{"command":[]}"#)
                .unwrap()
                .argv()
                .is_err()
        );
    }

    #[test]
    fn shell_command_argv_and_login() {
        let a = ShellCommandArgs::parse(r#"{"command":"echo hi"}"#).unwrap();
        assert_eq!(
            a.argv("/bin/zsh", true).unwrap(),
            ["/bin/zsh", "-lc", "echo hi"]
        );
        assert_eq!(
            a.argv("/bin/zsh", false).unwrap(),
            ["/bin/zsh", "-c", "echo hi"]
        );
        let a = ShellCommandArgs::parse(r#"{"command":"echo hi","login":false}"#).unwrap();
        assert_eq!(
            a.argv("/bin/bash", true).unwrap(),
            ["/bin/bash", "-c", "echo hi"]
        );
        let a = ShellCommandArgs::parse(r#"{"command":"echo hi","login":true}"#).unwrap();
        assert_eq!(
            a.argv("/bin/bash", false).unwrap_err().message,
            "login shell is disabled by config; omit `login` or set it to false."
        );
    }

    #[test]
    fn request_building() {
        let session = SessionExecContext {
            cwd: PathBuf::from("/work"),
            env: vec![
                ("PATH".into(), "/bin".into()),
                (NETWORK_DISABLED_ENV_VAR.into(), "0".into()),
            ],
            network_disabled: true,
        };
        let r = exec_request(vec!["ls".into()], Some("sub/../x"), None, &session);
        assert_eq!(r.cwd, PathBuf::from("/work/sub/../x"));
        assert_eq!(r.timeout, Duration::from_millis(10_000));
        assert_eq!(
            r.env,
            [
                ("PATH".to_string(), "/bin".to_string()),
                (NETWORK_DISABLED_ENV_VAR.to_string(), "1".to_string())
            ]
        );
        let r = exec_request(vec!["ls".into()], Some("/abs"), Some(5), &session);
        assert_eq!(r.cwd, PathBuf::from("/abs"));
        assert_eq!(r.timeout, Duration::from_millis(5));
    }

    #[test]
    fn error_texts() {
        assert_eq!(
            escalation_refused("Never").message,
            "approval policy is Never; reject command \u{2014} you should not ask for escalated permissions if the approval policy is Never"
        );
        assert_eq!(
            unsupported_payload("shell_command", "shell_command").message,
            "unsupported payload for shell_command handler: shell_command"
        );
        assert_eq!(rejected_by_user().message, "exec command rejected by user");
    }

    #[test]
    fn default_shell_exists() {
        assert!(default_user_shell().is_file());
    }
}
