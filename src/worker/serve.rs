//! The worker process: confine, announce readiness, then serve calls from the daemon over the
//! inherited socketpair until it closes. Each call runs on its own thread.

use crate::api;
use crate::sandbox::policy::SandboxPolicy;
use crate::sandbox::report::{Layer, LayerReport, LayerStatus};
use crate::tools::ToolContext;
use crate::wire::{
    CallContext, Ready, ToolFailure, UploadPiece, WorkerReply, WorkerRequest, worker_reply,
    worker_request,
};
use crate::worker::commands::SandboxedRunner;
use crate::worker::{confine, dispatch, frame};
use std::collections::{HashMap, HashSet, VecDeque};
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

/// The descriptor the daemon passes the request socket on.
pub const WORKER_FD: RawFd = 3;

/// Output delta bytes one streaming call may have sent and not yet had credited by the daemon
/// (spec/sandbox.md H6). Large enough to keep a local stream at full speed, small enough that
/// many stalled streams stay far below the daemon's memory budget.
pub const STREAM_WINDOW_BYTES: u64 = 1024 * 1024;

/// What the daemon tells a new worker: the first frame on its socketpair, as JSON (never in
/// argv, which every local user can read in /proc; spec/sandbox.md §8.6 H15).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct WorkerSpec {
    pub policy: SandboxPolicy,
    /// Layers the operator allows to be missing.
    pub degraded: Vec<Layer>,
}

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
            guard: confined.guard,
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

/// The argument a spare worker is started with (pool.rs), as long as `__worker`.
pub const SPARE_ARG: &str = "__spare_";

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

/// A reply too large to send becomes a clear RESOURCE_EXHAUSTED failure instead.
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
    worker_reply::Result::Failure(ToolFailure {
        code: tonic::Code::ResourceExhausted as i32,
        message: format!(
            "the result is {len} bytes, more than the {} MiB one response may carry; ask for \
             less (read_file: offset and limit; list_dir and grep_files: limit; a command: \
             send its output to a file and read that in parts)",
            MAX_RESPONSE_BYTES >> 20
        ),
        setup: None,
    })
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
        LayerStatus::NotApplicable => api::LayerStatus::Unspecified,
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

fn serve(mut reader: UnixStream, writer: UnixStream, state: WorkerState) {
    let state = Arc::new(state);
    let threads = crate::worker::threads::CallThreads::default();
    let writer = Arc::new(Mutex::new(writer));
    let calls: Arc<Calls> = Arc::default();
    // Cancels that overtook their call (the daemon sends them ahead of queued calls): ids above
    // every id seen so far. Such a call is cancelled the moment it arrives.
    let mut highest_id = 0u64;
    let mut early_cancels: HashSet<u64> = HashSet::new();
    loop {
        let req: WorkerRequest = match frame::read_blocking(&mut reader) {
            Ok(Some(r)) => r,
            // The daemon closed the socket (or sent garbage): nothing more to serve. Commands
            // still running must not outlive their worker (in danger-full-access there is no
            // PID namespace to end them).
            Ok(None) | Err(_) => {
                cancel_all_and_wait(&calls);
                crate::tools::unified_exec::close_all();
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
            let found = calls
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&target)
                .cloned();
            match (found, call) {
                (Some(c), worker_request::Call::Credit(credit)) => c.credit(credit.bytes),
                (Some(c), worker_request::Call::UploadPiece(piece)) => c.deliver(piece),
                (Some(c), _) => c.cancel(),
                (None, worker_request::Call::Cancel(id)) if id > highest_id => {
                    // Bounded: the daemon cancels only calls it started.
                    if early_cancels.len() < 4096 {
                        early_cancels.insert(id);
                    }
                }
                (None, _) => {}
            }
            continue;
        }
        highest_id = highest_id.max(req.id);
        let cancel = Arc::new(AtomicBool::new(early_cancels.remove(&req.id)));
        let call_state = Arc::new(CallState::new(cancel.clone()));
        calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(req.id, call_state.clone());
        let mut ctx = state.context(req.context.as_ref(), cancel);
        // The call's own view of the runner, to report a sandbox denial with the reply.
        let witness = Arc::new(crate::worker::commands::DenialWitness::new(
            state.runner.clone(),
        ));
        ctx.runner = witness.clone();
        let stream = req.stream;
        let state = state.clone();
        let call_writer = writer.clone();
        let call_table = calls.clone();
        let id = req.id;
        let spawned = threads.run(move || {
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
                let mut w = call_writer.lock().unwrap_or_else(|p| p.into_inner());
                let _ = frame::write_blocking(&mut *w, &frame);
            };
            // A panic in a tool must still answer the call (else the daemon waits for it
            // until its deadline, or for ever): INTERNAL, and the worker serves on.
            let inbox = call_state.clone();
            let mut pieces = |wait: bool| inbox.next_piece(wait);
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                dispatch::execute(&ctx, &state.runner, call, stream, &mut emit, &mut pieces)
            }))
            .unwrap_or_else(|_| {
                worker_reply::Result::Failure(ToolFailure {
                    code: tonic::Code::Internal as i32,
                    message: "the sandbox worker failed while running the call (a bug in \
                              corral; the worker log has the panic); nothing else is affected"
                        .into(),
                    setup: None,
                })
            });
            let result = bounded(result);
            let (kept_processes, ended_processes) =
                crate::tools::unified_exec::changes_of(&ctx.session_id);
            let reply = WorkerReply {
                id,
                last: true,
                result: Some(result),
                kept_processes,
                ended_processes,
                sandbox_denied: witness.denied(),
            };
            let mut w = call_writer.lock().unwrap_or_else(|p| p.into_inner());
            let _ = frame::write_blocking(&mut *w, &reply);
            drop(w);
            call_table
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
        });
        if let Err(e) = spawned {
            calls.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
            let reply = WorkerReply {
                id,
                last: true,
                result: Some(worker_reply::Result::Failure(ToolFailure {
                    code: tonic::Code::ResourceExhausted as i32,
                    message: format!("the sandbox worker cannot start a thread for the call: {e}"),
                    setup: None,
                })),
                ..Default::default()
            };
            let mut w = writer.lock().unwrap_or_else(|p| p.into_inner());
            let _ = frame::write_blocking(&mut *w, &reply);
        }
    }
}
