//! A call's way through the worker. The reader role: one thread at a time reads the daemon's
//! frames off the socket, hands cancels, credits and upload pieces to their calls, and starts
//! each call: on the reader thread itself for the quick file reads (`runs_inline`), else on a
//! call thread; when the socket closes it cancels what still runs and ends the worker. Then
//! running one call: its tool context, its partial replies (a streamed delta waits for
//! window), the dispatch to the tool (a panic still answers the call), and the final reply
//! with what the worker reports beside it.

use super::Serving;
use super::call_state::{CallState, cancel_all_and_wait, delta_bytes};
use super::reply::bounded;
use crate::sync::LockExt;
use crate::wire::frame;
use crate::wire::{
    CallContext, FailureKind, ToolFailure, WorkerReply, WorkerRequest, worker_reply, worker_request,
};
use crate::worker::dispatch;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// Calls the reader thread answers itself: they only read the file system, start nothing and
/// never wait for the daemon. Handing each to a call thread and back cost two thread wake-ups per
/// call, most of a small read's time in the worker (docs/BENCHMARKS.md §6).
fn runs_inline(call: &worker_request::Call) -> bool {
    matches!(
        call,
        worker_request::Call::ReadFile(_) | worker_request::Call::ListDir(_)
    )
}

/// Reads and starts calls until the socket closes, or until this thread ran a call itself for
/// so long that another took over reading.
pub(super) fn read_loop(serving: &Arc<Serving>) {
    let mut source = serving.source.locked();
    loop {
        if source.ended {
            return;
        }
        let req: WorkerRequest = match frame::read_blocking(&mut source.socket) {
            Ok(Some(r)) => r,
            // The daemon closed the socket (or sent garbage): nothing more to serve. Commands
            // still running must not outlive their worker (in danger-full-access there is no
            // PID namespace to end them).
            Ok(None) | Err(_) => {
                source.ended = true;
                drop(source);
                cancel_all_and_wait(&serving.calls);
                crate::tools::unified_exec::close_all();
                let (lock, cv) = &serving.ended;
                *lock.locked() = true;
                cv.notify_all();
                return;
            }
        };
        let Some(call) = req.call else { continue };
        let target = match &call {
            worker_request::Call::Cancel(target) => Some(*target),
            worker_request::Call::Credit(c) => Some(c.call),
            worker_request::Call::UploadPiece(p) => Some(p.call),
            _ => None,
        };
        if let Some(target) = target {
            let found = serving.calls.locked().get(&target).cloned();
            match (found, call) {
                (Some(c), worker_request::Call::Credit(credit)) => c.credit(credit.bytes),
                (Some(c), worker_request::Call::UploadPiece(piece)) => c.deliver(piece),
                (Some(c), _) => c.cancel(),
                (None, worker_request::Call::Cancel(id)) if id > source.highest_id => {
                    // Bounded: the daemon cancels only calls it started.
                    if source.early_cancels.len() < 4096 {
                        source.early_cancels.insert(id);
                    }
                }
                (None, _) => {}
            }
            continue;
        }
        source.highest_id = source.highest_id.max(req.id);
        let cancel = Arc::new(AtomicBool::new(source.early_cancels.remove(&req.id)));
        let call_state = Arc::new(CallState::new(cancel.clone()));
        serving.calls.locked().insert(req.id, call_state.clone());
        let job = Job {
            id: req.id,
            context: req.context,
            call,
            stream: req.stream,
            call_state,
        };
        // Only the last call of what arrived together runs here; those with more behind them
        // get threads, so a burst still runs in parallel (one thread reading and answering
        // calls one by one would be capped at one core, and at one thread's share of a busy
        // host).
        if runs_inline(&job.call)
            && source.socket.buffer().is_empty()
            && serving.watchdog.get().is_some()
        {
            // Free the reader role while the call runs, so the watchdog's thread can take it.
            drop(source);
            let started = (serving.epoch.elapsed().as_nanos() as u64).max(1);
            serving.inline_since.store(started, Ordering::SeqCst);
            serving.inline_calls.fetch_add(1, Ordering::Relaxed);
            if serving.watchdog_parked.load(Ordering::SeqCst)
                && let Some(watchdog) = serving.watchdog.get()
            {
                watchdog.unpark();
            }
            run(serving, job);
            serving.inline_since.store(0, Ordering::SeqCst);
            source = match serving.source.try_lock() {
                Ok(s) => s,
                Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
                // Another thread reads now; this one goes back to the call threads.
                Err(std::sync::TryLockError::WouldBlock) => return,
            };
            continue;
        }
        let id = job.id;
        let on_thread = serving.clone();
        if let Err(e) = serving.threads.run(move || run(&on_thread, job)) {
            serving.calls.locked().remove(&id);
            let reply = WorkerReply {
                id,
                last: true,
                result: Some(worker_reply::Result::Failure(ToolFailure::of(
                    FailureKind::ResourceExhausted,
                    format!("the sandbox worker cannot start a thread for the call: {e}"),
                ))),
                ..Default::default()
            };
            let _ = serving.writer().send(&reply);
        }
    }
}

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
