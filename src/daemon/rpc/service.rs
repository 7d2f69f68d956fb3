//! The gRPC services: Sessions, Tools, Bridge and Processes. Every tool call — typed, streamed or through
//! the bridge — takes one pipeline: resolve the session → policy checks (escalation, timeout
//! ceiling, running-command slot) → the worker → metrics and audit on every outcome, refusals
//! included. Status codes come from `status.rs`.

use crate::api::{
    self, bridge_server::Bridge, processes_server::Processes, sessions_server::Sessions,
    tools_server::Tools,
};
use crate::bridge::{self, ToolFormat};
use crate::daemon::caller::identity::{Authenticator, Caller, RootCallers, worker_identity};
use crate::daemon::caller::rules::{PolicyConfig, Rule, names_of};
use crate::daemon::pipeline::approvals::{self, AfterDenial, Command, Gate, Kind, Policy};
use crate::daemon::pipeline::audit::{self, ApprovalNote, Audit, Finished, Outcome};
use crate::daemon::pipeline::inflight::{CallGuard, InFlight};
use crate::daemon::pipeline::route::Executor;
use crate::daemon::pipeline::stream_pump::{Streamed, stream_call};
use crate::daemon::rpc::status::{self, invalid_field};
use crate::daemon::session::sessions::{self, Session, SessionStore, StoreError};
use crate::daemon::session::slots::Slot;
use crate::wire::process_call::Op as ProcessOp;
use crate::wire::process_reply::Op as ProcessAnswer;
use crate::wire::{WorkerReply, worker_reply::Result as Reply, worker_request::Call};
use prost::Message;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::{Request, Response, Status};

/// How long a streaming client may leave the command's output unread before the call is
/// cancelled (spec/sandbox.md H6); the config key `stream_stall_timeout` changes it.
pub const DEFAULT_STREAM_STALL_TIMEOUT: Duration = Duration::from_secs(30);

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
    pub running: crate::daemon::session::slots::RunningCommands,
    /// The operator policy; replaced on SIGHUP.
    pub policy: Arc<std::sync::RwLock<PolicyConfig>>,
    /// What the start-up probe learned: each layer's status, or why the sandbox is unavailable.
    pub host_layers: Arc<Result<Vec<api::Layer>, String>>,
    /// How long a ShellStream client may stop reading before its call is cancelled.
    pub stream_stall_timeout: Duration,
}

/// How a refused escalation is answered: the typed RPCs fail with PERMISSION_DENIED; a model's
/// call through Invoke gets Codex's refusal text as its output.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(in crate::daemon) enum Refusal {
    Status,
    ToModel,
}

/// A call the pipeline refused before it reached a worker.
pub(in crate::daemon) enum Refused {
    Status(Status),
    /// Answered to the model (Invoke): the call "succeeded" with the refusal as output.
    Answered(Box<Reply>),
    /// Not refused but held: the session's approval policy needs the user's decision first.
    Ask {
        session: Arc<Session>,
        kind: Kind,
        command: Command,
    },
}

/// A parked call being run after the user approved it (the decision is on its audit line).
struct Resume {
    kind: Kind,
    note: ApprovalNote,
}

/// A model's call refused with a text for the model (`success: false`).
fn answered(r: &api::InvokeRequest, output: String) -> Refused {
    Refused::Answered(Box::new(Reply::Invoke(api::InvokeResponse {
        call_id: r.call_id.clone(),
        output,
        success: false,
        ..Default::default()
    })))
}

/// A call on its way through the pipeline: what its audit line and metrics need at the end.
pub(in crate::daemon) struct Trace {
    caller: Caller,
    pub(in crate::daemon) session_id: String,
    tool: String,
    /// A copy of the call for the audit line (only when the audit log is on).
    described: Option<Call>,
    pub(in crate::daemon) bytes_in: usize,
    started: Instant,
    mode: String,
    /// The session's working directory, once the call reached its session.
    cwd: String,
    escalated: bool,
    /// The approval this call asked for, or was approved by.
    approval: Option<ApprovalNote>,
    _in_flight: CallGuard,
}

impl Trace {
    /// The session the call reached: its mode and cwd go on the audit line.
    pub(in crate::daemon) fn place(&mut self, session: &Session) {
        self.mode = session.mode.as_str().to_string();
        self.cwd = session.cwd.to_string_lossy().into_owned();
    }
}

/// What the policy checks granted: the session, whether the call runs escalated, and the
/// running-command slot it holds until it ends (or, if it leaves a process running, until
/// that process is gone).
pub(in crate::daemon) struct Admitted {
    pub(in crate::daemon) session: Arc<Session>,
    pub(in crate::daemon) escalated: bool,
    slot: Option<Slot>,
    /// The command, when the session's approval policy governs the call.
    command: Option<Command>,
}

impl CorralService {
    /// The caller's live session `id`. Another identity's session is NOT_FOUND, exactly like an
    /// unknown one: nothing hints that it exists.
    fn session(&self, id: &str, caller: Caller) -> Result<Arc<Session>, Status> {
        if id.is_empty() {
            return Err(invalid_field("session_id", "session_id is required"));
        }
        let session = self
            .sessions
            .get(id)
            .filter(|s| s.owner_uid == caller.uid)
            .ok_or_else(|| status::session_not_found(id))?;
        // Knowing a danger-full-access session's id must not give a caller what it could not
        // open (H19).
        if session.mode == crate::sandbox::policy::Mode::DangerFullAccess {
            crate::daemon::caller::peer::refuse_if_sandboxed(caller)?;
        }
        Ok(session)
    }

    pub(in crate::daemon) fn trace(&self, caller: Caller, session_id: &str, call: &Call) -> Trace {
        Trace {
            _in_flight: self.in_flight.enter(),
            caller,
            session_id: session_id.to_string(),
            tool: audit::describe(call).0,
            described: self.audit.enabled().then(|| call.clone()),
            bytes_in: audit::call_len(call),
            started: Instant::now(),
            mode: String::new(),
            cwd: String::new(),
            escalated: false,
            approval: None,
        }
    }

    /// The policy checks every call passes before it reaches a worker. The timeout ceiling has
    /// one rule: a typed Shell/ShellStream call that asks for more is refused here (naming the
    /// rule); a model's call (Invoke: shell, container.exec, shell_command) is clamped to the
    /// ceiling in the worker, which gets it with every call (`CallContext`), as does a typed
    /// call that names no timeout.
    ///
    /// The approval policy (spec/sandbox.md §5.2) is applied here too: a command call may be
    /// held for the user's decision (`Refused::Ask`), before it takes a running-command slot.
    /// `resume` is the question a parked call's approval answered.
    pub(in crate::daemon) fn admit(
        &self,
        trace: &mut Trace,
        call: &Call,
        asks_escalation: bool,
        refusal: Refusal,
        resume: Option<Kind>,
    ) -> Result<Admitted, Refused> {
        let session = self
            .session(&trace.session_id, trace.caller)
            .map_err(Refused::Status)?;
        trace.place(&session);
        // A process running outside the sandbox (an escalated exec_command or StartProcess) is
        // danger-full-access too: writing to it, reading, signalling it need what opening such
        // a session needs (H19).
        if let Some(id) = crate::daemon::pipeline::route::named_process(call)
            && session.processes.home_of(id).is_some_and(|h| h.escalated)
        {
            crate::daemon::caller::peer::refuse_if_sandboxed(trace.caller)
                .map_err(Refused::Status)?;
        }
        // A model's call of a tool outside the session's set is Codex's `unsupported call:
        // NAME`; nothing runs.
        if let Call::Invoke(r) = call
            && let Some(output) = session.tools.refusal(&r.name)
        {
            return Err(answered(r, output));
        }
        let policy = session.approvals.policy;
        // Only a governed call needs its command (and the shell lookup behind it).
        let command = (policy != Policy::Unset)
            .then(|| approvals::command_of(call, &session.cwd, &approvals::shell_of(&session)))
            .flatten();
        let may_escalate = |wanted: bool| wanted && self.may_escalate(trace.caller);
        let gate = match (resume, &command) {
            // Approved: the operator's leave is checked again (the policy may have changed
            // while the question waited).
            (Some(kind), _) if kind.unsandboxed() => match may_escalate(true) {
                true => Gate::Run { escalated: true },
                false => Gate::Refuse(Policy::Never.codex_name()),
            },
            (Some(_), _) => Gate::Run { escalated: false },
            (None, Some(c)) => approvals::before_run(
                policy,
                asks_escalation,
                may_escalate(asks_escalation),
                policy == Policy::Untrusted
                    && crate::tools::command_safety::is_known_safe_command(&c.argv),
                session.approvals.granted(c),
            ),
            // Not a command the policy governs: nothing to ask about.
            (None, None) => match approvals::before_run(
                policy,
                asks_escalation,
                may_escalate(asks_escalation),
                true,
                None,
            ) {
                Gate::Ask(_) => Gate::Run { escalated: false },
                gate => gate,
            },
        };
        let (escalated, ask) = match gate {
            Gate::Run { escalated } => (escalated, None),
            Gate::Ask(kind) => (false, Some(kind)),
            Gate::Refuse(policy_name) => {
                let text = match call {
                    Call::Invoke(r) if r.name == "exec_command" => {
                        crate::tools::unified_exec::errors::escalation_refused(policy_name).message
                    }
                    _ => crate::tools::shell::escalation_refused(policy_name).message,
                };
                return Err(match (refusal, call) {
                    (Refusal::ToModel, Call::Invoke(r)) => answered(r, text),
                    _ => Refused::Status(status::escalation_refused(text)),
                });
            }
        };
        if let (Call::Shell(req), Some(rule)) = (call, &session.rule) {
            let ceiling = session.timeout_ceiling_ms();
            if let Some(t) = req.timeout_ms.filter(|t| *t > ceiling) {
                return Err(Refused::Status(status::timeout_over_ceiling(
                    t, ceiling, &rule.name,
                )));
            }
        }
        if let (Some(kind), Some(command)) = (ask, command.clone()) {
            return Err(Refused::Ask {
                session,
                kind,
                command,
            });
        }
        let is_shell = matches!(call, Call::Shell(_))
            || matches!(call, Call::Invoke(r) if bridge::is_shell_tool(&r.name))
            || crate::daemon::pipeline::route::starts_process(call);
        let slot = if is_shell {
            Some(self.running.start(&session).map_err(Refused::Status)?)
        } else {
            None
        };
        if escalated {
            trace.mode = crate::sandbox::policy::Mode::DangerFullAccess
                .as_str()
                .to_string();
        }
        trace.escalated = escalated;
        Ok(Admitted {
            session,
            escalated,
            slot,
            command,
        })
    }

    /// The end of every call: metrics and the audit line.
    pub(in crate::daemon) fn finish(&self, trace: Trace, outcome: &Outcome) {
        let elapsed = trace.started.elapsed();
        crate::daemon::metrics::call(&trace.tool, &outcome.name, elapsed);
        if let Some(call) = &trace.described {
            self.audit.call(&Finished {
                caller: trace.caller,
                credential: trace.caller.credential.and_then(|i| self.auth.name(i)),
                session: &trace.session_id,
                mode: &trace.mode,
                cwd: &trace.cwd,
                call,
                escalated: trace.escalated,
                outcome,
                duration: elapsed,
                bytes_in: trace.bytes_in,
                approval: trace.approval.as_ref(),
            });
        }
    }

    /// A refusal ends the call here, audited and counted like any other outcome.
    pub(in crate::daemon) fn refuse(
        &self,
        trace: Trace,
        refused: Refused,
    ) -> Result<Reply, Status> {
        match refused {
            Refused::Status(s) => {
                self.finish(trace, &Outcome::code(s.code()));
                Err(s)
            }
            Refused::Answered(reply) => {
                let len = reply_len(&reply);
                self.finish(trace, &Outcome::refused(len));
                Ok(*reply)
            }
            // Callers hold the call for a decision (`stop`); one that does not cannot answer.
            Refused::Ask { .. } => {
                let s = Status::internal("a call that needs approval reached no approval flow");
                self.finish(trace, &Outcome::code(s.code()));
                Err(s)
            }
        }
    }

    /// A call admit stopped: held for a decision, or refused.
    fn stop(
        &self,
        trace: Trace,
        call: Call,
        asks_escalation: bool,
        refused: Refused,
    ) -> Result<Reply, Status> {
        match refused {
            Refused::Ask {
                session,
                kind,
                command,
            } => self.ask(
                trace,
                &session,
                call,
                asks_escalation,
                (kind, command),
                "",
                None,
            ),
            other => self.refuse(trace, other),
        }
    }

    /// Parks `call` for the user's decision and answers with the approval request; the call
    /// runs only through DecideApproval. `exit_code`: of the sandboxed run a retry would
    /// repeat.
    #[allow(clippy::too_many_arguments)]
    fn ask(
        &self,
        mut trace: Trace,
        session: &Arc<Session>,
        call: Call,
        asks_escalation: bool,
        (kind, command): (Kind, Command),
        reason: &str,
        exit_code: Option<i32>,
    ) -> Result<Reply, Status> {
        let fail = |trace: Trace, s: Status| {
            self.finish(trace, &Outcome::code(s.code()));
            Err(s)
        };
        let id = match approvals::new_id() {
            Ok(id) => id,
            Err(e) => {
                return fail(
                    trace,
                    Status::internal(format!("cannot draw a random approval id: {e}")),
                );
            }
        };
        let timeout = session.approvals.timeout;
        let request = api::ApprovalRequest {
            approval_id: id.clone(),
            command: command.argv.clone(),
            cwd: command.cwd.clone(),
            reason: reason.to_string(),
            justification: command.justification.clone(),
            kind: kind.api() as i32,
            expires_at_unix_ms: approvals::unix_ms_after(timeout),
            rejected_output: approvals::REJECTED_BY_USER.to_string(),
            call_id: match &call {
                Call::Invoke(r) => r.call_id.clone(),
                _ => String::new(),
            },
        };
        let Some(reply) = approval_reply(&call, request.clone()) else {
            return fail(
                trace,
                Status::internal("this call cannot wait for an approval"),
            );
        };
        let parked = approvals::Parked {
            call,
            kind,
            asks_escalation,
            command,
            request,
            caller: trace.caller,
            expires: Instant::now() + timeout,
        };
        if let Err(limit) = session.approvals.park(&id, parked) {
            return fail(trace, status::too_many_approvals(limit));
        }
        self.expire_later(session.clone(), id.clone(), timeout);
        trace.approval = Some(ApprovalNote {
            id,
            kind: kind.audit_name(),
            decision: None,
        });
        let mut outcome = Outcome::named("approval_requested", reply_len(&reply));
        outcome.exit_code = exit_code;
        self.finish(trace, &outcome);
        Ok(reply)
    }

    /// Expires approval `id` when its deadline passes or its session ends, if nobody decided
    /// it by then: one audit line says so.
    fn expire_later(&self, session: Arc<Session>, id: String, timeout: Duration) {
        let service = self.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(timeout) => {}
                _ = session.closed.cancelled() => {}
            }
            if let Some(parked) = session.approvals.expire(&id) {
                let mut trace = service.trace(parked.caller, &session.id, &parked.call);
                trace.place(&session);
                trace.approval = Some(ApprovalNote {
                    id,
                    kind: parked.kind.audit_name(),
                    decision: Some("expired"),
                });
                service.finish(trace, &Outcome::named("expired", 0));
            }
        });
    }

    /// The pipeline for a unary call (every typed RPC but ShellStream, and Invoke).
    pub(in crate::daemon) async fn run(
        &self,
        caller: Caller,
        session_id: &str,
        call: Call,
        asks_escalation: bool,
        refusal: Refusal,
    ) -> Result<Reply, Status> {
        self.run_gated(caller, session_id, call, asks_escalation, refusal, None)
            .await
    }

    /// [`CorralService::run`], for a new call or (`resume`) a parked one the user approved.
    /// After a sandbox denial the approval policy may hold the call again, for a retry
    /// without the sandbox.
    async fn run_gated(
        &self,
        caller: Caller,
        session_id: &str,
        call: Call,
        asks_escalation: bool,
        refusal: Refusal,
        resume: Option<Resume>,
    ) -> Result<Reply, Status> {
        let mut trace = self.trace(caller, session_id, &call);
        let kind = resume.as_ref().map(|r| r.kind);
        trace.approval = resume.map(|r| r.note);
        let admitted = match self.admit(&mut trace, &call, asks_escalation, refusal, kind) {
            Ok(a) => a,
            Err(refused) => return self.stop(trace, call, asks_escalation, refused),
        };
        let session = admitted.session.clone();
        let escalated = admitted.escalated;
        // Kept only when a denial could lead to a retry question.
        let retry = (!escalated && session.approvals.policy.retries_after_denial())
            .then(|| admitted.command.clone().map(|c| (call.clone(), c)))
            .flatten();
        let result = self
            .executor
            .call_reporting_denial(&admitted.session, call, escalated, admitted.slot)
            .await;
        let (result, denied) = match result {
            Ok((Reply::Failure(f), _)) => (Err(status::tool_failure(f)), false),
            Ok((Reply::Shell(mut r), _)) => {
                r.escalated = escalated;
                let denied = r.sandbox_denied;
                (Ok(Reply::Shell(r)), denied)
            }
            Ok((reply, denied)) => (Ok(reply), denied),
            Err(s) => (Err(s), false),
        };
        let mut outcome = Outcome::of(&result);
        if denied && outcome.name == "failed" {
            outcome.name = "denied".into();
        }
        if let (true, Some((call, command))) = (denied, retry) {
            let grant = session.approvals.granted(&command);
            match approvals::after_denial(
                session.approvals.policy,
                self.may_escalate(caller),
                grant,
            ) {
                AfterDenial::Stand => {}
                AfterDenial::Ask => {
                    crate::daemon::metrics::denial(&trace.tool);
                    return self.ask(
                        trace,
                        &session,
                        call,
                        asks_escalation,
                        (Kind::RetryUnsandboxed, command),
                        approvals::RETRY_REASON,
                        outcome.exit_code,
                    );
                }
                AfterDenial::Retry => {
                    // `approved_for_session` covers it: the denial is audited, then the retry.
                    self.finish(trace, &outcome);
                    let resume = Resume {
                        kind: Kind::RetryUnsandboxed,
                        note: ApprovalNote {
                            id: String::new(),
                            kind: Kind::RetryUnsandboxed.audit_name(),
                            decision: Some("approved_for_session"),
                        },
                    };
                    return Box::pin(self.run_gated(
                        caller,
                        session_id,
                        call,
                        asks_escalation,
                        refusal,
                        Some(resume),
                    ))
                    .await;
                }
            }
        }
        self.finish(trace, &outcome);
        result
    }

    /// The pipeline for a streamed shell call: the same checks, then the command's events
    /// flow to the client under credit-based flow control (see [`stream_call`]).
    ///
    /// A command that needs the user's decision before it runs gets a stream of one event, the
    /// approval request; DecideApproval then runs it as a unary Shell call.
    async fn run_stream(
        &self,
        caller: Caller,
        req: api::ShellRequest,
    ) -> Result<<CorralService as Tools>::ShellStreamStream, Status> {
        let asks_escalation = req.with_escalated_permissions;
        let session_id = req.session_id.clone();
        let call = Call::Shell(req);
        let mut trace = self.trace(caller, &session_id, &call);
        let admitted = match self.admit(&mut trace, &call, asks_escalation, Refusal::Status, None) {
            Ok(a) => a,
            // Only Invoke answers a refusal to the model; a stream never gets here with a reply
            // other than an approval request.
            Err(refused) => {
                return match self.stop(trace, call, asks_escalation, refused)? {
                    Reply::Shell(api::ShellResponse {
                        approval: Some(request),
                        ..
                    }) => Ok(Box::pin(tokio_stream::once(Ok(api::ShellStreamEvent {
                        event: Some(api::shell_stream_event::Event::Approval(request)),
                    })))),
                    reply => Err(status::unexpected_reply(reply)),
                };
            }
        };
        let started = async {
            // The worker checks its protection before running anything: a stale one answers
            // `Stale` as its first frame, and the session moves to a worker built for the
            // workspace as it is now (once), like a unary call (executor::call).
            for attempt in 0..2 {
                let seen = admitted.session.current_policy();
                let worker = self
                    .executor
                    .worker_for(&admitted.session, admitted.escalated)
                    .await?;
                let (mut handle, mut replies) = worker
                    .start(
                        &crate::daemon::pipeline::route::context_of(&admitted.session),
                        &call,
                        true,
                    )
                    .await?;
                let first = replies.recv().await;
                if let Some(WorkerReply {
                    result: Some(Reply::Stale(what)),
                    ..
                }) = &first
                {
                    handle.done();
                    match seen {
                        Some(seen) if attempt == 0 && !admitted.escalated => {
                            self.executor
                                .refresh(&admitted.session, &seen, what)
                                .await?;
                            continue;
                        }
                        _ => return Err(status::protection_unsettled(what)),
                    }
                }
                return Ok((handle, replies, first));
            }
            Err(status::protection_unsettled("no worker matched"))
        }
        .await;
        let stream = stream_call::<api::ShellStreamEvent>(self, trace, admitted, started)?;
        Ok(Box::pin(stream))
    }
}

/// The encoded size of a reply (the audit's bytes out).
fn reply_len(reply: &Reply) -> usize {
    match reply {
        Reply::Invoke(r) => r.encoded_len(),
        Reply::Shell(r) => r.encoded_len(),
        _ => 0,
    }
}

/// The answer of a call held for a decision: its own response type, carrying the request.
fn approval_reply(call: &Call, request: api::ApprovalRequest) -> Option<Reply> {
    match call {
        Call::Invoke(r) => Some(Reply::Invoke(api::InvokeResponse {
            call_id: r.call_id.clone(),
            approval: Some(request),
            ..Default::default()
        })),
        Call::Shell(_) => Some(Reply::Shell(api::ShellResponse {
            approval: Some(request),
            ..Default::default()
        })),
        Call::Process(crate::wire::ProcessCall {
            op: Some(ProcessOp::Start(_)),
        }) => Some(Reply::Process(crate::wire::ProcessReply {
            op: Some(ProcessAnswer::Start(api::StartProcessResponse {
                process_id: 0,
                approval: Some(request),
            })),
        })),
        _ => None,
    }
}

/// ShellStream's items: the worker's events, the end marked with the call's escalation.
impl Streamed for api::ShellStreamEvent {
    fn from_reply(
        reply: Option<Reply>,
        escalated: bool,
    ) -> Result<(Self, Option<Outcome>), Status> {
        let Some(Reply::ShellEvent(mut ev)) = reply else {
            return Err(status::unexpected_reply(reply));
        };
        let mut end = None;
        if let Some(api::shell_stream_event::Event::End(resp)) = &mut ev.event {
            resp.escalated = escalated;
            end = Some(Outcome::of(&Ok(Reply::Shell(resp.clone()))));
        }
        Ok((ev, end))
    }

    fn window_len(&self) -> u64 {
        match &self.event {
            Some(api::shell_stream_event::Event::Delta(d)) => d.data.len() as u64,
            _ => 0,
        }
    }

    fn audit_len(&self) -> usize {
        match &self.event {
            Some(api::shell_stream_event::Event::Delta(d)) => d.data.len(),
            Some(api::shell_stream_event::Event::End(resp)) => resp.encoded_len(),
            _ => 0,
        }
    }
}

#[tonic::async_trait]
impl Sessions for CorralService {
    async fn open_session(
        &self,
        request: Request<api::OpenSessionRequest>,
    ) -> Result<Response<api::OpenSessionResponse>, Status> {
        let caller = self.auth.caller_of(&request)?;
        crate::daemon::caller::peer::refuse_if_in_a_corral_sandbox(caller)?;
        let req = request.into_inner();
        let mut session =
            sessions::validate(&req).map_err(|e| invalid_field(&e.field, &e.message))?;
        session.id = sessions::new_session_id()
            .map_err(|e| Status::internal(format!("cannot draw a random session id: {e}")))?;
        let mode_given = req.mode != api::SandboxMode::Unspecified as i32;
        self.executor.resolve_profile(&mut session, mode_given)?;
        session.owner_uid = caller.uid;
        session.env = crate::daemon::session::environment::session_env(
            caller.uid,
            std::mem::take(&mut session.env),
        );
        session.identity = worker_identity(caller, self.root_callers)?;
        let rule = self.rule_for(caller, session.identity.as_ref());
        rule.check_mode(session.mode)
            .map_err(Status::permission_denied)?;
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
            crate::daemon::caller::peer::refuse_if_sandboxed(caller)?;
        }
        let policy = self.executor.policy_for(&session).await?;
        // H10: the operator's `roots_under` holds for the canonical form of every root the
        // session really gets, from every source (cwd, writable_roots, TMPDIR, /tmp).
        if let Some(rule) = &session.rule {
            for dir in std::iter::once(&policy.cwd).chain(&policy.writable_roots) {
                rule.check_root(dir).map_err(Status::permission_denied)?;
            }
        }
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
        self.check_worker_cap(caller.uid, session.rule.as_ref(), &policy)
            .await?;
        let mut policy = policy;
        self.executor.open(&mut policy).await?;
        session.policy = Some(policy.clone());
        let session = match self.sessions.insert(session) {
            Ok(s) => s,
            Err(StoreError::Full(n)) => {
                self.executor.pool().release(&policy).await;
                return Err(full(n));
            }
        };
        tracing::info!(session = %session.id, uid = caller.uid, pid = caller.pid, cwd = %session.cwd.display(), mode = session.mode.as_str(), "session opened");
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

    async fn list_sessions(
        &self,
        request: Request<api::ListSessionsRequest>,
    ) -> Result<Response<api::ListSessionsResponse>, Status> {
        let caller = self.auth.caller_of(&request)?;
        // A session id is a capability: a sandboxed caller that found a wider session's id
        // could use it. Such a caller sees none.
        if crate::daemon::caller::peer::is_sandboxed(caller.pid, caller.uid) {
            return Err(Status::permission_denied(
                "ListSessions is refused to a caller that runs inside a sandbox",
            ));
        }
        // A credential that may not have danger-full-access does not see such sessions.
        let full = crate::daemon::caller::peer::full_access_refusal(caller).is_none();
        let sessions = self
            .sessions
            .list_owned(caller.uid)
            .into_iter()
            .filter(|(s, _)| full || s.mode != crate::sandbox::policy::Mode::DangerFullAccess)
            .map(|(s, idle)| {
                let policy = s.current_policy();
                let paths = |v: &[std::path::PathBuf]| -> Vec<String> {
                    v.iter().map(|p| p.to_string_lossy().into_owned()).collect()
                };
                api::SessionInfo {
                    session_id: s.id.clone(),
                    cwd: policy.as_ref().map_or_else(
                        || s.cwd.to_string_lossy().into_owned(),
                        |p| p.cwd.to_string_lossy().into_owned(),
                    ),
                    mode: match s.mode {
                        crate::sandbox::policy::Mode::ReadOnly => api::SandboxMode::ReadOnly,
                        crate::sandbox::policy::Mode::WorkspaceWrite => {
                            api::SandboxMode::WorkspaceWrite
                        }
                        crate::sandbox::policy::Mode::DangerFullAccess => {
                            api::SandboxMode::DangerFullAccess
                        }
                    } as i32,
                    writable_roots: policy
                        .as_ref()
                        .map_or_else(Vec::new, |p| paths(&p.writable_roots)),
                    network_access: s.network_access,
                    profile: s.profile.clone(),
                    tools: s.tools.names().into_iter().map(String::from).collect(),
                    idle_seconds: idle.as_secs(),
                }
            })
            .collect();
        Ok(Response::new(api::ListSessionsResponse { sessions }))
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
            default_session_tools: bridge::ToolSet::default()
                .names()
                .into_iter()
                .map(String::from)
                .collect(),
            layers: match self.host_layers.as_ref() {
                Ok(layers) => layers.clone(),
                Err(e) => vec![api::Layer {
                    // The layer the §6 message names, when it has that shape.
                    name: e
                        .strip_prefix("sandbox unavailable: ")
                        .and_then(|rest| rest.split_once(" could not be applied"))
                        .map_or("sandbox", |(layer, _)| layer)
                        .into(),
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
        let id = req.session_id.clone();
        match self
            .run(caller, &id, Call::ReadFile(req), false, Refusal::Status)
            .await?
        {
            Reply::ReadFile(r) => Ok(Response::new(r)),
            other => Err(status::unexpected_reply(other)),
        }
    }

    async fn list_dir(
        &self,
        request: Request<api::ListDirRequest>,
    ) -> Result<Response<api::ListDirResponse>, Status> {
        let caller = self.auth.caller_of(&request)?;
        let req = request.into_inner();
        let id = req.session_id.clone();
        match self
            .run(caller, &id, Call::ListDir(req), false, Refusal::Status)
            .await?
        {
            Reply::ListDir(r) => Ok(Response::new(r)),
            other => Err(status::unexpected_reply(other)),
        }
    }

    async fn grep_files(
        &self,
        request: Request<api::GrepFilesRequest>,
    ) -> Result<Response<api::GrepFilesResponse>, Status> {
        let caller = self.auth.caller_of(&request)?;
        let req = request.into_inner();
        let id = req.session_id.clone();
        match self
            .run(caller, &id, Call::GrepFiles(req), false, Refusal::Status)
            .await?
        {
            Reply::GrepFiles(r) => Ok(Response::new(r)),
            other => Err(status::unexpected_reply(other)),
        }
    }

    async fn apply_patch(
        &self,
        request: Request<api::ApplyPatchRequest>,
    ) -> Result<Response<api::ApplyPatchResponse>, Status> {
        let caller = self.auth.caller_of(&request)?;
        let req = request.into_inner();
        let id = req.session_id.clone();
        match self
            .run(caller, &id, Call::ApplyPatch(req), false, Refusal::Status)
            .await?
        {
            Reply::ApplyPatch(r) => Ok(Response::new(r)),
            other => Err(status::unexpected_reply(other)),
        }
    }

    async fn shell(
        &self,
        request: Request<api::ShellRequest>,
    ) -> Result<Response<api::ShellResponse>, Status> {
        let caller = self.auth.caller_of(&request)?;
        let req = request.into_inner();
        let id = req.session_id.clone();
        let escalate = req.with_escalated_permissions;
        match self
            .run(caller, &id, Call::Shell(req), escalate, Refusal::Status)
            .await?
        {
            // The pipeline marks whether it ran escalated (a retry after a denial may).
            Reply::Shell(r) => Ok(Response::new(r)),
            other => Err(status::unexpected_reply(other)),
        }
    }

    type ShellStreamStream =
        Pin<Box<dyn tokio_stream::Stream<Item = Result<api::ShellStreamEvent, Status>> + Send>>;

    async fn shell_stream(
        &self,
        request: Request<api::ShellRequest>,
    ) -> Result<Response<Self::ShellStreamStream>, Status> {
        let caller = self.auth.caller_of(&request)?;
        let stream = self.run_stream(caller, request.into_inner()).await?;
        Ok(Response::new(stream))
    }
}

impl CorralService {
    /// A session that needs a new worker must stay within its owner's `max_workers`.
    async fn check_worker_cap(
        &self,
        uid: u32,
        rule: Option<&Rule>,
        policy: &crate::sandbox::policy::SandboxPolicy,
    ) -> Result<(), Status> {
        let Some(rule) = rule else { return Ok(()) };
        let (live, exists) = self.executor.pool().workers_of(uid, policy).await;
        if exists {
            return Ok(());
        }
        rule.check_workers(uid, live).map_err(status::exhausted)
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

    /// An escalated call runs only if the operator allows it and the caller's rule does; a
    /// confined root caller never escalates.
    fn may_escalate(&self, caller: Caller) -> bool {
        self.allow_escalation
            && (caller.uid != 0 || self.root_callers == RootCallers::Trusted)
            && self.rule_for(caller, None).allow_escalation
            && crate::daemon::caller::peer::full_access_refusal(caller).is_none()
    }
}

/// Whether a model's shell-tool call asks to run outside the sandbox (either spelling).
fn asks_for_escalation(name: &str, arguments: &str) -> bool {
    // An apply_patch typed into a shell tool is applied, not run, and never escalates (§5.6).
    if !bridge::is_shell_tool(name) || bridge::intercepts_apply_patch(name, arguments) {
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

#[tonic::async_trait]
impl Bridge for CorralService {
    async fn list_tools(
        &self,
        request: Request<api::ListToolsRequest>,
    ) -> Result<Response<api::ListToolsResponse>, Status> {
        let caller = self.auth.caller_of(&request)?;
        let req = request.into_inner();
        let set = if req.session_id.is_empty() {
            let mut set = bridge::ToolSet::sessionless();
            if req.shell_tool != api::ShellTool::Unspecified as i32 {
                set.shell = sessions::shell_tool(req.shell_tool)
                    .map_err(|e| invalid_field("shell_tool", &e))?;
            }
            set
        } else {
            self.session(&req.session_id, caller)?.tools
        };
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
        let listed = bridge::list_tools(&set, format, &req.exclude);
        Ok(Response::new(api::ListToolsResponse {
            tools_json: listed.json,
            names: listed.names.iter().map(|n| n.to_string()).collect(),
            parallel_safe: listed.parallel_safe.iter().map(|n| n.to_string()).collect(),
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
        let escalate = asks_for_escalation(&req.name, &req.arguments);
        let id = req.session_id.clone();
        match self
            .run(caller, &id, Call::Invoke(req), escalate, Refusal::ToModel)
            .await?
        {
            Reply::Invoke(r) => Ok(Response::new(r)),
            other => Err(status::unexpected_reply(other)),
        }
    }

    async fn get_prompt_context(
        &self,
        request: Request<api::GetPromptContextRequest>,
    ) -> Result<Response<api::GetPromptContextResponse>, Status> {
        let caller = self.auth.caller_of(&request)?;
        let req = request.into_inner();
        // The session's own budget unless the call overrides it; an unknown session is
        // answered NOT_FOUND by the pipeline below (audited like every call).
        let session_budget = self
            .sessions
            .get(&req.session_id)
            .filter(|s| s.owner_uid == caller.uid)
            .map_or(
                crate::tools::prompt_context::DEFAULT_PROJECT_DOC_MAX_BYTES,
                |s| s.project_doc_max_bytes,
            );
        let budget = sessions::project_doc_budget(
            "project_doc_max_bytes",
            req.project_doc_max_bytes,
            session_budget,
        )
        .map_err(|(field, message)| invalid_field(field, &message))?;
        // The date and zone are the host's (the daemon's), like Codex's local clock; the docs
        // are read by the session's worker, as the caller.
        let (current_date, timezone) = crate::tools::prompt_context::host_time_context();
        let call = Call::PromptContext(crate::wire::PromptContextCall {
            current_date,
            timezone,
            project_doc_max_bytes: budget,
        });
        match self
            .run(caller, &req.session_id, call, false, Refusal::Status)
            .await?
        {
            Reply::PromptContext(r) => Ok(Response::new(r)),
            other => Err(status::unexpected_reply(other)),
        }
    }

    async fn decide_approval(
        &self,
        request: Request<api::DecideApprovalRequest>,
    ) -> Result<Response<api::DecideApprovalResponse>, Status> {
        let caller = self.auth.caller_of(&request)?;
        let req = request.into_inner();
        if req.approval_id.is_empty() {
            return Err(invalid_field(
                "approval_id",
                "approval_id is required: the ApprovalRequest's approval_id",
            ));
        }
        let Some(decision) = approvals::Decision::from_api(req.decision) else {
            return Err(invalid_field(
                "decision",
                "decision is required: APPROVAL_DECISION_APPROVED, \
                 APPROVAL_DECISION_APPROVED_FOR_SESSION or APPROVAL_DECISION_DENIED",
            ));
        };
        // Every refused decision is audited, an unknown session's too.
        let unmatched = |s: Status| {
            self.audit.unmatched_decision(
                caller,
                caller.credential.and_then(|i| self.auth.name(i)),
                &req.session_id,
                &req.approval_id,
                decision.audit_name(),
                s.code(),
            );
            crate::daemon::metrics::call(
                "decide_approval",
                &Outcome::code(s.code()).name,
                Duration::ZERO,
            );
            s
        };
        let session = self.session(&req.session_id, caller).map_err(unmatched)?;
        let refused = |why| unmatched(status::decision_refused(&req.approval_id, &why));
        session
            .approvals
            .check(&req.approval_id, Instant::now())
            .map_err(refused)?;
        // The user decides, never the model: a sandboxed process (a command the model runs)
        // that reaches the socket — or a credential that may have been read by one (H19) —
        // cannot decide anything.
        if crate::daemon::caller::peer::full_access_refusal(caller).is_some() {
            return Err(unmatched(status::sandboxed_decider()));
        }
        let parked = session
            .approvals
            .take(&req.approval_id, decision, Instant::now())
            .map_err(refused)?;
        let note = ApprovalNote {
            id: req.approval_id.clone(),
            kind: parked.kind.audit_name(),
            decision: Some(decision.audit_name()),
        };
        // The decision's own audit line; an approved call then has its run's line too.
        let mut trace = self.trace(caller, &session.id, &parked.call);
        trace.place(&session);
        trace.approval = Some(note.clone());
        let refusal = match parked.call {
            Call::Invoke(_) => Refusal::ToModel,
            _ => Refusal::Status,
        };
        if decision == approvals::Decision::Denied {
            return match &parked.call {
                Call::Invoke(r) => {
                    let reply = api::InvokeResponse {
                        call_id: r.call_id.clone(),
                        output: approvals::REJECTED_BY_USER.to_string(),
                        success: false,
                        ..Default::default()
                    };
                    self.finish(trace, &Outcome::named("rejected", reply.encoded_len()));
                    Ok(Response::new(api::DecideApprovalResponse {
                        result: Some(api::decide_approval_response::Result::Invoke(reply)),
                    }))
                }
                _ => {
                    self.finish(trace, &Outcome::named("rejected", 0));
                    Err(status::rejected_by_user())
                }
            };
        }
        self.finish(trace, &Outcome::named(decision.audit_name(), 0));
        if decision == approvals::Decision::ApprovedForSession {
            let grant = if parked.kind.unsandboxed() {
                approvals::Grant::Unsandboxed
            } else {
                approvals::Grant::Sandboxed
            };
            session.approvals.grant(&parked.command, grant);
        }
        let resume = Resume {
            kind: parked.kind,
            note,
        };
        let reply = self
            .run_gated(
                caller,
                &session.id,
                parked.call,
                parked.asks_escalation,
                refusal,
                Some(resume),
            )
            .await?;
        use api::decide_approval_response::Result as Decided;
        let result = match reply {
            Reply::Invoke(r) => Decided::Invoke(r),
            Reply::Shell(r) => Decided::Shell(r),
            Reply::Process(crate::wire::ProcessReply {
                op: Some(ProcessAnswer::Start(r)),
            }) => Decided::StartProcess(r),
            other => return Err(status::unexpected_reply(other)),
        };
        Ok(Response::new(api::DecideApprovalResponse {
            result: Some(result),
        }))
    }

    async fn classify_command(
        &self,
        request: Request<api::ClassifyCommandRequest>,
    ) -> Result<Response<api::ClassifyCommandResponse>, Status> {
        self.auth.caller_of(&request)?;
        let req = request.into_inner();
        Ok(Response::new(api::ClassifyCommandResponse {
            known_safe: crate::tools::command_safety::is_known_safe_command(&req.command),
        }))
    }
}

impl CorralService {
    /// The pipeline for a typed process call; the answer's matching variant, or INTERNAL.
    async fn process<T>(
        &self,
        caller: Caller,
        session_id: &str,
        op: crate::wire::process_call::Op,
        asks_escalation: bool,
        answer: impl FnOnce(crate::wire::process_reply::Op) -> Option<T>,
    ) -> Result<Response<T>, Status> {
        let call = Call::Process(crate::wire::ProcessCall { op: Some(op) });
        match self
            .run(caller, session_id, call, asks_escalation, Refusal::Status)
            .await?
        {
            Reply::Process(crate::wire::ProcessReply { op: Some(op) }) => {
                answer(op).map(Response::new).ok_or_else(|| {
                    Status::internal("the sandbox worker answered another process call")
                })
            }
            other => Err(status::unexpected_reply(other)),
        }
    }
}

#[tonic::async_trait]
impl Processes for CorralService {
    async fn start_process(
        &self,
        request: Request<api::StartProcessRequest>,
    ) -> Result<Response<api::StartProcessResponse>, Status> {
        let caller = self.auth.caller_of(&request)?;
        let req = request.into_inner();
        let (id, escalate) = (req.session_id.clone(), req.with_escalated_permissions);
        self.process(
            caller,
            &id,
            ProcessOp::Start(req),
            escalate,
            |op| match op {
                ProcessAnswer::Start(r) => Some(r),
                _ => None,
            },
        )
        .await
    }

    async fn write_process(
        &self,
        request: Request<api::WriteProcessRequest>,
    ) -> Result<Response<api::WriteProcessResponse>, Status> {
        let caller = self.auth.caller_of(&request)?;
        let req = request.into_inner();
        let id = req.session_id.clone();
        self.process(caller, &id, ProcessOp::Write(req), false, |op| match op {
            ProcessAnswer::Write(r) => Some(r),
            _ => None,
        })
        .await
    }

    async fn read_process(
        &self,
        request: Request<api::ReadProcessRequest>,
    ) -> Result<Response<api::ReadProcessResponse>, Status> {
        let caller = self.auth.caller_of(&request)?;
        let req = request.into_inner();
        let id = req.session_id.clone();
        self.process(caller, &id, ProcessOp::Read(req), false, |op| match op {
            ProcessAnswer::Read(r) => Some(r),
            _ => None,
        })
        .await
    }

    async fn resize_process(
        &self,
        request: Request<api::ResizeProcessRequest>,
    ) -> Result<Response<api::ResizeProcessResponse>, Status> {
        let caller = self.auth.caller_of(&request)?;
        let req = request.into_inner();
        let id = req.session_id.clone();
        self.process(caller, &id, ProcessOp::Resize(req), false, |op| match op {
            ProcessAnswer::Resize(r) => Some(r),
            _ => None,
        })
        .await
    }

    async fn signal_process(
        &self,
        request: Request<api::SignalProcessRequest>,
    ) -> Result<Response<api::SignalProcessResponse>, Status> {
        let caller = self.auth.caller_of(&request)?;
        let req = request.into_inner();
        let id = req.session_id.clone();
        self.process(caller, &id, ProcessOp::Signal(req), false, |op| match op {
            ProcessAnswer::Signal(r) => Some(r),
            _ => None,
        })
        .await
    }

    async fn terminate_process(
        &self,
        request: Request<api::TerminateProcessRequest>,
    ) -> Result<Response<api::TerminateProcessResponse>, Status> {
        let caller = self.auth.caller_of(&request)?;
        let req = request.into_inner();
        let id = req.session_id.clone();
        self.process(
            caller,
            &id,
            ProcessOp::Terminate(req),
            false,
            |op| match op {
                ProcessAnswer::Terminate(r) => Some(r),
                _ => None,
            },
        )
        .await
    }

    async fn list_processes(
        &self,
        request: Request<api::ListProcessesRequest>,
    ) -> Result<Response<api::ListProcessesResponse>, Status> {
        let caller = self.auth.caller_of(&request)?;
        let req = request.into_inner();
        let id = req.session_id.clone();
        self.process(caller, &id, ProcessOp::List(req), false, |op| match op {
            ProcessAnswer::List(r) => Some(r),
            _ => None,
        })
        .await
    }
}
