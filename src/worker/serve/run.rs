//! Running one call, on the reader thread or a call thread: its tool context, its partial
//! replies (a streamed delta waits for window), the dispatch to the tool (a panic still answers
//! the call), and the final reply with what the worker reports beside it.

use super::Serving;
use super::call_state::{CallState, delta_bytes};
use super::reply::bounded;
use crate::sync::LockExt;
use crate::wire::{
    CallContext, FailureKind, ToolFailure, WorkerReply, worker_reply, worker_request,
};
use crate::worker::dispatch;
use std::sync::Arc;
use std::time::Instant;

/// A call taken off the socket.
pub(super) struct Job {
    pub(super) id: u64,
    pub(super) context: Option<CallContext>,
    pub(super) call: worker_request::Call,
    pub(super) stream: bool,
    pub(super) call_state: Arc<CallState>,
}

/// Runs one call and sends its final reply (on the reader thread or a call thread).
pub(super) fn run(serving: &Serving, job: Job) {
    let Job {
        id,
        context,
        call,
        stream,
        call_state,
    } = job;
    let state = &serving.state;
    let mut ctx = state.context(context.as_ref(), call_state.cancel.clone());
    // The call's own view of the runner, to report a sandbox denial with the reply.
    let witness = Arc::new(crate::worker::commands::DenialWitness::new(
        state.runner.clone(),
    ));
    ctx.runner = witness.clone();
    let mut emit = |partial: worker_reply::Result, deadline: Option<Instant>| {
        let bytes = delta_bytes(&partial);
        if bytes > 0 && !call_state.take_window(bytes, deadline) {
            return;
        }
        let frame = WorkerReply {
            id,
            last: false,
            result: Some(partial),
            ..Default::default()
        };
        let _ = serving.writer().send(&frame);
    };
    // A panic in a tool must still answer the call (else the daemon waits for it until its
    // deadline, or for ever): INTERNAL, and the worker serves on.
    let inbox = call_state.clone();
    let mut pieces = |wait: bool| inbox.next_piece(wait);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        dispatch::execute(&ctx, &state.runner, call, stream, &mut emit, &mut pieces)
    }))
    .unwrap_or_else(|_| {
        worker_reply::Result::Failure(ToolFailure::of(
            FailureKind::Internal,
            "the sandbox worker failed while running the call (a bug in corral; the worker log \
             has the panic); nothing else is affected"
                .into(),
        ))
    });
    let result = bounded(result);
    let (kept_processes, ended_processes) = crate::tools::unified_exec::changes_of(&ctx.session_id);
    let reply = WorkerReply {
        id,
        last: true,
        result: Some(result),
        kept_processes,
        ended_processes,
        sandbox_denied: witness.denied(),
        guard_stopped: state
            .runner
            .stopped()
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default(),
    };
    let _ = serving.writer().send(&reply);
    serving.calls.locked().remove(&id);
}
