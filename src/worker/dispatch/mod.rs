//! Executes one call: proto request → tool arguments → tool → proto response. The only place
//! where proto messages and tool types meet (DESIGN.md §4).

use crate::api;
use crate::calls;
use crate::tools::{ErrorKind, ToolContext, ToolError};
use crate::wire::process_call::Op as ProcessOp;
use crate::wire::{FailureKind, ToolFailure, worker_reply::Result as Reply, worker_request::Call};
use crate::worker::commands::SandboxedRunner;
use std::time::Instant;

mod process;
mod typed_calls;
use process::{process_call, prompt_context_call};
use typed_calls::{apply_patch_call, grep_files_call, list_dir_call, read_file_call, shell_call};

/// A tool failure's class on the wire (spec/tools.md §0.5); the daemon picks its gRPC code.
fn kind_of(kind: ErrorKind) -> FailureKind {
    match kind {
        ErrorKind::InvalidArgument => FailureKind::InvalidArgument,
        ErrorKind::NotFound => FailureKind::NotFound,
        ErrorKind::PermissionDenied => FailureKind::PermissionDenied,
        ErrorKind::DeadlineExceeded => FailureKind::DeadlineExceeded,
        ErrorKind::ResourceExhausted => FailureKind::ResourceExhausted,
        ErrorKind::AlreadyExists => FailureKind::AlreadyExists,
        ErrorKind::FailedPrecondition => FailureKind::FailedPrecondition,
        ErrorKind::Aborted => FailureKind::Aborted,
        ErrorKind::Cancelled => FailureKind::Cancelled,
        ErrorKind::Internal => FailureKind::Internal,
    }
}

/// A typed call's error with the path it is about in front, as Unix tools print it
/// (`PATH: failed to read file: …`). Model text through Invoke stays Codex's, which names no
/// path; a person or program calling the typed RPC needs to know which file.
pub(super) fn naming(path: &std::path::Path, mut err: ToolError) -> ToolError {
    err.message = format!("{}: {}", path.display(), err.message);
    err
}

/// The worker's answer to a failed call. An INVALID_ARGUMENT names the request field it is
/// about (the daemon's google.rpc.BadRequest): the one the tool named, else `main`, the call's
/// main input.
fn failure(err: ToolError, main: &'static str) -> ToolFailure {
    let field = match err.kind {
        ErrorKind::InvalidArgument => err.field.unwrap_or(main).to_string(),
        _ => String::new(),
    };
    ToolFailure {
        kind: kind_of(err.kind) as i32,
        message: err.message,
        setup: None,
        field,
    }
}

/// The request field an INVALID_ARGUMENT is about when the tool did not name one: the call's
/// main input (what the model or client wrote), in the typed RPC's own field names.
fn main_field(call: &Call) -> &'static str {
    match call {
        Call::ReadFile(_) => "file_path",
        Call::ListDir(_) => "dir_path",
        Call::GrepFiles(_) => "pattern",
        Call::ApplyPatch(_) => "patch",
        Call::Shell(_) => "command",
        Call::Invoke(_) => "arguments",
        // A running process's calls go wrong about which process (no stdin, gone, not a tty).
        Call::Process(p) => match p.op {
            Some(ProcessOp::Start(_)) => "command",
            _ => "process_id",
        },
        Call::Files(_) => "path",
        _ => "request",
    }
}

/// Where a streaming call's intermediate frames go. The second argument is when the command's
/// timeout fires: an emitter that waits for flow-control credit gives up then, because the
/// command's timeout is enforced by the same loop that produces the output.
pub type Emit<'a> = dyn FnMut(Reply, Option<Instant>) + 'a;

/// Runs one call to completion. `emit` receives the intermediate frames of a streaming call
/// (`stream`); the returned reply is the final one. `pieces` is the call's inbox (an upload's
/// pieces arrive there after its call).
pub fn execute(
    ctx: &ToolContext,
    runner: &SandboxedRunner,
    call: Call,
    stream: bool,
    emit: &mut Emit<'_>,
    pieces: &mut crate::worker::files::Pieces<'_>,
) -> Reply {
    // Calls that can write re-check protection first (per call, not per worker; H1); write_stdin
    // must reach its process's worker even when a new one is due.
    if calls::facts::may_write(&call)
        && let Err(what) = runner.protection.check_current()
    {
        return Reply::Stale(what);
    }
    let main = main_field(&call);
    let result = match call {
        Call::ReadFile(req) => read_file_call(ctx, req).map(Reply::ReadFile),
        Call::ListDir(req) => list_dir_call(ctx, req).map(Reply::ListDir),
        Call::GrepFiles(req) => grep_files_call(ctx, req).map(Reply::GrepFiles),
        Call::ApplyPatch(req) => guarded_apply_patch(ctx, runner, req).map(Reply::ApplyPatch),
        Call::Shell(req) => shell_call(ctx, runner, req, stream, emit).map(|resp| {
            if stream {
                Reply::ShellEvent(api::ShellStreamEvent {
                    event: Some(api::shell_stream_event::Event::End(resp)),
                })
            } else {
                Reply::Shell(resp)
            }
        }),
        Call::Invoke(req) => guarded_invoke(ctx, runner, req),
        Call::CloseSession(req) => Ok(Reply::Closed(
            u32::try_from(crate::tools::unified_exec::close_session(&req.session_id))
                .unwrap_or(u32::MAX),
        )),
        Call::Process(p) => process_call(ctx, p).map(Reply::Process),
        Call::PromptContext(req) => Ok(Reply::PromptContext(prompt_context_call(ctx, &req))),
        Call::Files(f) => crate::worker::files::call(ctx, runner, f, emit, pieces),
        Call::Cancel(_) | Call::Credit(_) | Call::UploadPiece(_) => {
            Err(ToolError::invalid("not a call"))
        }
    };
    result.unwrap_or_else(|e| Reply::Failure(failure(e, main)))
}

/// apply_patch checks its targets up front but writes later, by path: a concurrent command
/// could swap a directory on the way for a symlink in between. The guard takes away any
/// protected name the patch brought into being, and the patch fails saying so.
fn guarded_apply_patch(
    ctx: &ToolContext,
    runner: &SandboxedRunner,
    req: api::ApplyPatchRequest,
) -> Result<api::ApplyPatchResponse, ToolError> {
    let call = runner.guard_call()?;
    let result = apply_patch_call(ctx, req);
    match runner.guard_finish(call) {
        Some(lines) => Err(ToolError::new(
            crate::tools::ErrorKind::PermissionDenied,
            format!("patch rejected: {lines}"),
        )),
        None => result,
    }
}

/// A model's call. Commands have their own guard (`runner.run_checked`); a patch gets one here.
fn guarded_invoke(
    ctx: &ToolContext,
    runner: &SandboxedRunner,
    req: api::InvokeRequest,
) -> Result<Reply, ToolError> {
    // A patch typed into a shell tool is applied in-process too, so it needs the same guard.
    let call = if calls::facts::applies_a_patch(&req) {
        runner.guard_call()?
    } else {
        None
    };
    let out = calls::invoke(ctx, &req.name, &req.arguments, req.freeform);
    let command = out.command.map(|c| api::CommandEnd {
        exit_code: c.exit_code,
        process_id: c.process_id,
    });
    let (output, success, items) = match runner.guard_finish(call) {
        Some(lines) => (format!("patch rejected: {lines}"), false, Vec::new()),
        None => (out.output, out.success, out.content_items),
    };
    Ok(Reply::Invoke(api::InvokeResponse {
        call_id: req.call_id,
        output,
        success,
        content_items: items.into_iter().map(content_item).collect(),
        approval: None,
        command,
    }))
}

/// A bridge content item as its proto message.
fn content_item(item: calls::ContentItem) -> api::OutputContentItem {
    use api::output_content_item::Item;
    api::OutputContentItem {
        item: Some(match item {
            calls::ContentItem::InputImage { image_url, detail } => {
                Item::InputImage(api::InputImage {
                    image_url,
                    detail: detail.unwrap_or_default(),
                })
            }
        }),
    }
}
