//! The gRPC services: Sessions, Tools and Bridge. Each handler resolves the session, runs the
//! call through the executor, and maps failures to status codes.

use crate::api::{self, bridge_server::Bridge, sessions_server::Sessions, tools_server::Tools};
use crate::bridge::{self, ToolFormat};
use crate::daemon::audit::{self, Audit};
use crate::daemon::executor::Executor;
use crate::daemon::identity::{Authenticator, Caller, RootCallers, worker_identity};
use crate::daemon::inflight::InFlight;
use crate::daemon::policy::{PolicyConfig, Rule, names_of};
use crate::daemon::sessions::{self, Session, SessionStore, StoreError};
use crate::wire::{worker_reply::Result as Reply, worker_request::Call};
use std::sync::Arc;
use tonic::{Code, Request, Response, Status};
use tonic_types::{ErrorDetails, StatusExt};

/// Shared state of the three services.
#[derive(Clone)]
pub struct CorralService {
    pub sessions: SessionStore,
    pub executor: Executor,
    pub in_flight: InFlight,
    /// The operator allows escalated calls (danger-full-access on the model's request).
    pub allow_escalation: bool,
    /// How root callers are treated.
    pub root_callers: RootCallers,
    /// One JSON line per call.
    pub audit: Audit,
    /// Identifies callers (peer credentials; TLS certificates and tokens on TCP).
    pub auth: Authenticator,
    /// Shell commands running now, per user.
    pub running: crate::daemon::commands::RunningCommands,
    /// The operator policy; replaced on SIGHUP.
    pub policy: Arc<std::sync::RwLock<PolicyConfig>>,
    /// What the start-up probe learned: each layer's status, or why the sandbox is unavailable.
    pub host_layers: Arc<Result<Vec<api::Layer>, String>>,
}

impl CorralService {
    /// The caller's live session `id`. Another identity's session is NOT_FOUND, exactly like an
    /// unknown one: nothing hints that it exists.
    fn session(&self, id: &str, caller: Caller) -> Result<Arc<Session>, Status> {
        if id.is_empty() {
            return Err(invalid_field("session_id", "session_id is required"));
        }
        self.sessions
            .get(id)
            .filter(|s| s.owner_uid == caller.uid)
            .ok_or_else(|| {
                Status::not_found(format!(
                    "session `{id}` not found: it was never opened, was closed, or expired after \
                 being idle; open a new one with OpenSession"
                ))
            })
    }

    async fn run(&self, caller: Caller, session_id: &str, call: Call) -> Result<Reply, Status> {
        self.run_as(caller, session_id, call, false).await
    }

    async fn run_as(
        &self,
        caller: Caller,
        session_id: &str,
        call: Call,
        escalated: bool,
    ) -> Result<Reply, Status> {
        let _call = self.in_flight.enter();
        let session = self.session(session_id, caller)?;
        let started = std::time::Instant::now();
        let bytes_in = audit::call_len(&call);
        let described = self.audit_wanted().then(|| call.clone());
        let (tool, _) = audit::describe(&call);
        let is_shell = matches!(call, Call::Shell(_))
            || matches!(&call, Call::Invoke(r) if bridge::is_shell_tool(&r.name));
        let _slot = if is_shell {
            Some(self.running.start(&session)?)
        } else {
            None
        };
        let result = self.executor.call(&session, call, escalated).await;
        let result = match result {
            Ok(Reply::Failure(f)) => Err(Status::new(Code::from(f.code), f.message)),
            other => other,
        };
        crate::daemon::metrics::call(&tool, &audit::outcome(&result), started.elapsed());
        if let Some(call) = described {
            let mode = if escalated {
                "danger-full-access"
            } else {
                session.mode.as_str()
            };
            let credential = caller.credential.and_then(|i| self.auth.name(i));
            self.audit.call(
                caller,
                credential,
                session_id,
                mode,
                &call,
                escalated,
                &result,
                started.elapsed(),
                bytes_in,
            );
        }
        result
    }
}

/// INVALID_ARGUMENT with a google.rpc.BadRequest naming the field.
fn invalid_field(field: &str, message: &str) -> Status {
    Status::with_error_details(
        Code::InvalidArgument,
        message,
        ErrorDetails::with_bad_request_violation(field, message),
    )
}

/// Codex's refusal of an escalation request under the `never` approval policy (corral's
/// default; spec/tools.md §6.1).
fn escalation_refused() -> String {
    crate::tools::shell::escalation_refused("Never").message
}

/// Whether a model's shell-tool call asks to run outside the sandbox (either spelling).
fn asks_for_escalation(name: &str, arguments: &str) -> bool {
    if !bridge::is_shell_tool(name) {
        return false;
    }
    let Ok(serde_json::Value::Object(args)) = serde_json::from_str(arguments) else {
        return false;
    };
    args.get("sandbox_permissions").and_then(|v| v.as_str()) == Some("require_escalated")
        || args
            .get("with_escalated_permissions")
            .and_then(|v| v.as_bool())
            == Some(true)
}

fn unexpected(reply: Reply) -> Status {
    Status::internal(format!(
        "worker answered with an unexpected reply: {reply:?}"
    ))
}

#[tonic::async_trait]
impl Sessions for CorralService {
    async fn open_session(
        &self,
        request: Request<api::OpenSessionRequest>,
    ) -> Result<Response<api::OpenSessionResponse>, Status> {
        let caller = self.auth.caller_of(&request)?;
        let req = request.into_inner();
        let mut session =
            sessions::validate(&req).map_err(|e| invalid_field(&e.field, &e.message))?;
        session.id = sessions::new_session_id()
            .map_err(|e| Status::internal(format!("cannot draw a random session id: {e}")))?;
        let mode_given = req.mode != api::SandboxMode::Unspecified as i32;
        self.executor.resolve_profile(&mut session, mode_given)?;
        session.owner_uid = caller.uid;
        session.env =
            crate::daemon::environment::session_env(caller.uid, std::mem::take(&mut session.env));
        session.identity = worker_identity(caller, self.root_callers)?;
        let rule = self.rule_for(caller, session.identity.as_ref());
        rule.check_mode(session.mode)
            .map_err(Status::permission_denied)?;
        for dir in std::iter::once(&session.cwd).chain(&session.writable_roots) {
            rule.check_root(dir).map_err(Status::permission_denied)?;
        }
        if self.sessions.owned_by(caller.uid) >= rule.max_sessions {
            return Err(Status::resource_exhausted(format!(
                "uid {} already has {} open sessions, the most policy rule `{}` allows; close some",
                caller.uid, rule.max_sessions, rule.name
            )));
        }
        session.rule = Some(rule);
        if caller.uid == 0
            && self.root_callers == RootCallers::Confined
            && session.mode == crate::sandbox::policy::Mode::DangerFullAccess
        {
            return Err(Status::permission_denied(
                "root callers may use the sandboxed modes only (root_callers = confined); \
                 danger-full-access for root needs root_callers = trusted",
            ));
        }
        if session.mode == crate::sandbox::policy::Mode::DangerFullAccess {
            crate::daemon::peer::refuse_if_sandboxed(caller)?;
        }
        let policy = self.executor.policy_for(&session)?;
        let paths = |v: &[std::path::PathBuf]| -> Vec<String> {
            v.iter().map(|p| p.to_string_lossy().into_owned()).collect()
        };
        let writable_roots = paths(&policy.writable_roots);
        let skipped_writable_roots = paths(&policy.skipped_roots);
        let full = |n| {
            Status::resource_exhausted(format!(
                "too many open sessions ({n}); close sessions you no longer use"
            ))
        };
        if self.sessions.len() >= self.sessions.max_sessions() {
            return Err(full(self.sessions.max_sessions()));
        }
        self.executor.open(&policy).await?;
        session.policy = Some(policy.clone());
        let session = match self.sessions.insert(session) {
            Ok(s) => s,
            Err(StoreError::Full(n)) => {
                self.executor.pool().release(&policy).await;
                return Err(full(n));
            }
        };
        tracing::info!(session = %session.id, uid = caller.uid, pid = ?caller.pid, cwd = %session.cwd.display(), mode = session.mode.as_str(), "session opened");
        Ok(Response::new(api::OpenSessionResponse {
            session_id: session.id.clone(),
            skipped_writable_roots,
            writable_roots,
        }))
    }

    async fn close_session(
        &self,
        request: Request<api::CloseSessionRequest>,
    ) -> Result<Response<api::CloseSessionResponse>, Status> {
        let caller = self.auth.caller_of(&request)?;
        let id = request.into_inner().session_id;
        self.session(&id, caller)?;
        if let Some(session) = self.sessions.remove(&id) {
            self.executor.close(&session).await;
        }
        tracing::info!(session = %id, "session closed");
        Ok(Response::new(api::CloseSessionResponse {}))
    }

    async fn get_capabilities(
        &self,
        request: Request<api::GetCapabilitiesRequest>,
    ) -> Result<Response<api::GetCapabilitiesResponse>, Status> {
        self.auth.caller_of(&request)?;
        Ok(Response::new(api::GetCapabilitiesResponse {
            api_version: "corral.v1".into(),
            server_version: env!("CARGO_PKG_VERSION").into(),
            tools: bridge::tool_names().into_iter().map(String::from).collect(),
            layers: match self.host_layers.as_ref() {
                Ok(layers) => layers.clone(),
                Err(e) => vec![api::Layer {
                    name: "sandbox".into(),
                    status: api::LayerStatus::Unavailable as i32,
                    detail: e.clone(),
                }],
            },
            landlock_abi: crate::sandbox::landlock::kernel_abi().unwrap_or(0),
            session_idle_timeout_seconds: self.sessions.idle_timeout().as_secs(),
            profiles: self.executor.profiles().names().map(String::from).collect(),
            max_sessions: self.sessions.max_sessions() as u64,
        }))
    }
}

#[tonic::async_trait]
impl Tools for CorralService {
    async fn read_file(
        &self,
        request: Request<api::ReadFileRequest>,
    ) -> Result<Response<api::ReadFileResponse>, Status> {
        let caller = self.auth.caller_of(&request)?;
        let req = request.into_inner();
        match self
            .run(caller, &req.session_id.clone(), Call::ReadFile(req))
            .await?
        {
            Reply::ReadFile(r) => Ok(Response::new(r)),
            other => Err(unexpected(other)),
        }
    }

    async fn list_dir(
        &self,
        request: Request<api::ListDirRequest>,
    ) -> Result<Response<api::ListDirResponse>, Status> {
        let caller = self.auth.caller_of(&request)?;
        let req = request.into_inner();
        match self
            .run(caller, &req.session_id.clone(), Call::ListDir(req))
            .await?
        {
            Reply::ListDir(r) => Ok(Response::new(r)),
            other => Err(unexpected(other)),
        }
    }

    async fn grep_files(
        &self,
        request: Request<api::GrepFilesRequest>,
    ) -> Result<Response<api::GrepFilesResponse>, Status> {
        let caller = self.auth.caller_of(&request)?;
        let req = request.into_inner();
        match self
            .run(caller, &req.session_id.clone(), Call::GrepFiles(req))
            .await?
        {
            Reply::GrepFiles(r) => Ok(Response::new(r)),
            other => Err(unexpected(other)),
        }
    }

    async fn apply_patch(
        &self,
        request: Request<api::ApplyPatchRequest>,
    ) -> Result<Response<api::ApplyPatchResponse>, Status> {
        let caller = self.auth.caller_of(&request)?;
        let req = request.into_inner();
        match self
            .run(caller, &req.session_id.clone(), Call::ApplyPatch(req))
            .await?
        {
            Reply::ApplyPatch(r) => Ok(Response::new(r)),
            other => Err(unexpected(other)),
        }
    }

    async fn shell(
        &self,
        request: Request<api::ShellRequest>,
    ) -> Result<Response<api::ShellResponse>, Status> {
        let caller = self.auth.caller_of(&request)?;
        let req = request.into_inner();
        let escalated = self.check_escalation(caller, req.with_escalated_permissions)?;
        self.check_timeout(caller, &req)?;
        match self
            .run_as(caller, &req.session_id.clone(), Call::Shell(req), escalated)
            .await?
        {
            Reply::Shell(mut r) => {
                r.escalated = escalated;
                Ok(Response::new(r))
            }
            other => Err(unexpected(other)),
        }
    }

    type ShellStreamStream = std::pin::Pin<
        Box<dyn tokio_stream::Stream<Item = Result<api::ShellStreamEvent, Status>> + Send>,
    >;

    async fn shell_stream(
        &self,
        request: Request<api::ShellRequest>,
    ) -> Result<Response<Self::ShellStreamStream>, Status> {
        let caller = self.auth.caller_of(&request)?;
        let req = request.into_inner();
        let escalated = self.check_escalation(caller, req.with_escalated_permissions)?;
        let guard = self.in_flight.enter();
        let session = self.session(&req.session_id, caller)?;
        let slot = self.running.start(&session)?;
        let worker = self.executor.worker_for(&session, escalated).await?;
        let (mut handle, mut replies) = worker.start(
            crate::daemon::executor::context_of(&session),
            Call::Shell(req),
            true,
        )?;
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let closed = session.closed.clone();
        tokio::spawn(async move {
            let _guard = guard;
            let _slot = slot;
            loop {
                let next = tokio::select! {
                    frame = replies.recv() => frame,
                    // The session closed: stop the command (dropping `handle` cancels it).
                    _ = closed.cancelled() => {
                        let _ = tx.send(Err(Status::cancelled(
                            "the session was closed while the command was running",
                        ))).await;
                        return;
                    }
                    // The client went away: returning drops `handle`, which cancels the
                    // command and kills its process tree.
                    _ = tx.closed() => return,
                };
                let Some(frame) = next else {
                    let _ = tx
                        .send(Err(Status::unavailable(
                            "the sandbox worker exited while the command was running",
                        )))
                        .await;
                    handle.done();
                    return;
                };
                let item = match frame.result {
                    Some(Reply::ShellEvent(mut ev)) => {
                        if let Some(api::shell_stream_event::Event::End(end)) = &mut ev.event {
                            end.escalated = escalated;
                        }
                        Ok(ev)
                    }
                    Some(Reply::Failure(f)) => Err(Status::new(Code::from(f.code), f.message)),
                    other => Err(Status::internal(format!(
                        "unexpected worker frame: {other:?}"
                    ))),
                };
                let end = frame.last;
                if end {
                    handle.done();
                }
                // A client that went away drops the stream; dropping `handle` early then
                // cancels the command and kills its process tree.
                if tx.send(item).await.is_err() || end {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

impl CorralService {
    /// An escalated call runs only if the operator allows it (PERMISSION_DENIED otherwise);
    /// a confined root caller never escalates.
    fn check_escalation(&self, caller: Caller, requested: bool) -> Result<bool, Status> {
        match (requested, self.may_escalate(caller)) {
            (false, _) => Ok(false),
            (true, true) => Ok(true),
            (true, false) => Err(Status::permission_denied(escalation_refused())),
        }
    }

    /// A typed Shell call may not ask for more time than the caller's policy allows.
    fn check_timeout(&self, caller: Caller, req: &api::ShellRequest) -> Result<(), Status> {
        let session = self.session(&req.session_id, caller)?;
        let ceiling = session.timeout_ceiling_ms();
        match (req.timeout_ms, &session.rule) {
            (Some(t), Some(rule)) if t > ceiling => Err(Status::permission_denied(format!(
                "timeout_ms {t} exceeds the {ceiling} ms ceiling of policy rule `{}`",
                rule.name
            ))),
            _ => Ok(()),
        }
    }

    /// The policy rule that applies to a caller.
    fn rule_for(
        &self,
        caller: Caller,
        identity: Option<&crate::sandbox::policy::Identity>,
    ) -> Rule {
        let (user, groups) = names_of(caller.uid, identity);
        self.policy
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .rule_for(user.as_deref(), &groups)
    }

    fn audit_wanted(&self) -> bool {
        self.audit.enabled()
    }

    fn may_escalate(&self, caller: Caller) -> bool {
        self.allow_escalation
            && (caller.uid != 0 || self.root_callers == RootCallers::Trusted)
            && self.rule_for(caller, None).allow_escalation
            && !crate::daemon::peer::is_sandboxed(caller.pid, caller.uid)
    }
}

#[tonic::async_trait]
impl Bridge for CorralService {
    async fn list_tools(
        &self,
        request: Request<api::ListToolsRequest>,
    ) -> Result<Response<api::ListToolsResponse>, Status> {
        let caller = self.auth.caller_of(&request)?;
        let req = request.into_inner();
        if !req.session_id.is_empty() {
            self.session(&req.session_id, caller)?;
        }
        let format = match api::ToolFormat::try_from(req.format) {
            Ok(api::ToolFormat::Unspecified | api::ToolFormat::Responses) => ToolFormat::Responses,
            Ok(api::ToolFormat::ChatCompletions) => ToolFormat::ChatCompletions,
            Err(_) => {
                return Err(invalid_field(
                    "format",
                    &format!("format {} is not a known ToolFormat", req.format),
                ));
            }
        };
        Ok(Response::new(api::ListToolsResponse {
            tools_json: bridge::tool_definitions(format, &req.exclude),
        }))
    }

    async fn invoke(
        &self,
        request: Request<api::InvokeRequest>,
    ) -> Result<Response<api::InvokeResponse>, Status> {
        let caller = self.auth.caller_of(&request)?;
        let req = request.into_inner();
        if req.name.is_empty() {
            return Err(invalid_field(
                "name",
                "name is required: the tool the model called",
            ));
        }
        let escalated = asks_for_escalation(&req.name, &req.arguments);
        if escalated && !self.may_escalate(caller) {
            self.session(&req.session_id, caller)?;
            return Ok(Response::new(api::InvokeResponse {
                call_id: req.call_id,
                output: escalation_refused(),
                success: false,
            }));
        }
        match self
            .run_as(
                caller,
                &req.session_id.clone(),
                Call::Invoke(req),
                escalated,
            )
            .await?
        {
            Reply::Invoke(r) => Ok(Response::new(r)),
            other => Err(unexpected(other)),
        }
    }
}
