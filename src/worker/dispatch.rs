//! Executes one call: proto request → tool arguments → tool → proto response. The only place
//! where proto messages and tool types meet (DESIGN.md §4).

use crate::api;
use crate::bridge;
use crate::tools::{ErrorKind, ToolContext, ToolError, list_dir, read_file};
use crate::wire::{ToolFailure, worker_reply::Result as Reply, worker_request::Call};

/// The gRPC code a tool failure is answered with (spec/tools.md §0.5).
pub fn code_of(kind: ErrorKind) -> tonic::Code {
    match kind {
        ErrorKind::InvalidArgument => tonic::Code::InvalidArgument,
        ErrorKind::NotFound => tonic::Code::NotFound,
        ErrorKind::PermissionDenied => tonic::Code::PermissionDenied,
        ErrorKind::DeadlineExceeded => tonic::Code::DeadlineExceeded,
        ErrorKind::Internal => tonic::Code::Internal,
    }
}

fn failure(err: ToolError) -> ToolFailure {
    ToolFailure {
        code: code_of(err.kind) as i32,
        message: err.message,
    }
}

/// Runs one call to completion.
pub fn execute(ctx: &ToolContext, call: Call) -> Reply {
    let result = match call {
        Call::ReadFile(req) => read_file_call(ctx, req).map(Reply::ReadFile),
        Call::ListDir(req) => list_dir_call(ctx, req).map(Reply::ListDir),
        Call::Invoke(req) => {
            let out = bridge::invoke(ctx, &req.name, &req.arguments, req.freeform);
            Ok(Reply::Invoke(api::InvokeResponse {
                call_id: req.call_id,
                output: out.output,
                success: out.success,
            }))
        }
        Call::Cancel(_) => Err(ToolError::invalid("cancel is not a call")),
    };
    result.unwrap_or_else(|e| Reply::Failure(failure(e)))
}

/// A u64 from the wire as a usize (saturating on 32-bit hosts, where nothing that large fits).
fn size(v: Option<u64>) -> Option<usize> {
    v.map(|n| usize::try_from(n).unwrap_or(usize::MAX))
}

fn read_file_call(
    ctx: &ToolContext,
    req: api::ReadFileRequest,
) -> Result<api::ReadFileResponse, ToolError> {
    let mode = match api::ReadMode::try_from(req.mode).unwrap_or(api::ReadMode::Unspecified) {
        api::ReadMode::Unspecified => None,
        api::ReadMode::Slice => Some(read_file::ReadMode::Slice),
        api::ReadMode::Indentation => Some(read_file::ReadMode::Indentation),
    };
    let indentation = req.indentation.map(|i| read_file::IndentationArgs {
        anchor_line: size(i.anchor_line),
        max_levels: size(i.max_levels),
        include_siblings: i.include_siblings,
        include_header: i.include_header,
        max_lines: size(i.max_lines),
    });
    let args = read_file::ReadFileArgs {
        file_path: req.file_path,
        offset: size(req.offset),
        limit: size(req.limit),
        mode,
        indentation,
    };
    let out = read_file::read_file(&ctx.cwd, &args)?;
    Ok(api::ReadFileResponse {
        path: out.path.to_string_lossy().into_owned(),
        text: out.model_text(),
        lines: out
            .lines
            .into_iter()
            .map(|l| api::NumberedLine {
                number: l.number as u64,
                text: l.text,
            })
            .collect(),
    })
}

fn list_dir_call(
    ctx: &ToolContext,
    req: api::ListDirRequest,
) -> Result<api::ListDirResponse, ToolError> {
    let args = list_dir::ListDirArgs {
        dir_path: req.dir_path,
        offset: size(req.offset),
        limit: size(req.limit),
        depth: size(req.depth),
    };
    let out = list_dir::list_dir(&ctx.cwd, &args)?;
    Ok(api::ListDirResponse {
        absolute_path: out.absolute_path.to_string_lossy().into_owned(),
        text: out.model_text(),
        more_entries: out.more_entries,
        entries: out
            .entries
            .into_iter()
            .map(|e| api::DirEntry {
                relative_path: e.relative_path,
                name: e.name,
                depth: u32::try_from(e.depth).unwrap_or(u32::MAX),
                kind: match e.kind {
                    list_dir::EntryKind::File => api::EntryKind::File,
                    list_dir::EntryKind::Directory => api::EntryKind::Directory,
                    list_dir::EntryKind::Symlink => api::EntryKind::Symlink,
                    list_dir::EntryKind::Other => api::EntryKind::Other,
                } as i32,
            })
            .collect(),
    })
}
