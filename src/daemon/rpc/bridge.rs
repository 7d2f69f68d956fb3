//! The Bridge service's gRPC face: ListTools, Invoke, prompt context, approvals' decisions and
//! command classification.

use crate::api::{self, bridge_server::Bridge};
use crate::calls::{self, ToolFormat};
use crate::daemon::error::CallError;
use crate::daemon::pipeline::admit::{CorralService, Refusal};
use crate::daemon::rpc::status::invalid_field;
use crate::daemon::session::sessions::{self};
use crate::wire::{worker_reply::Result as Reply, worker_request::Call};
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
            other => Err(CallError::unexpected_reply(other).into()),
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
        let session = self
            .sessions
            .get(&req.session_id)
            .filter(|s| s.owner_uid() == caller.uid);
        let session_budget = session.as_ref().map_or(
            crate::tools::prompt_context::DEFAULT_PROJECT_DOC_MAX_BYTES,
            |s| s.project_doc_max_bytes,
        );
        // A proxied session's rules in force are Codex's `<network>` block.
        let network = session
            .as_ref()
            .and_then(|s| s.egress.as_ref())
            .map(|e| e.written());
        let budget = sessions::project_doc_budget(
            "project_doc_max_bytes",
            req.project_doc_max_bytes,
            session_budget,
        )
        .map_err(CallError::from)?;
        // The date and zone are the host's (the daemon's), like Codex's local clock; the docs
        // are read by the session's worker, as the caller.
        let (current_date, timezone) = crate::tools::prompt_context::host_time_context();
        let call = Call::PromptContext(crate::wire::PromptContextCall {
            current_date,
            timezone,
            project_doc_max_bytes: budget,
            network,
        });
        match self
            .run(caller, &req.session_id, call, false, Refusal::Error)
            .await?
        {
            Reply::PromptContext(r) => Ok(Response::new(r)),
            other => Err(CallError::unexpected_reply(other).into()),
        }
    }

    async fn decide_approval(
        &self,
        request: Request<api::DecideApprovalRequest>,
    ) -> Result<Response<api::DecideApprovalResponse>, Status> {
        let caller = self.auth.caller_of(&request)?;
        Ok(Response::new(
            self.decide(caller, request.into_inner()).await?,
        ))
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
