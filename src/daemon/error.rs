//! What goes wrong with a call, in the daemon's words. Every layer below the gRPC faces returns
//! a [`CallError`]; `rpc/status.rs` alone turns one into a gRPC status (its code and its
//! `google.rpc` details). The texts live here, beside the failure they describe.

use crate::wire::{FailureKind, ToolFailure};
use std::time::Duration;

/// A call's failure.
#[derive(Debug, Clone, PartialEq)]
pub enum CallError {
    /// The worker reported it: a tool's own failure, or a sandbox layer it could not set up.
    Tool(Box<ToolFailure>),
    /// The worker serving the call exited while the call was in flight.
    WorkerDied,
    /// A request field is wrong; `field` is its name in the request.
    InvalidField { field: String, message: String },
    /// The caller could not be identified.
    Unauthenticated(String),
    /// The caller, its rule, the operator's policy or the user does not allow it.
    Denied(String),
    /// A cap is reached; `retry_after` when waiting is the remedy.
    Exhausted {
        message: String,
        retry_after: Option<Duration>,
    },
    /// What the call names does not exist (for this caller).
    NotFound(String),
    /// The host, the session or the thing named is not in a state the call can run in.
    Unmet(String),
    /// The call was cut short: its session closed, its client left.
    Cancelled(String),
    /// A deadline passed before the call could be answered.
    Expired(String),
    /// The daemon could not do its own part (a socket, a spawn, the user database, a bug).
    Internal(String),
}

/// A failure's class: the canonical gRPC code it is answered with, named in the daemon's
/// vocabulary so that the audit log and the metrics can say it without knowing gRPC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    InvalidArgument,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    Unauthenticated,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    DeadlineExceeded,
    Cancelled,
    Unavailable,
    Internal,
}

impl Class {
    /// The canonical name (`NOT_FOUND`), as every gRPC library spells it.
    pub fn name(self) -> &'static str {
        match self {
            Class::InvalidArgument => "INVALID_ARGUMENT",
            Class::NotFound => "NOT_FOUND",
            Class::AlreadyExists => "ALREADY_EXISTS",
            Class::PermissionDenied => "PERMISSION_DENIED",
            Class::Unauthenticated => "UNAUTHENTICATED",
            Class::ResourceExhausted => "RESOURCE_EXHAUSTED",
            Class::FailedPrecondition => "FAILED_PRECONDITION",
            Class::Aborted => "ABORTED",
            Class::DeadlineExceeded => "DEADLINE_EXCEEDED",
            Class::Cancelled => "CANCELLED",
            Class::Unavailable => "UNAVAILABLE",
            Class::Internal => "INTERNAL",
        }
    }

    /// The class of a failure the worker reported (an unknown kind is the worker's bug).
    fn of_tool(f: &ToolFailure) -> Class {
        if f.setup.is_some() {
            return Class::FailedPrecondition;
        }
        match FailureKind::try_from(f.kind).unwrap_or(FailureKind::Internal) {
            FailureKind::InvalidArgument => Class::InvalidArgument,
            FailureKind::NotFound => Class::NotFound,
            FailureKind::PermissionDenied => Class::PermissionDenied,
            FailureKind::DeadlineExceeded => Class::DeadlineExceeded,
            FailureKind::ResourceExhausted => Class::ResourceExhausted,
            FailureKind::AlreadyExists => Class::AlreadyExists,
            FailureKind::FailedPrecondition => Class::FailedPrecondition,
            FailureKind::Aborted => Class::Aborted,
            FailureKind::Cancelled => Class::Cancelled,
            FailureKind::Internal => Class::Internal,
        }
    }
}

impl CallError {
    pub fn class(&self) -> Class {
        match self {
            CallError::Tool(f) => Class::of_tool(f),
            CallError::WorkerDied => Class::Unavailable,
            CallError::InvalidField { .. } => Class::InvalidArgument,
            CallError::Unauthenticated(_) => Class::Unauthenticated,
            CallError::Denied(_) => Class::PermissionDenied,
            CallError::Exhausted { .. } => Class::ResourceExhausted,
            CallError::NotFound(_) => Class::NotFound,
            CallError::Unmet(_) => Class::FailedPrecondition,
            CallError::Cancelled(_) => Class::Cancelled,
            CallError::Expired(_) => Class::DeadlineExceeded,
            CallError::Internal(_) => Class::Internal,
        }
    }

    /// The text a client reads (for a tool failure, the sandbox setup's §6 form).
    pub fn message(&self) -> String {
        match self {
            CallError::Tool(f) => match &f.setup {
                Some(setup) => setup_text(setup, &f.message),
                None => f.message.clone(),
            },
            CallError::WorkerDied => WORKER_DIED.to_string(),
            CallError::InvalidField { message, .. } | CallError::Exhausted { message, .. } => {
                message.clone()
            }
            CallError::Unauthenticated(m)
            | CallError::Denied(m)
            | CallError::NotFound(m)
            | CallError::Unmet(m)
            | CallError::Cancelled(m)
            | CallError::Expired(m)
            | CallError::Internal(m) => m.clone(),
        }
    }

    /// The sandbox layer a worker could not set up, when that is what failed.
    pub fn failed_layer(&self) -> Option<&str> {
        match self {
            CallError::Tool(f) => f.setup.as_ref().map(|s| s.layer.as_str()),
            _ => None,
        }
    }

    /// INVALID_ARGUMENT about request field `field`.
    pub fn invalid_field(field: &str, message: &str) -> CallError {
        CallError::InvalidField {
            field: field.to_string(),
            message: message.to_string(),
        }
    }

    /// A per-user cap of the policy (sessions, workers, running commands), or a daemon-wide
    /// table that is full.
    pub fn exhausted(message: String) -> CallError {
        CallError::Exhausted {
            message,
            retry_after: None,
        }
    }

    /// The worker answered a call with a reply of another kind.
    pub fn unexpected_reply(reply: impl std::fmt::Debug) -> CallError {
        CallError::Internal(format!(
            "worker answered with an unexpected reply: {reply:?}"
        ))
    }

    /// A new worker ended before saying it was ready (crash, not a reported layer failure).
    pub fn worker_setup_exited(exit: &str) -> CallError {
        CallError::Internal(format!(
            "the sandbox worker exited during setup ({exit}); see the daemon log"
        ))
    }

    /// A new worker did not finish confining itself in time.
    pub fn worker_not_ready(secs: u64) -> CallError {
        CallError::Internal(format!(
            "the sandbox worker did not become ready within {secs} s; see the daemon log"
        ))
    }

    /// The worker sent more streamed output than the flow-control window allows.
    pub fn window_exceeded(bytes: u64) -> CallError {
        CallError::Internal(format!(
            "the sandbox worker sent {bytes} bytes of output beyond its flow-control window; \
             the call was cancelled"
        ))
    }

    /// A user starting sandboxes faster than its rule allows, beyond the longest wait (H23).
    pub fn starting_too_fast(
        uid: u32,
        rule: &str,
        per_second: u32,
        retry_after: Duration,
    ) -> CallError {
        CallError::Exhausted {
            message: format!(
                "uid {uid} is starting sandboxes faster than policy rule `{rule}` allows \
                 ({per_second} per second, sandbox_starts_per_second): retry in {} ms, or \
                 reuse an open session",
                retry_after.as_millis().max(1)
            ),
            retry_after: Some(retry_after),
        }
    }

    /// An unknown session, or one of another identity: exactly the same answer, so nothing
    /// hints that the other exists.
    pub fn session_not_found(id: &str) -> CallError {
        CallError::NotFound(format!(
            "session `{id}` not found: it was never opened, was closed, or expired after being \
             idle; open a new one with OpenSession"
        ))
    }

    /// The session closed while one of its calls was running.
    pub fn session_closed() -> CallError {
        CallError::Cancelled(
            "the session was closed while the call was running; the call was cancelled".into(),
        )
    }

    /// A typed call asked for a longer timeout than the caller's rule allows.
    pub fn timeout_over_ceiling(requested: u64, ceiling: u64, rule: &str) -> CallError {
        CallError::Denied(format!(
            "timeout_ms {requested} exceeds the {ceiling} ms ceiling of policy rule `{rule}`"
        ))
    }

    /// A streaming client stopped reading for longer than the stall budget.
    pub fn stream_stalled(budget: Duration) -> CallError {
        CallError::exhausted(format!(
            "the client read none of the command's output for {} s, the daemon's stall budget; \
             the command was cancelled and its processes killed",
            budget.as_secs_f64()
        ))
    }

    /// A session's protection kept changing while a call tried to start (spec/sandbox.md
    /// §8.6 H1).
    pub fn protection_unsettled(what: &str) -> CallError {
        CallError::Unmet(format!(
            "protection of this session's workspace keeps changing ({what}); the call was not run"
        ))
    }

    /// A session has as many calls waiting for a decision as it may.
    pub fn too_many_approvals(limit: usize) -> CallError {
        CallError::exhausted(format!(
            "this session already has {limit} calls waiting for an approval decision, the most \
             it may; answer them with DecideApproval (or let them expire) first"
        ))
    }

    /// An upload that breaks the stream's rules before the worker sees it (no UploadStart
    /// first, a second one, an empty message, a data chunk over the limit).
    pub fn upload_refused(message: &str) -> CallError {
        CallError::invalid_field("item", &format!("{message}; nothing was changed"))
    }

    /// An upload's stream ended before its UploadFinish (the client cancelled, or is broken).
    pub fn upload_unfinished() -> CallError {
        CallError::Cancelled(
            "the upload stream ended without its UploadFinish message (a cancelled client looks \
             like this); nothing was changed. Send UploadFinish as the last message to commit"
                .into(),
        )
    }

    /// An upload client sent nothing for longer than the stall budget.
    pub fn upload_stalled(budget: Duration) -> CallError {
        CallError::exhausted(format!(
            "the client sent nothing of its upload for {} s, the daemon's stall budget; the \
             upload was cancelled and nothing was changed",
            budget.as_secs_f64()
        ))
    }

    /// An upload's client stream failed (`cause`: what the transport said).
    pub fn upload_interrupted(cause: &str) -> CallError {
        CallError::Cancelled(format!(
            "the upload stream ended abnormally ({cause}); nothing was changed"
        ))
    }
}

impl From<ToolFailure> for CallError {
    fn from(f: ToolFailure) -> CallError {
        CallError::Tool(Box::new(f))
    }
}

/// For logs: the text a client would read.
impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message())
    }
}

const WORKER_DIED: &str = "the sandbox worker serving this session exited while the call was \
     in flight; the call was lost. A new worker is started on the next call; retry it";

/// `sandbox unavailable: {layer} could not be applied: {cause}. {fix}` (spec/sandbox.md §6),
/// built from the parts; a failure with fixed wording (no cause) keeps its own text.
fn setup_text(setup: &crate::wire::SetupFailure, message: &str) -> String {
    if setup.cause.is_empty() {
        return message.to_string();
    }
    let mut text = format!(
        "sandbox unavailable: {} could not be applied: {}.",
        setup.layer, setup.cause
    );
    if !setup.fix.is_empty() {
        text.push(' ');
        text.push_str(&setup.fix);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::SetupFailure;

    #[test]
    fn setup_failures_are_built_from_their_parts() {
        let setup = CallError::from(ToolFailure {
            kind: FailureKind::Internal as i32,
            message: "sandbox setup failed: landlock could not be applied: x. y.".into(),
            setup: Some(SetupFailure {
                layer: "landlock".into(),
                cause: "ENOSYS".into(),
                fix: "Enable Landlock.".into(),
            }),
            field: String::new(),
        });
        assert_eq!(setup.class(), Class::FailedPrecondition);
        assert_eq!(
            setup.message(),
            "sandbox unavailable: landlock could not be applied: ENOSYS. Enable Landlock."
        );
        let fixed = CallError::from(ToolFailure {
            kind: FailureKind::FailedPrecondition as i32,
            message: "sandbox setup failed: capabilities remain after dropping them (CapEff=1)"
                .into(),
            setup: Some(SetupFailure {
                layer: "capabilities".into(),
                ..Default::default()
            }),
            field: String::new(),
        });
        assert_eq!(
            fixed.message(),
            "sandbox setup failed: capabilities remain after dropping them (CapEff=1)"
        );
    }

    #[test]
    fn a_tool_failure_keeps_the_class_the_worker_named() {
        let tool = CallError::from(ToolFailure::of(
            FailureKind::NotFound,
            "no such file".into(),
        ));
        assert_eq!(
            (tool.class(), tool.message().as_str()),
            (Class::NotFound, "no such file")
        );
        // A kind this daemon does not know (a newer worker's) is not trusted to be harmless.
        let unknown = CallError::from(ToolFailure {
            kind: 999,
            ..Default::default()
        });
        assert_eq!(unknown.class(), Class::Internal);
    }
}
