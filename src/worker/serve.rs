//! The worker process: confine, announce readiness, then serve calls from the daemon over the
//! inherited socketpair until it closes. Each call runs on its own thread.

use crate::api;
use crate::sandbox::policy::SandboxPolicy;
use crate::sandbox::report::{LayerReport, LayerStatus};
use crate::tools::ToolContext;
use crate::wire::frame;
use crate::wire::spec::{SPARE_ARG, STREAM_WINDOW_BYTES, WORKER_FD, WorkerSpec};
use crate::wire::{
    CallContext, Ready, ToolFailure, UploadPiece, WorkerReply, WorkerRequest, worker_reply,
    worker_request,
};
use crate::worker::commands::SandboxedRunner;
use crate::worker::{confine, dispatch};
use std::collections::{HashMap, HashSet, VecDeque};
use std::os::fd::FromRawFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Entry point of `corral __worker`; returns the process exit status.
pub fn worker_main() -> i32 {
    frame::tune_allocator();
    // SAFETY: the daemon placed our end of the socketpair on WORKER_FD; nothing else owns it.
    let mut socket = unsafe { UnixStream::from_raw_fd(WORKER_FD) };
    // The descriptor arrived without FD_CLOEXEC (it had to survive our exec). Set it now, or
    // every command would inherit a channel to the daemon and could forge worker replies.
    // SAFETY: fcntl on a descriptor we own.
    if unsafe { libc::fcntl(WORKER_FD, libc::F_SETFD, libc::FD_CLOEXEC) } == -1 {
        eprintln!(
            "corral worker: cannot mark the request socket close-on-exec: {}",
            std::io::Error::last_os_error()
        );
        return 70;
    }
    let spec_json = match frame::read_bytes_blocking(&mut socket) {
        Ok(Some(bytes)) => bytes,
        // A spare worker (pool.rs) the daemon dropped without using it.
        Ok(None) => return 0,
        Err(_) => {
            eprintln!("corral worker: no spec arrived on the request socket");
            return 70;
        }
    };
    rename_spare();
    let spec: WorkerSpec = match serde_json::from_slice(&spec_json) {
        Ok(s) => s,
        Err(e) => {
            let _ = send_failure(
                &mut socket,
                tonic::Code::Internal,
                format!("bad worker spec: {e}"),
            );
            return 70;
        }
    };
    crate::tools::transfer::fsx::set_leftovers_possible(spec.replaces_a_dead_worker);
    // Confinement closes every other descriptor, so no second handle on the socket exists yet.
    let confined = match confine::confine(&spec.policy, &spec.degraded, &[0, 1, 2, WORKER_FD]) {
        Ok(c) => c,
        Err(e) => {
            let setup = crate::wire::SetupFailure {
                layer: e.layer.to_string(),
                cause: e.parts().map(|p| p.cause.to_string()).unwrap_or_default(),
                fix: e.parts().map(|p| p.fix.to_string()).unwrap_or_default(),
            };
            let _ = frame::write_blocking(
                &mut socket,
                &WorkerReply {
                    id: 0,
                    last: true,
                    result: Some(worker_reply::Result::Failure(ToolFailure {
                        code: tonic::Code::FailedPrecondition as i32,
                        message: e.message,
                        setup: Some(setup),
                        field: String::new(),
                    })),
                    ..Default::default()
                },
            );
            return 71;
        }
    };
    let mut writer = match socket.try_clone() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("corral worker: cannot use the request socket: {e}");
            return 70;
        }
    };
    let ready = WorkerReply {
        id: 0,
        last: true,
        result: Some(worker_reply::Result::Ready(Ready {
            layers: confined.reports.iter().map(layer_to_api).collect(),
        })),
        ..Default::default()
    };
    if frame::write_blocking(&mut writer, &ready).is_err() {
        return 0;
    }
    // Orphaned descendants of commands re-parent to us, so their whole tree can be killed.
    if let Err(e) = crate::tools::shell::become_subreaper() {
        eprintln!("corral worker: cannot become a child subreaper: {e}");
        return 72;
    }
    let state = WorkerState {
        runner: Arc::new(SandboxedRunner {
            protected_missing: spec.policy.protected_missing.clone(),
            sandboxed: spec.policy.mode.is_sandboxed(),
            guard: confined.guard.inspect(|g| {
                if let Some(path) = &spec.stopped_by {
                    g.stop_for(path.clone());
                }
            }),
            protection: crate::worker::commands::Protection::of(&spec.policy),
        }),
        shell: crate::tools::shell::default_user_shell(),
        network_disabled: !spec.policy.network,
        default_cwd: spec.policy.cwd.clone(),
        patch_rules: patch_rules(&spec.policy),
    };
    serve(socket, writer, state);
    0
}

/// A spare worker that got its spec is a worker like any other and says so where operators and
/// tests look (`/proc/PID/cmdline`, `ps`, `pgrep -f __worker`): its `__spare_` argument is
/// rewritten to `__worker` in place, in the argument block the kernel shows. Best effort.
fn rename_spare() {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return;
    };
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return;
    };
    // Fields 48 and 49 (arg_start, arg_end); the text after the name starts at field 3.
    let f: Vec<&str> = rest.split_ascii_whitespace().collect();
    let field = |n: usize| f.get(n - 3).and_then(|v| v.parse::<usize>().ok());
    let (Some(start), Some(end)) = (field(48), field(49)) else {
        return;
    };
    if start == 0 || end <= start || end - start > 1 << 20 {
        return;
    }
    // SAFETY: [arg_start, arg_end) is this process's argument block on its initial stack:
    // mapped and writable for the life of the process. Nothing holds a Rust reference into it
    // (std reads argv through raw pointers), and the bytes written keep its length and NULs.
    let block = unsafe { std::slice::from_raw_parts_mut(start as *mut u8, end - start) };
    let spare = SPARE_ARG.as_bytes();
    if let Some(pos) = block
        .windows(spare.len() + 1)
        .position(|w| w[0] == 0 && &w[1..] == spare)
        && block.get(pos + 1 + spare.len()) == Some(&0)
    {
        block[pos + 1..pos + 1 + spare.len()].copy_from_slice(b"__worker");
    }
}

/// apply_patch's view of the policy: its own up-front checks mirror what the sandbox enforces,
/// so a refused patch gets Codex's rejection text instead of a half-applied I/O error.
fn patch_rules(policy: &SandboxPolicy) -> crate::tools::apply_patch::PatchContext {
    use crate::sandbox::policy::Mode;
    let unconfined = policy.mode == Mode::DangerFullAccess;
    crate::tools::apply_patch::PatchContext {
        cwd: policy.cwd.clone(),
        writable_roots: if unconfined {
            vec![PathBuf::from("/")]
        } else {
            policy.writable_roots.clone()
        },
        read_only: policy.mode == Mode::ReadOnly,
        protected_names: if unconfined {
            Vec::new()
        } else {
            // The names guarded or protected directly at the top of a root (`.git`, `.codex`,
            // `.agents`, git-directory markers such as `HEAD`).
            let mut names: Vec<String> = policy
                .protected_paths
                .iter()
                .chain(&policy.protected_missing)
                .filter(|p| {
                    p.parent()
                        .is_some_and(|dir| policy.writable_roots.iter().any(|r| r == dir))
                })
                .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                .collect();
            names.sort();
            names.dedup();
            names
        },
        protected_paths: if unconfined {
            Vec::new()
        } else {
            // Existing protected paths, plus guarded ones deeper than a root's top (a `.git`
            // file's gitdir that does not exist yet).
            policy
                .protected_paths
                .iter()
                .chain(policy.protected_missing.iter().filter(|p| {
                    !p.parent()
                        .is_some_and(|dir| policy.writable_roots.iter().any(|r| r == dir))
                }))
                .cloned()
                .collect()
        },
    }
}

/// What every call of this worker shares.
struct WorkerState {
    runner: Arc<SandboxedRunner>,
    shell: PathBuf,
    network_disabled: bool,
    default_cwd: PathBuf,
    patch_rules: crate::tools::apply_patch::PatchContext,
}

impl WorkerState {
    fn context(&self, call: Option<&CallContext>, cancel: Arc<AtomicBool>) -> ToolContext {
        let cwd = call
            .map(|c| PathBuf::from(&c.cwd))
            .filter(|p| p.is_absolute())
            .unwrap_or_else(|| self.default_cwd.clone());
        let mut patch = self.patch_rules.clone();
        patch.cwd = cwd.clone();
        ToolContext {
            session_id: call.map(|c| c.session_id.clone()).unwrap_or_default(),
            timeout_ceiling_ms: call
                .map(|c| c.timeout_ceiling_ms)
                .filter(|t| *t > 0)
                .unwrap_or(u64::MAX),
            patch,
            cwd,
            env: call
                .map(|c| c.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
                .unwrap_or_default(),
            network_disabled: self.network_disabled,
            shell: self.shell.clone(),
            cancel,
            runner: self.runner.clone(),
            new_process_id: call.map(|c| c.new_process_id).filter(|id| *id != 0),
            background_terminal_max_timeout_ms: call
                .map(|c| c.background_terminal_max_timeout_ms)
                .filter(|ms| *ms > 0)
                .unwrap_or(crate::tools::unified_exec::DEFAULT_MAX_BACKGROUND_TERMINAL_TIMEOUT_MS),
        }
    }
}

/// The most one unary answer may be. Clients accept 64 MiB (`client::MAX_MESSAGE_BYTES`); this
/// leaves room for the frame and gRPC's own overhead, and keeps one answer well inside the
/// worker frame limit, so a reply is never dropped for its size.
pub const MAX_RESPONSE_BYTES: usize = 32 * 1024 * 1024;

/// A reply too large to send becomes a clear RESOURCE_EXHAUSTED failure instead; through
/// Invoke, where the model chose the size (a `read_file` limit), it is model text with
/// `success: false`, so that the agent loop gets a result to act on, not an exception.
fn bounded(result: worker_reply::Result) -> worker_reply::Result {
    use prost::Message;
    let len = match &result {
        worker_reply::Result::ReadFile(r) => r.encoded_len(),
        worker_reply::Result::ListDir(r) => r.encoded_len(),
        worker_reply::Result::GrepFiles(r) => r.encoded_len(),
        worker_reply::Result::ApplyPatch(r) => r.encoded_len(),
        worker_reply::Result::Shell(r) => r.encoded_len(),
        worker_reply::Result::Invoke(r) => r.encoded_len(),
        worker_reply::Result::Process(r) => r.encoded_len(),
        worker_reply::Result::PromptContext(r) => r.encoded_len(),
        worker_reply::Result::Files(r) => r.encoded_len(),
        _ => 0,
    };
    if len <= MAX_RESPONSE_BYTES {
        return result;
    }
    let message = format!(
        "the result is {len} bytes, more than the {} MiB one response may carry; ask for less \
         (read_file: offset and limit; list_dir and grep_files: limit; a command: send its \
         output to a file and read that in parts)",
        MAX_RESPONSE_BYTES >> 20
    );
    match result {
        worker_reply::Result::Invoke(r) => worker_reply::Result::Invoke(api::InvokeResponse {
            call_id: r.call_id,
            output: message,
            success: false,
            ..Default::default()
        }),
        _ => worker_reply::Result::Failure(ToolFailure {
            code: tonic::Code::ResourceExhausted as i32,
            message,
            setup: None,
            field: String::new(),
        }),
    }
}

fn send_failure(w: &mut UnixStream, code: tonic::Code, message: String) -> std::io::Result<()> {
    frame::write_blocking(
        w,
        &WorkerReply {
            id: 0,
            last: true,
            result: Some(worker_reply::Result::Failure(ToolFailure {
                code: code as i32,
                message,
                setup: None,
                field: String::new(),
            })),
            ..Default::default()
        },
    )
}

/// A layer report in the API's terms.
pub fn layer_to_api(r: &LayerReport) -> api::Layer {
    let status = match r.status {
        LayerStatus::Enforced | LayerStatus::PartiallyEnforced => api::LayerStatus::Enforced,
        LayerStatus::Degraded => api::LayerStatus::Degraded,
        LayerStatus::NotApplicable => api::LayerStatus::NotApplicable,
    };
    let mut detail = r.detail.clone();
    if !r.missing.is_empty() && r.status == LayerStatus::PartiallyEnforced {
        detail.push_str(&format!("; missing: {}", r.missing.join(", ")));
    }
    api::Layer {
        name: r.layer.as_str().to_string(),
        status: status as i32,
        detail,
    }
}

/// How long in-flight calls get to kill their process trees when the worker shuts down.
const SHUTDOWN_KILL_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// One in-flight call: its cancel flag, the flow-control window of its streamed output, and
/// (for an upload) the pieces that arrived for it.
struct CallState {
    cancel: Arc<AtomicBool>,
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
    fn new(cancel: Arc<AtomicBool>) -> Self {
        Self {
            cancel,
            unacked: Mutex::new(0),
            wake: Condvar::new(),
            inbox: Mutex::new((VecDeque::new(), 0)),
            arrived: Condvar::new(),
        }
    }

    fn cancel(&self) {
        self.cancel.store(true, Ordering::SeqCst);
        {
            let _guard = self.unacked.lock().unwrap_or_else(|p| p.into_inner());
            self.wake.notify_all();
        }
        let _guard = self.inbox.lock().unwrap_or_else(|p| p.into_inner());
        self.arrived.notify_all();
    }

    /// Queues an upload piece. The daemon keeps within the upload window; one that does not is
    /// not trusted with the worker's memory: the call is cancelled.
    fn deliver(&self, piece: UploadPiece) {
        use prost::Message;
        let len = piece.item.as_ref().map_or(0, |i| i.encoded_len() as u64);
        let mut inbox = self.inbox.lock().unwrap_or_else(|p| p.into_inner());
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
    fn next_piece(&self, wait: bool) -> crate::worker::files::Next {
        use crate::worker::files::Next;
        use prost::Message;
        let mut inbox = self.inbox.lock().unwrap_or_else(|p| p.into_inner());
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

    fn credit(&self, bytes: u64) {
        let mut unacked = self.unacked.lock().unwrap_or_else(|p| p.into_inner());
        *unacked = unacked.saturating_sub(bytes);
        self.wake.notify_all();
    }

    /// Takes `bytes` of window, waiting while it is full. Blocking here stops the command's
    /// output loop, so the command blocks on its pipe: a client that stops reading stalls its
    /// own command. Gives up (false: drop the delta) when the call is cancelled, or when the
    /// window is full past the command's `deadline`: the executor must get back to its loop to
    /// enforce the timeout, and output the client is not reading is then not worth holding.
    fn take_window(&self, bytes: u64, deadline: Option<Instant>) -> bool {
        let mut unacked = self.unacked.lock().unwrap_or_else(|p| p.into_inner());
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

type Calls = Mutex<HashMap<u64, Arc<CallState>>>;

/// The size of a streamed output delta or download chunk (what the window counts); 0 for other
/// frames.
fn delta_bytes(reply: &worker_reply::Result) -> u64 {
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
fn cancel_all_and_wait(calls: &Calls) {
    for call in calls.lock().unwrap_or_else(|p| p.into_inner()).values() {
        call.cancel();
    }
    let deadline = std::time::Instant::now() + SHUTDOWN_KILL_WAIT;
    while !calls.lock().unwrap_or_else(|p| p.into_inner()).is_empty()
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// How long a call may run on the reader thread before another thread takes over reading: a
/// file call on a slow or hung file system stalls the worker's other calls (and the cancels and
/// credits of running ones) for about this long, not for as long as it takes.
const INLINE_BUDGET: Duration = Duration::from_millis(5);
/// How often the watchdog looks at the call running on the reader thread.
const WATCH_TICK: Duration = Duration::from_millis(2);
/// Ticks without a call on the reader thread after which the watchdog sleeps until the next one
/// (an idle worker does not wake every tick).
const WATCH_IDLE_TICKS: u32 = 50;

/// Calls the reader thread answers itself: they only read the file system, start nothing and
/// never wait for the daemon. Handing each to a call thread and back cost two thread wake-ups per
/// call, most of a small read's time in the worker (docs/BENCHMARKS.md §6).
fn runs_inline(call: &worker_request::Call) -> bool {
    matches!(
        call,
        worker_request::Call::ReadFile(_) | worker_request::Call::ListDir(_)
    )
}

/// The reader role: the socket's read side and what only the reader touches. Held by one thread
/// at a time, for as long as it reads.
struct Source {
    socket: std::io::BufReader<UnixStream>,
    /// Cancels that overtook their call (the daemon sends them ahead of queued calls): ids above
    /// every id seen so far. Such a call is cancelled the moment it arrives.
    highest_id: u64,
    early_cancels: HashSet<u64>,
    /// The daemon closed the socket and the worker has shut down.
    ended: bool,
}

/// What the reader, the call threads and the watchdog share.
struct Serving {
    state: WorkerState,
    threads: crate::worker::threads::CallThreads,
    writer: Mutex<Writer>,
    calls: Calls,
    source: Mutex<Source>,
    /// When the call running on the reader thread started (ns after `epoch`); 0: none.
    inline_since: std::sync::atomic::AtomicU64,
    /// Calls run on the reader thread so far (the watchdog sees whether it is needed).
    inline_calls: std::sync::atomic::AtomicU64,
    epoch: Instant,
    watchdog_parked: AtomicBool,
    watchdog: std::sync::OnceLock<std::thread::Thread>,
    /// Set once the worker has shut down (the main thread waits for it).
    ended: (Mutex<bool>, Condvar),
}

/// The socket's write side and a buffer kept between frames (a reply is encoded into it instead
/// of into a fresh allocation each time).
struct Writer {
    socket: UnixStream,
    buf: Vec<u8>,
}

impl Writer {
    fn send(&mut self, msg: &WorkerReply) -> std::io::Result<()> {
        frame::write_reusing(&mut self.socket, &mut self.buf, msg)
    }
}

impl Serving {
    fn writer(&self) -> std::sync::MutexGuard<'_, Writer> {
        self.writer.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn serve(reader: UnixStream, writer: UnixStream, state: WorkerState) {
    let serving = Serving::new(reader, writer, state);
    start_watchdog(&serving);
    read_loop(&serving);
    // Another thread may have taken over reading; the worker is done when the socket closed.
    let (lock, cv) = &serving.ended;
    let mut ended = lock.lock().unwrap_or_else(|p| p.into_inner());
    while !*ended {
        ended = cv.wait(ended).unwrap_or_else(|p| p.into_inner());
    }
}

impl Serving {
    fn new(reader: UnixStream, writer: UnixStream, state: WorkerState) -> Arc<Self> {
        Arc::new(Serving {
            state,
            threads: crate::worker::threads::CallThreads::default(),
            writer: Mutex::new(Writer {
                socket: writer,
                buf: Vec::new(),
            }),
            calls: Calls::default(),
            // Several frames arrive in one read when the daemon is busy.
            source: Mutex::new(Source {
                socket: std::io::BufReader::with_capacity(64 * 1024, reader),
                highest_id: 0,
                early_cancels: HashSet::new(),
                ended: false,
            }),
            inline_since: Default::default(),
            inline_calls: Default::default(),
            epoch: Instant::now(),
            watchdog_parked: AtomicBool::new(false),
            watchdog: std::sync::OnceLock::new(),
            ended: (Mutex::new(false), Condvar::new()),
        })
    }
}

fn start_watchdog(serving: &Arc<Serving>) {
    let watched = serving.clone();
    match std::thread::Builder::new()
        .name("watchdog".into())
        .spawn(move || watch(&watched))
    {
        Ok(handle) => {
            let _ = serving.watchdog.set(handle.thread().clone());
        }
        // Without a watchdog nothing could take over from a stuck reader: no call runs inline.
        Err(e) => eprintln!("corral worker: no watchdog thread ({e}); every call gets a thread"),
    }
}

/// Reads and starts calls until the socket closes, or until this thread ran a call itself for
/// so long that another took over reading.
fn read_loop(serving: &Arc<Serving>) {
    let mut source = serving.source.lock().unwrap_or_else(|p| p.into_inner());
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
                *lock.lock().unwrap_or_else(|p| p.into_inner()) = true;
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
            let found = serving
                .calls
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&target)
                .cloned();
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
        serving
            .calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(req.id, call_state.clone());
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
            serving
                .calls
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
            let reply = WorkerReply {
                id,
                last: true,
                result: Some(worker_reply::Result::Failure(ToolFailure {
                    code: tonic::Code::ResourceExhausted as i32,
                    message: format!("the sandbox worker cannot start a thread for the call: {e}"),
                    setup: None,
                    field: String::new(),
                })),
                ..Default::default()
            };
            let _ = serving.writer().send(&reply);
        }
    }
}

/// Hands the reader role to another thread when a call has run on the reader thread for longer
/// than [`INLINE_BUDGET`].
fn watch(serving: &Arc<Serving>) {
    let mut rescued = 0u64;
    let mut seen_calls = 0u64;
    let mut idle = 0u32;
    loop {
        std::thread::sleep(WATCH_TICK);
        let since = serving.inline_since.load(Ordering::SeqCst);
        let calls = serving.inline_calls.load(Ordering::Relaxed);
        if since == 0 && calls == seen_calls {
            idle += 1;
            if idle >= WATCH_IDLE_TICKS {
                // Parked until the reader runs a call: it unparks us when it sees the flag, or
                // we see its call here (both use SeqCst, so one of the two happens).
                serving.watchdog_parked.store(true, Ordering::SeqCst);
                if serving.inline_since.load(Ordering::SeqCst) == 0 {
                    std::thread::park();
                }
                serving.watchdog_parked.store(false, Ordering::SeqCst);
                idle = 0;
            }
            continue;
        }
        idle = 0;
        seen_calls = calls;
        let now = serving.epoch.elapsed().as_nanos() as u64;
        if since != 0
            && since != rescued
            && now.saturating_sub(since) >= INLINE_BUDGET.as_nanos() as u64
        {
            rescued = since;
            let reader = serving.clone();
            if let Err(e) = serving.threads.run(move || read_loop(&reader)) {
                eprintln!("corral worker: cannot start a thread to take over reading: {e}");
            }
        }
    }
}

/// A call taken off the socket.
struct Job {
    id: u64,
    context: Option<CallContext>,
    call: worker_request::Call,
    stream: bool,
    call_state: Arc<CallState>,
}

/// Runs one call and sends its final reply (on the reader thread or a call thread).
fn run(serving: &Serving, job: Job) {
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
        worker_reply::Result::Failure(ToolFailure {
            code: tonic::Code::Internal as i32,
            message: "the sandbox worker failed while running the call (a bug in corral; the \
                      worker log has the panic); nothing else is affected"
                .into(),
            setup: None,
            field: String::new(),
        })
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
    serving
        .calls
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&id);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::worker_request::Call;
    use std::io::Write;

    fn state(cwd: &std::path::Path) -> WorkerState {
        WorkerState {
            runner: Arc::new(SandboxedRunner {
                protected_missing: Vec::new(),
                sandboxed: false,
                guard: None,
                protection: Default::default(),
            }),
            shell: PathBuf::from("/bin/sh"),
            network_disabled: true,
            default_cwd: cwd.to_path_buf(),
            patch_rules: crate::tools::apply_patch::PatchContext {
                cwd: cwd.to_path_buf(),
                writable_roots: Vec::new(),
                read_only: true,
                protected_names: Vec::new(),
                protected_paths: Vec::new(),
            },
        }
    }

    fn read_request(id: u64, path: &str) -> Vec<u8> {
        frame::encode(&WorkerRequest {
            id,
            context: None,
            call: Some(Call::ReadFile(api::ReadFileRequest {
                file_path: path.into(),
                ..Default::default()
            })),
            stream: false,
        })
    }

    fn lines_of(reply: &WorkerReply) -> usize {
        match &reply.result {
            Some(worker_reply::Result::ReadFile(r)) => r.lines.len(),
            other => panic!("not a read_file reply: {other:?}"),
        }
    }

    #[test]
    fn file_calls_are_answered_and_serve_returns_when_the_socket_closes() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), "one\ntwo\nthree\n").unwrap();
        let (mut ours, theirs) = UnixStream::pair().unwrap();
        let writer = theirs.try_clone().unwrap();
        let st = state(dir.path());
        let served = std::thread::spawn(move || serve(theirs, writer, st));
        // Several requests in one write: the reader takes them from its buffer.
        let mut batch = Vec::new();
        for id in 1..=3 {
            batch.extend(read_request(id, "a.txt"));
        }
        ours.write_all(&batch).unwrap();
        ours.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut ids = Vec::new();
        for _ in 0..3 {
            let reply: WorkerReply = frame::read_blocking(&mut ours).unwrap().unwrap();
            assert!(reply.last);
            assert_eq!(lines_of(&reply), 3);
            ids.push(reply.id);
        }
        ids.sort();
        assert_eq!(ids, [1, 2, 3]);
        ours.shutdown(std::net::Shutdown::Write).unwrap();
        served.join().unwrap();
    }

    #[test]
    fn a_call_stuck_on_the_reader_thread_is_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), "one\ntwo\n").unwrap();
        let (mut ours, theirs) = UnixStream::pair().unwrap();
        let writer = theirs.try_clone().unwrap();
        let serving = Serving::new(theirs, writer, state(dir.path()));
        start_watchdog(&serving);
        // As if the reader thread had left the reader role for a call that never ends: nobody
        // reads, and a call has been running since the start.
        serving.inline_since.store(1, Ordering::SeqCst);
        serving.inline_calls.fetch_add(1, Ordering::SeqCst);
        if serving.watchdog_parked.load(Ordering::SeqCst) {
            serving.watchdog.get().unwrap().unpark();
        }
        ours.write_all(&read_request(1, "a.txt")).unwrap();
        ours.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let started = Instant::now();
        let reply: WorkerReply = frame::read_blocking(&mut ours)
            .expect("another thread took over reading and answered")
            .unwrap();
        assert_eq!((reply.id, lines_of(&reply)), (1, 2));
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
    }
}
