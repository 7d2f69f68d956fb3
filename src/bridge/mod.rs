//! The function-call bridge: model-facing tool definitions (`ListTools`) and dispatch of a
//! model's tool call to the tool, returning exactly the text and success flag Codex would send
//! back to the model (`Invoke`). No gRPC types here: the daemon converts at its edge.

mod definitions;
mod invoke;

pub use definitions::{
    ApplyPatchTool, ListedTools, ShellTool, ToolFormat, ToolSet, VIEW_IMAGE_UNSUPPORTED,
    is_parallel_safe, list_tools, tool_definitions, tool_names, unsupported_call,
};
pub use invoke::{
    ContentItem, InvokeOutcome, ShellCommand, ToolEffects, intercept_apply_patch,
    intercepts_apply_patch, invoke, is_shell_tool, tool_effects,
};
