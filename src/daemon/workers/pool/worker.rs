//! The [`Worker`] handle of one live worker process: its birth (the spec sent, the ready or
//! failure awaited), the writer task that batches frames to it, the reader task that routes its
//! replies to their calls, and its reaping (the exit logged, its cgroup released, orphans
//! killed, the calls in flight failed). What crosses it per call is in `call`.

use super::spare::Spare;
use crate::api;
use crate::daemon::error::CallError;
use crate::sandbox::cgroup::WorkerCgroup;
use crate::sync::LockExt;
use crate::wire::frame;
use crate::wire::spec::WorkerSpec;
use crate::wire::{WorkerReply, worker_reply::Result as Reply};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

/// How long a new worker may take to confine itself and say it is ready.
const WORKER_READY_TIMEOUT: Duration = Duration::from_secs(20);

/// Call requests waiting to be written to one worker, in bytes. Requests come from clients, so
/// a worker that reads slowly makes new calls wait here instead of growing the daemon.
pub(super) const OUTGOING_BYTES: usize = 16 * 1024 * 1024;

/// Up to this many bytes of queued frames are written to a worker at once.
const BATCH_BYTES: usize = 64 * 1024;

/// Each call's replies. Unbounded, but bounded in fact: a unary call gets one frame, and a
/// streaming call's output deltas are limited by its flow-control window (credit).
type Pending = Arc<Mutex<HashMap<u64, mpsc::UnboundedSender<WorkerReply>>>>;

/// A call request and the share of [`OUTGOING_BYTES`] it holds until written.
type Outgoing = (Vec<u8>, tokio::sync::OwnedSemaphorePermit);

/// Every worker process not yet reaped (what tells its reader to kill it, and what says it was
/// reaped), for the shutdown: workers that no session uses any more keep running until their
/// last calls end, outside the pool's table.
#[allow(clippy::type_complexity)]
pub(super) static LIVE: Mutex<Vec<(Arc<tokio::sync::Notify>, tokio::sync::watch::Receiver<bool>)>> =
    Mutex::new(Vec::new());

/// One live worker process.
pub struct Worker {
    /// Call requests (bounded in bytes by `outgoing_budget`).
    pub(super) outgoing: mpsc::UnboundedSender<Outgoing>,
    pub(super) outgoing_budget: Arc<tokio::sync::Semaphore>,
    /// Cancels and credits: tiny, never wait behind call requests, and must not be lost.
    pub(super) control: mpsc::UnboundedSender<Vec<u8>>,
    pub(super) pending: Pending,
    pub(super) next_id: AtomicU64,
    dead: Arc<AtomicBool>,
    /// A second handle on our end of the socket, only polled: it reports the worker's end
    /// closed (the worker exited) before the reader task gets to run and see the EOF.
    hangup: std::os::unix::net::UnixStream,
    /// What the worker reported about each sandbox layer.
    pub layers: Vec<api::Layer>,
    /// The protected path whose creation stopped this worker's sandbox (H18), once reported.
    stopped: Arc<Mutex<Option<PathBuf>>>,
}

impl Worker {
    /// Spawns and confines a worker; fails with FAILED_PRECONDITION if the sandbox cannot be set up.
    pub async fn spawn(
        spec: &WorkerSpec,
        cgroup: Option<WorkerCgroup>,
    ) -> Result<Arc<Worker>, CallError> {
        let spare = Spare::start(cgroup, false)?;
        Self::specialise(spare, spec).await
    }

    /// Gives `spare` its spec and waits until it has confined itself. The spare's cgroup must
    /// already carry the spec's limit (see [`WorkerPool::spawn`]).
    pub(super) async fn specialise(
        spare: Spare,
        spec: &WorkerSpec,
    ) -> Result<Arc<Worker>, CallError> {
        // The cgroup is released off the async threads once the worker is reaped (or on any
        // early return).
        let Spare {
            mut child,
            ours,
            cgroup,
        } = spare;
        let spec_json = serde_json::to_string(spec)
            .map_err(|e| CallError::Internal(format!("cannot encode the worker spec: {e}")))?;
        let hangup = ours
            .try_clone()
            .map_err(|e| CallError::Internal(format!("worker socket: {e}")))?;
        ours.set_nonblocking(true)
            .map_err(|e| CallError::Internal(format!("worker socket: {e}")))?;
        let stream = tokio::net::UnixStream::from_std(ours)
            .map_err(|e| CallError::Internal(format!("worker socket: {e}")))?;
        let (mut read_half, mut write_half) = stream.into_split();
        {
            use tokio::io::AsyncWriteExt;
            write_half
                .write_all(&frame::encode_bytes(spec_json.as_bytes()))
                .await
                .map_err(|e| {
                    CallError::Internal(format!("cannot send the worker its spec: {e}"))
                })?;
        }

        let first = tokio::time::timeout(
            WORKER_READY_TIMEOUT,
            frame::read_async::<WorkerReply>(&mut read_half),
        )
        .await;
        let layers = match first {
            Ok(Ok(Some(WorkerReply {
                result: Some(Reply::Ready(ready)),
                ..
            }))) => ready.layers,
            Ok(Ok(Some(WorkerReply {
                result: Some(Reply::Failure(f)),
                ..
            }))) => {
                let _ = child.wait().await;
                return Err(CallError::from(f));
            }
            Ok(Ok(_)) | Ok(Err(_)) => {
                let exit = child
                    .wait()
                    .await
                    .map(|s| s.to_string())
                    .unwrap_or_default();
                return Err(CallError::worker_setup_exited(&exit));
            }
            Err(_) => {
                let _ = child.kill().await;
                return Err(CallError::worker_not_ready(WORKER_READY_TIMEOUT.as_secs()));
            }
        };

        // A proxied sandbox's one way out is placed before the worker takes any call; the
        // proxy serves until the worker is reaped.
        let ended = tokio_util::sync::CancellationToken::new();
        if let Some(egress) = &spec.policy.egress {
            let placed = match child.id() {
                Some(pid) => crate::daemon::egress::attach(pid, egress, ended.clone()).await,
                None => Err(CallError::worker_setup_exited(
                    "before its proxy was placed",
                )),
            };
            if let Err(e) = placed {
                let _ = child.kill().await;
                return Err(e);
            }
        }
        metrics::gauge!(crate::daemon::metrics::WORKERS).increment(1.0);
        let pending: Pending = Arc::default();
        let dead = Arc::new(AtomicBool::new(false));
        let (reaped_tx, reaped) = tokio::sync::watch::channel(false);
        let stop = Arc::new(tokio::sync::Notify::new());
        {
            let mut live = LIVE.locked();
            live.retain(|(_, reaped)| !*reaped.borrow());
            live.push((stop.clone(), reaped.clone()));
        }
        let (outgoing, mut calls_rx) = mpsc::unbounded_channel::<Outgoing>();
        let (control, mut control_rx) = mpsc::unbounded_channel::<Vec<u8>>();
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            // Frames that are ready together leave in one write (one wake-up of the worker's
            // reader instead of one per frame); large ones (upload pieces) are not copied.
            let mut batch: Vec<u8> = Vec::new();
            let mut permits = Vec::new();
            loop {
                // Control frames first: a cancel must not wait behind queued calls.
                let (bytes, permit) = tokio::select! {
                    biased;
                    Some(bytes) = control_rx.recv() => (bytes, None),
                    Some((bytes, permit)) = calls_rx.recv() => (bytes, Some(permit)),
                    else => break,
                };
                if bytes.len() >= BATCH_BYTES {
                    if write_half.write_all(&bytes).await.is_err() {
                        break;
                    }
                    continue;
                }
                batch.clear();
                batch.extend_from_slice(&bytes);
                permits.push(permit);
                let mut large = None;
                while batch.len() < BATCH_BYTES {
                    let (bytes, permit) = match control_rx.try_recv() {
                        Ok(bytes) => (bytes, None),
                        Err(_) => match calls_rx.try_recv() {
                            Ok((bytes, permit)) => (bytes, Some(permit)),
                            Err(_) => break,
                        },
                    };
                    if bytes.len() >= BATCH_BYTES {
                        large = Some((bytes, permit));
                        break;
                    }
                    batch.extend_from_slice(&bytes);
                    permits.push(permit);
                }
                if write_half.write_all(&batch).await.is_err() {
                    break;
                }
                permits.clear();
                if let Some((bytes, _permit)) = large
                    && write_half.write_all(&bytes).await.is_err()
                {
                    break;
                }
            }
        });
        // A replacement for a stopped worker is stopped from the start (H18), before it says so.
        let stopped = Arc::new(Mutex::new(spec.stopped_by.clone()));
        {
            let pending = pending.clone();
            let dead = dead.clone();
            let stopped = stopped.clone();
            tokio::spawn(async move {
                // Replies that arrive together are taken in one read.
                let mut read_half = tokio::io::BufReader::with_capacity(64 * 1024, read_half);
                let reading = async {
                    while let Ok(Some(reply)) =
                        frame::read_async::<WorkerReply>(&mut read_half).await
                    {
                        if !reply.guard_stopped.is_empty() {
                            stopped
                                .locked()
                                .get_or_insert_with(|| PathBuf::from(&reply.guard_stopped));
                        }
                        let mut table = pending.locked();
                        let (id, last) = (reply.id, reply.last);
                        if let Some(tx) = table.get(&id) {
                            let _ = tx.send(reply);
                        }
                        if last {
                            table.remove(&id);
                        }
                    }
                };
                tokio::pin!(reading);
                tokio::select! {
                    () = &mut reading => {}
                    // The daemon stops: kill the worker (through the handle that knows whether
                    // it was reaped, so never another process) and read on until its EOF.
                    () = stop.notified() => {
                        let _ = child.start_kill();
                        reading.await;
                    }
                }
                dead.store(true, Ordering::SeqCst);
                metrics::gauge!(crate::daemon::metrics::WORKERS).decrement(1.0);
                // A worker whose sessions all closed exits 0; anything else is worth a warning.
                match child.wait().await {
                    Ok(s) if s.success() => tracing::debug!("sandbox worker exited"),
                    Ok(s) => {
                        let oom = cgroup
                            .0
                            .as_ref()
                            .and_then(|c| c.oom_kills().ok())
                            .unwrap_or(0);
                        tracing::warn!(status = %s, oom_kills = oom, "sandbox worker exited abnormally")
                    }
                    Err(e) => tracing::warn!("cannot reap a sandbox worker: {e}"),
                }
                drop(cgroup);
                // A danger-full-access worker's commands have no pid namespace to die with. Killed
                // before the calls fail, so a client that retries finds them gone.
                let _ = tokio::task::spawn_blocking(crate::daemon::workers::orphans::kill_adopted)
                    .await;
                let _ = reaped_tx.send(true);
                // Dropping the senders fails every call in flight on this worker.
                pending.locked().clear();
                ended.cancel();
            });
        }
        Ok(Arc::new(Worker {
            outgoing,
            outgoing_budget: Arc::new(tokio::sync::Semaphore::new(OUTGOING_BYTES)),
            control,
            pending,
            next_id: AtomicU64::new(1),
            dead,
            hangup,
            layers,
            stopped,
        }))
    }

    /// The protected path whose creation stopped this worker's sandbox (H18), if one did.
    pub fn stopped(&self) -> Option<PathBuf> {
        self.stopped.locked().clone()
    }

    /// The worker exited: its reader saw the EOF, or its end of the socket is closed already.
    /// The second check matters for a call that arrives just after the worker died: without
    /// it the call would be sent to the dead worker and fail, rather than start a new one.
    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::SeqCst) || hung_up(&self.hangup)
    }
}

/// Whether the other end of `socket` is closed (the kernel closes a process's descriptors as it
/// exits, before its parent can reap it). Never blocks.
pub(super) fn hung_up(socket: &std::os::unix::net::UnixStream) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd;
    // POLLHUP needs no asking: a Unix stream socket reports it once the peer has closed.
    let mut fds = [PollFd::new(socket.as_fd(), PollFlags::empty())];
    matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
        && fds[0]
            .revents()
            .is_some_and(|r| r.contains(PollFlags::POLLHUP))
}

#[cfg(test)]
mod tests {
    use super::hung_up;

    #[test]
    fn a_closed_peer_is_seen_at_once_and_an_open_one_never() {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        assert!(!hung_up(&ours));
        // Unread data from the peer is not a hang-up.
        std::io::Write::write_all(&mut &theirs, b"reply").unwrap();
        assert!(!hung_up(&ours));
        drop(theirs);
        assert!(
            hung_up(&ours),
            "seen without reading the pending data first"
        );
    }
}
