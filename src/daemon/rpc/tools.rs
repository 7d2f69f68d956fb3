//! The Tools service's gRPC face: each typed call goes through the one pipeline.

use crate::api::{self, tools_server::Tools};
use crate::daemon::error::CallError;
use crate::daemon::pipeline::admit::{CorralService, Refusal};
use crate::daemon::pipeline::call::ShellEvents;
use crate::daemon::rpc::status::Grpc;
use crate::wire::{worker_reply::Result as Reply, worker_request::Call};
use std::pin::Pin;
use tonic::{Request, Response, Status};

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
            .run(caller, &id, Call::ReadFile(req), false, Refusal::Error)
            .await?
        {
            Reply::ReadFile(r) => Ok(Response::new(r)),
            other => Err(CallError::unexpected_reply(other).into()),
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
            .run(caller, &id, Call::ListDir(req), false, Refusal::Error)
            .await?
        {
            Reply::ListDir(r) => Ok(Response::new(r)),
            other => Err(CallError::unexpected_reply(other).into()),
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
            .run(caller, &id, Call::GrepFiles(req), false, Refusal::Error)
            .await?
        {
            Reply::GrepFiles(r) => Ok(Response::new(r)),
            other => Err(CallError::unexpected_reply(other).into()),
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
            .run(caller, &id, Call::ApplyPatch(req), false, Refusal::Error)
            .await?
        {
            Reply::ApplyPatch(r) => Ok(Response::new(r)),
            other => Err(CallError::unexpected_reply(other).into()),
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
            .run(caller, &id, Call::Shell(req), escalate, Refusal::Error)
            .await?
        {
            // The pipeline marks whether it ran escalated (a retry after a denial may).
            Reply::Shell(r) => Ok(Response::new(r)),
            other => Err(CallError::unexpected_reply(other).into()),
        }
    }

    type ShellStreamStream =
        Pin<Box<dyn tokio_stream::Stream<Item = Result<api::ShellStreamEvent, Status>> + Send>>;

    async fn shell_stream(
        &self,
        request: Request<api::ShellRequest>,
    ) -> Result<Response<Self::ShellStreamStream>, Status> {
        let caller = self.auth.caller_of(&request)?;
        Ok(Response::new(
            match self.run_stream(caller, request.into_inner()).await? {
                ShellEvents::Running(events) => Box::pin(Grpc(events)),
                ShellEvents::Held(request) => {
                    Box::pin(tokio_stream::once(Ok(api::ShellStreamEvent {
                        event: Some(api::shell_stream_event::Event::Approval(request)),
                    })))
                }
            },
        ))
    }
}
