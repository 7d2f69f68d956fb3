//! The daemon's failures as gRPC statuses, in one place: a failure's class picks the code, and
//! what a client can act on rides along as `google.rpc` details (BadRequest naming the field,
//! RetryInfo saying when). Nothing else in the daemon builds a `Status`.

use crate::daemon::error::{CallError, Class};
use std::pin::Pin;
use std::task::{Context, Poll};
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

impl From<CallError> for Status {
    fn from(e: CallError) -> Status {
        let code = code_of(e.class());
        let message = e.message();
        match e {
            CallError::InvalidField { field, .. } => bad_request(&field, &message),
            // A tool's INVALID_ARGUMENT names the field the worker named, else the request's
            // main input.
            CallError::Tool(f) if code == Code::InvalidArgument => {
                let field = if f.field.is_empty() {
                    "request"
                } else {
                    &f.field
                };
                bad_request(field, &message)
            }
            CallError::Exhausted {
                retry_after: Some(after),
                ..
            } => Status::with_error_details(
                code,
                message,
                ErrorDetails::with_retry_info(Some(after)),
            ),
            _ => Status::new(code, message),
        }
    }
}

fn code_of(class: Class) -> Code {
    match class {
        Class::InvalidArgument => Code::InvalidArgument,
        Class::NotFound => Code::NotFound,
        Class::AlreadyExists => Code::AlreadyExists,
        Class::PermissionDenied => Code::PermissionDenied,
        Class::Unauthenticated => Code::Unauthenticated,
        Class::ResourceExhausted => Code::ResourceExhausted,
        Class::FailedPrecondition => Code::FailedPrecondition,
        Class::Aborted => Code::Aborted,
        Class::DeadlineExceeded => Code::DeadlineExceeded,
        Class::Cancelled => Code::Cancelled,
        Class::Unavailable => Code::Unavailable,
        Class::Internal => Code::Internal,
    }
}

fn bad_request(field: &str, message: &str) -> Status {
    Status::with_error_details(
        Code::InvalidArgument,
        message,
        ErrorDetails::with_bad_request_violation(field, message),
    )
}

/// A request field the gRPC face itself finds wrong.
pub fn invalid_field(field: &str, message: &str) -> Status {
    CallError::invalid_field(field, message).into()
}

/// A response stream of the pipeline's items, its failures as statuses.
pub struct Grpc<S>(pub S);

impl<T, S> tokio_stream::Stream for Grpc<S>
where
    S: tokio_stream::Stream<Item = Result<T, CallError>> + Unpin,
{
    type Item = Result<T, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.get_mut().0)
            .poll_next(cx)
            .map(|item| item.map(|r| r.map_err(Status::from)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{FailureKind, ToolFailure};

    /// The audit log and the metrics name a failure by its class; a client sees the code. They
    /// must be the same name.
    #[test]
    fn every_class_is_answered_with_the_code_of_its_name() {
        for class in [
            Class::InvalidArgument,
            Class::NotFound,
            Class::AlreadyExists,
            Class::PermissionDenied,
            Class::Unauthenticated,
            Class::ResourceExhausted,
            Class::FailedPrecondition,
            Class::Aborted,
            Class::DeadlineExceeded,
            Class::Cancelled,
            Class::Unavailable,
            Class::Internal,
        ] {
            let code = code_of(class);
            let debug: String = format!("{code:?}")
                .chars()
                .enumerate()
                .flat_map(|(i, c)| {
                    let sep = (c.is_uppercase() && i > 0).then_some('_');
                    sep.into_iter()
                        .chain(std::iter::once(c.to_ascii_uppercase()))
                })
                .collect();
            assert_eq!(debug, class.name());
        }
    }

    #[test]
    fn invalid_arguments_name_their_field() {
        let offset = Status::from(CallError::from(ToolFailure {
            kind: FailureKind::InvalidArgument as i32,
            message: "offset must be a 1-indexed line number".into(),
            setup: None,
            field: "offset".into(),
        }));
        assert_eq!(offset.code(), Code::InvalidArgument);
        assert_eq!(offset.message(), "offset must be a 1-indexed line number");
        let bad = offset.get_details_bad_request().expect("a BadRequest");
        assert_eq!(bad.field_violations[0].field, "offset");
        let unnamed = Status::from(CallError::from(ToolFailure::of(
            FailureKind::InvalidArgument,
            "x".into(),
        )));
        assert_eq!(
            unnamed.get_details_bad_request().unwrap().field_violations[0].field,
            "request"
        );
        let field = Status::from(CallError::invalid_field("cwd", "cwd is required"));
        assert_eq!(
            field.get_details_bad_request().unwrap().field_violations[0].field,
            "cwd"
        );
    }

    #[test]
    fn a_start_refused_for_its_rate_says_when_to_retry() {
        let after = std::time::Duration::from_millis(250);
        let s = Status::from(CallError::starting_too_fast(1000, "r", 2, after));
        assert_eq!(s.code(), Code::ResourceExhausted);
        assert_eq!(s.get_details_retry_info().unwrap().retry_delay, Some(after));
        assert_eq!(
            Status::from(CallError::WorkerDied).code(),
            Code::Unavailable
        );
    }
}
