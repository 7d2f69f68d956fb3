//! The Files service: ReadBytes, WriteBytes, Upload, Download, Stat, ListDirectory,
//! MakeDirectory, Remove and Copy. Each call takes the same
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
use crate::daemon::pipeline::admit::{Admitted, CorralService, Refusal, Trace};
use crate::daemon::pipeline::audit::Outcome;
use crate::daemon::pipeline::route::context_of;
use crate::daemon::pipeline::stream_pump::{CallStream, Streamed, stream_call};
use crate::daemon::rpc::status;
use crate::daemon::session::sessions::Session;
use crate::daemon::workers::pool::{CallHandle, Worker};
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
use std::time::Duration;
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};

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

    async fn stat(
        &self,
        request: Request<api::StatRequest>,
    ) -> Result<Response<api::StatResponse>, Status> {
        self.unary_files(
            request,
            Op::Stat,
            |r| r.session_id.clone(),
            |op| match op {
                Answer::Stat(r) => Some(r),
                _ => None,
            },
        )
        .await
    }

    async fn list_directory(
        &self,
        request: Request<api::ListDirectoryRequest>,
    ) -> Result<Response<api::ListDirectoryResponse>, Status> {
        self.unary_files(
            request,
            Op::ListDirectory,
            |r| r.session_id.clone(),
            |op| match op {
                Answer::ListDirectory(r) => Some(r),
                _ => None,
            },
        )
        .await
    }

    async fn make_directory(
        &self,
        request: Request<api::MakeDirectoryRequest>,
    ) -> Result<Response<api::MakeDirectoryResponse>, Status> {
        self.unary_files(
            request,
            Op::MakeDirectory,
            |r| r.session_id.clone(),
            |op| match op {
                Answer::MakeDirectory(r) => Some(r),
                _ => None,
            },
        )
        .await
    }

    async fn remove(
        &self,
        request: Request<api::RemoveRequest>,
    ) -> Result<Response<api::RemoveResponse>, Status> {
        self.unary_files(
            request,
            Op::Remove,
            |r| r.session_id.clone(),
            |op| match op {
                Answer::Remove(r) => Some(r),
                _ => None,
            },
        )
        .await
    }

    async fn copy(
        &self,
        request: Request<api::CopyRequest>,
    ) -> Result<Response<api::CopyResponse>, Status> {
        self.unary_files(
            request,
            Op::Copy,
            |r| r.session_id.clone(),
            |op| match op {
                Answer::Copy(r) => Some(r),
                _ => None,
            },
        )
        .await
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

/// How long a refused upload waits for the worker to remove its staging before answering
/// anyway (the worker's clean-up is a few unlinks; this bounds a worker that hangs).
const UPLOAD_CLEANUP_WAIT: Duration = Duration::from_secs(5);

/// An upload running in its worker.
struct StartedUpload {
    worker: Arc<Worker>,
    handle: CallHandle,
    replies: mpsc::UnboundedReceiver<WorkerReply>,
}

impl CorralService {
    /// A unary Files call (Stat, ListDirectory, MakeDirectory, Remove, Copy): the one pipeline
    /// (session, policy, audit, metrics) to the session's worker, and its answer.
    async fn unary_files<Req, Resp>(
        &self,
        request: Request<Req>,
        op: impl FnOnce(Req) -> Op,
        session_of: impl FnOnce(&Req) -> String,
        pick: impl FnOnce(Answer) -> Option<Resp>,
    ) -> Result<Response<Resp>, Status> {
        let caller = self.auth.caller_of(&request)?;
        let req = request.into_inner();
        let id = session_of(&req);
        let reply = self
            .run(caller, &id, files_call(op(req)), false, Refusal::Status)
            .await?;
        answer(reply, pick).map(Response::new)
    }

    /// The whole upload: its start through the pipeline, its pieces to the worker, the audit
    /// line however it ends.
    async fn upload_call(
        &self,
        caller: crate::daemon::caller::identity::Caller,
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
        let follow_up = files_call(Op::RemoveUploadStagings(start.clone()));
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
        if matches!(&result, Err(s) if status::is_worker_died(s)) {
            self.remove_upload_stagings(&admitted.session, follow_up)
                .await;
        }
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

    /// After an upload's worker died mid-way: what that upload had staged beside its destination
    /// is no longer locked by anyone, and a new worker of the session removes it before the
    /// client hears of the failure (a later transfer there would too). Bounded by
    /// [`UPLOAD_CLEANUP_WAIT`]; a failure is logged, and the client's answer is the same.
    async fn remove_upload_stagings(&self, session: &Session, call: Call) {
        // A closed session gets no new worker (its pool slot is released).
        if session.closed.is_cancelled() {
            return;
        }
        let removal = self.executor.call(session, call, false, None);
        let outcome = tokio::time::timeout(UPLOAD_CLEANUP_WAIT, removal).await;
        match outcome {
            Ok(Ok(Reply::Files(FilesReply {
                op: Some(Answer::RemovedStagings(n)),
            }))) => {
                tracing::info!(session = %session.id, removed = n, "an upload's worker died; removed its stagings");
            }
            Ok(Ok(other)) => {
                tracing::warn!(session = %session.id, "removing a dead upload's stagings: {}", status::unexpected_reply(other).message());
            }
            Ok(Err(s)) => {
                tracing::warn!(session = %session.id, "removing a dead upload's stagings failed: {}", s.message());
            }
            Err(_) => {
                tracing::warn!(session = %session.id, "removing a dead upload's stagings took longer than {UPLOAD_CLEANUP_WAIT:?}");
            }
        }
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
        let (worker, handle, replies, first_credit) = 'started: {
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
        let mut started = StartedUpload {
            worker,
            handle,
            replies,
        };
        let fed = self
            .forward_upload(session, &mut started, first_credit, incoming, trace)
            .await;
        let StartedUpload {
            mut handle,
            mut replies,
            ..
        } = started;
        if fed.is_err() && !handle.is_done() {
            // A refusal the daemon made itself, a client gone or stalled: the worker removes
            // its staging when the call is cancelled and answers after that. The client hears
            // the refusal once nothing of the upload is left on disk.
            handle.cancel();
            let cleaned = async {
                while let Some(frame) = replies.recv().await {
                    if frame.last {
                        break;
                    }
                }
            };
            let _ = tokio::time::timeout(UPLOAD_CLEANUP_WAIT, cleaned).await;
        }
        fed
    }

    /// Forwards the client's messages to the worker while credit lasts, until the worker's
    /// answer or a refusal.
    async fn forward_upload(
        &self,
        session: &Session,
        started: &mut StartedUpload,
        first_credit: u64,
        incoming: &mut Streaming<api::UploadRequest>,
        trace: &mut Trace,
    ) -> Result<api::UploadResponse, Status> {
        let StartedUpload {
            worker,
            handle,
            replies,
        } = started;
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
        caller: crate::daemon::caller::identity::Caller,
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
        stream_call::<api::DownloadResponse>(self, trace, admitted, started)
    }
}

/// Download's items: the file's chunks, then its summary, which ends the call.
impl Streamed for api::DownloadResponse {
    fn from_reply(
        reply: Option<Reply>,
        _escalated: bool,
    ) -> Result<(Self, Option<Outcome>), Status> {
        let Some(Reply::Files(FilesReply {
            op: Some(Answer::Download(r)),
        })) = reply
        else {
            return Err(status::unexpected_reply(reply));
        };
        let end = matches!(r.item, Some(api::download_response::Item::Summary(_)))
            .then(|| Outcome::of(&Ok(Reply::Files(FilesReply { op: None }))));
        Ok((r, end))
    }

    fn window_len(&self) -> u64 {
        match &self.item {
            Some(api::download_response::Item::Data(d)) => d.len() as u64,
            _ => 0,
        }
    }

    fn audit_len(&self) -> usize {
        match &self.item {
            Some(api::download_response::Item::Data(d)) => d.len(),
            _ => 0,
        }
    }
}
