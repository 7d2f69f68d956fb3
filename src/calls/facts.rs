//! Every per-tool fact the daemon and the worker decide by, in one place: what a call is named
//! and names (the audit line), the command it would run (approvals), whether it asks for
//! escalation, starts or names a process, runs a command, may write, or applies a patch. No
//! other file matches on a tool's name; a new tool is described here and in `definitions`.

pub use super::tool_call::ToolCall;
use crate::api;
use crate::wire::worker_request::Call;
use std::path::Path;

/// `f` of the model call's one parse: the one that travels with the call, or (a caller that
/// has none: tests, a one-off) a parse made here.
fn parsed<T>(r: &api::InvokeRequest, tool: Option<&ToolCall>, f: impl FnOnce(&ToolCall) -> T) -> T {
    match tool {
        Some(t) => f(t),
        None => f(&ToolCall::parse(r)),
    }
}

/// Every name a call can have: the model-facing tools an `Invoke` runs, the typed calls' names
/// ([`describe`]), `decide_approval` and `set_network_rules` — the metrics' `tool` label values (any other name is
/// the caller's text and is shown as `other`).
pub const CALL_NAMES: &[&str] = &[
    // The bridge's tools (an Invoke's name).
    "apply_patch",
    "container.exec",
    "exec_command",
    "grep_files",
    "list_dir",
    "read_file",
    "shell",
    "shell_command",
    "update_plan",
    "view_image",
    "write_stdin",
    // Typed calls.
    "cancel",
    "close_session",
    "copy",
    "credit",
    "decide_approval",
    "download",
    "files",
    "get_prompt_context",
    "list_directory",
    "make_directory",
    "process",
    "process_list",
    "process_read",
    "process_resize",
    "process_signal",
    "process_start",
    "process_terminate",
    "process_write",
    "read_bytes",
    "remove",
    "remove_upload_stagings",
    "set_network_rules",
    "stat",
    "upload",
    "upload_piece",
    "write_bytes",
];

/// Whether the call runs a command, and so holds one of its owner's running-command slots: the
/// shell tools, typed Shell, and whatever starts a process.
pub fn runs_a_command(call: &Call) -> bool {
    matches!(call, Call::Shell(_))
        || matches!(call, Call::Invoke(r) if super::is_shell_tool(&r.name))
        || starts_process(call)
}

/// The refusal text of an escalation the policy does not allow, in the words of the tool the
/// call used (exec_command's differ from the shell tools').
pub fn escalation_refused_text(call: &Call, policy_name: &str) -> String {
    match call {
        Call::Invoke(r) if r.name == "exec_command" => {
            crate::tools::unified_exec::errors::escalation_refused(policy_name).message
        }
        _ => crate::tools::shell::escalation_refused(policy_name).message,
    }
}

/// Whether a model call applies a patch in the worker's own process (apply_patch, or a patch
/// typed into a shell tool), which needs the protection guard as a command does.
pub fn applies_a_patch(r: &api::InvokeRequest) -> bool {
    super::model::takes_a_patch(&r.name) || super::intercepts_apply_patch(&r.name, &r.arguments)
}

/// Whether a call can write: those re-check protection first (per call; H1). Read-only tools
/// cannot create or change a protected name. write_stdin starts nothing: it talks to a process
/// already running in its worker (which that process's own guard watches).
pub fn may_write(call: &Call) -> bool {
    use crate::wire::process_call::Op as ProcessOp;
    match call {
        Call::Shell(_) | Call::ApplyPatch(_) => true,
        Call::Invoke(r) => r.name != "write_stdin",
        Call::Process(p) => matches!(p.op, Some(ProcessOp::Start(_))),
        Call::Files(f) => matches!(
            f.op,
            Some(
                crate::wire::files_call::Op::WriteBytes(_)
                    | crate::wire::files_call::Op::Upload(_)
                    | crate::wire::files_call::Op::RemoveUploadStagings(_)
                    | crate::wire::files_call::Op::MakeDirectory(_)
                    | crate::wire::files_call::Op::Remove(_)
                    | crate::wire::files_call::Op::Copy(_)
            )
        ),
        _ => false,
    }
}

/// The tool and the argv or paths a call names (never contents).
pub fn describe(call: &Call, tool: Option<&ToolCall>) -> (String, Vec<String>) {
    match call {
        Call::ReadFile(r) => ("read_file".into(), vec![r.file_path.clone()]),
        Call::ListDir(r) => ("list_dir".into(), vec![r.dir_path.clone()]),
        Call::GrepFiles(r) => ("grep_files".into(), vec![r.path.clone()]),
        Call::ApplyPatch(r) => ("apply_patch".into(), patch_paths(&r.patch)),
        Call::Shell(r) if !r.command.is_empty() => ("shell".into(), r.command.clone()),
        Call::Shell(r) => ("shell_command".into(), vec![r.script.clone()]),
        Call::Invoke(r) => (r.name.clone(), parsed(r, tool, |t| t.targets(&r.arguments))),
        Call::Cancel(_) => ("cancel".into(), Vec::new()),
        Call::Credit(_) => ("credit".into(), Vec::new()),
        Call::CloseSession(_) => ("close_session".into(), Vec::new()),
        Call::Process(p) => describe_process(p),
        Call::PromptContext(_) => ("get_prompt_context".into(), Vec::new()),
        Call::Files(f) => describe_files(f),
        Call::UploadPiece(_) => ("upload_piece".into(), Vec::new()),
    }
}

/// A Files call: `read_bytes`, `write_bytes`, `upload`, `download`, `stat`, `list_directory`,
/// `make_directory`, `remove` or `copy` with the paths it names (an upload's `source_name` too:
/// it may be where the tree lands; a copy's source and destination).
pub fn describe_files(call: &crate::wire::FilesCall) -> (String, Vec<String>) {
    use crate::wire::files_call::Op;
    match &call.op {
        Some(Op::ReadBytes(r)) => ("read_bytes".into(), vec![r.path.clone()]),
        Some(Op::WriteBytes(r)) => ("write_bytes".into(), vec![r.path.clone()]),
        Some(Op::Upload(r)) if !r.source_name.is_empty() => {
            ("upload".into(), vec![r.path.clone(), r.source_name.clone()])
        }
        Some(Op::Upload(r)) => ("upload".into(), vec![r.path.clone()]),
        Some(Op::Download(r)) => ("download".into(), vec![r.path.clone()]),
        Some(Op::RemoveUploadStagings(r)) => {
            ("remove_upload_stagings".into(), vec![r.path.clone()])
        }
        Some(Op::Stat(r)) => ("stat".into(), vec![r.path.clone()]),
        Some(Op::ListDirectory(r)) => ("list_directory".into(), vec![r.path.clone()]),
        Some(Op::MakeDirectory(r)) => ("make_directory".into(), vec![r.path.clone()]),
        Some(Op::Remove(r)) => ("remove".into(), vec![r.path.clone()]),
        Some(Op::Copy(r)) => (
            "copy".into(),
            vec![r.source_path.clone(), r.destination_path.clone()],
        ),
        None => ("files".into(), Vec::new()),
    }
}

/// A typed process call: `process_start` with its argv (or script), the others with the id.
pub fn describe_process(call: &crate::wire::ProcessCall) -> (String, Vec<String>) {
    use crate::api::start_process_request::Command;
    use crate::wire::process_call::Op;
    let id = |id: i32| vec![id.to_string()];
    match &call.op {
        Some(Op::Start(r)) => (
            "process_start".into(),
            match &r.command {
                Some(Command::Argv(a)) => a.args.clone(),
                Some(Command::Script(s)) => vec![s.clone()],
                None => Vec::new(),
            },
        ),
        Some(Op::Write(r)) => ("process_write".into(), id(r.process_id)),
        Some(Op::Read(r)) => ("process_read".into(), id(r.process_id)),
        Some(Op::Resize(r)) => ("process_resize".into(), id(r.process_id)),
        Some(Op::Signal(r)) => (
            "process_signal".into(),
            vec![r.process_id.to_string(), r.signal.clone()],
        ),
        Some(Op::Terminate(r)) => ("process_terminate".into(), id(r.process_id)),
        Some(Op::List(_)) => ("process_list".into(), Vec::new()),
        None => ("process".into(), Vec::new()),
    }
}

/// The file paths a patch names (its `*** … File:` and `*** Move to:` headers).
pub fn patch_paths(patch: &str) -> Vec<String> {
    const HEADERS: [&str; 4] = [
        "*** Add File: ",
        "*** Delete File: ",
        "*** Update File: ",
        "*** Move to: ",
    ];
    patch
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            HEADERS
                .iter()
                .find_map(|h| l.strip_prefix(h))
                .map(str::to_string)
        })
        .collect()
}

/// The process a call writes to and how many bytes: `write_stdin` (its `session_id` and
/// `chars`) and WriteProcess.
pub fn stdin_of(call: &Call, tool: Option<&ToolCall>) -> Option<(i32, usize)> {
    match call {
        Call::Invoke(r) => parsed(r, tool, ToolCall::stdin),
        Call::Process(p) => match &p.op {
            Some(crate::wire::process_call::Op::Write(w)) => Some((w.process_id, w.data.len())),
            _ => None,
        },
        _ => None,
    }
}

/// The command a call would run, as the user is shown it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    /// The argv (a script as `[shell, -lc|-c, script]`, as the shell tools build it).
    pub argv: Vec<String>,
    /// Where it runs (the workdir resolved against the session's cwd).
    pub cwd: String,
    /// The model's (or the typed caller's) justification.
    pub justification: String,
}

/// The command of a call the approval policies govern: the command tools (`shell`,
/// `container.exec`, `shell_command`, `exec_command`, the typed Shell and StartProcess). `None`
/// for every other call, for an apply_patch typed into a shell tool (it never escalates and is
/// never asked about, spec/tools.md §5.6), and for arguments that do not parse (the tool
/// answers the parse error without running anything).
pub fn command_of(
    call: &Call,
    tool: Option<&ToolCall>,
    session_cwd: &Path,
    shell: &str,
) -> Option<Command> {
    use crate::tools::shell::shell_command_argv;
    let cwd = |workdir: Option<&str>| -> String {
        match workdir.filter(|w| !w.is_empty()) {
            Some(w) => session_cwd.join(w).to_string_lossy().into_owned(),
            None => session_cwd.to_string_lossy().into_owned(),
        }
    };
    let text = |j: Option<String>| j.unwrap_or_default();
    match call {
        Call::Invoke(r) => parsed(r, tool, |t| {
            if r.freeform || t.intercepts_apply_patch() {
                return None;
            }
            if let Some(a) = t.shell_args() {
                Some(Command {
                    argv: a.argv().ok()?,
                    cwd: cwd(a.workdir.as_deref()),
                    justification: text(a.justification),
                })
            } else if let Some(a) = t.shell_command_args() {
                Some(Command {
                    argv: a.argv(shell, true).ok()?,
                    cwd: cwd(a.workdir.as_deref()),
                    justification: text(a.justification),
                })
            } else {
                let a = t.exec_command_args()?;
                Some(Command {
                    argv: a.argv(shell, true).ok()?,
                    cwd: cwd(a.workdir.as_deref()),
                    justification: text(a.justification),
                })
            }
        }),
        Call::Shell(r) => {
            let argv = match (r.command.is_empty(), r.script.is_empty()) {
                (false, true) => r.command.clone(),
                (true, false) => shell_command_argv(shell, &r.script, r.login.unwrap_or(true)),
                // Both or neither: the worker refuses it without running anything.
                _ => return None,
            };
            Some(Command {
                argv,
                cwd: cwd(Some(&r.workdir)),
                justification: r.justification.clone(),
            })
        }
        Call::Process(p) => {
            use crate::api::start_process_request::Command as Cmd;
            let Some(crate::wire::process_call::Op::Start(r)) = &p.op else {
                return None;
            };
            let argv = match r.command.as_ref()? {
                Cmd::Argv(a) if !a.args.is_empty() => a.args.clone(),
                Cmd::Argv(_) => return None,
                Cmd::Script(s) => shell_command_argv(shell, s, true),
            };
            Some(Command {
                argv,
                cwd: cwd(Some(&r.workdir)),
                justification: r.justification.clone(),
            })
        }
        _ => None,
    }
}

/// The process a call names: write_stdin's `session_id`, or a typed call's `process_id`.
pub fn named_process(call: &Call, tool: Option<&ToolCall>) -> Option<i32> {
    use crate::wire::process_call::Op;
    match call {
        Call::Invoke(r) => parsed(r, tool, ToolCall::named_process),
        Call::Process(p) => match p.op.as_ref()? {
            Op::Write(r) => Some(r.process_id),
            Op::Read(r) => Some(r.process_id),
            Op::Resize(r) => Some(r.process_id),
            Op::Signal(r) => Some(r.process_id),
            Op::Terminate(r) => Some(r.process_id),
            Op::Start(_) | Op::List(_) => None,
        },
        _ => None,
    }
}

/// Whether a call may leave a process running (it gets an id drawn by the daemon).
pub fn starts_process(call: &Call) -> bool {
    match call {
        Call::Invoke(r) => r.name == "exec_command",
        Call::Process(p) => matches!(p.op, Some(crate::wire::process_call::Op::Start(_))),
        _ => false,
    }
}

pub fn is_process_list(call: &Call) -> bool {
    matches!(call, Call::Process(p) if matches!(p.op, Some(crate::wire::process_call::Op::List(_))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_of_each_tool() {
        let cwd = Path::new("/w");
        let invoke = |name: &str, args: &str| {
            Call::Invoke(api::InvokeRequest {
                name: name.into(),
                arguments: args.into(),
                ..Default::default()
            })
        };
        let c = command_of(
            &invoke(
                "shell",
                r#"{"command":["rm","x"],"workdir":"sub","justification":"why"}"#,
            ),
            None,
            cwd,
            "/bin/bash",
        )
        .unwrap();
        assert_eq!(c.argv, ["rm", "x"]);
        assert_eq!(c.cwd, "/w/sub");
        assert_eq!(c.justification, "why");
        let c = command_of(
            &invoke("shell_command", r#"{"command":"ls","login":false}"#),
            None,
            cwd,
            "/bin/bash",
        )
        .unwrap();
        assert_eq!(c.argv, ["/bin/bash", "-c", "ls"]);
        let c = command_of(
            &invoke("exec_command", r#"{"cmd":"ls","workdir":"/abs"}"#),
            None,
            cwd,
            "/bin/zsh",
        )
        .unwrap();
        assert_eq!(c.argv, ["/bin/zsh", "-lc", "ls"]);
        assert_eq!(c.cwd, "/abs");
        // Not governed: other tools, unparsable arguments, a patch through a shell tool.
        assert!(
            command_of(
                &invoke("read_file", r#"{"file_path":"/x"}"#),
                None,
                cwd,
                "sh"
            )
            .is_none()
        );
        assert!(
            command_of(
                &invoke("write_stdin", r#"{"session_id":1}"#),
                None,
                cwd,
                "sh"
            )
            .is_none()
        );
        assert!(command_of(&invoke("shell", "not json"), None, cwd, "sh").is_none());
        let patch =
            r#"{"command":["apply_patch","*** Begin Patch\n*** Add File: a\n+x\n*** End Patch"]}"#;
        assert!(command_of(&invoke("shell", patch), None, cwd, "sh").is_none());
        let typed = Call::Shell(api::ShellRequest {
            script: "echo hi".into(),
            login: Some(false),
            ..Default::default()
        });
        assert_eq!(
            command_of(&typed, None, cwd, "/bin/sh").unwrap().argv,
            ["/bin/sh", "-c", "echo hi"]
        );
    }

    /// Every fact the pipeline reads about a model call — its name and targets (trace, audit),
    /// escalation, the process it names, the command for approvals, the slot, the audit's
    /// stdin — comes from one parse of its arguments.
    #[test]
    fn a_model_call_is_parsed_once_for_every_fact() {
        use super::super::tool_call::PARSES;
        let cwd = Path::new("/w");
        for (name, args) in [
            (
                "exec_command",
                r#"{"cmd":"ls","sandbox_permissions":"require_escalated","justification":"j"}"#,
            ),
            ("write_stdin", r#"{"session_id":3,"chars":"ab"}"#),
            (
                "shell",
                r#"{"command":["apply_patch","*** Begin Patch\n*** End Patch"]}"#,
            ),
        ] {
            let call = Call::Invoke(api::InvokeRequest {
                name: name.into(),
                arguments: args.into(),
                ..Default::default()
            });
            let Call::Invoke(r) = &call else {
                unreachable!()
            };
            PARSES.with(|n| n.set(0));
            let parsed = ToolCall::parse(r);
            let tool = Some(&parsed);
            let (named, _) = describe(&call, tool);
            assert_eq!(named, name);
            let escalates = parsed.asks_for_escalation();
            let process = named_process(&call, tool);
            let command = command_of(&call, tool, cwd, "/bin/sh");
            let _ = runs_a_command(&call);
            let _ = starts_process(&call);
            let stdin = stdin_of(&call, tool);
            assert_eq!(PARSES.with(|n| n.get()), 1, "{name}");
            match name {
                "exec_command" => {
                    assert!(escalates);
                    assert_eq!(command.unwrap().justification, "j");
                }
                "write_stdin" => {
                    assert_eq!((process, stdin), (Some(3), Some((3, 2))));
                    assert!(command.is_none());
                }
                // A patch typed into a shell: applied, never a command nor an escalation.
                _ => assert!(!escalates && command.is_none()),
            }
            // Without the call's parse at hand, a fact parses again (the counter counts).
            let _ = named_process(&call, None);
            assert_eq!(PARSES.with(|n| n.get()), 2, "{name}");
        }
    }
}
