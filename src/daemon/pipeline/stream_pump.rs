//! One streamed call (ShellStream, Download) from its worker to its client, under credit-based
//! flow control: the worker may have one window of output in flight, credit goes back only
//! when the transport takes an item, and a client that takes nothing for the stall budget has
//! its call cancelled. The daemon therefore holds at most a window per call however slowly a
//! client reads (spec/sandbox.md §8.6 H6).

use crate::daemon::error::CallError;
use crate::daemon::pipeline::admit::{Admitted, CorralService, Trace};
use crate::daemon::pipeline::audit::Outcome;
use crate::daemon::workers::pool::{CallHandle, Credits};
use crate::sync::LockExt;
use crate::wire::{WorkerReply, worker_reply::Result as Reply};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

/// What a streamed RPC sends: how a worker frame becomes an item, and what an item weighs.
pub(in crate::daemon) trait Streamed: Sized + Send + 'static {
    /// The item a worker frame carries, and the call's outcome when that item ends the call.
    fn from_reply(
        reply: Option<Reply>,
        escalated: bool,
    ) -> Result<(Self, Option<Outcome>), CallError>;

    /// The bytes of the item that count against the worker's flow-control window.
    fn window_len(&self) -> u64;

    /// The bytes of the item that count as the call's output in the audit line.
    fn audit_len(&self) -> usize;
}

/// Starts moving a call's frames to a new response stream; a call that failed to start is
/// finished (metrics, audit) with its status.
pub(in crate::daemon) fn stream_call<T: Streamed>(
    service: &CorralService,
    trace: Trace,
    admitted: Admitted,
    started: Result<crate::daemon::pipeline::route::Streamed, CallError>,
) -> Result<CallStream<T>, CallError> {
    let (handle, replies, first) = match started {
        Ok(started) => (started.handle, started.replies, started.first),
        Err(e) => {
            service.finish(trace, &Outcome::failed(&e));
            return Err(e);
        }
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let (abort_tx, abort_rx) = oneshot::channel();
    let progress = Arc::new(Progress::default());
    let stream = CallStream {
        rx,
        abort: Some(abort_rx),
        credits: handle.credits(),
        progress: progress.clone(),
        ended: false,
    };
    let pump = Pump {
        service: service.clone(),
        trace,
        admitted,
        handle,
        first: Some(Some(first)),
        replies,
        tx,
        abort: Some(abort_tx),
        progress,
    };
    tokio::spawn(pump.run());
    Ok(stream)
}

/// Where a streamed call's client is: items handed to the stream and not yet taken by the
/// transport, and since when it has made no progress.
#[derive(Default)]
struct Progress {
    state: Mutex<(usize, Option<Instant>)>,
    /// Window bytes taken by the transport (credited back to the worker).
    credited: AtomicU64,
}

impl Progress {
    fn pushed(&self) {
        let mut s = self.state.locked();
        if s.0 == 0 {
            s.1 = Some(Instant::now());
        }
        s.0 += 1;
    }

    fn pulled(&self, window_bytes: u64) {
        let mut s = self.state.locked();
        s.0 = s.0.saturating_sub(1);
        s.1 = Some(Instant::now());
        self.credited.fetch_add(window_bytes, Ordering::Relaxed);
    }

    /// Items are waiting and the client has taken none of them for `budget`.
    fn stalled(&self, budget: Duration) -> bool {
        let s = self.state.locked();
        s.0 > 0 && s.1.is_some_and(|t| t.elapsed() >= budget)
    }
}

/// The response stream of a streamed call. Credit goes back to the worker only when the
/// transport takes an item; a stall past the budget ends the stream with the pump's error.
pub(in crate::daemon) struct CallStream<T> {
    rx: mpsc::UnboundedReceiver<Result<T, CallError>>,
    abort: Option<oneshot::Receiver<CallError>>,
    credits: Credits,
    progress: Arc<Progress>,
    ended: bool,
}

impl<T: Streamed> tokio_stream::Stream for CallStream<T> {
    type Item = Result<T, CallError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        // An abort jumps the queue: the items still waiting belong to a cancelled call.
        if let Some(abort) = &mut this.abort {
            match Pin::new(abort).poll(cx) {
                Poll::Ready(Ok(status)) => {
                    this.ended = true;
                    return Poll::Ready(Some(Err(status)));
                }
                Poll::Ready(Err(_)) => this.abort = None,
                Poll::Pending => {}
            }
        }
        match this.rx.poll_recv(cx) {
            Poll::Ready(Some(item)) => {
                let bytes = item.as_ref().map(T::window_len).unwrap_or(0);
                this.progress.pulled(bytes);
                if bytes > 0 {
                    this.credits.grant(bytes);
                }
                Poll::Ready(Some(item))
            }
            other => other,
        }
    }
}

/// Moves one streamed call's frames from its worker to its [`CallStream`], watches for the
/// session closing, the worker dying, the client leaving or stalling, and finishes the call
/// (metrics, one audit line with the bytes streamed) however it ends.
struct Pump<T> {
    service: CorralService,
    trace: Trace,
    admitted: Admitted,
    handle: CallHandle,
    /// The first frame, already read by the caller; taken on the first turn of the loop.
    first: Option<Option<WorkerReply>>,
    replies: mpsc::UnboundedReceiver<WorkerReply>,
    tx: mpsc::UnboundedSender<Result<T, CallError>>,
    abort: Option<oneshot::Sender<CallError>>,
    progress: Arc<Progress>,
}

impl<T: Streamed> Pump<T> {
    async fn run(mut self) {
        let outcome = self.forward().await;
        // Unless the call ended, dropping the handle cancels it: the worker stops its work
        // (a command's whole tree is killed).
        drop(self.handle);
        drop(self.admitted);
        self.service.finish(self.trace, &outcome);
    }

    fn abort(&mut self, error: CallError) -> Outcome {
        let outcome = Outcome::failed(&error);
        if let Some(tx) = self.abort.take() {
            let _ = tx.send(error);
        }
        outcome
    }

    /// Ends the stream with `error` as its last item.
    fn fail(&mut self, error: CallError) -> Outcome {
        let outcome = Outcome::failed(&error);
        let _ = self.tx.send(Err(error));
        outcome
    }

    async fn forward(&mut self) -> Outcome {
        let budget = self.service.stream_stall_timeout;
        let mut tick = tokio::time::interval(
            (budget / 4).clamp(Duration::from_millis(50), Duration::from_secs(1)),
        );
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let closed = self.admitted.session.closed.clone();
        let mut received: u64 = 0;
        let mut bytes_out: usize = 0;
        loop {
            let frame = match self.first.take() {
                Some(frame) => frame,
                None => tokio::select! {
                    frame = self.replies.recv() => frame,
                    _ = closed.cancelled() => return self.fail(CallError::session_closed()),
                    // The client went away.
                    _ = self.tx.closed() => return Outcome::client_left(),
                    _ = tick.tick() => {
                        if self.progress.stalled(budget) {
                            tracing::info!(
                                session = %self.trace.session_id,
                                "stream client stalled; cancelling its call"
                            );
                            return self.abort(CallError::stream_stalled(budget));
                        }
                        // The worker honours its window; a daemon never trusts that with memory.
                        let credited = self.progress.credited.load(Ordering::Relaxed);
                        let unacked = received.saturating_sub(credited);
                        if unacked > 2 * crate::wire::spec::STREAM_WINDOW_BYTES {
                            return self.abort(CallError::window_exceeded(unacked));
                        }
                        continue;
                    }
                },
            };
            let Some(frame) = frame else {
                self.handle.done();
                return self.fail(CallError::WorkerDied);
            };
            if frame.last {
                self.handle.done();
            }
            let item = match frame.result {
                Some(Reply::Failure(f)) => Err(CallError::from(f)),
                result => T::from_reply(result, self.admitted.escalated),
            };
            let (item, outcome, failed) = match item {
                Ok((item, end)) => {
                    received += item.window_len();
                    bytes_out += item.audit_len();
                    (Ok(item), end, false)
                }
                Err(e) => {
                    let outcome = Outcome::failed(&e);
                    (Err(e), Some(outcome), true)
                }
            };
            self.progress.pushed();
            if self.tx.send(item).is_err() {
                return Outcome::client_left();
            }
            // An error item is the last the client sees, whether or not the worker says so.
            if frame.last || failed {
                let mut outcome = outcome.unwrap_or_else(Outcome::unfinished);
                outcome.bytes_out = bytes_out;
                return outcome;
            }
        }
    }
}
