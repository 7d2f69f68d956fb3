//! The reader role: one thread at a time reads the daemon's frames off the socket, hands
//! cancels, credits and upload pieces to their calls, and starts each call: on the reader
//! thread itself for the quick file reads (`runs_inline`), else on a call thread. When the
//! socket closes it cancels what still runs and ends the worker.

use super::Serving;
use super::call_state::{CallState, cancel_all_and_wait};
use super::run::{Job, run};
use crate::sync::LockExt;
use crate::wire::frame;
use crate::wire::{
    FailureKind, ToolFailure, WorkerReply, WorkerRequest, worker_reply, worker_request,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

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
