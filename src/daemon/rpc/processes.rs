//! The Processes service's gRPC face: long-lived processes, each call through the one pipeline.

use crate::api::{self, processes_server::Processes};
use crate::daemon::caller::identity::Caller;
use crate::daemon::error::CallError;
use crate::daemon::pipeline::admit::{CorralService, Refusal};
use crate::wire::process_call::Op as ProcessOp;
use crate::wire::process_reply::Op as ProcessAnswer;
use crate::wire::{worker_reply::Result as Reply, worker_request::Call};
use tonic::{Request, Response, Status};

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
            .run(caller, session_id, call, asks_escalation, Refusal::Error)
            .await?
        {
            Reply::Process(crate::wire::ProcessReply { op: Some(op) }) => {
                answer(op).map(Response::new).ok_or_else(|| {
                    CallError::Internal("the sandbox worker answered another process call".into())
                        .into()
                })
            }
            other => Err(CallError::unexpected_reply(other).into()),
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
