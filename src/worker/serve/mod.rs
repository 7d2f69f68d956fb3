//! The worker process: confine, announce readiness, then serve calls from the daemon over the
//! inherited socketpair until it closes. Each call runs on its own thread.
//!
//! This file is the entry (`worker_main`: the spec, the confinement, the ready report) and what
//! the serving threads share (`Serving`: the socket's two sides and the calls in flight). The
//! rest, one room each:
//! - `spare`: a spare worker that got its spec renames itself `__worker`;
//! - `state`: what every call of the worker shares, drawn from its policy;
//! - `reader`: the reader role, which takes frames off the socket and starts calls;
//! - `watchdog`: hands the reader role on when a call run on the reader thread takes too long;
//! - `run`: runs one call and sends its replies;
//! - `call_state`: one call in flight: its cancel flag, streaming window and upload inbox;
//! - `reply`: the bounds and shapes of what the worker sends back.

mod call_state;
mod calls;
mod reply;
mod spare;
mod state;
mod watchdog;

use crate::sync::LockExt;
use crate::wire::frame;
use crate::wire::spec::{WORKER_FD, WorkerSpec};
use crate::wire::{FailureKind, Ready, ToolFailure, WorkerReply, worker_reply};
use crate::worker::commands::SandboxedRunner;
use crate::worker::confine;
use call_state::Calls;
use calls::read_loop;
use reply::{layer_to_api, send_failure};
use spare::rename_spare;
use state::{WorkerState, patch_rules};
use std::collections::HashSet;
use std::os::fd::FromRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;
use watchdog::start_watchdog;

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
        // A spare worker (`daemon::workers::pool`) the daemon dropped without using it.
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
                FailureKind::Internal,
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
                        kind: FailureKind::FailedPrecondition as i32,
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
        self.writer.locked()
    }
}

fn serve(reader: UnixStream, writer: UnixStream, state: WorkerState) {
    let serving = Serving::new(reader, writer, state);
    start_watchdog(&serving);
    read_loop(&serving);
    // Another thread may have taken over reading; the worker is done when the socket closed.
    let (lock, cv) = &serving.ended;
    let mut ended = lock.locked();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api;
    use crate::wire::WorkerRequest;
    use crate::wire::worker_request::Call;
    use std::io::Write;
    use std::path::PathBuf;
    use std::time::Duration;

    pub(super) fn state(cwd: &std::path::Path) -> WorkerState {
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

    pub(super) fn read_request(id: u64, path: &str) -> Vec<u8> {
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

    pub(super) fn lines_of(reply: &WorkerReply) -> usize {
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
}
