//! The agent tools, as plain Rust: arguments in, structured results and model-facing text out.
//!
//! This module knows nothing of gRPC or of sandboxing. It is run inside a confined worker; the
//! sandbox, not this code, is what bounds the damage a bug here could do. Every tool follows the
//! same shape (one file per tool): parse arguments → validate → act → format.

pub mod apply_patch;
pub mod command_safety;
mod context;
pub mod grep_files;
pub mod list_dir;
pub mod prompt_context;
pub mod read_file;
pub mod shell;
pub mod transfer;
pub mod unified_exec;
pub mod update_plan;
pub mod view_image;

pub use context::{CommandRunner, ToolContext};

use std::io;
use std::path::{Path, PathBuf};

/// The class of a tool failure; the daemon maps it to a gRPC status code (spec/tools.md §0.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Bad arguments: parse errors, `offset must be…`, invalid regex, invalid patch.
    InvalidArgument,
    /// The path (or process) does not exist.
    NotFound,
    /// Rejected by the mode, the policy or file permissions.
    PermissionDenied,
    /// A tool's own time limit expired.
    DeadlineExceeded,
    /// A per-session limit is reached (e.g. the processes a session keeps), or the disk is full.
    ResourceExhausted,
    /// The target exists and the call may not replace it.
    AlreadyExists,
    /// The filesystem is not in the state the call needs (e.g. a directory where a file goes).
    FailedPrecondition,
    /// Something changed underneath the call (a file shrank while it was read); retrying may work.
    Aborted,
    /// The caller cancelled the call.
    Cancelled,
    /// Any other I/O failure.
    Internal,
}

/// A tool failure. `message` is the exact model-facing text (spec/tools.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolError {
    pub kind: ErrorKind,
    pub message: String,
    /// The request field an INVALID_ARGUMENT is about (the typed RPC's name for it), carried
    /// to the client as a google.rpc.BadRequest field violation; never part of model text.
    pub field: Option<&'static str>,
}

impl ToolError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            field: None,
        }
    }

    /// The same failure, naming the request field it is about (see [`ToolError::field`]).
    pub fn on(mut self, field: &'static str) -> Self {
        self.field = Some(field);
        self
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }

    /// An I/O failure with the model text `{prefix}{io error Display}`; the kind follows the error.
    pub fn io(prefix: &str, err: &io::Error) -> Self {
        Self::new(kind_of_io(err), format!("{prefix}{err}"))
    }

    /// `failed to parse function arguments: {serde error}` (spec/tools.md §0.3).
    pub fn parse(err: &serde_json::Error) -> Self {
        Self::invalid(format!("failed to parse function arguments: {err}"))
    }
}

/// A function tool's JSON arguments as `A`, with `failed to parse function arguments: …` when
/// they do not fit (spec/tools.md §0.3). Every tool parses its arguments here.
///
/// JSON `null` counts as absent, for every optional field of every tool (nested objects too):
/// strict-schema clients and models send `null` for each optional parameter they leave out.
/// The arguments are first parsed exactly as given (Codex's own parse, byte for byte); only
/// when that fails and they hold a `null` are they parsed again without the nulls, and if that
/// fails as well the first error is the answer, so the text of every error stays Codex's.
pub fn parse_arguments<A: serde::de::DeserializeOwned>(arguments: &str) -> Result<A, ToolError> {
    let first = match serde_json::from_str(arguments) {
        Ok(args) => return Ok(args),
        Err(e) => e,
    };
    let retried = serde_json::from_str::<serde_json::Value>(arguments)
        .ok()
        .and_then(|mut value| drop_nulls(&mut value).then_some(value))
        .and_then(|value| serde_json::from_value(value).ok());
    retried.ok_or_else(|| ToolError::parse(&first))
}

/// [`parse_arguments`] for arguments already parsed as JSON: the same typing, a second try
/// without the nulls; `None` when they do not fit.
pub fn arguments_from_value<A: serde::de::DeserializeOwned>(
    value: &serde_json::Value,
) -> Option<A> {
    A::deserialize(value).ok().or_else(|| {
        let mut value = value.clone();
        drop_nulls(&mut value)
            .then(|| A::deserialize(&value).ok())
            .flatten()
    })
}

/// Removes every `null` member of every object in `value`; whether any was removed.
fn drop_nulls(value: &mut serde_json::Value) -> bool {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            let before = map.len();
            map.retain(|_, v| !v.is_null());
            let mut dropped = map.len() != before;
            for v in map.values_mut() {
                dropped |= drop_nulls(v);
            }
            dropped
        }
        Value::Array(items) => {
            let mut dropped = false;
            for v in items {
                dropped |= drop_nulls(v);
            }
            dropped
        }
        _ => false,
    }
}

impl std::fmt::Display for ToolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ToolError {}

/// The error class of an I/O error. A full disk, a quota, the file-size limit or the descriptor
/// limits are a resource running out (RESOURCE_EXHAUSTED), not a fault of corral's.
pub fn kind_of_io(err: &io::Error) -> ErrorKind {
    if let Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG | libc::EMFILE | libc::ENFILE) =
        err.raw_os_error()
    {
        return ErrorKind::ResourceExhausted;
    }
    match err.kind() {
        io::ErrorKind::NotFound => ErrorKind::NotFound,
        io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem => {
            ErrorKind::PermissionDenied
        }
        // The wrong kind of file (a directory given to read_file, a file to list_dir): the
        // caller's mistake about the filesystem, not a fault of corral's to page anyone on.
        io::ErrorKind::IsADirectory | io::ErrorKind::NotADirectory => ErrorKind::FailedPrecondition,
        _ => ErrorKind::Internal,
    }
}

/// Resolves a path argument against the session's working directory (spec/tools.md §0.4): an
/// absolute path is kept, a relative one is joined to `cwd`, with no normalisation of `.`/`..`
/// and no symlink resolution.
pub fn resolve_path(cwd: &Path, path: &str) -> PathBuf {
    cwd.join(path)
}

/// Cuts `s` to at most `max` bytes, moved back to a UTF-8 character boundary (no marker).
pub fn truncate_to_char_boundary(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A temporary directory no git repository encloses, for tests whose answer depends on there
/// being none (`.gitignore` applies only inside one; project docs stop at its root). Codex's own
/// sandbox leaves empty `/tmp/.git` mount points behind on a machine where it ran, which would
/// make every directory under `/tmp` part of a "repository": the first candidate base without a
/// `.git` above it is used.
#[cfg(test)]
pub(crate) fn tempdir_outside_any_repository() -> tempfile::TempDir {
    let inside_a_repository = |dir: &Path| dir.ancestors().any(|a| a.join(".git").exists());
    let candidates = [
        std::env::temp_dir(),
        PathBuf::from("/var/tmp"),
        PathBuf::from("/dev/shm"),
    ];
    let base = candidates
        .iter()
        .find(|d| d.is_dir() && !inside_a_repository(d))
        .unwrap_or(&candidates[0]);
    tempfile::tempdir_in(base).expect("tempdir")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn null_is_absent_for_every_optional_argument_and_errors_stay_codex_s() {
        use unified_exec::{ExecCommandArgs, WriteStdinArgs};
        let with_nulls: ExecCommandArgs = parse_arguments(
            r#"{"cmd":"x","workdir":null,"shell":null,"login":null,"tty":null,
               "yield_time_ms":null,"max_output_tokens":null,"sandbox_permissions":null,
               "with_escalated_permissions":null,"justification":null,"prefix_rule":null}"#,
        )
        .unwrap();
        assert_eq!(with_nulls, parse_arguments(r#"{"cmd":"x"}"#).unwrap());
        let w: WriteStdinArgs =
            parse_arguments(r#"{"session_id":3,"chars":null,"yield_time_ms":null}"#).unwrap();
        assert_eq!(w, parse_arguments(r#"{"session_id":3}"#).unwrap());
        // Nested objects too (read_file's indentation).
        let r: read_file::ReadFileArgs = parse_arguments(
            r#"{"file_path":"f","offset":null,"mode":null,
               "indentation":{"anchor_line":null,"include_siblings":null}}"#,
        )
        .unwrap();
        assert_eq!(r.file_path, "f");
        // A required field sent as null fails with the text of the arguments as sent.
        let e = parse_arguments::<ExecCommandArgs>(r#"{"cmd":null,"tty":null}"#).unwrap_err();
        assert_eq!(
            e.message,
            "failed to parse function arguments: invalid type: null, expected a string at \
             line 1 column 11"
        );
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        let e = parse_arguments::<ExecCommandArgs>(r#"{"tty":null}"#).unwrap_err();
        assert_eq!(
            e.message,
            "failed to parse function arguments: invalid type: null, expected a boolean at \
             line 1 column 11"
        );
    }

    #[test]
    fn a_resource_running_out_is_resource_exhausted() {
        for errno in [
            libc::ENOSPC,
            libc::EDQUOT,
            libc::EFBIG,
            libc::EMFILE,
            libc::ENFILE,
        ] {
            let e = io::Error::from_raw_os_error(errno);
            assert_eq!(kind_of_io(&e), ErrorKind::ResourceExhausted, "{e}");
        }
        let eio = io::Error::from_raw_os_error(libc::EIO);
        assert_eq!(kind_of_io(&eio), ErrorKind::Internal);
        let enoent = io::Error::from_raw_os_error(libc::ENOENT);
        assert_eq!(kind_of_io(&enoent), ErrorKind::NotFound);
    }
}
