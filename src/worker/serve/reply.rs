//! The bounds and shapes of what the worker sends back beside a tool's own result: the most one
//! answer may carry (a larger one becomes a clear failure), the failure frame sent before
//! serving starts, and the sandbox layers' reports in the API's terms.

use crate::api;
use crate::sandbox::report::{LayerReport, LayerStatus};
use crate::wire::frame;
use crate::wire::{FailureKind, ToolFailure, WorkerReply, worker_reply};
use std::os::unix::net::UnixStream;

/// The most one unary answer may be. Clients accept 64 MiB (`client::MAX_MESSAGE_BYTES`); this
/// leaves room for the frame and gRPC's own overhead, and keeps one answer well inside the
/// worker frame limit, so a reply is never dropped for its size.
pub const MAX_RESPONSE_BYTES: usize = 32 * 1024 * 1024;

/// A reply too large to send becomes a clear RESOURCE_EXHAUSTED failure instead; through
/// Invoke, where the model chose the size (a `read_file` limit), it is model text with
/// `success: false`, so that the agent loop gets a result to act on, not an exception.
pub(super) fn bounded(result: worker_reply::Result) -> worker_reply::Result {
    use prost::Message;
    let len = match &result {
        worker_reply::Result::ReadFile(r) => r.encoded_len(),
        worker_reply::Result::ListDir(r) => r.encoded_len(),
        worker_reply::Result::GrepFiles(r) => r.encoded_len(),
        worker_reply::Result::ApplyPatch(r) => r.encoded_len(),
        worker_reply::Result::Shell(r) => r.encoded_len(),
        worker_reply::Result::Invoke(r) => r.encoded_len(),
        worker_reply::Result::Process(r) => r.encoded_len(),
        worker_reply::Result::PromptContext(r) => r.encoded_len(),
        worker_reply::Result::Files(r) => r.encoded_len(),
        _ => 0,
    };
    if len <= MAX_RESPONSE_BYTES {
        return result;
    }
    let message = format!(
        "the result is {len} bytes, more than the {} MiB one response may carry; ask for less \
         (read_file: offset and limit; list_dir and grep_files: limit; a command: send its \
         output to a file and read that in parts)",
        MAX_RESPONSE_BYTES >> 20
    );
    match result {
        worker_reply::Result::Invoke(r) => worker_reply::Result::Invoke(api::InvokeResponse {
            call_id: r.call_id,
            output: message,
            success: false,
            ..Default::default()
        }),
        _ => {
            worker_reply::Result::Failure(ToolFailure::of(FailureKind::ResourceExhausted, message))
        }
    }
}

pub(super) fn send_failure(
    w: &mut UnixStream,
    kind: FailureKind,
    message: String,
) -> std::io::Result<()> {
    frame::write_blocking(
        w,
        &WorkerReply {
            id: 0,
            last: true,
            result: Some(worker_reply::Result::Failure(ToolFailure::of(
                kind, message,
            ))),
            ..Default::default()
        },
    )
}

/// A layer report in the API's terms.
pub fn layer_to_api(r: &LayerReport) -> api::Layer {
    let status = match r.status {
        LayerStatus::Enforced | LayerStatus::PartiallyEnforced => api::LayerStatus::Enforced,
        LayerStatus::Degraded => api::LayerStatus::Degraded,
        LayerStatus::NotApplicable => api::LayerStatus::NotApplicable,
    };
    let mut detail = r.detail.clone();
    if !r.missing.is_empty() && r.status == LayerStatus::PartiallyEnforced {
        detail.push_str(&format!("; missing: {}", r.missing.join(", ")));
    }
    api::Layer {
        name: r.layer.as_str().to_string(),
        status: status as i32,
        detail,
    }
}
