//! The Files service's gRPC face: ReadBytes, WriteBytes, Upload, Download, Stat,
//! ListDirectory, MakeDirectory, Remove and Copy. Each call takes the same pipeline as every
//! tool call (session, policy checks, one audit line with the path and the bytes moved,
//! metrics) to the session's worker, which does all the file work (DESIGN.md §1: the daemon
//! never touches user files); the streams' flow control is `pipeline/transfer.rs`.

use crate::api::{self, files_server::Files};
use crate::daemon::error::CallError;
use crate::daemon::pipeline::admit::{CorralService, Refusal};
use crate::daemon::pipeline::transfer::files_call;
use crate::daemon::rpc::status::Grpc;
use crate::wire::files_call::Op;
use crate::wire::files_reply::Op as Answer;
use crate::wire::{FilesReply, worker_reply::Result as Reply};
use std::pin::Pin;
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};

/// The answer of a unary Files call, or INTERNAL for another kind of reply.
fn answer<T>(reply: Reply, pick: impl FnOnce(Answer) -> Option<T>) -> Result<T, CallError> {
    match reply {
        Reply::Files(FilesReply { op: Some(op) }) => pick(op).ok_or_else(|| {
            CallError::Internal("the sandbox worker answered another files call".into())
        }),
        other => Err(CallError::unexpected_reply(other)),
    }
}

type DownloadItem = Result<api::DownloadResponse, Status>;

#[tonic::async_trait]
impl Files for CorralService {
    async fn read_bytes(
        &self,
        request: Request<api::ReadBytesRequest>,
    ) -> Result<Response<api::ReadBytesResponse>, Status> {
        self.unary_files(
            request,
            Op::ReadBytes,
            |r| r.session_id.clone(),
            |op| match op {
                Answer::ReadBytes(r) => Some(r),
                _ => None,
            },
        )
        .await
    }

    async fn write_bytes(
        &self,
        request: Request<api::WriteBytesRequest>,
    ) -> Result<Response<api::WriteBytesResponse>, Status> {
        self.unary_files(
            request,
            Op::WriteBytes,
            |r| r.session_id.clone(),
            |op| match op {
                Answer::WriteBytes(r) => Some(r),
                _ => None,
            },
        )
        .await
    }

    async fn upload(
        &self,
        request: Request<Streaming<api::UploadRequest>>,
    ) -> Result<Response<api::UploadResponse>, Status> {
        let caller = self.auth.caller_of(&request)?;
        let incoming = request
            .into_inner()
            .map(|m| m.map_err(|s| format!("{}: {}", s.code(), s.message())));
        // Its own task: if the client goes away, hyper drops this handler, and the upload must
        // still be cancelled in the worker and audited.
        let service = self.clone();
        let upload =
            tokio::spawn(async move { service.upload_call(caller, Box::pin(incoming)).await });
        match upload.await {
            Ok(result) => Ok(Response::new(result?)),
            Err(e) => Err(CallError::Internal(format!("the upload task failed: {e}")).into()),
        }
    }

    async fn stat(
        &self,
        request: Request<api::StatRequest>,
    ) -> Result<Response<api::StatResponse>, Status> {
        self.unary_files(
            request,
            Op::Stat,
            |r| r.session_id.clone(),
            |op| match op {
                Answer::Stat(r) => Some(r),
                _ => None,
            },
        )
        .await
    }

    async fn list_directory(
        &self,
        request: Request<api::ListDirectoryRequest>,
    ) -> Result<Response<api::ListDirectoryResponse>, Status> {
        self.unary_files(
            request,
            Op::ListDirectory,
            |r| r.session_id.clone(),
            |op| match op {
                Answer::ListDirectory(r) => Some(r),
                _ => None,
            },
        )
        .await
    }

    async fn make_directory(
        &self,
        request: Request<api::MakeDirectoryRequest>,
    ) -> Result<Response<api::MakeDirectoryResponse>, Status> {
        self.unary_files(
            request,
            Op::MakeDirectory,
            |r| r.session_id.clone(),
            |op| match op {
                Answer::MakeDirectory(r) => Some(r),
                _ => None,
            },
        )
        .await
    }

    async fn remove(
        &self,
        request: Request<api::RemoveRequest>,
    ) -> Result<Response<api::RemoveResponse>, Status> {
        self.unary_files(
            request,
            Op::Remove,
            |r| r.session_id.clone(),
            |op| match op {
                Answer::Remove(r) => Some(r),
                _ => None,
            },
        )
        .await
    }

    async fn copy(
        &self,
        request: Request<api::CopyRequest>,
    ) -> Result<Response<api::CopyResponse>, Status> {
        self.unary_files(
            request,
            Op::Copy,
            |r| r.session_id.clone(),
            |op| match op {
                Answer::Copy(r) => Some(r),
                _ => None,
            },
        )
        .await
    }

    type DownloadStream = Pin<Box<dyn tokio_stream::Stream<Item = DownloadItem> + Send>>;

    async fn download(
        &self,
        request: Request<api::DownloadRequest>,
    ) -> Result<Response<Self::DownloadStream>, Status> {
        let caller = self.auth.caller_of(&request)?;
        let stream = self.download_call(caller, request.into_inner()).await?;
        Ok(Response::new(Box::pin(Grpc(stream))))
    }
}

impl CorralService {
    /// A unary Files call (Stat, ListDirectory, MakeDirectory, Remove, Copy): the one pipeline
    /// (session, policy, audit, metrics) to the session's worker, and its answer.
    async fn unary_files<Req, Resp>(
        &self,
        request: Request<Req>,
        op: impl FnOnce(Req) -> Op,
        session_of: impl FnOnce(&Req) -> String,
        pick: impl FnOnce(Answer) -> Option<Resp>,
    ) -> Result<Response<Resp>, Status> {
        let caller = self.auth.caller_of(&request)?;
        let req = request.into_inner();
        let id = session_of(&req);
        let reply = self
            .run(caller, &id, files_call(op(req)), false, Refusal::Error)
            .await?;
        Ok(Response::new(answer(reply, pick)?))
    }
}
