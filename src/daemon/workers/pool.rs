//! Sandbox workers: one confined process per effective policy, spawned on demand, shared by the
//! sessions with that policy, dropped when the last of them closes, replaced when one dies.
//!
//! A worker is a re-exec of this binary (`corral __worker`), so confinement happens in a fresh
//! single-threaded process (DESIGN.md §1). Calls travel as frames over a socketpair; a worker
//! that dies fails only the calls in flight on it.

use crate::api;
use crate::daemon::rpc::status;
use crate::sandbox::cgroup::{MemoryCgroups, WorkerCgroup};
use crate::sandbox::policy::SandboxPolicy;
use crate::sandbox::report::Layer;
use crate::wire::frame;
use crate::wire::spec::{SPARE_ARG, WORKER_FD, WorkerSpec};
use crate::wire::{
    CallContext, WorkerReply, WorkerRequest, worker_reply::Result as Reply, worker_request::Call,
};
use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tonic::Status;

/// How many spare workers ([`Spare`]) the pool keeps started ahead. Two, so that an
/// `OpenSession` right after another still finds one: a replacement is not ready for 10–20 ms
/// (its cgroup join waits for an RCU grace period, see [`Spare`]).
const SPARE_WORKERS: usize = 2;

/// How long after a spare is taken its replacement starts: the fork and exec of the binary
/// take CPU that the open which took the spare needs more (measured: an open after idle time,
/// 6.2 ms with the replacement starting at once). The other spare covers an open meanwhile.
const REPLACE_AFTER: Duration = Duration::from_millis(20);

/// The memory limit of a spare's cgroup until a session's spec gives it the session's own: a
/// spare runs only the daemon's code, so this only bounds a fault in it.
const SPARE_MEMORY_BYTES: u64 = 256 * 1024 * 1024;

/// The process limit (threads count) of a spare's cgroup until its session's is set, likewise.
const SPARE_PROCESSES: u64 = 256;

/// How long a new worker may take to confine itself and say it is ready.
const WORKER_READY_TIMEOUT: Duration = Duration::from_secs(20);

/// Call requests waiting to be written to one worker, in bytes. Requests come from clients, so
/// a worker that reads slowly makes new calls wait here instead of growing the daemon.
const OUTGOING_BYTES: usize = 16 * 1024 * 1024;

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
static LIVE: Mutex<Vec<(Arc<tokio::sync::Notify>, tokio::sync::watch::Receiver<bool>)>> =
    Mutex::new(Vec::new());

/// One live worker process.
pub struct Worker {
    /// Call requests (bounded in bytes by `outgoing_budget`).
    outgoing: mpsc::UnboundedSender<Outgoing>,
    outgoing_budget: Arc<tokio::sync::Semaphore>,
    /// Cancels and credits: tiny, never wait behind call requests, and must not be lost.
    control: mpsc::UnboundedSender<Vec<u8>>,
    pending: Pending,
    next_id: AtomicU64,
    dead: Arc<AtomicBool>,
    /// A second handle on our end of the socket, only polled: it reports the worker's end
    /// closed (the worker exited) before the reader task gets to run and see the EOF.
    hangup: std::os::unix::net::UnixStream,
    /// What the worker reported about each sandbox layer.
    pub layers: Vec<api::Layer>,
    /// The protected path whose creation stopped this worker's sandbox (H18), once reported.
    stopped: Arc<Mutex<Option<PathBuf>>>,
}

/// A started `corral __worker` that has not received its spec: it has only exec'd and waits on
/// its socketpair, unconfined but holding nothing of anyone (it runs as the daemon, with an empty
/// environment, and only the daemon has the other end of its socket). Prepared ahead so that
/// starting a session's worker skips the fork and exec of the binary. Specialised at most once:
/// the worker reads exactly one spec, and a `Spare` is consumed by [`Worker::specialise`].
///
/// A spare is started **in its own memory cgroup** (when workers get one), which becomes the
/// worker's: moving a process into a cgroup waits for an RCU grace period whenever no other
/// move happened just before (the kernel's `cgroup_threadgroup_rwsem`), 5–16 ms on an idle
/// host, and that wait belongs in the background, not in an `OpenSession`. Only the limit is
/// the session's, written before the spec is sent (H11).
pub struct Spare {
    child: tokio::process::Child,
    ours: std::os::unix::net::UnixStream,
    /// Declared after `child`: a spare dropped unused is killed before its cgroup is removed.
    cgroup: CgroupHold,
}

impl Spare {
    /// Starts a worker process in `cgroup`. A spare started ahead (`ahead`) is named `__spare_`
    /// until it gets its spec (serve.rs renames it).
    fn start(cgroup: Option<WorkerCgroup>, ahead: bool) -> Result<Spare, Status> {
        // A session's own worker joins its cgroup before it runs (H11). A spare is moved in
        // from here right after its exec: in a child that joined itself, the wait for the RCU
        // grace period (see [`Spare`]) kept a copy-on-write copy of the daemon alive while the
        // daemon served the next open (measured: an open right after another, 13 ms instead
        // of 4). A spare does nothing before its spec, and its spec comes after the move.
        let join = match ahead {
            true => None,
            false => cgroup
                .as_ref()
                .map(|c| (c.procs_path(), c.pids_procs_path())),
        };
        let cgroup = CgroupHold(cgroup);
        let (ours, theirs) = std::os::unix::net::UnixStream::pair()
            .map_err(|e| Status::internal(format!("cannot create the worker socketpair: {e}")))?;
        let theirs_fd = theirs.as_raw_fd();
        let mut cmd = tokio::process::Command::new("/proc/self/exe");
        cmd.arg(if ahead { SPARE_ARG } else { "__worker" })
            // The daemon's environment (and any secret in it) never reaches the sandbox.
            .env_clear()
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            // Relayed into the daemon's log (its format, bounded): see worker_log.
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        // SAFETY: between fork and exec we only call dup2/fcntl and the cgroup join (open,
        // write, close of a path built before the fork), all async-signal-safe.
        unsafe {
            cmd.pre_exec(move || {
                // The worker's memory limit covers it and every command from its first
                // instruction (H11).
                if let Some((procs, pids)) = &join {
                    crate::sandbox::cgroup::join_raw(procs)?;
                    // And the process limit, which binds root too (H21).
                    if let Some(pids) = pids {
                        crate::sandbox::cgroup::join_raw(pids)?;
                    }
                }
                if theirs_fd == WORKER_FD {
                    // dup2 onto itself would keep FD_CLOEXEC set; clear it explicitly.
                    if libc::fcntl(theirs_fd, libc::F_SETFD, 0) == -1 {
                        return Err(std::io::Error::last_os_error());
                    }
                } else if libc::dup2(theirs_fd, WORKER_FD) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| Status::internal(format!("cannot start a sandbox worker: {e}")))?;
        drop(theirs);
        if let Some(stderr) = child.stderr.take() {
            crate::daemon::workers::worker_log::relay(stderr, child.id());
        }
        if ahead && let Some(cg) = &cgroup.0 {
            // On failure `child` is dropped, which kills it.
            let pid = child
                .id()
                .ok_or_else(|| Status::internal("a spare worker exited at once"))?;
            cg.add_process(pid).map_err(|e| {
                Status::internal(format!("cannot move a spare worker into its cgroup: {e}"))
            })?;
        }
        Ok(Spare {
            child,
            ours,
            cgroup,
        })
    }

    /// The process exited (or closed its end) while waiting.
    fn is_dead(&self) -> bool {
        hung_up(&self.ours)
    }
}

impl Worker {
    /// Spawns and confines a worker; fails with FAILED_PRECONDITION if the sandbox cannot be set up.
    pub async fn spawn(
        spec: &WorkerSpec,
        cgroup: Option<WorkerCgroup>,
    ) -> Result<Arc<Worker>, Status> {
        let spare = Spare::start(cgroup, false)?;
        Self::specialise(spare, spec).await
    }

    /// Gives `spare` its spec and waits until it has confined itself. The spare's cgroup must
    /// already carry the spec's limit (see [`WorkerPool::spawn`]).
    async fn specialise(spare: Spare, spec: &WorkerSpec) -> Result<Arc<Worker>, Status> {
        // The cgroup is released off the async threads once the worker is reaped (or on any
        // early return).
        let Spare {
            mut child,
            ours,
            cgroup,
        } = spare;
        let spec_json = serde_json::to_string(spec)
            .map_err(|e| Status::internal(format!("cannot encode the worker spec: {e}")))?;
        let hangup = ours
            .try_clone()
            .map_err(|e| Status::internal(format!("worker socket: {e}")))?;
        ours.set_nonblocking(true)
            .map_err(|e| Status::internal(format!("worker socket: {e}")))?;
        let stream = tokio::net::UnixStream::from_std(ours)
            .map_err(|e| Status::internal(format!("worker socket: {e}")))?;
        let (mut read_half, mut write_half) = stream.into_split();
        {
            use tokio::io::AsyncWriteExt;
            write_half
                .write_all(&frame::encode_bytes(spec_json.as_bytes()))
                .await
                .map_err(|e| Status::internal(format!("cannot send the worker its spec: {e}")))?;
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
                return Err(status::tool_failure(f));
            }
            Ok(Ok(_)) | Ok(Err(_)) => {
                let exit = child
                    .wait()
                    .await
                    .map(|s| s.to_string())
                    .unwrap_or_default();
                return Err(status::worker_setup_exited(&exit));
            }
            Err(_) => {
                let _ = child.kill().await;
                return Err(status::worker_not_ready(WORKER_READY_TIMEOUT.as_secs()));
            }
        };

        metrics::gauge!(crate::daemon::metrics::WORKERS).increment(1.0);
        let pending: Pending = Arc::default();
        let dead = Arc::new(AtomicBool::new(false));
        let (reaped_tx, reaped) = tokio::sync::watch::channel(false);
        let stop = Arc::new(tokio::sync::Notify::new());
        {
            let mut live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
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
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .get_or_insert_with(|| PathBuf::from(&reply.guard_stopped));
                        }
                        let mut table = pending.lock().unwrap_or_else(|p| p.into_inner());
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
                pending.lock().unwrap_or_else(|p| p.into_inner()).clear();
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
        self.stopped
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The worker exited: its reader saw the EOF, or its end of the socket is closed already.
    /// The second check matters for a call that arrives just after the worker died: without
    /// it the call would be sent to the dead worker and fail, rather than start a new one.
    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::SeqCst) || hung_up(&self.hangup)
    }

    /// Sends a call; replies arrive on the returned receiver (several for a streaming call, the
    /// final one has `last`). Dropping the returned handle before the end cancels the call. A
    /// streaming call's output deltas stop once a window of them is unacknowledged: grant
    /// credit with [`CallHandle::credit`] as they are passed on.
    pub async fn start(
        &self,
        context: &CallContext,
        call: &Call,
        stream: bool,
    ) -> Result<(CallHandle, mpsc::UnboundedReceiver<WorkerReply>), Status> {
        if self.is_dead() {
            return Err(status::worker_died());
        }
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let bytes = encode_request(id, context, call, stream);
        let share = u32::try_from(bytes.len().min(OUTGOING_BYTES)).unwrap_or(u32::MAX);
        let permit = self
            .outgoing_budget
            .clone()
            .acquire_many_owned(share)
            .await
            .map_err(|_| status::worker_died())?;
        let (tx, rx) = mpsc::unbounded_channel();
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, tx);
        // The reader clears the table when the worker dies; an entry added after that would
        // never see its sender dropped.
        if self.is_dead() {
            self.pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
            return Err(status::worker_died());
        }
        // From here on the handle exists, so a failure or a dropped future cancels the call.
        let handle = CallHandle {
            id,
            control: self.control.clone(),
            finished: false,
        };
        self.outgoing
            .send((bytes, permit))
            .map_err(|_| status::worker_died())?;
        Ok((handle, rx))
    }

    /// Sends the next piece of upload `call` (after its call request, on the same ordered queue,
    /// within the same byte budget).
    pub async fn send_piece(&self, piece: crate::wire::UploadPiece) -> Result<(), Status> {
        if self.is_dead() {
            return Err(status::worker_died());
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
            .map_err(|_| status::worker_died())?;
        self.outgoing
            .send((bytes, permit))
            .map_err(|_| status::worker_died())
    }

    /// Runs a unary call to completion.
    pub async fn call(&self, context: &CallContext, call: &Call) -> Result<Reply, Status> {
        self.call_tracked(context, call).await.map(|t| t.reply)
    }

    /// Runs a unary call to completion; with the processes the worker started and stopped
    /// keeping for the call's session, and whether a command it ran was denied by the sandbox.
    pub async fn call_tracked(
        &self,
        context: &CallContext,
        call: &Call,
    ) -> Result<Tracked, Status> {
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
            Some(_) => Err(Status::internal("the sandbox worker sent an empty reply")),
            None => {
                handle.done();
                Err(status::worker_died())
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

/// Whether the other end of `socket` is closed (the kernel closes a process's descriptors as it
/// exits, before its parent can reap it). Never blocks.
fn hung_up(socket: &std::os::unix::net::UnixStream) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd;
    // POLLHUP needs no asking: a Unix stream socket reports it once the peer has closed.
    let mut fds = [PollFd::new(socket.as_fd(), PollFlags::empty())];
    matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
        && fds[0]
            .revents()
            .is_some_and(|r| r.contains(PollFlags::POLLHUP))
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

/// A worker's memory cgroup, removed (which may wait for its last processes) on a blocking
/// thread, never on the async runtime.
struct CgroupHold(Option<WorkerCgroup>);

impl Drop for CgroupHold {
    fn drop(&mut self) {
        if let Some(cg) = self.0.take() {
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    rt.spawn_blocking(move || drop(cg));
                }
                Err(_) => drop(cg),
            }
        }
    }
}

/// One policy's worker slot: the worker (started on first use, replaced when it died) and the
/// number of sessions using it.
struct PoolEntry {
    /// Held only by calls for this policy while they start or replace its worker: a slow spawn
    /// (a hung mount, a loaded host) never stalls another policy, let alone another user
    /// (spec/sandbox.md §8.6 H5).
    worker: Arc<tokio::sync::Mutex<Option<Arc<Worker>>>>,
    users: usize,
}

/// The workers by policy (whose key includes the pinned root identities, H4).
#[derive(Clone)]
pub struct WorkerPool {
    /// Short critical sections only; never held across an await.
    workers: Arc<Mutex<HashMap<SandboxPolicy, PoolEntry>>>,
    degraded: Vec<Layer>,
    /// Where each worker gets its memory cgroup; `None` (no controller this daemon may use):
    /// workers fall back to RLIMIT_DATA.
    cgroups: Option<Arc<MemoryCgroups>>,
    /// Why there is none (e.g. a daemon that is not root may not write its cgroup).
    no_cgroup_because: Option<Arc<str>>,
    spawned: Arc<AtomicU64>,
    /// Workers started ahead, not yet given a spec; shared by nobody (see [`Spare`]).
    spares: Arc<Mutex<Spares>>,
}

/// The spare workers: ready ones, and how many are being started.
#[derive(Default)]
struct Spares {
    ready: Vec<Spare>,
    starting: usize,
    /// The daemon is stopping: start no more.
    closed: bool,
}

impl WorkerPool {
    pub fn new(degraded: Vec<Layer>) -> Self {
        let (cgroups, no_cgroup_because) = match MemoryCgroups::detect() {
            Ok(c) => (Some(Arc::new(c)), None),
            Err(why) => {
                tracing::warn!(
                    "no memory cgroup for sandbox workers ({why}); their memory is limited by \
                     RLIMIT_DATA per process instead"
                );
                (None, Some(Arc::from(why)))
            }
        };
        Self {
            workers: Arc::default(),
            degraded,
            cgroups,
            no_cgroup_because,
            spawned: Arc::default(),
            spares: Arc::default(),
        }
    }

    fn spares(&self) -> std::sync::MutexGuard<'_, Spares> {
        self.spares.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts spare workers in the background until [`SPARE_WORKERS`] are ready or starting.
    /// Never waits, and holds no lock while a spare starts.
    pub fn prewarm(&self) {
        self.prewarm_after(Duration::ZERO);
    }

    /// [`Self::prewarm`], with each spare started `delay` from now.
    fn prewarm_after(&self, delay: Duration) {
        let mut spares = self.spares();
        while !spares.closed && spares.ready.len() + spares.starting < SPARE_WORKERS {
            spares.starting += 1;
            let shared = self.spares.clone();
            let cgroups = self.cgroups.clone();
            let n = self.spawned.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(async move {
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                    // The daemon may have begun stopping meanwhile: start nothing then.
                    let mut spares = shared.lock().unwrap_or_else(|p| p.into_inner());
                    if spares.closed {
                        spares.starting -= 1;
                        return;
                    }
                }
                // The cgroup and the fork of the daemon are made on a blocking thread, not a
                // runtime thread.
                let started = tokio::task::spawn_blocking(move || {
                    let cgroup = match cgroups {
                        Some(cgroups) => Some(
                            cgroups
                                .create(&format!("worker-{n}"), SPARE_MEMORY_BYTES, SPARE_PROCESSES)
                                .map_err(|e| {
                                    Status::internal(format!(
                                        "cannot create a spare worker's memory cgroup: {e}"
                                    ))
                                })?,
                        ),
                        None => None,
                    };
                    Spare::start(cgroup, true)
                })
                .await;
                let mut spares = shared.lock().unwrap_or_else(|p| p.into_inner());
                spares.starting -= 1;
                match started {
                    Ok(Ok(spare)) if !spares.closed => spares.ready.push(spare),
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => tracing::warn!("cannot start a spare sandbox worker: {e}"),
                    Err(e) => tracing::warn!("spare sandbox worker task: {e}"),
                }
            });
        }
    }

    /// A live spare, if one is ready (dead ones are dropped, which kills and reaps them). The
    /// caller owns it: it leaves the pool for good.
    fn take_spare(&self) -> Option<Spare> {
        let mut spares = self.spares();
        while let Some(spare) = spares.ready.pop() {
            if !spare.is_dead() {
                return Some(spare);
            }
        }
        None
    }

    /// Whether workers get a memory cgroup (else the RLIMIT_DATA fallback applies).
    pub fn has_memory_cgroups(&self) -> bool {
        self.cgroups.is_some()
    }

    /// Why workers get no memory cgroup, when they do not.
    pub fn no_memory_cgroup_because(&self) -> Option<&str> {
        self.no_cgroup_because.as_deref()
    }

    pub fn degraded(&self) -> &[Layer] {
        &self.degraded
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<SandboxPolicy, PoolEntry>> {
        self.workers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The slot of `policy`, created if missing; `join` counts one more session on it.
    fn slot(
        &self,
        policy: &SandboxPolicy,
        join: bool,
    ) -> Arc<tokio::sync::Mutex<Option<Arc<Worker>>>> {
        let mut table = self.table();
        let join_slot = |entry: &mut PoolEntry| {
            if join || entry.users == 0 {
                entry.users += 1;
            }
            entry.worker.clone()
        };
        // Looked up first: a policy is cloned only for a new slot, not on every call.
        if let Some(entry) = table.get_mut(policy) {
            return join_slot(entry);
        }
        join_slot(table.entry(policy.clone()).or_insert_with(|| PoolEntry {
            worker: Arc::default(),
            users: 0,
        }))
    }

    /// The live worker in `slot`, starting one if there is none or it died.
    async fn live(
        &self,
        policy: &SandboxPolicy,
        slot: &tokio::sync::Mutex<Option<Arc<Worker>>>,
    ) -> Result<Arc<Worker>, Status> {
        let mut current = slot.lock().await;
        let replaces_a_dead_worker = match current.as_ref() {
            Some(worker) if !worker.is_dead() => return Ok(worker.clone()),
            Some(_) => {
                tracing::info!(
                    mode = policy.mode.as_str(),
                    "replacing a sandbox worker that exited"
                );
                true
            }
            None => false,
        };
        // A stop is the session's, not the process's (H18): dying does not undo it.
        let stopped_by = current.as_ref().and_then(|w| w.stopped());
        let worker = self
            .spawn(policy, replaces_a_dead_worker, stopped_by)
            .await?;
        *current = Some(worker.clone());
        Ok(worker)
    }

    /// A session starts using `policy`: make sure a live worker exists for it.
    pub async fn acquire(&self, policy: &SandboxPolicy) -> Result<Arc<Worker>, Status> {
        let slot = self.slot(policy, true);
        match self.live(policy, &slot).await {
            Ok(worker) => Ok(worker),
            Err(e) => {
                self.release(policy).await;
                Err(e)
            }
        }
    }

    /// The live worker for `policy`, replacing one that died.
    pub async fn get(&self, policy: &SandboxPolicy) -> Result<Arc<Worker>, Status> {
        let slot = self.slot(policy, false);
        self.live(policy, &slot).await
    }

    /// The protected path whose creation stopped the worker for `policy` (H18), if it did.
    pub async fn stopped(&self, policy: &SandboxPolicy) -> Option<PathBuf> {
        let slot = self.table().get(policy).map(|e| e.worker.clone())?;
        let current = slot.lock().await;
        current.as_ref().and_then(|w| w.stopped())
    }

    /// The live worker for `policy`, if there is one (never starts one).
    pub async fn existing(&self, policy: &SandboxPolicy) -> Option<Arc<Worker>> {
        let slot = self.table().get(policy).map(|e| e.worker.clone())?;
        let current = slot.lock().await;
        current.as_ref().filter(|w| !w.is_dead()).cloned()
    }

    /// A session stopped using `policy`; the last one out drops the worker (it exits on EOF
    /// once the calls still holding it are done).
    pub async fn release(&self, policy: &SandboxPolicy) {
        let mut table = self.table();
        if let Some(entry) = table.get_mut(policy) {
            entry.users = entry.users.saturating_sub(1);
            if entry.users == 0 {
                table.remove(policy);
            }
        }
    }

    async fn spawn(
        &self,
        policy: &SandboxPolicy,
        replaces_a_dead_worker: bool,
        stopped_by: Option<PathBuf>,
    ) -> Result<Arc<Worker>, Status> {
        // A spare is only usable if it sits in a cgroup whenever workers get one.
        let spare = self
            .take_spare()
            .filter(|s| s.cgroup.0.is_some() == self.cgroups.is_some());
        // Replace the spare taken (or start the first), once this open has had the CPU.
        self.prewarm_after(REPLACE_AFTER);
        let limit = policy.limits.memory_bytes;
        let processes = policy.limits.processes;
        // Every worker of a user lives under that user's ceiling (H21).
        let uid = policy
            .identity
            .as_ref()
            .map_or_else(|| nix::unistd::geteuid().as_raw(), |i| i.uid);
        let user_limit = policy.limits.user_memory_bytes;
        let cgroups = self.cgroups.clone();
        let cant_limit = |e: &dyn std::fmt::Display| {
            Status::failed_precondition(format!(
                "sandbox unavailable: limits could not be applied: cannot create the worker's \
                 memory cgroup or set its limit: {e}. Check the daemon may write its cgroup"
            ))
        };
        let spare = match spare {
            // The session's limit goes on before the spec, so it covers everything the worker
            // does for the session (H11). No process moves between cgroups here.
            Some(mut spare) => {
                let spare = tokio::task::spawn_blocking(move || {
                    if let (Some(cg), Some(cgroups)) = (spare.cgroup.0.take(), &cgroups) {
                        let cg = cgroups.move_to_user(cg, uid, user_limit)?;
                        cg.set_limit(limit)?;
                        cg.set_max_processes(processes)?;
                        spare.cgroup.0 = Some(cg);
                    }
                    Ok::<_, std::io::Error>(spare)
                })
                .await
                .map_err(|e| Status::internal(format!("memory cgroup task: {e}")))?;
                spare.map_err(|e| cant_limit(&e))?
            }
            // No spare ready (opens back to back): a worker of its own, started in its cgroup.
            None => {
                let cgroup = match &self.cgroups {
                    Some(cgroups) => {
                        let n = self.spawned.fetch_add(1, Ordering::Relaxed);
                        let cgroups = cgroups.clone();
                        let made = tokio::task::spawn_blocking(move || {
                            cgroups.create_for_user(
                                uid,
                                user_limit,
                                &format!("worker-{n}"),
                                limit,
                                processes,
                            )
                        })
                        .await
                        .map_err(|e| Status::internal(format!("memory cgroup task: {e}")))?;
                        Some(made.map_err(|e| cant_limit(&e))?)
                    }
                    None => None,
                };
                Spare::start(cgroup, false)?
            }
        };
        let spec = WorkerSpec {
            policy: policy.clone(),
            degraded: self.degraded.clone(),
            replaces_a_dead_worker,
            stopped_by,
        };
        Worker::specialise(spare, &spec).await
    }

    /// Stops every worker (the daemon is shutting down and no call is left on them): kills each,
    /// waits until it is reaped, and kills the commands of danger-full-access workers that
    /// outlived them (`orphans`). Bounded: a few seconds at most.
    pub async fn shutdown(&self) {
        // Spares never got a spec: dropping them kills them.
        let spares: Vec<Spare> = {
            let mut spares = self.spares();
            spares.closed = true;
            spares.ready.drain(..).collect()
        };
        drop(spares);
        // Every worker process, also those no session uses any more that are still finishing.
        let workers: Vec<_> = LIVE
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
            .collect();
        for (stop, _) in &workers {
            stop.notify_one();
        }
        for (_, mut reaped) in workers {
            let _ = tokio::time::timeout(Duration::from_secs(3), reaped.wait_for(|r| *r)).await;
        }
        let _ = tokio::task::spawn_blocking(crate::daemon::workers::orphans::kill_adopted).await;
    }

    // Added for the per-user worker cap (H12, policy `max_workers`); keep when rewriting.
    /// Live workers running as `uid` (a worker without an identity runs as the daemon's uid),
    /// and whether `policy` already has one (opening a session for it spawns nothing new).
    pub async fn workers_of(&self, uid: u32, policy: &SandboxPolicy) -> (usize, bool) {
        let daemon_uid = nix::unistd::geteuid().as_raw();
        let table = self.table();
        // A slot whose worker is being started right now counts: it will be live.
        let live = |e: &PoolEntry| {
            e.worker
                .try_lock()
                .map(|w| w.as_ref().is_some_and(|w| !w.is_dead()))
                .unwrap_or(true)
        };
        let count = table
            .iter()
            .filter(|(p, e)| live(e) && p.identity.as_ref().map_or(daemon_uid, |i| i.uid) == uid)
            .count();
        let exists = table.get(policy).is_some_and(live);
        (count, exists)
    }
}

#[cfg(test)]
mod tests {
    use super::{encode_request, hung_up};
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
