//! The Bridge service's gRPC face: ListTools, Invoke, prompt context, approvals' decisions and
//! command classification.

use crate::api::{self, bridge_server::Bridge};
use crate::calls::{self, ToolFormat};
use crate::daemon::pipeline::admit::{CorralService, Refusal, Resume};
use crate::daemon::pipeline::approvals;
use crate::daemon::pipeline::audit::{ApprovalNote, Outcome};
use crate::daemon::rpc::status::{self, invalid_field};
use crate::daemon::session::sessions::{self};
use crate::wire::process_reply::Op as ProcessAnswer;
use crate::wire::{worker_reply::Result as Reply, worker_request::Call};
use prost::Message;
use std::time::{Duration, Instant};
use tonic::{Request, Response, Status};

#[tonic::async_trait]
impl Bridge for CorralService {
    async fn list_tools(
        &self,
        request: Request<api::ListToolsRequest>,
    ) -> Result<Response<api::ListToolsResponse>, Status> {
        let caller = self.auth.caller_of(&request)?;
        let req = request.into_inner();
        let set = if req.session_id.is_empty() {
            let mut set = calls::ToolSet::sessionless();
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
        let listed = calls::list_tools(&set, format, &req.exclude);
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
        let id = req.session_id.clone();
        // Whether it asks for escalation is read from its arguments, parsed once in the pipeline.
        match self
            .run(caller, &id, Call::Invoke(req), false, Refusal::ToModel)
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
