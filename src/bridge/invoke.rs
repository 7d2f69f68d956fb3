//! Dispatches one model tool call: parse the arguments → run the tool → the model text and the
//! success flag (spec/tools.md §0.1–0.3).

use crate::tools::{ToolContext, ToolError, list_dir, read_file};
use serde::de::DeserializeOwned;

/// What goes back to the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvokeOutcome {
    pub output: String,
    pub success: bool,
}

impl InvokeOutcome {
    fn ok(output: String) -> Self {
        Self {
            output,
            success: true,
        }
    }

    fn failed(err: ToolError) -> Self {
        Self {
            output: err.message,
            success: false,
        }
    }
}

/// Runs the tool `name` with the model's `arguments` (a JSON object for function calls, the raw
/// input for freeform calls).
pub fn invoke(ctx: &ToolContext, name: &str, arguments: &str, freeform: bool) -> InvokeOutcome {
    let result = match name {
        "read_file" => function_call(name, arguments, freeform, |args| {
            read_file::read_file(&ctx.cwd, &args).map(|out| out.model_text())
        }),
        "list_dir" => function_call(name, arguments, freeform, |args| {
            list_dir::list_dir(&ctx.cwd, &args).map(|out| out.model_text())
        }),
        // Codex's router answers an unregistered tool with the same text.
        _ => Err(ToolError::invalid(format!("unsupported call: {name}"))),
    };
    match result {
        Ok(text) => InvokeOutcome::ok(text),
        Err(err) => InvokeOutcome::failed(err),
    }
}

/// A function tool: refuses a freeform payload, parses the JSON arguments into `A`, runs `run`.
fn function_call<A: DeserializeOwned>(
    name: &str,
    arguments: &str,
    freeform: bool,
    run: impl FnOnce(A) -> Result<String, ToolError>,
) -> Result<String, ToolError> {
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
        ToolContext {
            cwd: dir.to_path_buf(),
        }
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
        assert_eq!(out, InvokeOutcome::ok("L2: beta\nL3: gamma".into()));
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
}
