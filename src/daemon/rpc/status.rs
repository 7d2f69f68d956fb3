//! Domain errors → gRPC status codes, in one place: what the worker reports (tool failures,
//! sandbox setup failures), what happens to a worker (it died), and what the call pipeline
//! refuses (sessions, policy, flow control). Handlers never pick a code themselves.

use crate::wire::ToolFailure;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

/// A failure the worker reported: a tool's own class (spec/tools.md §0.5), or
/// FAILED_PRECONDITION with the §6 text when the sandbox could not be set up. An
/// INVALID_ARGUMENT carries a google.rpc.BadRequest naming the field the worker named (the
/// request's main input when it named none).
pub fn tool_failure(f: ToolFailure) -> Status {
    match f.setup {
        Some(setup) => Status::failed_precondition(setup_text(&setup, &f.message)),
        None if Code::from(f.code) == Code::InvalidArgument => {
            let field = if f.field.is_empty() {
                "request"
            } else {
                &f.field
            };
            invalid_field(field, &f.message)
        }
        None => Status::new(Code::from(f.code), f.message),
    }
}

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

const WORKER_DIED: &str = "the sandbox worker serving this session exited while the call was \
     in flight; the call was lost. A new worker is started on the next call; retry it";

/// The worker serving the call exited while it was in flight.
pub fn worker_died() -> Status {
    Status::unavailable(WORKER_DIED)
}

/// Whether `s` is [`worker_died`]'s answer.
pub fn is_worker_died(s: &Status) -> bool {
    s.code() == tonic::Code::Unavailable && s.message() == WORKER_DIED
}

/// A new worker ended before saying it was ready (crash, not a reported layer failure).
pub fn worker_setup_exited(exit: &str) -> Status {
    Status::internal(format!(
        "the sandbox worker exited during setup ({exit}); see the daemon log"
    ))
}

/// A new worker did not finish confining itself in time.
pub fn worker_not_ready(secs: u64) -> Status {
    Status::internal(format!(
        "the sandbox worker did not become ready within {secs} s; see the daemon log"
    ))
}

/// The worker answered a call with a reply of another kind.
pub fn unexpected_reply(reply: impl std::fmt::Debug) -> Status {
    Status::internal(format!(
        "worker answered with an unexpected reply: {reply:?}"
    ))
}

/// The worker sent more streamed output than the flow-control window allows.
pub fn window_exceeded(bytes: u64) -> Status {
    Status::internal(format!(
        "the sandbox worker sent {bytes} bytes of output beyond its flow-control window; the \
         call was cancelled"
    ))
}

/// INVALID_ARGUMENT with a google.rpc.BadRequest naming the field.
pub fn invalid_field(field: &str, message: &str) -> Status {
    Status::with_error_details(
        Code::InvalidArgument,
        message,
        ErrorDetails::with_bad_request_violation(field, message),
    )
}

/// A user starting sandboxes faster than its rule allows, beyond the longest wait (H23).
pub fn starting_too_fast(
    uid: u32,
    rule: &str,
    per_second: u32,
    retry_after: std::time::Duration,
) -> Status {
    let message = format!(
        "uid {uid} is starting sandboxes faster than policy rule `{rule}` allows \
         ({per_second} per second, sandbox_starts_per_second): retry in {} ms, or reuse an \
         open session",
        retry_after.as_millis().max(1)
    );
    Status::with_error_details(
        Code::ResourceExhausted,
        message,
        ErrorDetails::with_retry_info(Some(retry_after)),
    )
}

/// An unknown session, or one of another identity: exactly the same answer, so nothing hints
/// that the other exists.
pub fn session_not_found(id: &str) -> Status {
    Status::not_found(format!(
        "session `{id}` not found: it was never opened, was closed, or expired after being \
         idle; open a new one with OpenSession"
    ))
}

/// The session closed while one of its calls was running.
pub fn session_closed() -> Status {
    Status::cancelled("the session was closed while the call was running; the call was cancelled")
}

/// An escalation the operator (or the caller's rule) does not allow.
pub fn escalation_refused(text: String) -> Status {
    Status::permission_denied(text)
}

/// A typed call asked for a longer timeout than the caller's rule allows.
pub fn timeout_over_ceiling(requested: u64, ceiling: u64, rule: &str) -> Status {
    Status::permission_denied(format!(
        "timeout_ms {requested} exceeds the {ceiling} ms ceiling of policy rule `{rule}`"
    ))
}

/// A per-user cap of the policy (sessions, workers, running commands), or a daemon-wide table
/// that is full.
pub fn exhausted(text: String) -> Status {
    Status::resource_exhausted(text)
}

/// A streaming client stopped reading for longer than the stall budget.
pub fn stream_stalled(budget: std::time::Duration) -> Status {
    Status::resource_exhausted(format!(
        "the client read none of the command's output for {} s, the daemon's stall budget; \
         the command was cancelled and its processes killed",
        budget.as_secs_f64()
    ))
}

/// A session's protection kept changing while a call tried to start (spec/sandbox.md §8.6 H1).
pub fn protection_unsettled(what: &str) -> Status {
    Status::failed_precondition(format!(
        "protection of this session's workspace keeps changing ({what}); the call was not run"
    ))
}

/// A session has as many calls waiting for a decision as it may.
pub fn too_many_approvals(limit: usize) -> Status {
    Status::resource_exhausted(format!(
        "this session already has {limit} calls waiting for an approval decision, the most it \
         may; answer them with DecideApproval (or let them expire) first"
    ))
}

/// Why a decision was not taken (nothing ran): unknown (or another identity's) approval,
/// decided already, or expired.
pub fn decision_refused(id: &str, why: &crate::daemon::pipeline::approvals::Refusal) -> Status {
    use crate::daemon::pipeline::approvals::Refusal;
    match why {
        Refusal::NotFound => Status::not_found(format!(
            "approval `{id}` not found in this session: it was never issued here, belongs to \
             another session, or was settled long ago; nothing ran"
        )),
        Refusal::AlreadyDecided(d) => Status::failed_precondition(format!(
            "approval `{id}` was already decided ({}); a decision is final and nothing ran again",
            d.audit_name()
        )),
        Refusal::Expired(at) => Status::deadline_exceeded(format!(
            "approval `{id}` expired at {} before a decision arrived; nothing ran. Give the \
             model the request's rejected_output (`{}`)",
            crate::daemon::pipeline::audit::rfc3339(
                std::time::UNIX_EPOCH + std::time::Duration::from_millis(*at)
            ),
            crate::daemon::pipeline::approvals::REJECTED_BY_USER
        )),
    }
}

/// The user denied a typed call (Shell, ShellStream, StartProcess): Codex's text.
pub fn rejected_by_user() -> Status {
    Status::permission_denied(crate::daemon::pipeline::approvals::REJECTED_BY_USER)
}

/// A sandboxed process (a model's own command) tried to decide an approval.
pub fn sandboxed_decider() -> Status {
    Status::permission_denied(
        "approval decisions must come from the user's client, not from a sandboxed process; \
         nothing was decided",
    )
}

/// An upload that breaks the stream's rules before the worker sees it (no UploadStart first,
/// a second one, an empty message, a data chunk over the limit).
pub fn upload_refused(message: &str) -> Status {
    invalid_field("item", &format!("{message}; nothing was changed"))
}

/// An upload's stream ended before its UploadFinish (the client cancelled, or is broken).
pub fn upload_unfinished() -> Status {
    Status::cancelled(
        "the upload stream ended without its UploadFinish message (a cancelled client looks \
         like this); nothing was changed. Send UploadFinish as the last message to commit",
    )
}

/// An upload client sent nothing for longer than the stall budget.
pub fn upload_stalled(budget: std::time::Duration) -> Status {
    Status::resource_exhausted(format!(
        "the client sent nothing of its upload for {} s, the daemon's stall budget; the upload was cancelled and nothing was changed",
        budget.as_secs_f64()
    ))
}

/// An upload's client stream failed (the client cancelled, or the connection broke).
pub fn upload_interrupted(cause: &Status) -> Status {
    Status::cancelled(format!(
        "the upload stream ended abnormally ({}: {}); nothing was changed",
        cause.code(),
        cause.message()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::SetupFailure;

    #[test]
    fn setup_failures_are_built_from_their_parts() {
        let s = tool_failure(ToolFailure {
            code: Code::Internal as i32,
            message: "sandbox setup failed: landlock could not be applied: x. y.".into(),
            setup: Some(SetupFailure {
                layer: "landlock".into(),
                cause: "ENOSYS".into(),
                fix: "Enable Landlock.".into(),
            }),
            field: String::new(),
        });
        assert_eq!(s.code(), Code::FailedPrecondition);
        assert_eq!(
            s.message(),
            "sandbox unavailable: landlock could not be applied: ENOSYS. Enable Landlock."
        );
        let fixed = tool_failure(ToolFailure {
            code: Code::FailedPrecondition as i32,
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
        let tool = tool_failure(ToolFailure {
            code: Code::NotFound as i32,
            message: "no such file".into(),
            setup: None,
            field: String::new(),
        });
        assert_eq!(
            (tool.code(), tool.message()),
            (Code::NotFound, "no such file")
        );
        let offset = tool_failure(ToolFailure {
            code: Code::InvalidArgument as i32,
            message: "offset must be a 1-indexed line number".into(),
            setup: None,
            field: "offset".into(),
        });
        assert_eq!(offset.code(), Code::InvalidArgument);
        assert_eq!(offset.message(), "offset must be a 1-indexed line number");
        let bad = offset.get_details_bad_request().expect("a BadRequest");
        assert_eq!(bad.field_violations[0].field, "offset");
        let unnamed = tool_failure(ToolFailure {
            code: Code::InvalidArgument as i32,
            message: "x".into(),
            ..Default::default()
        });
        assert_eq!(
            unnamed.get_details_bad_request().unwrap().field_violations[0].field,
            "request"
        );
    }
}
