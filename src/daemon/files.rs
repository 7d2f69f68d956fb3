//! The Files service: ReadBytes, WriteBytes, Upload and Download. Each call takes the same
//! pipeline as every tool call (session, policy checks, one audit line with the path and the
//! bytes moved, metrics) to the session's worker, which does all the file work (DESIGN.md §1:
//! the daemon never touches user files).
//!
//! Both streams are bounded in bytes end to end (spec/sandbox.md H6). An upload's pieces go to
//! the worker only while the worker's credit lasts (it credits what it has written), so a client
//! faster than the disk waits in its own HTTP/2 flow control, not in the daemon's memory. A
//! download's chunks are credited back to the worker only when the transport takes them, like
//! ShellStream's output. A client that stalls past the budget ends its call; an upload that ends
//! in any way but its completion changes nothing.

use crate::api::{self, files_server::Files, upload_request::Item as Upload};
use crate::daemon::audit::Outcome;
use crate::daemon::executor::context_of;
use crate::daemon::pool::CallHandle;
use crate::daemon::service::{Admitted, CallStream, CorralService, Progress, Refusal, Trace};
use crate::daemon::status;
use crate::tools::transfer::MAX_DATA_CHUNK;
use crate::wire::files_call::Op;
use crate::wire::files_reply::Op as Answer;
use crate::wire::{
    FilesCall, FilesReply, UploadPiece, WorkerReply, worker_reply::Result as Reply,
    worker_request::Call,
};
use prost::Message;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tonic::{Code, Request, Response, Status, Streaming};

fn files_call(op: Op) -> Call {
    Call::Files(FilesCall { op: Some(op) })
}

/// The answer of a unary Files call, or INTERNAL for another kind of reply.
fn answer<T>(reply: Reply, pick: impl FnOnce(Answer) -> Option<T>) -> Result<T, Status> {
    match reply {
        Reply::Files(FilesReply { op: Some(op) }) => pick(op)
            .ok_or_else(|| Status::internal("the sandbox worker answered another files call")),
        other => Err(status::unexpected_reply(other)),
    }
}

type DownloadItem = Result<api::DownloadResponse, Status>;

#[tonic::async_trait]
impl Files for CorralService {
    async fn read_bytes(
        &self,
        request: Request<api::ReadBytesRequest>,
    ) -> Result<Response<api::ReadBytesResponse>, Status> {
        let caller = self.auth.caller_of(&request)?;
        let req = request.into_inner();
        let id = req.session_id.clone();
        let reply = self
            .run(
                caller,
                &id,
                files_call(Op::ReadBytes(req)),
                false,
                Refusal::Status,
            )
            .await?;
        answer(reply, |op| match op {
            Answer::ReadBytes(r) => Some(r),
            _ => None,
        })
        .map(Response::new)
    }

    async fn write_bytes(
        &self,
        request: Request<api::WriteBytesRequest>,
    ) -> Result<Response<api::WriteBytesResponse>, Status> {
        let caller = self.auth.caller_of(&request)?;
        let req = request.into_inner();
        let id = req.session_id.clone();
        let reply = self
            .run(
                caller,
                &id,
                files_call(Op::WriteBytes(req)),
                false,
                Refusal::Status,
            )
            .await?;
        answer(reply, |op| match op {
            Answer::WriteBytes(r) => Some(r),
            _ => None,
        })
        .map(Response::new)
    }

    async fn upload(
        &self,
        request: Request<Streaming<api::UploadRequest>>,
    ) -> Result<Response<api::UploadResponse>, Status> {
        let caller = self.auth.caller_of(&request)?;
        let incoming = request.into_inner();
        // Its own task: if the client goes away, hyper drops this handler, and the upload must
        // still be cancelled in the worker and audited.
        let service = self.clone();
        tokio::spawn(async move { service.upload_call(caller, incoming).await })
            .await
            .map_err(|e| Status::internal(format!("the upload task failed: {e}")))?
            .map(Response::new)
    }

    type DownloadStream = Pin<Box<dyn tokio_stream::Stream<Item = DownloadItem> + Send>>;

    async fn download(
        &self,
        request: Request<api::DownloadRequest>,
    ) -> Result<Response<Self::DownloadStream>, Status> {
        let caller = self.auth.caller_of(&request)?;
        let stream = self.download_call(caller, request.into_inner()).await?;
        Ok(Response::new(Box::pin(stream)))
    }
}

/// Reads the next message of an upload's stream within the stall budget.
async fn next_message(
    incoming: &mut Streaming<api::UploadRequest>,
    budget: Duration,
) -> Result<Option<api::UploadRequest>, Status> {
    match tokio::time::timeout(budget, incoming.message()).await {
        Err(_) => Err(status::upload_stalled(budget)),
        Ok(Err(s)) => Err(status::upload_interrupted(&s)),
        Ok(Ok(m)) => Ok(m),
    }
}

impl CorralService {
    /// The whole upload: its start through the pipeline, its pieces to the worker, the audit
    /// line however it ends.
    async fn upload_call(
        &self,
        caller: crate::daemon::identity::Caller,
        mut incoming: Streaming<api::UploadRequest>,
    ) -> Result<api::UploadResponse, Status> {
        let budget = self.stream_stall_timeout;
        let start = match next_message(&mut incoming, budget)
            .await?
            .and_then(|m| m.item)
        {
            Some(Upload::Start(start)) => start,
            _ => {
                return Err(status::upload_refused(
                    "an upload starts with an UploadStart message (its session and destination)",
                ));
            }
        };
        let session_id = start.session_id.clone();
        let call = files_call(Op::Upload(start));
        let mut trace = self.trace(caller, &session_id, &call);
        let admitted = match self.admit(&mut trace, &call, false, Refusal::Status, None) {
            Ok(a) => a,
            Err(refused) => {
                return Err(match self.refuse(trace, refused) {
                    Ok(reply) => status::unexpected_reply(reply),
                    Err(s) => s,
                });
            }
        };
        let result = self
            .feed_upload(&admitted, call, &mut incoming, &mut trace)
            .await;
        let outcome = match &result {
            Ok(r) => Outcome::of(&Ok(Reply::Files(FilesReply {
                op: Some(Answer::Upload(r.clone())),
            }))),
            Err(s) => Outcome::code(s.code()),
        };
        drop(admitted);
        self.finish(trace, &outcome);
        result
    }

    /// Starts the upload in the worker (which checks the destination and answers with its first
    /// credit), then forwards the client's messages while credit lasts.
    async fn feed_upload(
        &self,
        admitted: &Admitted,
        call: Call,
        incoming: &mut Streaming<api::UploadRequest>,
        trace: &mut Trace,
    ) -> Result<api::UploadResponse, Status> {
        let session = &admitted.session;
        let (worker, mut handle, mut replies, first_credit) = 'started: {
            for attempt in 0..2 {
                let seen = session.current_policy();
                let worker = self.executor.worker_for(session, false).await?;
                let (mut handle, mut replies) =
                    worker.start(&context_of(session), &call, true).await?;
                let first = tokio::select! {
                    first = replies.recv() => first,
                    _ = session.closed.cancelled() => return Err(status::session_closed()),
                };
                let result = match first {
                    Some(WorkerReply { result, .. }) => result,
                    None => {
                        handle.done();
                        return Err(status::worker_died());
                    }
                };
                match result {
                    Some(Reply::UploadCredit(n)) => break 'started (worker, handle, replies, n),
                    Some(Reply::Stale(what)) => {
                        handle.done();
                        match seen {
                            Some(seen) if attempt == 0 => {
                                self.executor.refresh(session, &seen, &what).await?;
                                continue;
                            }
                            _ => return Err(status::protection_unsettled(&what)),
                        }
                    }
                    Some(Reply::Failure(f)) => {
                        handle.done();
                        return Err(status::tool_failure(f));
                    }
                    other => {
                        handle.done();
                        return Err(status::unexpected_reply(other));
                    }
                }
            }
            return Err(status::protection_unsettled("no worker matched"));
        };
        let budget = self.stream_stall_timeout;
        let call_id = handle.id();
        // Piece bytes the worker will still take; the next message is read only while positive,
        // so at most the window and one message are ever in flight.
        let mut window = i64::try_from(first_credit).unwrap_or(i64::MAX);
        let mut client_done = false;
        let mut entries_in: u64 = 0;
        trace.bytes_in = 0;
        loop {
            tokio::select! {
                frame = replies.recv() => {
                    let Some(frame) = frame else {
                        handle.done();
                        return Err(status::worker_died());
                    };
                    if frame.last {
                        handle.done();
                    }
                    match frame.result {
                        Some(Reply::UploadCredit(n)) if !frame.last => {
                            window = window.saturating_add(i64::try_from(n).unwrap_or(i64::MAX));
                        }
                        Some(Reply::Files(FilesReply { op: Some(Answer::Upload(r)) })) => {
                            return Ok(r);
                        }
                        Some(Reply::Failure(f)) => return Err(status::tool_failure(f)),
                        other => return Err(status::unexpected_reply(other)),
                    }
                }
                message = next_message(incoming, budget), if window > 0 && !client_done => {
                    let piece = match message? {
                        // The stream ended without its UploadFinish: a cancelled client looks
                        // like this to the server (hyper ends the body on RST_STREAM CANCEL).
                        None => return Err(status::upload_unfinished()),
                        Some(api::UploadRequest { item: Some(Upload::Finish(finish)) }) => {
                            let received = u64::try_from(trace.bytes_in).unwrap_or(u64::MAX);
                            if (finish.entries, finish.bytes) != (entries_in, received) {
                                return Err(status::upload_refused(&format!(
                                    "the UploadFinish says {} entries and {} bytes were sent, \
                                     the daemon received {entries_in} entries and {received} bytes",
                                    finish.entries, finish.bytes
                                )));
                            }
                            // Messages after the finish are not read: the tree is complete.
                            client_done = true;
                            UploadPiece { call: call_id, item: None, end: true }
                        }
                        Some(m) => {
                            match &m.item {
                                Some(Upload::Start(_)) => {
                                    return Err(status::upload_refused(
                                        "UploadStart comes once, as the first message",
                                    ));
                                }
                                Some(Upload::Data(d)) if d.len() > MAX_DATA_CHUNK => {
                                    return Err(status::upload_refused(&format!(
                                        "a data message carries {} bytes, more than the {} \
                                         (1 MiB) an upload's chunk may",
                                        d.len(),
                                        MAX_DATA_CHUNK
                                    )));
                                }
                                Some(Upload::Data(d)) => trace.bytes_in += d.len(),
                                Some(Upload::Entry(_)) => entries_in += 1,
                                // (A finish was taken by the arm above.)
                                Some(Upload::Finish(_)) | None => {
                                    return Err(status::upload_refused(
                                        "an upload message without an entry or data",
                                    ));
                                }
                            }
                            window -= i64::try_from(m.encoded_len()).unwrap_or(i64::MAX);
                            UploadPiece { call: call_id, item: Some(m), end: false }
                        }
                    };
                    worker.send_piece(piece).await?;
                }
                _ = session.closed.cancelled() => return Err(status::session_closed()),
            }
        }
    }

    /// Download: the pipeline, the worker's first frame (so a refusal is the RPC's status, not
    /// a stream that fails at once), then a pump to the response stream.
    async fn download_call(
        &self,
        caller: crate::daemon::identity::Caller,
        req: api::DownloadRequest,
    ) -> Result<CallStream<api::DownloadResponse>, Status> {
        let session_id = req.session_id.clone();
        let call = files_call(Op::Download(req));
        let mut trace = self.trace(caller, &session_id, &call);
        let admitted = match self.admit(&mut trace, &call, false, Refusal::Status, None) {
            Ok(a) => a,
            Err(refused) => {
                return Err(match self.refuse(trace, refused) {
                    Ok(reply) => status::unexpected_reply(reply),
                    Err(s) => s,
                });
            }
        };
        let started = async {
            let worker = self.executor.worker_for(&admitted.session, false).await?;
            let (mut handle, mut replies) = worker
                .start(&context_of(&admitted.session), &call, true)
                .await?;
            let first = tokio::select! {
                first = replies.recv() => first,
                _ = admitted.session.closed.cancelled() => return Err(status::session_closed()),
            };
            match first {
                Some(WorkerReply {
                    result: Some(Reply::Failure(f)),
                    last: true,
                    ..
                }) => {
                    handle.done();
                    Err(status::tool_failure(f))
                }
                None => {
                    handle.done();
                    Err(status::worker_died())
                }
                first => Ok((handle, replies, first)),
            }
        }
        .await;
        let (handle, replies, first) = match started {
            Ok(s) => s,
            Err(s) => {
                self.finish(trace, &Outcome::code(s.code()));
                return Err(s);
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
            window_len: chunk_len,
        };
        let pump = DownloadPump {
            service: self.clone(),
            trace,
            admitted,
            handle,
            first,
            replies,
            tx,
            abort: Some(abort_tx),
            progress,
        };
        tokio::spawn(pump.run());
        Ok(stream)
    }
}

/// The bytes of a download item that count against the worker's window.
fn chunk_len(r: &api::DownloadResponse) -> u64 {
    match &r.item {
        Some(api::download_response::Item::Data(d)) => d.len() as u64,
        _ => 0,
    }
}

/// Moves a download's frames from the worker to its response stream; ends the call (metrics and
/// the audit line with the bytes sent) however it ends.
struct DownloadPump {
    service: CorralService,
    trace: Trace,
    admitted: Admitted,
    handle: CallHandle,
    first: Option<WorkerReply>,
    replies: mpsc::UnboundedReceiver<WorkerReply>,
    tx: mpsc::UnboundedSender<DownloadItem>,
    abort: Option<oneshot::Sender<Status>>,
    progress: Arc<Progress>,
}

impl DownloadPump {
    async fn run(mut self) {
        let outcome = self.forward().await;
        // Unless the call ended, dropping the handle cancels it in the worker.
        drop(self.handle);
        drop(self.admitted);
        self.service.finish(self.trace, &outcome);
    }

    fn abort(&mut self, status: Status) -> Outcome {
        let outcome = Outcome::code(status.code());
        if let Some(tx) = self.abort.take() {
            let _ = tx.send(status);
        }
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
        let mut first = self.first.take();
        loop {
            let frame = match first.take() {
                Some(frame) => Some(frame),
                None => tokio::select! {
                    frame = self.replies.recv() => frame,
                    _ = closed.cancelled() => {
                        let s = status::session_closed();
                        let outcome = Outcome::code(s.code());
                        let _ = self.tx.send(Err(s));
                        return outcome;
                    }
                    _ = self.tx.closed() => return Outcome::code(Code::Cancelled),
                    _ = tick.tick() => {
                        if self.progress.stalled(budget) {
                            return self.abort(status::stream_stalled(budget));
                        }
                        // The worker honours its window; the daemon never trusts that with memory.
                        let credited = self.progress.credited.load(Ordering::Relaxed);
                        let unacked = received.saturating_sub(credited);
                        if unacked > 2 * crate::worker::serve::STREAM_WINDOW_BYTES {
                            return self.abort(status::window_exceeded(unacked));
                        }
                        continue;
                    }
                },
            };
            let Some(frame) = frame else {
                self.handle.done();
                let s = status::worker_died();
                let outcome = Outcome::code(s.code());
                let _ = self.tx.send(Err(s));
                return outcome;
            };
            if frame.last {
                self.handle.done();
            }
            let item = match frame.result {
                Some(Reply::Files(FilesReply {
                    op: Some(Answer::Download(r)),
                })) => Ok(r),
                Some(Reply::Failure(f)) => Err(status::tool_failure(f)),
                other => Err(status::unexpected_reply(other)),
            };
            let outcome = match &item {
                Err(s) => Some(Outcome::code(s.code())),
                Ok(r) => {
                    received += chunk_len(r);
                    matches!(r.item, Some(api::download_response::Item::Summary(_)))
                        .then(|| Outcome::of(&Ok(Reply::Files(FilesReply { op: None }))))
                }
            };
            self.progress.pushed();
            if self.tx.send(item).is_err() {
                return Outcome::code(Code::Cancelled);
            }
            if frame.last || outcome.as_ref().is_some_and(|o| o.name != "ok") {
                let mut outcome = outcome.unwrap_or_else(|| Outcome::code(Code::Internal));
                outcome.bytes_out = usize::try_from(received).unwrap_or(usize::MAX);
                return outcome;
            }
        }
    }
}
