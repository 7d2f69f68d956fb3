//! Dispatches one model tool call: parse the arguments → run the tool → the model text and the
//! success flag (spec/tools.md §0.1–0.3).

use crate::tools::apply_patch::invocation::{
    IMPLICIT_INVOCATION_ERROR, Invocation, classify_argv, classify_script, interception_warning,
};
use crate::tools::shell::{
    self, ShellArgs, ShellCommandArgs, TruncationPolicy, exec_request, unsupported_payload,
};
use crate::tools::{
    ToolContext, ToolError, apply_patch, grep_files, list_dir, read_file, unified_exec,
    update_plan, view_image,
};
use serde::de::DeserializeOwned;

/// What goes back to the model.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct InvokeOutcome {
    pub output: String,
    pub success: bool,
    /// When not empty, the function call output is these items rather than `output` (view_image).
    pub content_items: Vec<ContentItem>,
    /// How the command the call ran (or wrote to) ended, for the caller and the audit log.
    pub command: Option<CommandEnd>,
}

/// How a command ended: its exit code, or the process id it still runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CommandEnd {
    pub exit_code: Option<i32>,
    pub process_id: Option<i32>,
}

impl CommandEnd {
    fn exited(code: i32) -> Self {
        Self {
            exit_code: Some(code),
            process_id: None,
        }
    }

    fn of(out: &unified_exec::CallResult) -> Self {
        Self {
            exit_code: out.output.exit_code,
            process_id: out.output.session_id,
        }
    }
}

/// One item of a function call output (Codex's `FunctionCallOutputContentItem`; its text
/// items go in the output text, so only images are items here).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContentItem {
    InputImage {
        image_url: String,
        detail: Option<String>,
    },
}

/// view_image's `output` text beside the image item, for clients that can only send text: the
/// text older Codex answered while it attached the image to a user message.
pub const VIEW_IMAGE_OUTPUT_TEXT: &str = "attached local image path";

impl InvokeOutcome {
    fn failed(err: ToolError) -> Self {
        Self {
            output: err.message,
            success: false,
            content_items: Vec::new(),
            command: None,
        }
    }
}

/// Whether `name` runs a command (`shell`, its alias `container.exec`, `shell_command`,
/// `exec_command`): the calls that may ask for escalation and that count as running commands.
/// (`write_stdin` talks to a process already running; it starts nothing.)
pub fn is_shell_tool(name: &str) -> bool {
    matches!(
        name,
        "shell" | "container.exec" | "shell_command" | "exec_command"
    )
}

/// What a tool can do to the session, for clients that decide by it: MCP's tool annotations
/// (`readOnlyHint`, `destructiveHint`), by which Codex runs a read-only tool with no approval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolEffects {
    /// Changes nothing: no file, no process (update_plan only reports a plan to the client).
    pub read_only: bool,
    /// May delete or overwrite what exists (a command, a patch, input to a running command).
    pub destructive: bool,
}

/// Whether the tool `name` takes Codex's patch grammar (as JSON `input` or freeform).
pub fn takes_a_patch(name: &str) -> bool {
    name == "apply_patch"
}

/// The effects of the tool `name`; `None` for a name no session offers.
pub fn tool_effects(name: &str) -> Option<ToolEffects> {
    let (read_only, destructive) = match name {
        "read_file" | "list_dir" | "grep_files" | "view_image" | "update_plan" => (true, false),
        "apply_patch" | "write_stdin" => (false, true),
        _ if is_shell_tool(name) => (false, true),
        _ => return None,
    };
    Some(ToolEffects {
        read_only,
        destructive,
    })
}

/// Runs the tool `name` with the model's `arguments` (a JSON object for function calls, the raw
/// input for freeform calls).
pub fn invoke(ctx: &ToolContext, name: &str, arguments: &str, freeform: bool) -> InvokeOutcome {
    // Set by the calls that run or talk to a command.
    let mut command = None;
    let result = match name {
        "read_file" => function_call(name, arguments, freeform, |args| {
            read_file::read_file(&ctx.cwd, &args).map(|out| (out.model_text(), true))
        }),
        "list_dir" => function_call(name, arguments, freeform, |args| {
            list_dir::list_dir(&ctx.cwd, &args).map(|out| (out.model_text(), true))
        }),
        "grep_files" => function_call(name, arguments, freeform, |args| {
            grep_files::grep_files(&ctx.cwd, &args).map(|out| (out.model_text(), out.success()))
        }),
        // The freeform (custom) tool sends the patch itself; the JSON variant wraps it in `input`.
        "apply_patch" => {
            let result = if freeform {
                apply_patch::apply_patch_for_model(arguments, &ctx.patch)
            } else {
                apply_patch::apply_patch_json(arguments, &ctx.patch)
            };
            result.map(|out| (out.model_text(), true))
        }
        // Codex registers `container.exec` as an alias of `shell`.
        "shell" | "container.exec" => shell_call(ctx, name, arguments, freeform, &mut command),
        "shell_command" => shell_command_call(ctx, name, arguments, freeform, &mut command),
        "exec_command" => function_call(
            name,
            arguments,
            freeform,
            |args: unified_exec::ExecCommandArgs| {
                // A patch typed into the shell is applied as a patch (spec/tools.md §5.9).
                if let Some(out) = intercept_apply_patch(
                    ctx,
                    name,
                    ShellCommand::Script(&args.cmd),
                    args.workdir.as_deref(),
                ) {
                    return Ok((out.output, out.success));
                }
                unified_exec::exec_command(ctx, &args).map(|r| {
                    command = Some(CommandEnd::of(&r));
                    (r.model_text(), true)
                })
            },
        ),
        "write_stdin" => function_call(name, arguments, freeform, |args| {
            unified_exec::write_stdin(ctx, &args).map(|r| {
                command = Some(CommandEnd::of(&r));
                (r.model_text(), true)
            })
        }),
        // The plan is for the client (it has the arguments); the model gets `Plan updated`.
        "update_plan" => function_call(
            name,
            arguments,
            freeform,
            |_: update_plan::UpdatePlanArgs| Ok((update_plan::PLAN_UPDATED.to_string(), true)),
        ),
        "view_image" => return view_image_call(ctx, name, arguments, freeform),
        // Codex's router answers an unregistered tool with the same text.
        _ => Err(ToolError::invalid(format!("unsupported call: {name}"))),
    };
    match result {
        Ok((output, success)) => InvokeOutcome {
            output,
            success,
            content_items: Vec::new(),
            command,
        },
        Err(err) => InvokeOutcome::failed(err),
    }
}

/// `view_image`: the image as one `input_image` content item (spec/tools.md §8).
fn view_image_call(
    ctx: &ToolContext,
    name: &str,
    arguments: &str,
    freeform: bool,
) -> InvokeOutcome {
    let result = function_call(
        name,
        arguments,
        freeform,
        |args: view_image::ViewImageArgs| {
            view_image::view_image(&ctx.cwd, &args).map(|out| (out, true))
        },
    );
    match result {
        Ok((image, _)) => InvokeOutcome {
            output: VIEW_IMAGE_OUTPUT_TEXT.to_string(),
            success: true,
            content_items: vec![ContentItem::InputImage {
                image_url: image.image_url,
                detail: image.detail.map(str::to_string),
            }],
            command: None,
        },
        Err(err) => InvokeOutcome::failed(err),
    }
}

/// `shell`: argv executed directly; the structured JSON format (spec/tools.md §6.3).
fn shell_call(
    ctx: &ToolContext,
    name: &str,
    arguments: &str,
    freeform: bool,
    command: &mut Option<CommandEnd>,
) -> Result<(String, bool), ToolError> {
    if freeform {
        return Err(unsupported_payload("shell", name));
    }
    let args = ShellArgs::parse(arguments)?;
    if let Some(out) = intercept_apply_patch(
        ctx,
        name,
        ShellCommand::Argv(&args.command),
        args.workdir.as_deref(),
    ) {
        return Ok((out.output, out.success));
    }
    let req = exec_request(
        args.argv()?,
        args.workdir.as_deref(),
        ctx.clamp_timeout(args.timeout_ms),
        &ctx.exec_context(),
    );
    let outcome = ctx.runner.run(&req, &mut |_| {}, &ctx.cancel)?;
    *command = Some(CommandEnd::exited(outcome.exit_code));
    let text = shell::shell_output_text(&outcome, TruncationPolicy::default());
    Ok((text, outcome.success()))
}

/// `shell_command`: a script run by the session's shell; the freeform format (§6.4).
fn shell_command_call(
    ctx: &ToolContext,
    name: &str,
    arguments: &str,
    freeform: bool,
    command: &mut Option<CommandEnd>,
) -> Result<(String, bool), ToolError> {
    if freeform {
        return Err(unsupported_payload("shell_command", name));
    }
    let args = ShellCommandArgs::parse(arguments)?;
    if let Some(out) = intercept_apply_patch(
        ctx,
        name,
        ShellCommand::Script(&args.command),
        args.workdir.as_deref(),
    ) {
        return Ok((out.output, out.success));
    }
    let argv = args.argv(&ctx.shell.to_string_lossy(), true)?;
    // The policy's ceiling binds every command tool alike (the typed Shell RPC refuses more in
    // the daemon; a model's request is clamped here).
    let req = exec_request(
        argv,
        args.workdir.as_deref(),
        ctx.clamp_timeout(args.timeout_ms),
        &ctx.exec_context(),
    );
    let outcome = ctx.runner.run(&req, &mut |_| {}, &ctx.cancel)?;
    *command = Some(CommandEnd::exited(outcome.exit_code));
    let text = shell::shell_command_output_text(&outcome, TruncationPolicy::default());
    Ok((text, outcome.success()))
}

/// What a command tool was asked to run.
#[derive(Debug, Clone, Copy)]
pub enum ShellCommand<'a> {
    /// `shell`'s argv (also `exec`-style argv).
    Argv(&'a [String]),
    /// `shell_command`'s / `exec_command`'s script for the session's shell.
    Script(&'a str),
}

impl ShellCommand<'_> {
    fn classify(self) -> Invocation {
        match self {
            ShellCommand::Argv(argv) => classify_argv(argv),
            ShellCommand::Script(script) => classify_script(script),
        }
    }
}

/// apply_patch typed into a command tool (spec/tools.md §5.9): when `command` is an apply_patch
/// invocation, the patch is applied exactly as the apply_patch tool would apply it in this session
/// (same [`ToolContext::patch`] checks: writable roots, protected paths, read-only), relative
/// paths resolving against `workdir` and then the script's `cd` directory, and the answer is
/// apply_patch's model text. A bare patch sent as a command gets Codex's "patch detected without
/// explicit call" error. `None` means: not an apply_patch, run the command as usual. `tool` names
/// the calling tool in the typed result's warning (Codex records
/// `apply_patch was requested via {tool}. …` for the model separately; the bridge text stays
/// apply_patch's own, as in Codex's `intercept_apply_patch`).
pub fn intercept_apply_patch(
    ctx: &ToolContext,
    tool: &str,
    command: ShellCommand<'_>,
    workdir: Option<&str>,
) -> Option<InvokeOutcome> {
    let (patch, cd) = match command.classify() {
        Invocation::NotPatch => return None,
        Invocation::BarePatch => {
            return Some(InvokeOutcome {
                output: IMPLICIT_INVOCATION_ERROR.to_string(),
                success: false,
                content_items: Vec::new(),
                command: None,
            });
        }
        Invocation::Patch { patch, workdir } => (patch, workdir),
    };
    // `Path::join` keeps an absolute argument as is, which is what Codex's resolution does.
    let mut cwd = ctx.patch.cwd.clone();
    if let Some(dir) = workdir {
        cwd = cwd.join(dir);
    }
    if let Some(dir) = cd {
        cwd = cwd.join(dir);
    }
    let patch_ctx = apply_patch::PatchContext {
        cwd,
        ..ctx.patch.clone()
    };
    Some(
        match apply_patch::apply_patch_for_model(&patch, &patch_ctx) {
            Ok(mut out) => {
                out.warnings.push(interception_warning(tool));
                // Applied as a patch: no command ran.
                InvokeOutcome {
                    output: out.model_text(),
                    success: true,
                    content_items: Vec::new(),
                    command: None,
                }
            }
            Err(err) => InvokeOutcome::failed(err),
        },
    )
}

/// Whether a model call named `name` with `arguments` will be answered by
/// [`intercept_apply_patch`] (a patch or a bare patch through `shell`/`shell_command`). The
/// worker puts such a call under apply_patch's guard, and the daemon never escalates it:
/// apply_patch never runs outside the session's sandbox (§5.6). The decision is
/// [`ToolCall::intercepts_apply_patch`](super::tool_call::ToolCall), for callers without a parse.
pub fn intercepts_apply_patch(name: &str, arguments: &str) -> bool {
    super::tool_call::ToolCall::new(name, arguments, false).intercepts_apply_patch()
}

/// A function tool: refuses a freeform payload, parses the JSON arguments into `A`, runs `run`.
fn function_call<A: DeserializeOwned, T>(
    name: &str,
    arguments: &str,
    freeform: bool,
    run: impl FnOnce(A) -> Result<(T, bool), ToolError>,
) -> Result<(T, bool), ToolError> {
    if freeform {
        return Err(ToolError::invalid(format!(
            "{name} handler received unsupported payload"
        )));
    }
    let args = parse_arguments::<A>(arguments)?;
    run(args)
}

/// `failed to parse function arguments: {serde_json error}`.
pub(crate) fn parse_arguments<A: DeserializeOwned>(arguments: &str) -> Result<A, ToolError> {
    crate::tools::parse_arguments(arguments)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn ctx(dir: &std::path::Path) -> ToolContext {
        crate::worker::commands::test_context(dir)
    }

    #[test]
    fn every_tool_of_every_set_says_whether_it_writes() {
        use crate::calls::{ShellTool, ToolSet};
        for shell in [
            ShellTool::UnifiedExec,
            ShellTool::ShellCommand,
            ShellTool::Shell,
        ] {
            let set = ToolSet {
                shell,
                ..ToolSet::default()
            };
            for name in set.names().into_iter().chain(["container.exec"]) {
                assert!(tool_effects(name).is_some(), "{name}");
            }
        }
        for name in [
            "read_file",
            "list_dir",
            "grep_files",
            "view_image",
            "update_plan",
        ] {
            assert_eq!(
                tool_effects(name),
                Some(ToolEffects {
                    read_only: true,
                    destructive: false
                })
            );
        }
        for name in [
            "exec_command",
            "write_stdin",
            "apply_patch",
            "shell",
            "shell_command",
        ] {
            assert!(!tool_effects(name).unwrap().read_only, "{name}");
        }
        assert_eq!(tool_effects("rm_rf"), None);
    }

    #[test]
    fn read_file_through_the_bridge() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f.txt"), "alpha\nbeta\ngamma\n").unwrap();
        let out = invoke(
            &ctx(dir.path()),
            "read_file",
            r#"{"file_path":"f.txt","offset":2,"limit":2}"#,
            false,
        );
        assert_eq!(
            out,
            InvokeOutcome {
                output: "L2: beta\nL3: gamma".into(),
                success: true,
                content_items: vec![],
                command: None,
            }
        );
    }

    #[test]
    fn missing_field_is_the_serde_display_text() {
        let out = invoke(&ctx(&PathBuf::from("/")), "read_file", "{}", false);
        assert_eq!(
            out.output,
            "failed to parse function arguments: missing field `file_path` at line 1 column 2"
        );
        assert!(!out.success);
    }

    #[test]
    fn freeform_payload_to_a_function_tool() {
        let out = invoke(&ctx(&PathBuf::from("/")), "list_dir", "x", true);
        assert_eq!(out.output, "list_dir handler received unsupported payload");
        assert!(!out.success);
    }

    #[test]
    fn unknown_tool() {
        let out = invoke(&ctx(&PathBuf::from("/")), "nope", "{}", false);
        assert_eq!(out.output, "unsupported call: nope");
        assert!(!out.success);
    }

    fn strip_wall_time(text: &str) -> String {
        let (head, rest) = text.split_once("\nWall time: ").unwrap();
        let end = rest.find(" seconds\n").unwrap();
        format!("{head}\nWall time: _{}", &rest[end..])
    }

    #[test]
    fn heredoc_patch_through_shell_command_is_applied_not_run() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir(root.join("sub")).unwrap();
        let script = "cd sub && apply_patch <<'PATCH'\n*** Begin Patch\n*** Add File: n.txt\n+hi\n*** End Patch\nPATCH\n";
        let args = serde_json::json!({ "command": script }).to_string();
        let out = invoke(&ctx(&root), "shell_command", &args, false);
        assert!(out.success, "{}", out.output);
        assert_eq!(
            strip_wall_time(&out.output),
            "Exit code: 0\nWall time: _ seconds\nOutput:\nSuccess. Updated the following files:\nA n.txt\n"
        );
        assert_eq!(
            std::fs::read_to_string(root.join("sub/n.txt")).unwrap(),
            "hi\n"
        );
    }

    #[test]
    fn shell_route_keeps_apply_patch_checks() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let patch = "*** Begin Patch\n*** Add File: ../escape.txt\n+x\n*** End Patch";
        let args = serde_json::json!({ "command": ["apply_patch", patch] }).to_string();
        let out = invoke(&ctx(&root), "shell", &args, false);
        assert_eq!(
            out.output,
            "patch rejected: writing outside of the project; rejected by user approval settings"
        );
        assert!(!out.success);
        assert!(!root.parent().unwrap().join("escape.txt").exists());
        // A bare patch as the argv is refused with Codex's hint.
        let args = serde_json::json!({ "command": [patch] }).to_string();
        let out = invoke(&ctx(&root), "shell", &args, false);
        assert_eq!(out.output, IMPLICIT_INVOCATION_ERROR);
        assert!(!out.success);
    }

    #[test]
    fn interception_is_recognised_before_dispatch() {
        let heredoc =
            "apply_patch <<'EOF'\n*** Begin Patch\n*** Add File: a\n+x\n*** End Patch\nEOF\n";
        let sc = serde_json::json!({ "command": heredoc }).to_string();
        assert!(intercepts_apply_patch("shell_command", &sc));
        let sh = serde_json::json!({ "command": ["bash", "-lc", heredoc] }).to_string();
        assert!(intercepts_apply_patch("shell", &sh));
        assert!(intercepts_apply_patch("container.exec", &sh));
        let plain = serde_json::json!({ "command": "echo hi" }).to_string();
        assert!(!intercepts_apply_patch("shell_command", &plain));
        assert!(!intercepts_apply_patch("read_file", &sc));
    }

    #[test]
    fn update_plan_through_the_bridge() {
        let c = ctx(&PathBuf::from("/"));
        let out = invoke(
            &c,
            "update_plan",
            r#"{"plan":[{"step":"a","status":"pending"}]}"#,
            false,
        );
        assert_eq!((out.output.as_str(), out.success), ("Plan updated", true));
        let out = invoke(
            &c,
            "update_plan",
            r#"{"plan":[{"step":"a","status":"done"}]}"#,
            false,
        );
        assert_eq!(
            out.output,
            "failed to parse function arguments: unknown variant `done`, expected one of \
             `pending`, `in_progress`, `completed` at line 1 column 36"
        );
        assert!(!out.success);
        let out = invoke(&c, "update_plan", "x", true);
        assert_eq!(
            out.output,
            "update_plan handler received unsupported payload"
        );
    }

    #[test]
    fn view_image_through_the_bridge() {
        let dir = tempfile::tempdir().unwrap();
        let mut png = std::io::Cursor::new(Vec::new());
        image::DynamicImage::new_rgba8(3, 2)
            .write_to(&mut png, image::ImageFormat::Png)
            .unwrap();
        std::fs::write(dir.path().join("p.png"), png.get_ref()).unwrap();
        let out = invoke(&ctx(dir.path()), "view_image", r#"{"path":"p.png"}"#, false);
        assert!(out.success);
        assert_eq!(out.output, "attached local image path");
        let [ContentItem::InputImage { image_url, detail }] = &out.content_items[..] else {
            panic!("one image: {out:?}");
        };
        assert!(image_url.starts_with("data:image/png;base64,iVBORw0KGgo"));
        assert_eq!(detail, &None);
        let out = invoke(
            &ctx(dir.path()),
            "view_image",
            r#"{"path":"p.png","detail":"original"}"#,
            false,
        );
        assert!(
            matches!(&out.content_items[..], [ContentItem::InputImage { detail: Some(d), .. }] if d == "original")
        );
        let out = invoke(&ctx(dir.path()), "view_image", "{}", false);
        assert_eq!(
            out.output,
            "failed to parse function arguments: missing field `path` at line 1 column 2"
        );
        assert!(out.content_items.is_empty() && !out.success);
        let out = invoke(&ctx(dir.path()), "view_image", "x", true);
        assert_eq!(
            out.output,
            "view_image handler received unsupported payload"
        );
    }
}
