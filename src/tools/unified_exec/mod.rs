//! Unified exec (spec/tools.md §7): `exec_command` starts a command (pipes or a PTY) in the
//! session's sandbox and returns its output so far; a process still running stays alive under a
//! session id, and `write_stdin` writes to it and returns what it printed since.
//!
//! Plain Rust, no gRPC: `process/` runs one process (reader thread, tree, guard),
//! `buffer.rs` keeps its output (head+tail, sequence-numbered), `table.rs` is a session's
//! process table, `output.rs` the model text. The worker keeps one table per session in
//! [`sessions`], and kills a session's processes when the session closes.

pub mod buffer;
pub mod output;
pub mod process;
pub mod table;
pub mod typed;

use crate::sync::LockExt;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::tools::shell::capture::{CaptureBuffer, CaptureLimits};
use crate::tools::shell::{NETWORK_DISABLED_ENV_VAR, SandboxPermissions, shell_command_argv};
use crate::tools::{ToolContext, ToolError, resolve_path};

pub use output::ExecOutput;
pub use process::{Process, ProcessGuard, SpawnSpec};
pub use table::{MAX_UNIFIED_EXEC_PROCESSES, ProcessTable, WARNING_UNIFIED_EXEC_PROCESSES};

/// `MIN_YIELD_TIME_MS` (§7.1).
pub const MIN_YIELD_TIME_MS: u64 = 250;
/// `MIN_EMPTY_YIELD_TIME_MS` (§7.2).
pub const MIN_EMPTY_YIELD_TIME_MS: u64 = 5_000;
/// `MAX_YIELD_TIME_MS` (§7.1).
pub const MAX_YIELD_TIME_MS: u64 = 30_000;
/// `DEFAULT_MAX_BACKGROUND_TERMINAL_TIMEOUT_MS` (§7.2): the upper bound of an empty poll.
pub const DEFAULT_MAX_BACKGROUND_TERMINAL_TIMEOUT_MS: u64 = 300_000;
/// `DEFAULT_MAX_OUTPUT_TOKENS` (§7.3).
pub const DEFAULT_MAX_OUTPUT_TOKENS: usize = 10_000;
/// exec_command's default `yield_time_ms`.
pub const DEFAULT_EXEC_YIELD_TIME_MS: u64 = 10_000;
/// write_stdin's default `yield_time_ms`.
pub const DEFAULT_WRITE_STDIN_YIELD_TIME_MS: u64 = 250;
/// `POST_EXIT_CLOSE_WAIT_CAP` (§7.1): after the exit, how long a call waits for the output to
/// close.
pub const POST_EXIT_CLOSE_WAIT_CAP: Duration = Duration::from_millis(50);
/// After a write, the pause before collecting output (not counted in `Wall time`).
pub const WRITE_PAUSE: Duration = Duration::from_millis(100);

/// The environment overrides of every unified-exec process (§7.1; Codex's `UNIFIED_EXEC_ENV`).
pub const UNIFIED_EXEC_ENV: [(&str, &str); 10] = [
    ("NO_COLOR", "1"),
    ("TERM", "dumb"),
    ("LANG", "C.UTF-8"),
    ("LC_CTYPE", "C.UTF-8"),
    ("LC_ALL", "C.UTF-8"),
    ("COLORTERM", ""),
    ("PAGER", "cat"),
    ("GIT_PAGER", "cat"),
    ("GH_PAGER", "cat"),
    ("CODEX_CI", "1"),
];

fn default_exec_yield() -> u64 {
    DEFAULT_EXEC_YIELD_TIME_MS
}

fn default_write_yield() -> u64 {
    DEFAULT_WRITE_STDIN_YIELD_TIME_MS
}

/// Arguments of `exec_command`. Unknown keys are ignored (§0.3).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ExecCommandArgs {
    pub cmd: String,
    pub workdir: Option<String>,
    pub shell: Option<String>,
    pub login: Option<bool>,
    #[serde(default)]
    pub tty: bool,
    #[serde(default = "default_exec_yield")]
    pub yield_time_ms: u64,
    pub max_output_tokens: Option<usize>,
    pub sandbox_permissions: Option<SandboxPermissions>,
    pub with_escalated_permissions: Option<bool>,
    pub justification: Option<String>,
    pub prefix_rule: Option<Vec<String>>,
}

/// Arguments of `write_stdin`. Unknown keys are ignored (§0.3).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct WriteStdinArgs {
    /// The process id (the model is trained on `session_id`); an `i32`, as in Codex.
    pub session_id: i32,
    #[serde(default)]
    pub chars: String,
    #[serde(default = "default_write_yield")]
    pub yield_time_ms: u64,
    pub max_output_tokens: Option<usize>,
}

impl ExecCommandArgs {
    pub fn parse(arguments: &str) -> Result<Self, ToolError> {
        crate::tools::parse_arguments(arguments)
    }

    /// `[shell, "-lc"|"-c", cmd]`: the model's `shell` or the session's; `login` defaults to
    /// true, and an explicit login shell is refused when the session forbids it.
    pub fn argv(
        &self,
        session_shell: &str,
        allow_login_shell: bool,
    ) -> Result<Vec<String>, ToolError> {
        let login = match self.login {
            Some(true) if !allow_login_shell => {
                return Err(crate::tools::shell::login_shell_disabled());
            }
            Some(login) => login,
            None => allow_login_shell,
        };
        let shell = self
            .shell
            .as_deref()
            .filter(|s| !s.is_empty())
            .unwrap_or(session_shell);
        Ok(shell_command_argv(shell, &self.cmd, login))
    }
}

impl WriteStdinArgs {
    pub fn parse(arguments: &str) -> Result<Self, ToolError> {
        crate::tools::parse_arguments(arguments)
    }
}

/// exec_command's wait: clamped to [250, 30 000] ms.
pub fn clamp_exec_yield(ms: u64) -> u64 {
    ms.clamp(MIN_YIELD_TIME_MS, MAX_YIELD_TIME_MS)
}

/// write_stdin's wait: at least 250 ms; an empty poll within [5 000, `max_background`], a
/// write at most 30 000 ms.
pub fn clamp_write_yield(ms: u64, empty: bool, max_background: u64) -> u64 {
    let ms = ms.max(MIN_YIELD_TIME_MS);
    if empty {
        ms.clamp(
            MIN_EMPTY_YIELD_TIME_MS,
            max_background.max(MIN_EMPTY_YIELD_TIME_MS),
        )
    } else {
        ms.min(MAX_YIELD_TIME_MS)
    }
}

/// The environment of a unified-exec process: the session's, the network flag, then the
/// overrides.
pub fn process_env(
    session_env: &[(String, String)],
    network_disabled: bool,
) -> Vec<(String, String)> {
    let overridden = |k: &str| {
        UNIFIED_EXEC_ENV.iter().any(|(o, _)| *o == k)
            || (network_disabled && k == NETWORK_DISABLED_ENV_VAR)
    };
    let mut env: Vec<(String, String)> = session_env
        .iter()
        .filter(|(k, _)| !overridden(k))
        .cloned()
        .collect();
    if network_disabled {
        env.push((NETWORK_DISABLED_ENV_VAR.into(), "1".into()));
    }
    env.extend(
        UNIFIED_EXEC_ENV
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string())),
    );
    env
}

/// A word quoted for a POSIX shell when it needs it (Codex's `shlex_join` of the argv).
pub fn shell_quote(word: &str) -> String {
    let safe = !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-./,:=@%+".contains(&b));
    if safe {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r#"'"'"'"#))
    }
}

pub fn shell_join(argv: &[String]) -> String {
    argv.iter()
        .map(|w| shell_quote(w))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The errors of §7.5 (their model text).
pub mod errors {
    use crate::tools::{ErrorKind, ToolError};

    pub fn unknown_process(id: i32) -> ToolError {
        ToolError::new(
            ErrorKind::NotFound,
            format!("write_stdin failed: Unknown process id {id}"),
        )
    }

    pub fn stdin_closed() -> ToolError {
        ToolError::invalid(
            "write_stdin failed: stdin is closed for this session; rerun exec_command with tty=true to keep stdin open",
        )
    }

    pub fn write_failed() -> ToolError {
        ToolError::new(
            ErrorKind::Internal,
            "write_stdin failed: failed to write to stdin",
        )
    }

    /// An escalation the policy refuses. exec_command words it `you cannot ask` where the
    /// shell tools say `you should not ask` (newest Codex, unified_exec/exec_command.rs).
    pub fn escalation_refused(policy: &str) -> ToolError {
        ToolError::new(
            ErrorKind::PermissionDenied,
            format!(
                "approval policy is {policy}; reject command \u{2014} you cannot ask for escalated permissions if the approval policy is {policy}"
            ),
        )
    }

    pub fn create_failed(command: &str, reason: &str) -> ToolError {
        ToolError::new(
            ErrorKind::Internal,
            format!(
                "exec_command failed for `{command}`: Failed to create unified exec process: {reason}"
            ),
        )
    }
}

/// The worker's tables, one per session.
fn registry() -> &'static Mutex<HashMap<String, Arc<ProcessTable>>> {
    static SESSIONS: OnceLock<Mutex<HashMap<String, Arc<ProcessTable>>>> = OnceLock::new();
    SESSIONS.get_or_init(Default::default)
}

/// The table of `session`, created on first use.
pub fn table_of(session: &str) -> Arc<ProcessTable> {
    registry()
        .locked()
        .entry(session.to_string())
        .or_default()
        .clone()
}

/// The ids `session`'s table started and stopped keeping since the last time (for the
/// daemon's routing; see `WorkerReply.kept_processes`).
pub fn changes_of(session: &str) -> (Vec<i32>, Vec<i32>) {
    let table = registry().locked().get(session).cloned();
    table.map(|t| t.take_changes()).unwrap_or_default()
}

/// The id a process started by this call gets: the one the daemon drew (unique across the
/// session's workers), or one drawn here.
fn new_id(ctx: &ToolContext, table: &ProcessTable) -> i32 {
    match ctx.new_process_id {
        Some(id) if table.reserve_id(id) => id,
        _ => table.allocate_id(),
    }
}

/// The session closed: kill every one of its processes (whole trees) and forget them.
/// Returns how many were killed.
pub fn close_session(session: &str) -> usize {
    let table = registry().locked().remove(session);
    match table {
        Some(t) => {
            let n = t.len();
            t.terminate_all();
            n
        }
        None => 0,
    }
}

/// The worker is going away: kill every process of every session.
pub fn close_all() {
    let tables: Vec<Arc<ProcessTable>> = registry().locked().drain().map(|(_, t)| t).collect();
    for t in tables {
        t.terminate_all();
    }
}

/// What a call returns besides its text: the §7.4 warning, for typed results.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallResult {
    pub output: ExecOutput,
    pub warnings: Vec<String>,
}

impl CallResult {
    pub fn model_text(&self) -> String {
        self.output.model_text()
    }
}

/// The §7.4 warning for `n` kept processes.
pub fn process_count_warning(n: usize) -> String {
    format!(
        "The maximum number of unified exec processes you can keep open is {WARNING_UNIFIED_EXEC_PROCESSES} and you currently have {n} processes open. Reuse older processes or close them to prevent automatic pruning of old processes"
    )
}

/// `exec_command` (§7.1).
pub fn exec_command(ctx: &ToolContext, args: &ExecCommandArgs) -> Result<CallResult, ToolError> {
    let argv = args.argv(&ctx.shell.to_string_lossy(), true)?;
    let cwd = match args.workdir.as_deref().filter(|w| !w.is_empty()) {
        Some(w) => resolve_path(&ctx.cwd, w),
        None => ctx.cwd.clone(),
    };
    let spec = SpawnSpec {
        argv: argv.clone(),
        cwd,
        env: process_env(&ctx.env, ctx.network_disabled),
        tty: args.tty,
        stdin_pipe: false,
        size: None,
    };
    let command = shell_join(&argv);
    let table = table_of(&ctx.session_id);
    let id = new_id(ctx, &table);
    let guard = match ctx.runner.guard_process() {
        Ok(g) => g,
        Err(e) => {
            table.release_id(id);
            return Err(errors::create_failed(&command, &e.message));
        }
    };
    let process = match Process::spawn(&spec, guard) {
        Ok(p) => Arc::new(p),
        Err(reason) => {
            table.release_id(id);
            return Err(errors::create_failed(&command, &reason));
        }
    };
    let start = Instant::now();
    // Kept before the first wait (as Codex does), so it counts — and may evict — at once.
    let mut warnings = Vec::new();
    let stored = !process.has_exited();
    if stored {
        let s = table.store(
            id,
            table::Entry {
                process: process.clone(),
                command: argv.clone(),
                tty: args.tty,
                last_used: start,
            },
        );
        if s.count >= WARNING_UNIFIED_EXEC_PROCESSES {
            warnings.push(process_count_warning(s.count));
        }
    }
    let deadline = start + Duration::from_millis(clamp_exec_yield(args.yield_time_ms));
    let mut collected = CaptureBuffer::new(CaptureLimits::WITH_TEXT);
    process.collect(deadline, POST_EXIT_CLOSE_WAIT_CAP, &mut |d| {
        collected.push(d)
    });
    let wall_time = start.elapsed();
    let (session_id, exit_code) = if stored {
        match table.refresh(id) {
            table::Refreshed::Alive => (Some(id), None),
            table::Refreshed::Exited(e) => {
                e.process.terminate();
                (None, e.process.status().exit)
            }
            table::Refreshed::Unknown => {
                // Evicted during the wait by a concurrent call.
                process.terminate();
                return Err(errors::unknown_process(id));
            }
        }
    } else {
        table.release_id(id);
        process.terminate();
        (None, process.status().exit)
    };
    let captured = collected.finish();
    if let Some(code) = exit_code {
        ctx.runner
            .process_exited(code, captured.has_denial_keyword());
    }
    Ok(CallResult {
        output: ExecOutput {
            chunk_id: output::chunk_id(),
            wall_time,
            exit_code,
            session_id,
            captured,
            max_output_tokens: args.max_output_tokens,
        },
        warnings,
    })
}

/// `write_stdin` (§7.2).
pub fn write_stdin(ctx: &ToolContext, args: &WriteStdinArgs) -> Result<CallResult, ToolError> {
    let table = table_of(&ctx.session_id);
    let Some(entry) = table.touch(args.session_id) else {
        return Err(errors::unknown_process(args.session_id));
    };
    let process = entry.process.clone();
    if !args.chars.is_empty() {
        if !entry.tty {
            return Err(errors::stdin_closed());
        }
        match process.write(args.chars.as_bytes()) {
            Ok(()) => std::thread::sleep(WRITE_PAUSE),
            Err(_) if process.has_exited() => {}
            Err(_) => return Err(errors::write_failed()),
        }
    }
    let wait = clamp_write_yield(
        args.yield_time_ms,
        args.chars.is_empty(),
        ctx.background_terminal_max_timeout_ms,
    );
    let start = Instant::now();
    let mut collected = CaptureBuffer::new(CaptureLimits::WITH_TEXT);
    process.collect(
        start + Duration::from_millis(wait),
        POST_EXIT_CLOSE_WAIT_CAP,
        &mut |d| collected.push(d),
    );
    let wall_time = start.elapsed();
    let (session_id, exit_code) = match table.refresh(args.session_id) {
        table::Refreshed::Alive => (Some(args.session_id), None),
        table::Refreshed::Exited(e) => {
            e.process.terminate();
            (None, e.process.status().exit)
        }
        table::Refreshed::Unknown => return Err(errors::unknown_process(args.session_id)),
    };
    Ok(CallResult {
        output: ExecOutput {
            chunk_id: output::chunk_id(),
            wall_time,
            exit_code,
            session_id,
            captured: collected.finish(),
            max_output_tokens: args.max_output_tokens,
        },
        warnings: Vec::new(),
    })
}

#[cfg(test)]
mod tests;
