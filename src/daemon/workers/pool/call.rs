//! One call on a worker: the request sent (encoded from borrowed parts, within the worker's
//! byte budget), its replies received, and the [`CallHandle`] that owns it. Dropping the handle
//! before the call's final frame cancels the call in the worker (kills its process tree), so no
//! path that gives up on a call can leave it running; [`Credits`] return a streaming call's
//! flow-control window as its output is passed on.

use super::worker::{OUTGOING_BYTES, Worker};
use crate::daemon::error::CallError;
use crate::sync::LockExt;
use crate::wire::frame;
use crate::wire::{
    CallContext, WorkerReply, WorkerRequest, worker_reply::Result as Reply, worker_request::Call,
};
use std::sync::atomic::Ordering;
use tokio::sync::mpsc;

impl Worker {
    /// Sends a call; replies arrive on the returned receiver (several for a streaming call, the
    /// final one has `last`). Dropping the returned handle before the end cancels the call. A
    /// streaming call's output deltas stop once a window of them is unacknowledged: grant
    /// credit with [`CallHandle::credit`] as they are passed on.
    pub async fn start(
        &self,
        context: &CallContext,
        call: &Call,
        stream: bool,
    ) -> Result<(CallHandle, mpsc::UnboundedReceiver<WorkerReply>), CallError> {
        if self.is_dead() {
            return Err(CallError::WorkerDied);
        }
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let bytes = encode_request(id, context, call, stream);
        let share = u32::try_from(bytes.len().min(OUTGOING_BYTES)).unwrap_or(u32::MAX);
        let permit = self
            .outgoing_budget
            .clone()
            .acquire_many_owned(share)
            .await
            .map_err(|_| CallError::WorkerDied)?;
        let (tx, rx) = mpsc::unbounded_channel();
        self.pending.locked().insert(id, tx);
        // The reader clears the table when the worker dies; an entry added after that would
        // never see its sender dropped.
        if self.is_dead() {
            self.pending.locked().remove(&id);
            return Err(CallError::WorkerDied);
        }
        // From here on the handle exists, so a failure or a dropped future cancels the call.
        let handle = CallHandle {
            id,
            control: self.control.clone(),
            finished: false,
        };
        self.outgoing
            .send((bytes, permit))
            .map_err(|_| CallError::WorkerDied)?;
        Ok((handle, rx))
    }

    /// Sends the next piece of upload `call` (after its call request, on the same ordered queue,
    /// within the same byte budget).
    pub async fn send_piece(&self, piece: crate::wire::UploadPiece) -> Result<(), CallError> {
        if self.is_dead() {
            return Err(CallError::WorkerDied);
        }
        let bytes = frame::encode(&WorkerRequest {
            id: 0,
            context: None,
            call: Some(Call::UploadPiece(piece)),
            stream: false,
        });
        let share = u32::try_from(bytes.len().min(OUTGOING_BYTES)).unwrap_or(u32::MAX);
        let permit = self
            .outgoing_budget
            .clone()
            .acquire_many_owned(share)
            .await
            .map_err(|_| CallError::WorkerDied)?;
        self.outgoing
            .send((bytes, permit))
            .map_err(|_| CallError::WorkerDied)
    }

    /// Runs a unary call to completion.
    pub async fn call(&self, context: &CallContext, call: &Call) -> Result<Reply, CallError> {
        self.call_tracked(context, call).await.map(|t| t.reply)
    }

    /// Runs a unary call to completion; with the processes the worker started and stopped
    /// keeping for the call's session, and whether a command it ran was denied by the sandbox.
    pub async fn call_tracked(
        &self,
        context: &CallContext,
        call: &Call,
    ) -> Result<Tracked, CallError> {
        let (mut handle, mut rx) = self.start(context, call, false).await?;
        match rx.recv().await {
            Some(WorkerReply {
                result: Some(reply),
                kept_processes,
                ended_processes,
                sandbox_denied,
                ..
            }) => {
                handle.done();
                Ok(Tracked {
                    reply,
                    kept: kept_processes,
                    ended: ended_processes,
                    sandbox_denied,
                })
            }
            Some(_) => Err(CallError::Internal(
                "the sandbox worker sent an empty reply".into(),
            )),
            None => {
                handle.done();
                Err(CallError::WorkerDied)
            }
        }
    }
}

/// The frame of a call request, encoded from borrowed parts: the same bytes as a
/// `WorkerRequest` holding them, without copying the call and its context into one first.
fn encode_request(id: u64, context: &CallContext, call: &Call, stream: bool) -> Vec<u8> {
    use prost::encoding;
    // Field numbers of `WorkerRequest` (proto/corral/v1/worker.proto).
    const ID: u32 = 1;
    const CONTEXT: u32 = 6;
    const STREAM: u32 = 8;
    let len = encoding::uint64::encoded_len(ID, &id)
        + encoding::message::encoded_len(CONTEXT, context)
        + call.encoded_len()
        + if stream {
            encoding::bool::encoded_len(STREAM, &stream)
        } else {
            0
        };
    let mut out = Vec::with_capacity(4 + len);
    out.extend_from_slice(&(len as u32).to_be_bytes());
    encoding::uint64::encode(ID, &id, &mut out);
    encoding::message::encode(CONTEXT, context, &mut out);
    call.encode(&mut out);
    if stream {
        encoding::bool::encode(STREAM, &stream, &mut out);
    }
    out
}

/// A unary call's final reply and what the worker reported with it.
pub struct Tracked {
    pub reply: Reply,
    /// The session's processes the worker started keeping, and stopped keeping.
    pub kept: Vec<i32>,
    pub ended: Vec<i32>,
    /// A command the call ran looked denied by the sandbox (model calls only; the typed Shell
    /// reply says it itself).
    pub sandbox_denied: bool,
}

/// An in-flight call: dropping it before the call finished tells the worker to cancel it (kill
/// its process tree).
pub struct CallHandle {
    id: u64,
    control: mpsc::UnboundedSender<Vec<u8>>,
    finished: bool,
}

impl CallHandle {
    /// The call's request id (what its upload pieces name).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The call ended: nothing to cancel on drop.
    pub fn done(&mut self) {
        self.finished = true;
    }

    /// Whether the call's final frame has been seen (or it was cancelled).
    pub fn is_done(&self) -> bool {
        self.finished
    }

    /// Cancels the call now, keeping its replies flowing: the worker still answers a cancelled
    /// call with a final frame, after its own clean-up.
    pub fn cancel(&mut self) {
        if !self.finished {
            self.send_cancel();
            self.finished = true;
        }
    }

    fn send_cancel(&self) {
        let cancel = WorkerRequest {
            id: 0,
            context: None,
            call: Some(Call::Cancel(self.id)),
            stream: false,
        };
        let _ = self.control.send(frame::encode(&cancel));
    }

    /// Something that returns flow-control credit to this call's worker.
    pub fn credits(&self) -> Credits {
        Credits {
            id: self.id,
            control: self.control.clone(),
        }
    }
}

impl Drop for CallHandle {
    fn drop(&mut self) {
        if !self.finished {
            self.send_cancel();
        }
    }
}

/// Returns window to one streaming call (see `STREAM_WINDOW_BYTES` in the worker).
#[derive(Clone)]
pub struct Credits {
    id: u64,
    control: mpsc::UnboundedSender<Vec<u8>>,
}

impl Credits {
    /// `bytes` of the call's output deltas left the daemon's hands (towards the client).
    pub fn grant(&self, bytes: u64) {
        let credit = WorkerRequest {
            id: 0,
            context: None,
            call: Some(Call::Credit(crate::wire::Credit {
                call: self.id,
                bytes,
            })),
            stream: false,
        };
        let _ = self.control.send(frame::encode(&credit));
    }
}

#[cfg(test)]
mod tests {
    use super::encode_request;
    use crate::wire::{CallContext, WorkerRequest, worker_request::Call};

    #[test]
    fn a_request_encoded_from_its_parts_decodes_as_the_whole() {
        let context = CallContext {
            cwd: "/work".into(),
            env: [("A".to_string(), "1".to_string())].into(),
            timeout_ceiling_ms: 5,
            session_id: "s".into(),
            new_process_id: 7,
            background_terminal_max_timeout_ms: 9,
        };
        let call = Call::ReadFile(crate::api::ReadFileRequest {
            session_id: "s".into(),
            file_path: "a.rs".into(),
            offset: Some(3),
            ..Default::default()
        });
        for stream in [false, true] {
            let bytes = encode_request(42, &context, &call, stream);
            let decoded: WorkerRequest = crate::wire::frame::read_blocking(&mut bytes.as_slice())
                .unwrap()
                .unwrap();
            assert_eq!(
                decoded,
                WorkerRequest {
                    id: 42,
                    context: Some(context.clone()),
                    call: Some(call.clone()),
                    stream,
                }
            );
        }
    }
}
