//! What a call is, in one place: the model-facing tool definitions (`ListTools`), dispatch of a
//! model's tool call to the tool, returning exactly the text and success flag Codex would send
//! back to the model (`Invoke`). No gRPC types here: the daemon converts at its edge.

mod definitions;
pub mod facts;
mod model;
mod tool_call;

pub use definitions::{ApplyPatchTool, ShellTool, ToolFormat, ToolSet, list_tools, tool_names};
pub use model::{
    ContentItem, InvokeOutcome, intercepts_apply_patch, invoke, is_shell_tool, takes_a_patch,
    tool_effects,
};
