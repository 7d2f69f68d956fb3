//! The daemon's side of path resolution: runs `corral __resolve` (see `worker::resolve`) for a
//! session's parameters and turns its answer into a policy or a status.
//!
//! Nothing here touches a caller's path. The helper is a child process awaited asynchronously
//! and killed at a deadline, so a FIFO, a slow mount or a huge file on one caller's path costs
//! that caller's `OpenSession` its deadline and nobody else anything (spec/sandbox.md §8.6 H5).

use crate::sandbox::policy::SandboxPolicy;
use crate::sandbox::roots::SessionParams;
use crate::worker::resolve::{ResolveAnswer, ResolveRefusal, ResolveRequest};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::Status;

/// How long one resolution may take before the helper is killed.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest answer read from the helper (a policy: a few KiB in practice).
const MAX_ANSWER_BYTES: u64 = 4 * 1024 * 1024;

/// Resolves `params` as the caller they name.
pub async fn resolve(params: &SessionParams) -> Result<SandboxPolicy, Status> {
    let request = serde_json::to_vec(&ResolveRequest {
        params: params.clone(),
    })
    .map_err(|e| Status::internal(format!("cannot encode the resolve request: {e}")))?;
    let mut child = tokio::process::Command::new("/proc/self/exe")
        .arg("__resolve")
        // The daemon's environment (and any secret in it) stays with the daemon.
        .env_clear()
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| Status::internal(format!("cannot start the path resolver: {e}")))?;
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
            return Err(Status::internal(format!(
                "the path resolver failed: {e}; see the daemon log"
            )));
        }
        // Dropping the future drops `child`, which kills it (kill_on_drop).
        Err(_) => {
            return Err(Status::deadline_exceeded(format!(
                "resolving the session's paths took longer than {} s (a FIFO, a hung mount or \
                 a very slow filesystem on the way?); the session was not opened",
                RESOLVE_TIMEOUT.as_secs()
            )));
        }
    };
    let answer: ResolveAnswer = serde_json::from_slice(&answer).map_err(|e| {
        Status::internal(format!(
            "the path resolver gave no usable answer ({status}): {e}; see the daemon log"
        ))
    })?;
    answer.map_err(|refusal| match refusal {
        ResolveRefusal::Invalid { field, message } => {
            crate::daemon::status::invalid_field(&field, &message)
        }
        ResolveRefusal::Denied(m) => Status::permission_denied(m),
        ResolveRefusal::Unenforceable(m) => Status::failed_precondition(m),
        ResolveRefusal::Helper(m) => Status::internal(format!(
            "the path resolver could not take the caller's identity: {m}"
        )),
    })
}
