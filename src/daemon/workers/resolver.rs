//! The daemon's side of path resolution: runs `corral __resolve` (see `worker::resolve`) for a
//! session's parameters and turns its answer into a policy or a status.
//!
//! Nothing here touches a caller's path. The helper is a child process awaited asynchronously
//! and killed at a deadline, so a FIFO, a slow mount or a huge file on one caller's path costs
//! that caller's `OpenSession` its deadline and nobody else anything (spec/sandbox.md §8.6 H5).

use crate::daemon::error::CallError;
use crate::sandbox::policy::SandboxPolicy;
use crate::sandbox::roots::SessionParams;
use crate::sync::LockExt;
use crate::wire::resolve::{ResolveAnswer, ResolveRefusal, ResolveRequest};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Child;

/// How long one resolution may take before the helper is killed.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest answer read from the helper (a policy: a few KiB in practice).
const MAX_ANSWER_BYTES: u64 = 4 * 1024 * 1024;

/// How many helpers are kept started ahead: two, so that an `OpenSession` right after another
/// still finds one.
const SPARE_HELPERS: usize = 2;

/// Starts resolver helpers ahead of the sessions that need them. A helper blocks reading its
/// request before it does anything, so one can wait unused: it runs as the daemon with an empty
/// environment, holds nothing of anyone, and answers exactly one request (it takes the caller's
/// identity only once that request names it). This takes the fork and exec of the binary, about
/// 2 ms, off every `OpenSession`.
#[derive(Clone, Default)]
pub struct Resolver {
    spares: Arc<Mutex<Spares>>,
}

#[derive(Default)]
struct Spares {
    /// Oldest first, and taken first, so none waits forever.
    ready: VecDeque<Child>,
    starting: usize,
    /// The daemon is stopping: start no more.
    closed: bool,
}

impl Resolver {
    fn spares(&self) -> std::sync::MutexGuard<'_, Spares> {
        self.spares.locked()
    }

    /// Starts helpers in the background until [`SPARE_HELPERS`] are ready or starting. Never
    /// waits, and holds no lock while one starts.
    pub fn prewarm(&self) {
        let mut spares = self.spares();
        while !spares.closed && spares.ready.len() + spares.starting < SPARE_HELPERS {
            spares.starting += 1;
            let shared = self.spares.clone();
            tokio::spawn(async move {
                // The fork of the daemon runs on a blocking thread, not a runtime thread.
                let started = tokio::task::spawn_blocking(start_helper).await;
                let mut spares = shared.locked();
                spares.starting -= 1;
                match started {
                    Ok(Ok(child)) if !spares.closed => spares.ready.push_back(child),
                    // Dropping it kills it.
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => {
                        tracing::warn!("cannot start a spare path resolver: {}", e.message())
                    }
                    Err(e) => tracing::warn!("spare path resolver task: {e}"),
                }
            });
        }
    }

    /// Kills the helpers waiting unused and starts no more (the daemon is stopping).
    pub async fn shutdown(&self) {
        let spares: Vec<Child> = {
            let mut spares = self.spares();
            spares.closed = true;
            spares.ready.drain(..).collect()
        };
        for mut child in spares {
            // SIGKILL, then reaped.
            let _ = child.kill().await;
        }
    }

    /// A helper still waiting for its request (exited ones are dropped, which reaps them).
    fn take_spare(&self) -> Option<Child> {
        let mut spares = self.spares();
        while let Some(mut child) = spares.ready.pop_front() {
            if matches!(child.try_wait(), Ok(None)) {
                return Some(child);
            }
        }
        None
    }

    /// Resolves `params` as the caller they name.
    pub async fn resolve(&self, params: &SessionParams) -> Result<SandboxPolicy, CallError> {
        let child = match self.take_spare() {
            Some(child) => child,
            None => start_helper()?,
        };
        self.prewarm();
        exchange(child, params).await
    }
}

/// Starts `corral __resolve`, which waits for its request on stdin.
fn start_helper() -> Result<Child, CallError> {
    tokio::process::Command::new("/proc/self/exe")
        .arg("__resolve")
        // The daemon's environment (and any secret in it) stays with the daemon.
        .env_clear()
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| CallError::Internal(format!("cannot start the path resolver: {e}")))
}

/// Sends `params` to the helper `child` and turns its answer into a policy or a status.
async fn exchange(mut child: Child, params: &SessionParams) -> Result<SandboxPolicy, CallError> {
    let request = serde_json::to_vec(&ResolveRequest {
        params: params.clone(),
    })
    .map_err(|e| CallError::Internal(format!("cannot encode the resolve request: {e}")))?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    let stdout = child.stdout.take().expect("piped stdout");
    let exchange = async {
        stdin.write_all(&request).await?;
        drop(stdin);
        let mut answer = Vec::new();
        stdout
            .take(MAX_ANSWER_BYTES)
            .read_to_end(&mut answer)
            .await?;
        let status = child.wait().await?;
        Ok::<_, std::io::Error>((answer, status))
    };
    let (answer, status) = match tokio::time::timeout(RESOLVE_TIMEOUT, exchange).await {
        Ok(Ok(done)) => done,
        Ok(Err(e)) => {
            return Err(CallError::Internal(format!(
                "the path resolver failed: {e}; see the daemon log"
            )));
        }
        // Dropping the future drops `child`, which kills it (kill_on_drop).
        Err(_) => {
            return Err(CallError::Expired(format!(
                "resolving the session's paths took longer than {} s (a FIFO, a hung mount or \
                 a very slow filesystem on the way?); the session was not opened",
                RESOLVE_TIMEOUT.as_secs()
            )));
        }
    };
    let answer: ResolveAnswer = serde_json::from_slice(&answer).map_err(|e| {
        CallError::Internal(format!(
            "the path resolver gave no usable answer ({status}): {e}; see the daemon log"
        ))
    })?;
    answer.map_err(|refusal| match refusal {
        ResolveRefusal::Invalid { field, message } => CallError::invalid_field(&field, &message),
        ResolveRefusal::Denied(m) => CallError::Denied(m),
        ResolveRefusal::Unenforceable(m) => CallError::Unmet(m),
        ResolveRefusal::Helper(m) => CallError::Internal(format!(
            "the path resolver could not take the caller's identity: {m}"
        )),
    })
}
