//! One call in flight, as the reader, the call's thread and the shutdown share it: its cancel
//! flag, the flow-control window of its streamed output (`STREAM_WINDOW_BYTES`, refilled by the
//! daemon's credits), and the upload pieces that arrived for it; and the cancelling of every
//! call when the worker shuts down.

use crate::api;
use crate::sync::LockExt;
use crate::wire::spec::STREAM_WINDOW_BYTES;
use crate::wire::{UploadPiece, worker_reply};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

/// How long in-flight calls get to kill their process trees when the worker shuts down.
const SHUTDOWN_KILL_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// One in-flight call: its cancel flag, the flow-control window of its streamed output, and
/// (for an upload) the pieces that arrived for it.
pub(super) struct CallState {
    pub(super) cancel: Arc<AtomicBool>,
    /// Delta bytes sent and not yet credited.
    unacked: Mutex<u64>,
    /// Woken by credit and by cancellation.
    wake: Condvar,
    /// Upload pieces not yet taken, and their bytes.
    inbox: Mutex<(VecDeque<UploadPiece>, u64)>,
    /// Woken by a piece and by cancellation.
    arrived: Condvar,
}

impl CallState {
    pub(super) fn new(cancel: Arc<AtomicBool>) -> Self {
        Self {
            cancel,
            unacked: Mutex::new(0),
            wake: Condvar::new(),
            inbox: Mutex::new((VecDeque::new(), 0)),
            arrived: Condvar::new(),
        }
    }

    pub(super) fn cancel(&self) {
        self.cancel.store(true, Ordering::SeqCst);
        {
            let _guard = self.unacked.locked();
            self.wake.notify_all();
        }
        let _guard = self.inbox.locked();
        self.arrived.notify_all();
    }

    /// Queues an upload piece. The daemon keeps within the upload window; one that does not is
    /// not trusted with the worker's memory: the call is cancelled.
    pub(super) fn deliver(&self, piece: UploadPiece) {
        use prost::Message;
        let len = piece.item.as_ref().map_or(0, |i| i.encoded_len() as u64);
        let mut inbox = self.inbox.locked();
        inbox.1 += len;
        if inbox.1 > 2 * crate::worker::files::UPLOAD_WINDOW_BYTES + (2 << 20) {
            drop(inbox);
            eprintln!("corral worker: an upload exceeded its flow-control window; cancelled");
            self.cancel();
            return;
        }
        inbox.0.push_back(piece);
        self.arrived.notify_all();
    }

    /// The next upload piece; with `wait`, blocks until one arrives or the call is cancelled.
    pub(super) fn next_piece(&self, wait: bool) -> crate::worker::files::Next {
        use crate::worker::files::Next;
        use prost::Message;
        let mut inbox = self.inbox.locked();
        loop {
            if self.cancel.load(Ordering::SeqCst) {
                return Next::Cancelled;
            }
            if let Some(piece) = inbox.0.pop_front() {
                inbox.1 -= piece.item.as_ref().map_or(0, |i| i.encoded_len() as u64);
                return Next::Piece(piece);
            }
            if !wait {
                return Next::Empty;
            }
            inbox = self.arrived.wait(inbox).unwrap_or_else(|p| p.into_inner());
        }
    }

    pub(super) fn credit(&self, bytes: u64) {
        let mut unacked = self.unacked.locked();
        *unacked = unacked.saturating_sub(bytes);
        self.wake.notify_all();
    }

    /// Takes `bytes` of window, waiting while it is full. Blocking here stops the command's
    /// output loop, so the command blocks on its pipe: a client that stops reading stalls its
    /// own command. Gives up (false: drop the delta) when the call is cancelled, or when the
    /// window is full past the command's `deadline`: the executor must get back to its loop to
    /// enforce the timeout, and output the client is not reading is then not worth holding.
    pub(super) fn take_window(&self, bytes: u64, deadline: Option<Instant>) -> bool {
        let mut unacked = self.unacked.locked();
        loop {
            if self.cancel.load(Ordering::SeqCst) {
                return false;
            }
            if *unacked < STREAM_WINDOW_BYTES {
                *unacked += bytes;
                return true;
            }
            unacked = match deadline {
                None => self.wake.wait(unacked).unwrap_or_else(|p| p.into_inner()),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return false;
                    }
                    self.wake
                        .wait_timeout(unacked, d - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
            };
        }
    }
}

pub(super) type Calls = Mutex<HashMap<u64, Arc<CallState>>>;

/// The size of a streamed output delta or download chunk (what the window counts); 0 for other
/// frames.
pub(super) fn delta_bytes(reply: &worker_reply::Result) -> u64 {
    use crate::wire::files_reply::Op;
    match reply {
        worker_reply::Result::ShellEvent(api::ShellStreamEvent {
            event: Some(api::shell_stream_event::Event::Delta(d)),
        }) => d.data.len() as u64,
        worker_reply::Result::Files(crate::wire::FilesReply {
            op:
                Some(Op::Download(api::DownloadResponse {
                    item: Some(api::download_response::Item::Data(d)),
                })),
        }) => d.len() as u64,
        _ => 0,
    }
}

/// Cancels every in-flight call (each kills its command's tree) and waits for them to end.
pub(super) fn cancel_all_and_wait(calls: &Calls) {
    for call in calls.locked().values() {
        call.cancel();
    }
    let deadline = std::time::Instant::now() + SHUTDOWN_KILL_WAIT;
    while !calls.locked().is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}
