//! Admission: the daemon's shared state (`CorralService`), a call's trace from arrival to its
//! audit line, and the checks every call passes before it reaches a worker — the caller's
//! session, escalation, the timeout ceiling, the owner's running-command slots and worker cap,
//! and the approval policy.

use crate::api::{self};
use crate::calls;
use crate::daemon::caller::identity::{Authenticator, Caller, RootCallers};
use crate::daemon::caller::rules::{PolicyConfig, Rule, names_of};
use crate::daemon::error::CallError;
use crate::daemon::pipeline::approvals::{self, Command, Gate, Kind, Policy};
use crate::daemon::pipeline::audit::{self, ApprovalNote, Audit, Finished, Outcome};
use crate::daemon::pipeline::call::reply_len;
use crate::daemon::pipeline::inflight::{CallGuard, InFlight};
use crate::daemon::pipeline::route::Executor;
use crate::daemon::session::sessions::{Session, SessionStore};
use crate::daemon::session::slots::Slot;
use crate::sync::RwLockExt;
use crate::wire::{worker_reply::Result as Reply, worker_request::Call};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
    pub host_layers: Arc<Result<Vec<api::Layer>, CallError>>,
    /// How long a ShellStream client may stop reading before its call is cancelled.
    pub stream_stall_timeout: Duration,
    /// What every proxied session's egress proxy shares (the operator's `[egress]`).
    pub egress: crate::daemon::egress::EgressSettings,
}

/// How a refused escalation is answered: the typed RPCs fail with PERMISSION_DENIED; a model's
/// call through Invoke gets Codex's refusal text as its output.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(in crate::daemon) enum Refusal {
    Error,
    ToModel,
}

/// A call the pipeline refused before it reached a worker.
pub(in crate::daemon) enum Refused {
    Failed(CallError),
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
pub(in crate::daemon) struct Resume {
    pub(in crate::daemon) kind: Kind,
    pub(in crate::daemon) note: ApprovalNote,
}

/// A model's call refused with a text for the model (`success: false`).
pub(in crate::daemon) fn answered(r: &api::InvokeRequest, output: String) -> Refused {
    Refused::Answered(Box::new(Reply::Invoke(api::InvokeResponse {
        call_id: r.call_id.clone(),
        output,
        success: false,
        ..Default::default()
    })))
}

/// A call on its way through the pipeline: what its audit line and metrics need at the end.
pub(in crate::daemon) struct Trace {
    pub(in crate::daemon) caller: Caller,
    pub(in crate::daemon) session_id: String,
    pub(in crate::daemon) tool: String,
    /// A model call's arguments, parsed once for every fact the pipeline needs.
    pub(in crate::daemon) parsed: Option<Arc<calls::facts::ToolCall>>,
    /// A copy of the call for the audit line (only when the audit log is on).
    pub(in crate::daemon) described: Option<Call>,
    pub(in crate::daemon) bytes_in: usize,
    pub(in crate::daemon) started: Instant,
    pub(in crate::daemon) mode: String,
    /// The session's working directory, once the call reached its session.
    pub(in crate::daemon) cwd: String,
    pub(in crate::daemon) escalated: bool,
    /// The approval this call asked for, or was approved by.
    pub(in crate::daemon) approval: Option<ApprovalNote>,
    pub(in crate::daemon) _in_flight: CallGuard,
}

impl Trace {
    /// The session the call reached: its mode and cwd go on the audit line.
    pub(in crate::daemon) fn place(&mut self, session: &Session) {
        self.mode = session.mode().as_str().to_string();
        self.cwd = session.cwd().to_string_lossy().into_owned();
    }
}

/// What the policy checks granted: the session, whether the call runs escalated, and the
/// running-command slot it holds until it ends (or, if it leaves a process running, until
/// that process is gone).
pub(in crate::daemon) struct Admitted {
    pub(in crate::daemon) session: Arc<Session>,
    pub(in crate::daemon) escalated: bool,
    pub(in crate::daemon) slot: Option<Slot>,
    /// The command, when the session's approval policy governs the call.
    pub(in crate::daemon) command: Option<Command>,
}

impl CorralService {
    /// The caller's live session `id`. Another identity's session is NOT_FOUND, exactly like an
    /// unknown one: nothing hints that it exists.
    pub(in crate::daemon) fn session(
        &self,
        id: &str,
        caller: Caller,
    ) -> Result<Arc<Session>, CallError> {
        if id.is_empty() {
            return Err(CallError::invalid_field(
                "session_id",
                "session_id is required",
            ));
        }
        let session = self
            .sessions
            .get(id)
            .filter(|s| s.owner_uid() == caller.uid)
            .ok_or_else(|| CallError::session_not_found(id))?;
        // Knowing a danger-full-access session's id must not give a caller what it could not
        // open (H19).
        if session.mode() == crate::sandbox::policy::Mode::DangerFullAccess {
            crate::daemon::caller::peer::refuse_if_sandboxed(caller)?;
        }
        Ok(session)
    }

    pub(in crate::daemon) fn trace(&self, caller: Caller, session_id: &str, call: &Call) -> Trace {
        let parsed = match call {
            Call::Invoke(r) => Some(Arc::new(calls::facts::ToolCall::parse(r))),
            _ => None,
        };
        Trace {
            _in_flight: self.in_flight.enter(),
            caller,
            session_id: session_id.to_string(),
            tool: calls::facts::describe(call, parsed.as_deref()).0,
            parsed,
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
            .map_err(Refused::Failed)?;
        trace.place(&session);
        // A process running outside the sandbox (an escalated exec_command or StartProcess) is
        // danger-full-access too: writing to it, reading, signalling it need what opening such
        // a session needs (H19).
        if let Some(id) = calls::facts::named_process(call, trace.parsed.as_deref())
            && session.processes.home_of(id).is_some_and(|h| h.escalated)
        {
            crate::daemon::caller::peer::refuse_if_sandboxed(trace.caller)
                .map_err(Refused::Failed)?;
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
            .then(|| {
                calls::facts::command_of(
                    call,
                    trace.parsed.as_deref(),
                    session.cwd(),
                    &approvals::shell_of(&session),
                )
            })
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
                let text = calls::facts::escalation_refused_text(call, policy_name);
                return Err(match (refusal, call) {
                    (Refusal::ToModel, Call::Invoke(r)) => answered(r, text),
                    _ => Refused::Failed(CallError::Denied(text)),
                });
            }
        };
        if let (Call::Shell(req), Some(rule)) = (call, session.rule()) {
            let ceiling = session.timeout_ceiling_ms();
            if let Some(t) = req.timeout_ms.filter(|t| *t > ceiling) {
                return Err(Refused::Failed(CallError::timeout_over_ceiling(
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
        let slot = if calls::facts::runs_a_command(call) {
            Some(self.running.start(&session).map_err(Refused::Failed)?)
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
                parsed: trace.parsed.as_deref(),
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
    ) -> Result<Reply, CallError> {
        match refused {
            Refused::Failed(e) => {
                self.finish(trace, &Outcome::failed(&e));
                Err(e)
            }
            Refused::Answered(reply) => {
                let len = reply_len(&reply);
                self.finish(trace, &Outcome::refused(len));
                Ok(*reply)
            }
            // Callers hold the call for a decision (`stop`); one that does not cannot answer.
            Refused::Ask { .. } => {
                let e = CallError::Internal(
                    "a call that needs approval reached no approval flow".into(),
                );
                self.finish(trace, &Outcome::failed(&e));
                Err(e)
            }
        }
    }
}

impl CorralService {
    /// A session that needs a new worker must stay within its owner's `max_workers`.
    pub(in crate::daemon) async fn check_worker_cap(
        &self,
        uid: u32,
        rule: Option<&Rule>,
        policy: &crate::sandbox::policy::SandboxPolicy,
    ) -> Result<(), CallError> {
        let Some(rule) = rule else { return Ok(()) };
        let (live, exists) = self.executor.pool().workers_of(uid, policy).await;
        if exists {
            return Ok(());
        }
        rule.check_workers(uid, live).map_err(CallError::exhausted)
    }

    /// The policy rule that applies to a caller.
    pub(in crate::daemon) fn rule_for(
        &self,
        caller: Caller,
        identity: Option<&crate::sandbox::policy::Identity>,
    ) -> Rule {
        let (user, groups) = names_of(caller.uid, identity);
        self.policy.read_locked().rule_for(user.as_deref(), &groups)
    }

    /// An escalated call runs only if the operator allows it and the caller's rule does; a
    /// confined root caller never escalates.
    pub(in crate::daemon) fn may_escalate(&self, caller: Caller) -> bool {
        self.allow_escalation
            && (caller.uid != 0 || self.root_callers == RootCallers::Trusted)
            && self.rule_for(caller, None).allow_escalation
            && crate::daemon::caller::peer::full_access_refusal(caller).is_none()
    }
}
