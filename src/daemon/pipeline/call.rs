//! Running an admitted call: on its worker (unary or streamed), held for an approval and run
//! when the user decides, or stopped with the refusal — always ending in one audit line.

use crate::api;
use crate::daemon::caller::identity::Caller;
use crate::daemon::error::CallError;
use crate::daemon::pipeline::admit::{CorralService, Refusal, Refused, Resume, Trace};
use crate::daemon::pipeline::approvals::{self, AfterDenial, Command, Kind};
use crate::daemon::pipeline::audit::{ApprovalNote, Outcome};
use crate::daemon::pipeline::stream_pump::{CallStream, Streamed, stream_call};
use crate::daemon::session::sessions::Session;
use crate::wire::process_call::Op as ProcessOp;
use crate::wire::process_reply::Op as ProcessAnswer;
use crate::wire::{worker_reply::Result as Reply, worker_request::Call};
use prost::Message;
use std::sync::Arc;
use std::time::{Duration, Instant};

impl CorralService {
    /// A call admit stopped: held for a decision, or refused.
    pub(in crate::daemon) fn stop(
        &self,
        trace: Trace,
        call: Call,
        asks_escalation: bool,
        refused: Refused,
    ) -> Result<Reply, CallError> {
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
    pub(in crate::daemon) fn ask(
        &self,
        mut trace: Trace,
        session: &Arc<Session>,
        call: Call,
        asks_escalation: bool,
        (kind, command): (Kind, Command),
        reason: &str,
        exit_code: Option<i32>,
    ) -> Result<Reply, CallError> {
        let fail = |trace: Trace, e: CallError| {
            self.finish(trace, &Outcome::failed(&e));
            Err(e)
        };
        let id = match approvals::new_id() {
            Ok(id) => id,
            Err(e) => {
                return fail(
                    trace,
                    CallError::Internal(format!("cannot draw a random approval id: {e}")),
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
                CallError::Internal("this call cannot wait for an approval".into()),
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
            return fail(trace, CallError::too_many_approvals(limit));
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
    pub(in crate::daemon) fn expire_later(
        &self,
        session: Arc<Session>,
        id: String,
        timeout: Duration,
    ) {
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
    ) -> Result<Reply, CallError> {
        self.run_gated(caller, session_id, call, asks_escalation, refusal, None)
            .await
    }

    /// [`CorralService::run`], for a new call or (`resume`) a parked one the user approved.
    /// After a sandbox denial the approval policy may hold the call again, for a retry
    /// without the sandbox.
    pub(in crate::daemon) async fn run_gated(
        &self,
        caller: Caller,
        session_id: &str,
        call: Call,
        asks_escalation: bool,
        refusal: Refusal,
        resume: Option<Resume>,
    ) -> Result<Reply, CallError> {
        let mut trace = self.trace(caller, session_id, &call);
        // A model call asks for escalation in its arguments (read from the one parse).
        let asks_escalation = asks_escalation
            || trace
                .parsed
                .as_ref()
                .is_some_and(|t| t.asks_for_escalation());
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
            .call_reporting_denial(
                &admitted.session,
                call,
                trace.parsed.as_deref(),
                escalated,
                admitted.slot,
            )
            .await;
        let (result, denied) = match result {
            Ok((Reply::Failure(f), _)) => (Err(CallError::from(f)), false),
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
    pub(in crate::daemon) async fn run_stream(
        &self,
        caller: Caller,
        req: api::ShellRequest,
    ) -> Result<ShellEvents, CallError> {
        let asks_escalation = req.with_escalated_permissions;
        let session_id = req.session_id.clone();
        let call = Call::Shell(req);
        let mut trace = self.trace(caller, &session_id, &call);
        let admitted = match self.admit(&mut trace, &call, asks_escalation, Refusal::Error, None) {
            Ok(a) => a,
            // Only Invoke answers a refusal to the model; a stream never gets here with a reply
            // other than an approval request.
            Err(refused) => {
                return match self.stop(trace, call, asks_escalation, refused)? {
                    Reply::Shell(api::ShellResponse {
                        approval: Some(request),
                        ..
                    }) => Ok(ShellEvents::Held(request)),
                    reply => Err(CallError::unexpected_reply(reply)),
                };
            }
        };
        // The worker checks its protection before running anything; a stale one moves the
        // session to a worker built for the workspace as it is now (once), like a unary call.
        let started = self
            .executor
            .start_streamed(&admitted.session, &call, admitted.escalated)
            .await;
        stream_call(self, trace, admitted, started).map(ShellEvents::Running)
    }
}

/// What a ShellStream call answers: the command's events, or (held for the user's decision)
/// the approval request, the stream's one event.
pub(in crate::daemon) enum ShellEvents {
    Running(CallStream<api::ShellStreamEvent>),
    Held(api::ApprovalRequest),
}

/// The encoded size of a reply (the audit's bytes out).
pub(in crate::daemon) fn reply_len(reply: &Reply) -> usize {
    match reply {
        Reply::Invoke(r) => r.encoded_len(),
        Reply::Shell(r) => r.encoded_len(),
        _ => 0,
    }
}

/// The answer of a call held for a decision: its own response type, carrying the request.
pub(in crate::daemon) fn approval_reply(
    call: &Call,
    request: api::ApprovalRequest,
) -> Option<Reply> {
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
    ) -> Result<(Self, Option<Outcome>), CallError> {
        let Some(Reply::ShellEvent(mut ev)) = reply else {
            return Err(CallError::unexpected_reply(reply));
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
