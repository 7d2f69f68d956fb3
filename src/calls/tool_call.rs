//! A model's call (`Invoke`) as the daemon decides about it: its name and its arguments,
//! parsed once. Every fact the pipeline needs about it — does it ask for escalation, the
//! command it would run, the paths and process it names, is it a patch typed into a shell —
//! is read from this one parse, which travels with the call (`pipeline::admit::Trace`).

use crate::api;
use crate::tools::apply_patch::invocation::{Invocation, classify_argv, classify_script};
use crate::tools::shell::{ShellArgs, ShellCommandArgs};
use crate::tools::unified_exec::ExecCommandArgs;
use serde::de::DeserializeOwned;
use serde_json::Value;

pub struct ToolCall {
    name: String,
    /// A freeform call's input is the raw text (a patch), not JSON.
    freeform: bool,
    /// The arguments as JSON, when they are JSON.
    args: Option<Value>,
}

#[cfg(test)]
thread_local! {
    /// JSON parses of a model call's arguments on this thread (the one-parse test).
    pub static PARSES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

impl ToolCall {
    /// The one parse of the call's arguments.
    pub fn parse(r: &api::InvokeRequest) -> ToolCall {
        ToolCall::new(&r.name, &r.arguments, r.freeform)
    }

    /// A call named `name` with `arguments` (the raw input of a freeform call).
    pub fn new(name: &str, arguments: &str, freeform: bool) -> ToolCall {
        #[cfg(test)]
        PARSES.with(|n| n.set(n.get() + 1));
        let args = (!freeform)
            .then(|| serde_json::from_str(arguments).ok())
            .flatten();
        ToolCall {
            name: name.to_string(),
            freeform,
            args,
        }
    }

    fn member(&self, key: &str) -> Option<&Value> {
        self.args.as_ref()?.as_object()?.get(key)
    }

    /// The arguments as a tool's argument type, as the tool itself would read them.
    fn typed<A: DeserializeOwned>(&self) -> Option<A> {
        crate::tools::arguments_from_value(self.args.as_ref()?)
    }

    pub fn shell_args(&self) -> Option<ShellArgs> {
        matches!(self.name.as_str(), "shell" | "container.exec")
            .then(|| self.typed())
            .flatten()
    }

    pub fn shell_command_args(&self) -> Option<ShellCommandArgs> {
        (self.name == "shell_command")
            .then(|| self.typed())
            .flatten()
    }

    pub fn exec_command_args(&self) -> Option<ExecCommandArgs> {
        (self.name == "exec_command")
            .then(|| self.typed())
            .flatten()
    }

    /// A patch typed into a shell tool: applied, not run; it never escalates and is never
    /// asked about (spec/tools.md §5.6).
    pub fn intercepts_apply_patch(&self) -> bool {
        let form = if let Some(a) = self.shell_args() {
            Some(classify_argv(&a.command))
        } else if let Some(a) = self.shell_command_args() {
            Some(classify_script(&a.command))
        } else {
            self.exec_command_args().map(|a| classify_script(&a.cmd))
        };
        form.is_some_and(|f| f != Invocation::NotPatch)
    }

    /// Whether a shell tool's call asks to run outside the sandbox (either spelling).
    pub fn asks_for_escalation(&self) -> bool {
        if !super::is_shell_tool(&self.name) || self.intercepts_apply_patch() {
            return false;
        }
        self.member("sandbox_permissions").and_then(Value::as_str) == Some("require_escalated")
            || self
                .member("with_escalated_permissions")
                .and_then(Value::as_bool)
                == Some(true)
    }

    /// The paths a patch names, or the argv or paths the arguments name (never contents).
    pub fn targets(&self, raw_arguments: &str) -> Vec<String> {
        if self.name == "apply_patch" {
            let patch = if self.freeform {
                raw_arguments.to_string()
            } else {
                self.member("input")
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .unwrap_or_default()
            };
            return super::facts::patch_paths(&patch);
        }
        let Some(Value::Object(args)) = &self.args else {
            return Vec::new();
        };
        let strings = |v: &Value| -> Vec<String> {
            match v {
                Value::String(s) => vec![s.clone()],
                Value::Array(a) => a
                    .iter()
                    .filter_map(|x| x.as_str().map(str::to_string))
                    .collect(),
                _ => Vec::new(),
            }
        };
        // `cmd`: exec_command's script.
        ["command", "cmd", "file_path", "dir_path", "path"]
            .iter()
            .filter_map(|k| args.get(*k))
            .flat_map(strings)
            .collect()
    }

    /// write_stdin's `session_id`: the process it talks to.
    pub fn named_process(&self) -> Option<i32> {
        if self.name != "write_stdin" {
            return None;
        }
        self.member("session_id")?
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())
    }

    /// write_stdin's process and how many bytes it writes.
    pub fn stdin(&self) -> Option<(i32, usize)> {
        let id = self.named_process()?;
        let bytes = self
            .member("chars")
            .and_then(Value::as_str)
            .map_or(0, str::len);
        Some((id, bytes))
    }
}
