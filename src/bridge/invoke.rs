//! Dispatches one model tool call: parse the arguments → run the tool → the model text and the
//! success flag (spec/tools.md §0.1–0.3).

use crate::tools::shell::{
    self, ShellArgs, ShellCommandArgs, TruncationPolicy, exec_request, unsupported_payload,
};
use crate::tools::{
    ToolContext, ToolError, apply_patch, grep_files, list_dir, read_file, update_plan, view_image,
};
use serde::de::DeserializeOwned;

/// What goes back to the model.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct InvokeOutcome {
    pub output: String,
    pub success: bool,
    /// When not empty, the function call output is these items rather than `output` (view_image).
    pub content_items: Vec<ContentItem>,
}

/// One item of a function call output (Codex's `FunctionCallOutputContentItem`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContentItem {
    InputText(String),
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
        }
    }
}

/// Whether `name` runs a command (`shell`, its alias `container.exec`, `shell_command`): the
/// calls that may ask for escalation and that count as running commands.
pub fn is_shell_tool(name: &str) -> bool {
    matches!(name, "shell" | "container.exec" | "shell_command")
}

/// Runs the tool `name` with the model's `arguments` (a JSON object for function calls, the raw
/// input for freeform calls).
pub fn invoke(ctx: &ToolContext, name: &str, arguments: &str, freeform: bool) -> InvokeOutcome {
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
        "shell" | "container.exec" => shell_call(ctx, name, arguments, freeform),
        "shell_command" => shell_command_call(ctx, name, arguments, freeform),
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
) -> Result<(String, bool), ToolError> {
    if freeform {
        return Err(unsupported_payload("shell", name));
    }
    let args = ShellArgs::parse(arguments)?;
    let req = exec_request(
        args.argv()?,
        args.workdir.as_deref(),
        ctx.clamp_timeout(args.timeout_ms),
        &ctx.exec_context(),
    );
    let outcome = ctx.runner.run(&req, &mut |_| {}, &ctx.cancel)?;
    let text = shell::shell_output_text(&outcome, TruncationPolicy::default());
    Ok((text, outcome.success()))
}

/// `shell_command`: a script run by the session's shell; the freeform format (§6.4).
fn shell_command_call(
    ctx: &ToolContext,
    name: &str,
    arguments: &str,
    freeform: bool,
) -> Result<(String, bool), ToolError> {
    if freeform {
        return Err(unsupported_payload("shell_command", name));
    }
    let args = ShellCommandArgs::parse(arguments)?;
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
    let text = shell::shell_command_output_text(&outcome, TruncationPolicy::default());
    Ok((text, outcome.success()))
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
    serde_json::from_str(arguments).map_err(|e| ToolError::parse(&e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn ctx(dir: &std::path::Path) -> ToolContext {
        crate::worker::commands::test_context(dir)
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
