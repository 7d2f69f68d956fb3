//! Files moved in streams: an Upload's pieces go to the worker only while the worker's credit
//! lasts (it credits what it has written), so a client faster than the disk waits in its own
//! HTTP/2 flow control, not in the daemon's memory; a Download's chunks are credited back to the
//! worker only when the transport takes them, like ShellStream's output. A client that stalls
//! past the budget ends its call; an upload that ends in any way but its completion changes
//! nothing (spec/sandbox.md H6).

use crate::api::{self, upload_request::Item as Upload};
use crate::daemon::error::CallError;
use crate::daemon::pipeline::admit::{Admitted, CorralService, Refusal, Trace};
use crate::daemon::pipeline::audit::Outcome;
use crate::daemon::pipeline::route::Streamed;
use crate::daemon::pipeline::stream_pump::{self, CallStream, stream_call};
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
use tokio_stream::{Stream, StreamExt};

/// A Files call to the worker.
pub(in crate::daemon) fn files_call(op: Op) -> Call {
    Call::Files(FilesCall { op: Some(op) })
}

/// An upload's messages as the client sends them; a transport failure is its description.
pub(in crate::daemon) type Incoming =
    Pin<Box<dyn Stream<Item = Result<api::UploadRequest, String>> + Send>>;

/// Reads the next message of an upload's stream within the stall budget.
async fn next_message(
    incoming: &mut Incoming,
    budget: Duration,
) -> Result<Option<api::UploadRequest>, CallError> {
    match tokio::time::timeout(budget, incoming.next()).await {
        Err(_) => Err(CallError::upload_stalled(budget)),
        Ok(Some(Err(cause))) => Err(CallError::upload_interrupted(&cause)),
        Ok(Some(Ok(m))) => Ok(Some(m)),
        Ok(None) => Ok(None),
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
    /// The whole upload: its start through the pipeline, its pieces to the worker, the audit
    /// line however it ends.
    pub(in crate::daemon) async fn upload_call(
        &self,
        caller: crate::daemon::caller::identity::Caller,
        mut incoming: Incoming,
    ) -> Result<api::UploadResponse, CallError> {
        let budget = self.stream_stall_timeout;
        let start = match next_message(&mut incoming, budget)
            .await?
            .and_then(|m| m.item)
        {
            Some(Upload::Start(start)) => start,
            _ => {
                return Err(CallError::upload_refused(
                    "an upload starts with an UploadStart message (its session and destination)",
                ));
            }
        };
        let session_id = start.session_id.clone();
        let follow_up = files_call(Op::RemoveUploadStagings(start.clone()));
        let call = files_call(Op::Upload(start));
        let (mut trace, admitted) = self.admit_transfer(caller, &session_id, &call)?;
        let result = self
            .feed_upload(&admitted, call, &mut incoming, &mut trace)
            .await;
        if matches!(&result, Err(s) if *s == CallError::WorkerDied) {
            self.remove_upload_stagings(&admitted.session, follow_up)
                .await;
        }
        let outcome = match &result {
            Ok(r) => Outcome::of(&Ok(Reply::Files(FilesReply {
                op: Some(Answer::Upload(r.clone())),
            }))),
            Err(e) => Outcome::failed(e),
        };
        drop(admitted);
        self.finish(trace, &outcome);
        result
    }

    /// A transfer through admission; a refusal is finished (audited) and is the call's error.
    fn admit_transfer(
        &self,
        caller: crate::daemon::caller::identity::Caller,
        session_id: &str,
        call: &Call,
    ) -> Result<(Trace, Admitted), CallError> {
        let mut trace = self.trace(caller, session_id, call);
        match self.admit(&mut trace, call, false, Refusal::Error, None) {
            Ok(admitted) => Ok((trace, admitted)),
            Err(refused) => Err(match self.refuse(trace, refused) {
                Ok(reply) => CallError::unexpected_reply(reply),
                Err(e) => e,
            }),
        }
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
                tracing::warn!(session = %session.id, "removing a dead upload's stagings: {}", CallError::unexpected_reply(other).message());
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
        incoming: &mut Incoming,
        trace: &mut Trace,
    ) -> Result<api::UploadResponse, CallError> {
        let session = &admitted.session;
        let Streamed {
            worker,
            mut handle,
            replies,
            first,
        } = self.executor.start_streamed(session, &call, false).await?;
        let first_credit = match first.result {
            Some(Reply::UploadCredit(n)) => n,
            other => {
                handle.done();
                return Err(match other {
                    Some(Reply::Failure(f)) => CallError::from(f),
                    other => CallError::unexpected_reply(other),
                });
            }
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
        incoming: &mut Incoming,
        trace: &mut Trace,
    ) -> Result<api::UploadResponse, CallError> {
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
                        return Err(CallError::WorkerDied);
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
                        Some(Reply::Failure(f)) => return Err(CallError::from(f)),
                        other => return Err(CallError::unexpected_reply(other)),
                    }
                }
                message = next_message(incoming, budget), if window > 0 && !client_done => {
                    let piece = match message? {
                        // The stream ended without its UploadFinish: a cancelled client looks
                        // like this to the server (hyper ends the body on RST_STREAM CANCEL).
                        None => return Err(CallError::upload_unfinished()),
                        Some(api::UploadRequest { item: Some(Upload::Finish(finish)) }) => {
                            let received = u64::try_from(trace.bytes_in).unwrap_or(u64::MAX);
                            if (finish.entries, finish.bytes) != (entries_in, received) {
                                return Err(CallError::upload_refused(&format!(
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
                                    return Err(CallError::upload_refused(
                                        "UploadStart comes once, as the first message",
                                    ));
                                }
                                Some(Upload::Data(d)) if d.len() > MAX_DATA_CHUNK => {
                                    return Err(CallError::upload_refused(&format!(
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
                                    return Err(CallError::upload_refused(
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
                _ = session.closed.cancelled() => return Err(CallError::session_closed()),
            }
        }
    }

    /// Download: the pipeline, the worker's first frame (so a refusal is the RPC's status, not
    /// a stream that fails at once), then a pump to the response stream.
    pub(in crate::daemon) async fn download_call(
        &self,
        caller: crate::daemon::caller::identity::Caller,
        req: api::DownloadRequest,
    ) -> Result<CallStream<api::DownloadResponse>, CallError> {
        let session_id = req.session_id.clone();
        let call = files_call(Op::Download(req));
        let (trace, admitted) = self.admit_transfer(caller, &session_id, &call)?;
        let started = self
            .executor
            .start_streamed(&admitted.session, &call, false)
            .await;
        stream_call::<api::DownloadResponse>(self, trace, admitted, started)
    }
}

/// Download's items: the file's chunks, then its summary, which ends the call.
impl stream_pump::Streamed for api::DownloadResponse {
    fn from_reply(
        reply: Option<Reply>,
        _escalated: bool,
    ) -> Result<(Self, Option<Outcome>), CallError> {
        let Some(Reply::Files(FilesReply {
            op: Some(Answer::Download(r)),
        })) = reply
        else {
            return Err(CallError::unexpected_reply(reply));
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
