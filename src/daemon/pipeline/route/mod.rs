//! Where calls run: every session's calls go to the confined worker of its effective policy.
//! The daemon itself never touches user files.

use crate::daemon::error::CallError;
use crate::daemon::session::processes::Home;
use crate::daemon::session::sessions::Session;
use crate::daemon::session::slots::Slot;
use crate::daemon::workers::pool::{CallHandle, Worker, WorkerPool};
use crate::daemon::workers::resolver::Resolver;
use crate::daemon::workers::start_rate::StartRate;
use crate::sandbox::policy::{Mode, SandboxPolicy};
use crate::sandbox::profile::ProfileSet;
use crate::sandbox::report::Layer;
use crate::sync::LockExt;
use crate::wire::{CallContext, WorkerReply, worker_reply::Result as Reply, worker_request::Call};
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::mpsc;

mod policy;

/// Runs calls for sessions.
#[derive(Clone)]
pub struct Executor {
    pool: WorkerPool,
    /// corral's own state: masked in every sandboxed worker; no writable root may contain it.
    state_paths: Vec<PathBuf>,
    /// The sandbox profiles sessions may use.
    profiles: Arc<ProfileSet>,
    /// Resolves each session's paths as its caller (§8.6 H5).
    resolver: Resolver,
    /// Each user's budget of sandbox starts (H23).
    starts: Arc<StartRate>,
    /// The directory of the daemon's Unix socket (one of `state_paths`), named as such when a
    /// writable root holds it.
    socket_dir: Option<PathBuf>,
}

impl Executor {
    pub fn new(degraded: Vec<Layer>, state_paths: Vec<PathBuf>, profiles: ProfileSet) -> Self {
        Self {
            pool: WorkerPool::new(degraded),
            state_paths,
            profiles: Arc::new(profiles),
            resolver: Resolver::default(),
            starts: Arc::default(),
            socket_dir: None,
        }
    }

    /// Names `dir` (one of the state paths) as the directory of the daemon's socket.
    pub fn with_socket_dir(mut self, dir: Option<PathBuf>) -> Self {
        self.socket_dir = dir;
        self
    }

    /// Starts the spare workers and path resolvers that make the next `OpenSession` fast.
    pub fn prewarm(&self) {
        self.pool.prewarm();
        self.resolver.prewarm();
    }

    /// Stops every worker and helper (the daemon is shutting down and no call is left).
    pub async fn shutdown(&self) {
        self.resolver.shutdown().await;
        self.pool.shutdown().await;
    }

    pub fn profiles(&self) -> &ProfileSet {
        &self.profiles
    }

    pub fn pool(&self) -> &WorkerPool {
        &self.pool
    }

    /// Starts (or joins) the session's worker; fails with FAILED_PRECONDITION when the sandbox
    /// cannot be set up. A worker that was stopped (H18) is not joined: the new session gets a
    /// later generation of the policy, and so a sandbox of its own.
    pub async fn open(&self, policy: &mut SandboxPolicy) -> Result<(), CallError> {
        while self.pool.stopped(policy).await.is_some() {
            policy.sandbox_generation += 1;
        }
        self.pool.acquire(policy).await.map(|_| ())
    }

    /// The session no longer uses its worker.
    pub async fn close(&self, session: &Session) {
        // Its long-lived processes (unified exec) die with it, before the workers are let go.
        let held: Vec<SandboxPolicy> = std::mem::take(&mut *session.held_policies.locked());
        let mut policies: Vec<SandboxPolicy> = Vec::new();
        for policy in [
            Some(session.current_policy()),
            session.escalated_policy.get().cloned(),
        ]
        .into_iter()
        .flatten()
        .chain(held.iter().cloned())
        {
            if !policies.contains(&policy) {
                policies.push(policy);
            }
        }
        for policy in &policies {
            if let Some(worker) = self.pool.existing(policy).await {
                let close = Call::CloseSession(crate::wire::CloseSession {
                    session_id: session.id.clone(),
                });
                if let Err(e) = worker.call(&context_of(session), &close).await {
                    tracing::warn!(session = %session.id, "closing the session's processes failed: {}", e.message());
                }
            }
        }
        session.processes.clear();
        self.pool.release(&session.current_policy()).await;
        if let Some(policy) = session.escalated_policy.get() {
            self.pool.release(policy).await;
        }
        for policy in &held {
            self.pool.release(policy).await;
        }
    }

    /// The worker a call runs in: the session's own, or — for an escalated call — a
    /// danger-full-access worker for the same caller.
    pub async fn worker_for(
        &self,
        session: &Session,
        escalated: bool,
    ) -> Result<Arc<Worker>, CallError> {
        if escalated {
            return Ok(self.escalated_worker(session).await?.0);
        }
        let policy = session.current_policy();
        // Replacing a worker that died (say, killed by its memory limit on purpose, in a loop)
        // is a start like any other (H23).
        if self.pool.existing(&policy).await.is_none() {
            self.wait_for_start_turn(&session.sandbox).await?;
        }
        self.pool.get(&policy).await
    }

    /// The danger-full-access worker a session's escalated calls run in, for the same caller,
    /// and its policy. The first escalated call makes the session a user of that worker
    /// (released with the session); later ones reuse it.
    async fn escalated_worker(
        &self,
        session: &Session,
    ) -> Result<(Arc<Worker>, SandboxPolicy), CallError> {
        if let Some(policy) = session.escalated_policy.get() {
            // Replacing one that died is a start like any other (H23).
            if self.pool.existing(policy).await.is_none() {
                self.wait_for_start_turn(&session.sandbox).await?;
            }
            return Ok((self.pool.get(policy).await?, policy.clone()));
        }
        let mut unconfined = session.sandbox.clone();
        unconfined.mode = Mode::DangerFullAccess;
        unconfined.network_access = true;
        let policy = self.policy_for(&unconfined).await?;
        let worker = if session.escalated_policy.set(policy.clone()).is_ok() {
            self.pool.acquire(&policy).await?
        } else {
            // Another call of the session got there first, with an equal policy.
            self.pool.get(&policy).await?
        };
        Ok((worker, policy))
    }

    /// The session's worker reported its protection stale (`what` changed): resolve the policy
    /// again as the caller and move the session to a worker built for it. The roots stay
    /// pinned: if any of them is no longer the same directory, the call fails instead.
    pub async fn refresh(
        &self,
        session: &Session,
        seen: &SandboxPolicy,
        what: &str,
    ) -> Result<(), CallError> {
        let _one_at_a_time = session.refreshing.lock().await;
        let current = session.current_policy();
        if current != *seen {
            // Another call already moved the session.
            return Ok(());
        }
        // A stopped sandbox is not rebuilt for the session (H18): its commands stay refused.
        if let Some(path) = self.pool.stopped(&current).await {
            return Err(CallError::Unmet(crate::sandbox::watcher::stopped_message(
                &path,
            )));
        }
        let mut fresh = self.policy_for(&session.sandbox).await?;
        fresh.sandbox_generation = current.sandbox_generation;
        if fresh.writable_roots != current.writable_roots || fresh.root_ids != current.root_ids {
            return Err(CallError::Unmet(format!(
                "the session's writable roots are no longer the directories pinned when it \
                 opened ({what}; roots now {:?}); open a new session",
                fresh.writable_roots
            )));
        }
        if fresh == current {
            return Err(CallError::Unmet(format!(
                "protection of this session's workspace changed ({what}) and could not be \
                 re-established; open a new session"
            )));
        }
        tracing::info!(session = %session.id, change = what, "protection changed; moving the session to a new worker");
        self.pool.acquire(&fresh).await?;
        session.move_to(fresh);
        if session.processes.lives_in(&current) {
            // Processes the session started there keep running where they are; calls naming
            // them are routed there until the session closes.
            session.held_policies.locked().push(current);
        } else {
            self.pool.release(&current).await;
        }
        Ok(())
    }

    /// Runs one call in the session's worker (or, escalated, in a danger-full-access one); a
    /// call naming a kept process runs in the worker that has it. `slot` is the call's
    /// running-command slot: a process the call leaves running keeps it.
    pub async fn call(
        &self,
        session: &Session,
        call: Call,
        escalated: bool,
        slot: Option<Slot>,
    ) -> Result<Reply, CallError> {
        self.call_reporting_denial(session, call, None, escalated, slot)
            .await
            .map(|(reply, _)| reply)
    }

    /// [`Executor::call`], and whether a command the call ran looked denied by the sandbox
    /// (what the approval policies act on, spec/sandbox.md §5.2). `parsed`: a model call's
    /// arguments as the pipeline parsed them.
    pub async fn call_reporting_denial(
        &self,
        session: &Session,
        call: Call,
        parsed: Option<&crate::calls::facts::ToolCall>,
        escalated: bool,
        slot: Option<Slot>,
    ) -> Result<(Reply, bool), CallError> {
        if crate::calls::facts::is_process_list(&call) {
            return self
                .list_processes(session, call)
                .await
                .map(|reply| (reply, false));
        }
        let home = crate::calls::facts::named_process(&call, parsed)
            .and_then(|id| session.processes.home_of(id));
        let mut context = context_of(session);
        if crate::calls::facts::starts_process(&call) {
            context.new_process_id = session.processes.draw_id();
        }
        let (context, call, home) = (&context, &call, &home);
        let (tracked, home) = self
            .with_fresh_protection(session, escalated, move |seen| async move {
                // A call naming a kept process runs where that process lives; any other in the
                // session's current worker (`seen`), or escalated in its danger-full-access one.
                let (worker, home) = match home {
                    Some(h) if h.escalated => (self.escalated_worker(session).await?.0, h.clone()),
                    Some(h) => (self.pool.get(&h.policy).await?, h.clone()),
                    None if escalated => {
                        let (worker, policy) = self.escalated_worker(session).await?;
                        (worker, Home { policy, escalated })
                    }
                    None => (
                        self.pool.get(&seen).await?,
                        Home {
                            policy: seen,
                            escalated: false,
                        },
                    ),
                };
                let tracked = tokio::select! {
                    tracked = worker.call_tracked(context, call) => tracked?,
                    // Dropping the call future cancels it in the worker.
                    _ = session.closed.cancelled() => return Err(CallError::session_closed()),
                };
                Ok(match tracked.reply {
                    Reply::Stale(what) => Fresh::Stale(what),
                    _ => Fresh::Ran((tracked, home)),
                })
            })
            .await?;
        let mut slot = slot;
        if tracked.kept.is_empty() && tracked.ended.is_empty() {
            // Nothing to record; a running-command slot ends with the call.
            drop(slot.take());
        } else {
            session
                .processes
                .record(&home, &tracked.kept, &tracked.ended, slot.take());
        }
        Ok((tracked.reply, tracked.sandbox_denied))
    }

    /// Runs `attempt` against the session's protection as it is now. A worker that finds its
    /// protection stale runs nothing and answers [`Fresh::Stale`]; the session then moves to a
    /// worker built for the workspace as it is now and `attempt` runs once more (not for an
    /// escalated call: nothing protects a danger-full-access worker). The one place a call is
    /// retried. `attempt` gets the policy it runs under.
    pub(in crate::daemon) async fn with_fresh_protection<T, F>(
        &self,
        session: &Session,
        escalated: bool,
        mut attempt: impl FnMut(SandboxPolicy) -> F,
    ) -> Result<T, CallError>
    where
        F: Future<Output = Result<Fresh<T>, CallError>>,
    {
        let seen = session.current_policy();
        let what = match attempt(seen.clone()).await? {
            Fresh::Ran(t) => return Ok(t),
            Fresh::Stale(what) => what,
        };
        if escalated {
            return Err(CallError::protection_unsettled(&what));
        }
        self.refresh(session, &seen, &what).await?;
        match attempt(session.current_policy()).await? {
            Fresh::Ran(t) => Ok(t),
            Fresh::Stale(what) => Err(CallError::protection_unsettled(&what)),
        }
    }

    /// Starts a streamed call (ShellStream, Download, Upload) in the session's worker and
    /// reads its first frame, which says whether it started: a failure to start is the call's
    /// error, not the first item of a stream that fails at once.
    pub(in crate::daemon) async fn start_streamed(
        &self,
        session: &Session,
        call: &Call,
        escalated: bool,
    ) -> Result<Streamed, CallError> {
        self.with_fresh_protection(session, escalated, move |_| async move {
            let worker = self.worker_for(session, escalated).await?;
            let (mut handle, mut replies) = worker.start(&context_of(session), call, true).await?;
            let first = tokio::select! {
                first = replies.recv() => first,
                _ = session.closed.cancelled() => return Err(CallError::session_closed()),
            };
            let Some(first) = first else {
                handle.done();
                return Err(CallError::WorkerDied);
            };
            match first.result {
                Some(Reply::Stale(what)) => {
                    handle.done();
                    Ok(Fresh::Stale(what))
                }
                Some(Reply::Failure(f)) if first.last => {
                    handle.done();
                    Err(CallError::from(f))
                }
                _ => Ok(Fresh::Ran(Streamed {
                    worker,
                    handle,
                    replies,
                    first,
                })),
            }
        })
        .await
    }

    /// ListProcesses: the session's processes from every worker that has some, and from its
    /// current one, by id.
    async fn list_processes(&self, session: &Session, call: Call) -> Result<Reply, CallError> {
        let mut workers: Vec<Arc<Worker>> = vec![self.worker_for(session, false).await?];
        for home in session.processes.homes() {
            let worker = if home.escalated {
                self.worker_for(session, true).await?
            } else {
                self.pool.get(&home.policy).await?
            };
            if !workers.iter().any(|w| Arc::ptr_eq(w, &worker)) {
                workers.push(worker);
            }
        }
        let mut all: Vec<crate::api::ProcessInfo> = Vec::new();
        for worker in workers {
            match worker.call(&context_of(session), &call).await? {
                Reply::Process(crate::wire::ProcessReply {
                    op: Some(crate::wire::process_reply::Op::List(list)),
                }) => all.extend(list.processes),
                other => return Ok(other),
            }
        }
        for p in &mut all {
            p.escalated = session.processes.is_escalated(p.process_id);
        }
        all.sort_by_key(|p| p.process_id);
        Ok(Reply::Process(crate::wire::ProcessReply {
            op: Some(crate::wire::process_reply::Op::List(
                crate::api::ListProcessesResponse { processes: all },
            )),
        }))
    }
}

/// What one attempt of a call came to: it ran, or its worker found its protection stale and
/// ran nothing.
pub(in crate::daemon) enum Fresh<T> {
    Ran(T),
    Stale(String),
}

/// A streamed call that started in its worker: the worker (an upload sends it pieces), the
/// call's handle, its replies, and the first one, already read.
pub(in crate::daemon) struct Streamed {
    pub(in crate::daemon) worker: Arc<Worker>,
    pub(in crate::daemon) handle: CallHandle,
    pub(in crate::daemon) replies: mpsc::UnboundedReceiver<WorkerReply>,
    pub(in crate::daemon) first: WorkerReply,
}

/// The per-call session facts sent with each call.
pub fn context_of(session: &Session) -> CallContext {
    CallContext {
        cwd: session.cwd().to_string_lossy().into_owned(),
        env: session
            .sandbox
            .env
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        timeout_ceiling_ms: session.timeout_ceiling_ms(),
        session_id: session.id.clone(),
        new_process_id: 0,
        background_terminal_max_timeout_ms: session.background_terminal_max_timeout_ms,
    }
}
