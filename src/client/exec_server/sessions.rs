//! Exec-server sessions: what an `initialize` creates and a `resumeSessionId` takes back. A
//! session outlives its connection for [`RESUME_WINDOW`] (processes keep running, output is
//! retained); a new connection that names it takes it over and the old one is cut off. An
//! expired session's processes are killed and its corral sessions closed.
//!
//! Each session holds the corral sessions it opened, one per distinct sandbox Codex asked for
//! (`sandbox::SessionSpec`), and the processes it started.

use super::Channel;
use super::process::{Outbox, Process, RETAIN_CLOSED};
use super::rpc::RpcError;
use super::sandbox::SessionSpec;
use crate::api::{self, processes_client::ProcessesClient, sessions_client::SessionsClient};
use crate::sync::LockExt;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

/// How long a session waits for its client to come back.
pub const RESUME_WINDOW: Duration = Duration::from_secs(30);

/// Processes one session may hold at once (a client that never terminates them stops here).
pub const MAX_PROCESSES: usize = 256;

pub struct ExecSession {
    pub id: String,
    channel: Channel,
    /// corral session ids by the sandbox they enforce.
    corral: tokio::sync::Mutex<HashMap<SessionSpec, String>>,
    processes: Mutex<HashMap<String, Arc<Process>>>,
    /// The attached connection's outbox (None while detached).
    pub outbox: Outbox,
    /// Bumped at every attach and detach: a detach's expiry timer acts only if nothing
    /// happened since.
    generation: AtomicU64,
}

/// Every session of this front.
#[derive(Default)]
pub struct Registry {
    sessions: Mutex<HashMap<String, Arc<ExecSession>>>,
}

impl Registry {
    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<ExecSession>>> {
        self.sessions.locked()
    }

    /// A new session attached to `outbox`.
    pub fn create(
        &self,
        channel: Channel,
        outbox: mpsc::Sender<Value>,
    ) -> Result<Arc<ExecSession>, RpcError> {
        let id = new_id()?;
        let s = Arc::new(ExecSession {
            id: id.clone(),
            channel,
            corral: tokio::sync::Mutex::default(),
            processes: Mutex::default(),
            outbox: Arc::new(Mutex::new(Some(outbox))),
            generation: AtomicU64::new(0),
        });
        self.table().insert(id, s.clone());
        Ok(s)
    }

    /// Takes over session `id` for a new connection (the old one, if still attached, gets no
    /// more notifications).
    pub fn resume(
        &self,
        id: &str,
        outbox: mpsc::Sender<Value>,
    ) -> Result<Arc<ExecSession>, RpcError> {
        let s = self.table().get(id).cloned().ok_or_else(|| {
            RpcError::new(
                super::rpc::INVALID_REQUEST,
                format!(
                    "unknown session `{id}`: it expired ({} s after its connection ended) or \
                     never existed; initialize without resumeSessionId",
                    RESUME_WINDOW.as_secs()
                ),
            )
        })?;
        s.generation.fetch_add(1, Ordering::SeqCst);
        *s.outbox.locked() = Some(outbox);
        Ok(s)
    }

    /// The connection of `s` ended: detach it, and end the session unless it is resumed
    /// within [`RESUME_WINDOW`].
    pub fn detach(self: &Arc<Self>, s: &Arc<ExecSession>, outbox: &mpsc::Sender<Value>) {
        {
            let mut current = s.outbox.locked();
            // Taken over by a newer connection meanwhile: not ours to detach.
            if !current.as_ref().is_some_and(|c| c.same_channel(outbox)) {
                return;
            }
            *current = None;
        }
        let generation = s.generation.fetch_add(1, Ordering::SeqCst) + 1;
        let (registry, s) = (self.clone(), s.clone());
        tokio::spawn(async move {
            tokio::time::sleep(RESUME_WINDOW).await;
            if s.generation.load(Ordering::SeqCst) != generation {
                return;
            }
            registry.table().remove(&s.id);
            s.close().await;
        });
    }

    /// Ends every session (the front is stopping).
    pub async fn close_all(&self) {
        let all: Vec<_> = self.table().drain().map(|(_, s)| s).collect();
        for s in all {
            s.close().await;
        }
    }
}

impl ExecSession {
    /// The corral session enforcing `spec`, opened on first use.
    pub async fn corral_session(&self, spec: &SessionSpec) -> Result<String, RpcError> {
        let mut corral = self.corral.lock().await;
        if let Some(id) = corral.get(spec) {
            return Ok(id.clone());
        }
        let request = api::OpenSessionRequest {
            cwd: spec.cwd.to_string_lossy().into_owned(),
            mode: spec.mode.api() as i32,
            writable_roots: spec
                .writable_roots
                .iter()
                .map(|p| p.to_string_lossy().into_owned())
                .collect(),
            network_access: spec.network,
            exclude_slash_tmp: !spec.slash_tmp,
            exclude_tmpdir_env_var: !spec.tmpdir,
            ..Default::default()
        };
        let id = SessionsClient::new(self.channel.clone())
            .open_session(request)
            .await
            .map_err(|s| super::handlers::rpc_error(&s))?
            .into_inner()
            .session_id;
        corral.insert(spec.clone(), id.clone());
        Ok(id)
    }

    pub fn process(&self, id: &str) -> Option<Arc<Process>> {
        self.table().get(id).cloned()
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Process>>> {
        self.processes.locked()
    }

    /// Claims `id` for a process about to start (a duplicate is refused).
    pub fn claim(&self, id: &str) -> Result<(), RpcError> {
        let table = self.table();
        if table.contains_key(id) {
            return Err(RpcError::new(
                super::rpc::INVALID_REQUEST,
                format!("process id `{id}` is already in use in this session"),
            ));
        }
        if table.len() >= MAX_PROCESSES {
            return Err(RpcError::new(
                super::rpc::INVALID_REQUEST,
                format!(
                    "this session already holds {MAX_PROCESSES} processes; terminate some \
                     (process/terminate)"
                ),
            ));
        }
        Ok(())
    }

    pub fn insert(&self, p: Arc<Process>) {
        self.table().insert(p.id.clone(), p);
    }

    /// A closed process stays readable for [`RETAIN_CLOSED`], then the session forgets it
    /// and corral does too (its retained output is freed; its slot counts no more).
    pub async fn retire(&self, p: &Arc<Process>) {
        tokio::time::sleep(RETAIN_CLOSED).await;
        {
            let mut table = self.table();
            // The same process, not a later one that reused the id.
            if !table.get(&p.id).is_some_and(|held| Arc::ptr_eq(held, p)) {
                return;
            }
            table.remove(&p.id);
        }
        if p.mark_terminated() {
            let _ = self
                .processes_client()
                .terminate_process(api::TerminateProcessRequest {
                    session_id: p.corral_session.clone(),
                    process_id: p.corral_id,
                })
                .await;
        }
    }

    pub fn processes_client(&self) -> ProcessesClient<Channel> {
        ProcessesClient::new(self.channel.clone())
    }

    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// Kills every process and closes every corral session (which kills what is left).
    async fn close(&self) {
        let sessions: Vec<String> = self.corral.lock().await.drain().map(|(_, id)| id).collect();
        self.table().clear();
        let mut client = SessionsClient::new(self.channel.clone());
        for id in sessions {
            let _ = client
                .close_session(api::CloseSessionRequest { session_id: id })
                .await;
        }
    }
}

/// A 128-bit random session id in the UUID text form Codex's server uses.
fn new_id() -> Result<String, RpcError> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b)
        .map_err(|e| RpcError::internal(format!("no randomness for a session id: {e}")))?;
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    Ok(format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    ))
}
