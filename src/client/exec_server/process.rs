//! One process Codex started (`process/start`), as the front keeps it: the corral process that
//! runs it, and its output renumbered the exec-server way — every chunk, then the exit, then the
//! close, each with the next `seq` from 1 — retained (1 MiB, oldest dropped first) for
//! `process/read {afterSeq}` and pushed as `process/output|exited|closed` notifications to
//! whichever connection holds the session. One pump per process is the only reader of corral's
//! `ReadProcess`, so the two views never disagree.

use super::rpc;
use crate::api::{self, processes_client::ProcessesClient};
use crate::sync::LockExt;
use base64::Engine;
use serde_json::{Value, json};
use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// Output kept per process for `process/read` (Codex's server keeps the same).
pub const RETAINED_BYTES: usize = 1024 * 1024;

/// How long corral's `ReadProcess` may wait for output in one call of the pump.
const PUMP_WAIT_MS: u32 = 10_000;

/// How long a closed process stays readable (`process/read` after the end), as in Codex's
/// server; then the front forgets it and corral does too.
pub const RETAIN_CLOSED: Duration = Duration::from_secs(30);

/// One retained chunk.
struct Chunk {
    seq: u64,
    data: Vec<u8>,
}

#[derive(Default)]
struct Output {
    chunks: VecDeque<Chunk>,
    retained: usize,
    /// The last seq given out (0: none yet).
    last_seq: u64,
    exit_code: Option<i32>,
    closed: bool,
    /// Why the process's output ended without a close (corral forgot it, the daemon went away).
    failure: Option<String>,
}

/// Where the notifications of a session go: the attached connection's outbox, if any.
pub type Outbox = std::sync::Arc<Mutex<Option<mpsc::Sender<Value>>>>;

pub struct Process {
    pub id: String,
    /// Runs in a sandboxed corral session (its failures may be the sandbox's doing).
    pub sandboxed: bool,
    pub corral_session: String,
    pub corral_id: i32,
    pub tty: bool,
    /// Whether `process/write` may write: a PTY, or pipes started with `pipeStdin`.
    pub stdin_open: AtomicBool,
    output: Mutex<Output>,
    /// Bumped on every change, for `process/read`'s long poll.
    changed: watch::Sender<u64>,
    /// `writeId`s already written (Codex retries a write under the same id).
    writes: Mutex<HashSet<String>>,
    /// `process/terminate` was asked: corral kills and forgets the process, so the pump's
    /// losing sight of it is the expected end, not a failure.
    terminated: AtomicBool,
}

impl Process {
    pub fn new(id: String, corral_session: String, corral_id: i32, tty: bool, stdin: bool) -> Self {
        Self {
            id,
            sandboxed: true,
            corral_session,
            corral_id,
            tty,
            stdin_open: AtomicBool::new(stdin),
            output: Mutex::default(),
            changed: watch::channel(0).0,
            writes: Mutex::default(),
            terminated: AtomicBool::new(false),
        }
    }

    /// Marks the process terminated; false when it already was (the second `process/terminate`
    /// of the same process kills nothing).
    pub fn mark_terminated(&self) -> bool {
        !self.terminated.swap(true, Ordering::SeqCst)
    }

    fn output(&self) -> std::sync::MutexGuard<'_, Output> {
        self.output.locked()
    }

    fn stream(&self) -> &'static str {
        if self.tty { "pty" } else { "stdout" }
    }

    /// Whether the process has not exited yet (as far as the pump has seen).
    pub fn running(&self) -> bool {
        let o = self.output();
        o.exit_code.is_none() && !o.closed && o.failure.is_none()
    }

    /// Records a `writeId`; false when it was written before (the write is not repeated).
    pub fn first_write(&self, write_id: &str) -> bool {
        self.writes.locked().insert(write_id.to_string())
    }

    /// Reads corral's output until the process is closed, renumbering and notifying.
    pub async fn pump(
        self: std::sync::Arc<Self>,
        mut client: ProcessesClient<super::Channel>,
        outbox: Outbox,
    ) {
        let mut cursor: Option<u64> = None;
        let mut exit_told = false;
        loop {
            let read = client
                .read_process(api::ReadProcessRequest {
                    session_id: self.corral_session.clone(),
                    process_id: self.corral_id,
                    after_seq: cursor,
                    wait_ms: PUMP_WAIT_MS,
                    max_bytes: 0,
                })
                .await;
            let r = match read {
                Ok(r) => r.into_inner(),
                Err(status)
                    if status.code() == tonic::Code::NotFound
                        && self.terminated.load(Ordering::SeqCst) =>
                {
                    // Terminated: corral killed the tree and forgot it.
                    self.close(None, &outbox).await;
                    return;
                }
                Err(status) => {
                    let why = format!("corral stopped reporting the process: {}", status.message());
                    self.close(Some(why), &outbox).await;
                    return;
                }
            };
            for chunk in r.chunks {
                if chunk.data.is_empty() {
                    continue;
                }
                let seq = self.push(chunk.data.clone());
                self.notify(
                    &outbox,
                    "process/output",
                    json!({
                        "processId": self.id,
                        "seq": seq,
                        "stream": self.stream(),
                        "chunk": base64::engine::general_purpose::STANDARD.encode(&chunk.data),
                    }),
                )
                .await;
            }
            cursor = r.last_seq.or(cursor);
            let state = r.state.unwrap_or_default();
            if !exit_told && let Some(code) = state.exit_code {
                exit_told = true;
                let seq = self.end(|o| o.exit_code = Some(code));
                let denied = self.sandbox_denied();
                self.notify(
                    &outbox,
                    "process/exited",
                    json!({"processId": self.id, "seq": seq, "exitCode": code, "sandboxDenied": denied}),
                )
                .await;
            }
            if state.closed {
                self.close(None, &outbox).await;
                return;
            }
            if !r.more && r.last_seq.is_none() && !state.running && state.exit_code.is_none() {
                // Neither running nor exited nor closed: nothing more will come.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }

    /// The output ended: closed, or (`failure`) lost; `process/closed` takes the next seq.
    async fn close(&self, failure: Option<String>, outbox: &Outbox) {
        let seq = self.end(|o| {
            o.failure = failure;
            o.closed = true;
        });
        self.notify(
            outbox,
            "process/closed",
            json!({"processId": self.id, "seq": seq}),
        )
        .await;
    }

    /// Retains a chunk under the next seq, dropping the oldest past [`RETAINED_BYTES`].
    fn push(&self, data: Vec<u8>) -> u64 {
        let mut o = self.output();
        o.last_seq += 1;
        let seq = o.last_seq;
        o.retained += data.len();
        o.chunks.push_back(Chunk { seq, data });
        while o.retained > RETAINED_BYTES && o.chunks.len() > 1 {
            if let Some(old) = o.chunks.pop_front() {
                o.retained -= old.data.len();
            }
        }
        drop(o);
        self.changed.send_modify(|v| *v += 1);
        seq
    }

    /// Takes the next seq for a terminal event and applies it.
    fn end(&self, apply: impl FnOnce(&mut Output)) -> u64 {
        let mut o = self.output();
        o.last_seq += 1;
        let seq = o.last_seq;
        apply(&mut o);
        drop(o);
        self.changed.send_modify(|v| *v += 1);
        seq
    }

    async fn notify(&self, outbox: &Outbox, method: &str, params: Value) {
        let tx = outbox.locked().clone();
        if let Some(tx) = tx {
            // A client that stops reading stalls this pump only (bounded outbox).
            let _ = tx.send(rpc::notification(method, params)).await;
        }
    }

    /// `process/read`: retained chunks after `after_seq`, waiting up to `wait` for some when
    /// there are none and the process is not closed; at most `max_bytes`, but always at least
    /// one chunk.
    pub async fn read(&self, after_seq: u64, max_bytes: usize, wait: Duration) -> Value {
        let mut changed = self.changed.subscribe();
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            {
                let o = self.output();
                let mut chunks = Vec::new();
                let mut bytes = 0usize;
                for c in o.chunks.iter().filter(|c| c.seq > after_seq) {
                    if !chunks.is_empty() && bytes + c.data.len() > max_bytes {
                        break;
                    }
                    bytes += c.data.len();
                    chunks.push(json!({
                        "seq": c.seq,
                        "stream": self.stream(),
                        "chunk": base64::engine::general_purpose::STANDARD.encode(&c.data),
                    }));
                }
                let done = o.closed || o.exit_code.is_some();
                if !chunks.is_empty() || done || tokio::time::Instant::now() >= deadline {
                    let next = chunks
                        .last()
                        .and_then(|c| c["seq"].as_u64())
                        .unwrap_or(after_seq)
                        + 1;
                    return json!({
                        "chunks": chunks,
                        "nextSeq": next,
                        "exited": o.exit_code.is_some(),
                        "exitCode": o.exit_code,
                        "closed": o.closed,
                        "failure": o.failure,
                        "sandboxDenied": o.exit_code.is_some() && self.denied_in(&o),
                    });
                }
            }
            if tokio::time::timeout_at(deadline, changed.changed())
                .await
                .is_err()
            {
                continue;
            }
        }
    }

    /// Whether the process failed the way a sandbox denial looks, so Codex offers its retry
    /// outside the sandbox (its own server decides the same way, from the exit code and the
    /// output's words).
    fn sandbox_denied(&self) -> bool {
        let o = self.output();
        self.denied_in(&o)
    }

    fn denied_in(&self, o: &Output) -> bool {
        const SIGNS: [&str; 5] = [
            "read-only file system",
            "operation not permitted",
            "permission denied",
            "bad system call",
            "sandbox",
        ];
        if !self.sandboxed || o.exit_code.is_none_or(|c| c == 0) {
            return false;
        }
        // The tail of what it printed is where the failure is said.
        let mut tail: Vec<u8> = Vec::new();
        for c in o.chunks.iter().rev() {
            tail.splice(0..0, c.data.iter().copied());
            if tail.len() > 64 * 1024 {
                break;
            }
        }
        let text = String::from_utf8_lossy(&tail).to_lowercase();
        SIGNS.iter().any(|s| text.contains(s))
    }

    /// Marks stdin closed (a write then answers `stdinClosed`).
    pub fn close_stdin(&self) {
        self.stdin_open.store(false, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_drops_the_oldest_and_seqs_run_on() {
        let p = Process::new("p".into(), "s".into(), 1, false, false);
        let a = p.push(vec![b'a'; RETAINED_BYTES]);
        let b = p.push(vec![b'b'; 10]);
        assert_eq!((a, b), (1, 2));
        let exited = p.end(|o| o.exit_code = Some(0));
        assert_eq!(exited, 3);
        let o = p.output();
        assert_eq!(o.chunks.len(), 1);
        assert_eq!(o.chunks[0].seq, 2);
    }

    #[tokio::test]
    async fn read_returns_after_the_cursor_and_waits_for_more() {
        let p = std::sync::Arc::new(Process::new("p".into(), "s".into(), 1, true, true));
        p.push(b"one".to_vec());
        let r = p.read(0, 1 << 20, Duration::ZERO).await;
        assert_eq!(r["chunks"][0]["seq"], 1);
        assert_eq!(r["chunks"][0]["stream"], "pty");
        assert_eq!(r["nextSeq"], 2);
        let waiter = {
            let p = p.clone();
            tokio::spawn(async move { p.read(1, 1 << 20, Duration::from_secs(5)).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        p.push(b"two".to_vec());
        let r = waiter.await.unwrap();
        assert_eq!(r["chunks"][0]["seq"], 2);
        // Nothing new, not done, no wait: an empty answer at once.
        let r = p.read(2, 1 << 20, Duration::ZERO).await;
        assert_eq!(r["chunks"].as_array().unwrap().len(), 0);
        assert_eq!(
            (r["exited"].as_bool(), r["closed"].as_bool()),
            (Some(false), Some(false))
        );
        // max_bytes: at least one chunk.
        let r = p.read(0, 1, Duration::ZERO).await;
        assert_eq!(r["chunks"].as_array().unwrap().len(), 1);
    }
}
