//! A user's decision on a held call (DecideApproval): checked (its approval, its decider),
//! audited whether or not it matched, and — approved — the call run through the pipeline
//! again, the decision on its audit line.

use crate::api;
use crate::daemon::caller::identity::Caller;
use crate::daemon::error::CallError;
use crate::daemon::pipeline::admit::{CorralService, Refusal, Resume};
use crate::daemon::pipeline::approvals;
use crate::daemon::pipeline::audit::{ApprovalNote, Outcome};
use crate::wire::process_reply::Op as ProcessAnswer;
use crate::wire::{worker_reply::Result as Reply, worker_request::Call};
use prost::Message;
use std::time::{Duration, Instant};

impl CorralService {
    pub(in crate::daemon) async fn decide(
        &self,
        caller: Caller,
        req: api::DecideApprovalRequest,
    ) -> Result<api::DecideApprovalResponse, CallError> {
        if req.approval_id.is_empty() {
            return Err(CallError::invalid_field(
                "approval_id",
                "approval_id is required: the ApprovalRequest's approval_id",
            ));
        }
        let Some(decision) = approvals::Decision::from_api(req.decision) else {
            return Err(CallError::invalid_field(
                "decision",
                "decision is required: APPROVAL_DECISION_APPROVED, \
                 APPROVAL_DECISION_APPROVED_FOR_SESSION or APPROVAL_DECISION_DENIED",
            ));
        };
        // Every refused decision is audited, an unknown session's too.
        let unmatched = |e: CallError| {
            self.audit.unmatched_decision(
                caller,
                caller.credential.and_then(|i| self.auth.name(i)),
                &req.session_id,
                &req.approval_id,
                decision.audit_name(),
                e.class(),
            );
            crate::daemon::metrics::call(
                "decide_approval",
                &Outcome::failed(&e).name,
                Duration::ZERO,
            );
            e
        };
        let session = self.session(&req.session_id, caller).map_err(unmatched)?;
        let refused = |why: approvals::Refusal| unmatched(why.error(&req.approval_id));
        session
            .approvals
            .check(&req.approval_id, Instant::now())
            .map_err(refused)?;
        // The user decides, never the model: a sandboxed process (a command the model runs)
        // that reaches the socket — or a credential that may have been read by one (H19) —
        // cannot decide anything.
        if crate::daemon::caller::peer::full_access_refusal(caller).is_some() {
            return Err(unmatched(CallError::Denied(
                "approval decisions must come from the user's client, not from a sandboxed \
                 process; nothing was decided"
                    .into(),
            )));
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
            _ => Refusal::Error,
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
                    Ok(api::DecideApprovalResponse {
                        result: Some(api::decide_approval_response::Result::Invoke(reply)),
                    })
                }
                _ => {
                    self.finish(trace, &Outcome::named("rejected", 0));
                    Err(CallError::Denied(approvals::REJECTED_BY_USER.into()))
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
            other => return Err(CallError::unexpected_reply(other)),
        };
        Ok(api::DecideApprovalResponse {
            result: Some(result),
        })
    }
}
