//! Executes one call: proto request → tool arguments → tool → proto response. The only place
//! where proto messages and tool types meet (DESIGN.md §4). The typed calls (ReadFile, ListDir,
//! GrepFiles, ApplyPatch, Shell) are here; a running process's calls in `process.rs`.

use crate::api;
use crate::calls;
use crate::tools::shell::{
    self, Captured, ExecOutcome, OutputChunk, TruncationPolicy, exec_request,
};
use crate::tools::{
    ErrorKind, ToolContext, ToolError, apply_patch, grep_files, list_dir, read_file,
};
use crate::wire::process_call::Op as ProcessOp;
use crate::wire::{FailureKind, ToolFailure, worker_reply::Result as Reply, worker_request::Call};
use crate::worker::commands::SandboxedRunner;
use std::time::Instant;

mod process;
use process::{process_call, prompt_context_call};

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

/// A u64 from the wire as a usize (saturating on 32-bit hosts, where nothing that large fits).
pub(super) fn size(v: Option<u64>) -> Option<usize> {
    v.map(|n| usize::try_from(n).unwrap_or(usize::MAX))
}

pub(super) fn read_file_call(
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
    let path = crate::tools::resolve_path(&ctx.cwd, &req.file_path);
    let args = read_file::ReadFileArgs {
        file_path: req.file_path,
        offset: size(req.offset),
        limit: size(req.limit),
        mode,
        indentation,
    };
    let out = read_file::read_file(&ctx.cwd, &args).map_err(|e| naming(&path, e))?;
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

pub(super) fn list_dir_call(
    ctx: &ToolContext,
    req: api::ListDirRequest,
) -> Result<api::ListDirResponse, ToolError> {
    let path = crate::tools::resolve_path(&ctx.cwd, &req.dir_path);
    let args = list_dir::ListDirArgs {
        dir_path: req.dir_path,
        offset: size(req.offset),
        limit: size(req.limit),
        depth: size(req.depth),
    };
    let out = list_dir::list_dir(&ctx.cwd, &args).map_err(|e| naming(&path, e))?;
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

/// The typed Shell call: argv (`shell`, structured text) or script (`shell_command`, freeform
/// text), run under the worker's checks, every output chunk streamed when asked.
pub(super) fn shell_call(
    ctx: &ToolContext,
    runner: &SandboxedRunner,
    req: api::ShellRequest,
    stream: bool,
    emit: &mut Emit<'_>,
) -> Result<api::ShellResponse, ToolError> {
    let structured = !req.command.is_empty();
    let argv = match (structured, req.script.is_empty()) {
        (true, true) => req.command,
        (false, false) => shell::shell_command_argv(
            &ctx.shell.to_string_lossy(),
            &req.script,
            req.login.unwrap_or(true),
        ),
        (true, false) => {
            return Err(ToolError::invalid(
                "give either command (an argv) or script, not both",
            ));
        }
        (false, true) => {
            return Err(ToolError::invalid("command must not be empty"));
        }
    };
    let policy = match req.truncation.and_then(|t| t.budget) {
        Some(api::truncation_policy::Budget::Bytes(b)) => {
            TruncationPolicy::Bytes(usize::try_from(b).unwrap_or(usize::MAX))
        }
        Some(api::truncation_policy::Budget::Tokens(t)) => {
            TruncationPolicy::Tokens(usize::try_from(t).unwrap_or(usize::MAX))
        }
        None => TruncationPolicy::default(),
    };
    let workdir = (!req.workdir.is_empty()).then_some(req.workdir.as_str());
    let exec = exec_request(
        argv,
        workdir,
        ctx.clamp_timeout(req.timeout_ms),
        &ctx.exec_context(),
    );
    // Taken before the command starts, so it is never later than the executor's own deadline.
    let deadline = Instant::now().checked_add(exec.timeout);
    if stream {
        emit(
            Reply::ShellEvent(api::ShellStreamEvent {
                event: Some(api::shell_stream_event::Event::Begin(api::ShellBegin {
                    argv: exec.argv.clone(),
                    cwd: exec.cwd.to_string_lossy().into_owned(),
                })),
            }),
            deadline,
        );
    }
    let mut seq = 0u64;
    let mut on_chunk = |chunk: OutputChunk| {
        if !stream {
            return;
        }
        let (kind, data) = match chunk {
            OutputChunk::Stdout(d) => (api::OutputStream::Stdout, d),
            OutputChunk::Stderr(d) => (api::OutputStream::Stderr, d),
        };
        emit(
            Reply::ShellEvent(api::ShellStreamEvent {
                event: Some(api::shell_stream_event::Event::Delta(api::OutputDelta {
                    seq,
                    stream: kind as i32,
                    data,
                })),
            }),
            deadline,
        );
        seq += 1;
    };
    let report = runner.run_checked(&exec, &mut on_chunk, &ctx.cancel)?;
    let denied = runner.sandbox_denied(&report);
    let outcome = report.outcome;
    let text = if structured {
        shell::shell_output_text(&outcome, policy)
    } else {
        shell::shell_command_output_text(&outcome, policy)
    };
    Ok(shell_response(&outcome, text, denied, policy))
}

pub(super) fn captured(c: &Captured) -> api::CapturedOutput {
    api::CapturedOutput {
        head: c.head.clone(),
        tail: c.tail.clone(),
        total_bytes: c.total_bytes,
        dropped_bytes: c.dropped_bytes,
    }
}

pub(super) fn shell_response(
    outcome: &ExecOutcome,
    text: String,
    sandbox_denied: bool,
    policy: TruncationPolicy,
) -> api::ShellResponse {
    api::ShellResponse {
        exit_code: outcome.exit_code,
        signal: outcome.signal.unwrap_or(0),
        duration_seconds: outcome.duration.as_secs_f64(),
        timed_out: outcome.timed_out,
        truncated: outcome.combined.text_len as usize > policy.byte_budget(),
        sandbox_denied,
        stdout: Some(captured(&outcome.stdout)),
        stderr: Some(captured(&outcome.stderr)),
        combined: Some(captured(&outcome.combined)),
        text,
        success: outcome.success(),
        escalated: false,
        approval: None,
    }
}

pub(super) fn grep_files_call(
    ctx: &ToolContext,
    req: api::GrepFilesRequest,
) -> Result<api::GrepFilesResponse, ToolError> {
    let args = grep_files::GrepFilesArgs {
        pattern: req.pattern,
        include: (!req.include.is_empty()).then_some(req.include),
        path: (!req.path.is_empty()).then_some(req.path),
        limit: size(req.limit),
    };
    let out = grep_files::grep_files(&ctx.cwd, &args)?;
    Ok(api::GrepFilesResponse {
        text: out.model_text(),
        truncated: out.truncated,
        matches: out
            .matches
            .iter()
            .map(|m| {
                let since = m
                    .modified
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .unwrap_or_default();
                api::GrepMatch {
                    path: m.path.to_string_lossy().into_owned(),
                    modified_unix_seconds: i64::try_from(since.as_secs()).unwrap_or(i64::MAX),
                    modified_nanos: since.subsec_nanos(),
                }
            })
            .collect(),
    })
}

pub(super) fn apply_patch_call(
    ctx: &ToolContext,
    req: api::ApplyPatchRequest,
) -> Result<api::ApplyPatchResponse, ToolError> {
    let out = apply_patch::apply_patch(&req.patch, &ctx.patch)?;
    Ok(api::ApplyPatchResponse {
        text: out.model_text(),
        warnings: out.warnings.clone(),
        changes: out
            .changes
            .into_iter()
            .map(|c| {
                let (kind, moved_from) = match c.kind {
                    apply_patch::FileChangeKind::Added => {
                        (api::FileChangeKind::Added, String::new())
                    }
                    apply_patch::FileChangeKind::Modified => {
                        (api::FileChangeKind::Modified, String::new())
                    }
                    apply_patch::FileChangeKind::Deleted => {
                        (api::FileChangeKind::Deleted, String::new())
                    }
                    apply_patch::FileChangeKind::Moved { from } => (
                        api::FileChangeKind::Moved,
                        from.to_string_lossy().into_owned(),
                    ),
                };
                api::FileChange {
                    path: c.path.to_string_lossy().into_owned(),
                    kind: kind as i32,
                    moved_from,
                    unified_diff: c.unified_diff,
                    overwritten: c.overwritten,
                }
            })
            .collect(),
    })
}
