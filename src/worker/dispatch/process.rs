//! The long-lived process calls (start, write, read, resize, signal, terminate, list) and the
//! prompt context: proto request → the tool → proto response.

use crate::api;
use crate::tools::shell;
use crate::tools::unified_exec::typed;
use crate::tools::{ToolContext, ToolError};
use crate::wire::process_call::Op as ProcessOp;
use crate::wire::process_reply::Op as ProcessAnswer;
use crate::wire::{ProcessCall, ProcessReply};

/// GetPromptContext: the project docs are read here, in the sandbox, as the caller.
pub(super) fn prompt_context_call(
    ctx: &ToolContext,
    req: &crate::wire::PromptContextCall,
) -> api::GetPromptContextResponse {
    let c = crate::tools::prompt_context::prompt_context(
        &ctx.cwd,
        &ctx.shell,
        &req.current_date,
        &req.timezone,
        req.project_doc_max_bytes,
        req.network
            .as_ref()
            .map(|n| crate::tools::prompt_context::NetworkContext {
                allowed_domains: n.allowed.clone(),
                denied_domains: n.denied.clone(),
            }),
    );
    api::GetPromptContextResponse {
        responses_input_json: c.responses_input_json(),
        chat_messages_json: c.chat_messages_json(),
        cwd: c.cwd,
        shell: c.shell,
        current_date: c.current_date,
        timezone: c.timezone,
        environment_context: c.environment_context,
        project_docs: c
            .project_docs
            .into_iter()
            .map(|d| api::ProjectDoc {
                path: d.path.to_string_lossy().into_owned(),
                bytes_used: d.bytes_used,
                truncated: d.truncated,
            })
            .collect(),
        user_instructions: c.user_instructions.unwrap_or_default(),
    }
}

/// A typed process call (the Processes service).
pub(super) fn process_call(
    ctx: &ToolContext,
    call: ProcessCall,
) -> Result<ProcessReply, ToolError> {
    let op = call
        .op
        .ok_or_else(|| ToolError::invalid("the process call names no operation"))?;
    let answer = match op {
        ProcessOp::Start(r) => {
            let argv = match r.command {
                Some(api::start_process_request::Command::Argv(a)) => a.args,
                Some(api::start_process_request::Command::Script(script)) => {
                    if script.trim().is_empty() {
                        return Err(ToolError::invalid("script is empty"));
                    }
                    shell::shell_command_argv(&ctx.shell.to_string_lossy(), &script, true)
                }
                None => return Err(ToolError::invalid("give the command: argv or script")),
            };
            if !r.tty && (r.rows != 0 || r.cols != 0) {
                return Err(ToolError::invalid("rows and cols are for tty processes").on("rows"));
            }
            let args = typed::StartArgs {
                argv,
                workdir: Some(r.workdir).filter(|w| !w.is_empty()),
                tty: r.tty,
                size: Some(typed::pty_size(r.rows, r.cols)?),
                env: r.env.into_iter().collect(),
            };
            ProcessAnswer::Start(api::StartProcessResponse {
                process_id: typed::start(ctx, &args)?,
                approval: None,
            })
        }
        ProcessOp::Write(r) => {
            typed::write(ctx, r.process_id, &r.data, r.close_stdin)?;
            ProcessAnswer::Write(api::WriteProcessResponse {})
        }
        ProcessOp::Read(r) => {
            let out = typed::read(
                ctx,
                r.process_id,
                r.after_seq,
                std::time::Duration::from_millis(r.wait_ms.into()),
                r.max_bytes as usize,
            )?;
            let last_seq = out.read.chunks.last().map(|c| c.seq).or(r.after_seq);
            ProcessAnswer::Read(api::ReadProcessResponse {
                gap: out.read.gap,
                more: out.read.more,
                last_seq,
                state: Some(process_state(out.status, out.output_bytes)),
                chunks: out
                    .read
                    .chunks
                    .into_iter()
                    .map(|c| api::ProcessOutputChunk {
                        seq: c.seq,
                        offset: c.offset,
                        data: c.data,
                    })
                    .collect(),
            })
        }
        ProcessOp::Resize(r) => {
            if r.rows == 0 || r.cols == 0 {
                return Err(ToolError::invalid("rows and cols are required (1 to 1000)"));
            }
            let (rows, cols) = typed::pty_size(r.rows, r.cols)?;
            typed::resize(ctx, r.process_id, rows, cols)?;
            ProcessAnswer::Resize(api::ResizeProcessResponse {})
        }
        ProcessOp::Signal(r) => {
            typed::signal(ctx, r.process_id, typed::parse_signal(&r.signal)?)?;
            ProcessAnswer::Signal(api::SignalProcessResponse {})
        }
        ProcessOp::Terminate(r) => {
            let (status, bytes) = typed::terminate(ctx, r.process_id)?;
            ProcessAnswer::Terminate(api::TerminateProcessResponse {
                state: Some(process_state(status, bytes)),
            })
        }
        ProcessOp::List(_) => ProcessAnswer::List(api::ListProcessesResponse {
            processes: typed::list(ctx)
                .into_iter()
                .map(|p| api::ProcessInfo {
                    process_id: p.id,
                    command: p.command,
                    tty: p.tty,
                    state: Some(process_state(p.status, p.output_bytes)),
                    escalated: false,
                })
                .collect(),
        }),
    };
    Ok(ProcessReply { op: Some(answer) })
}

pub(super) fn process_state(
    status: crate::tools::unified_exec::process::Status,
    bytes: u64,
) -> api::ProcessState {
    api::ProcessState {
        running: status.exit.is_none(),
        exit_code: status.exit,
        closed: status.closed,
        output_bytes: bytes,
    }
}
