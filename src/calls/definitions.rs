//! The model-facing tool definitions, stored verbatim (Responses API shape) so they stay
//! byte-exact, and reshaped for Chat Completions on request. exec_command, write_stdin,
//! view_image and the freeform apply_patch are the pinned Codex release's own
//! (tests/codex/tools-VERSION.json, checked by tests/it/codex_fidelity.rs); the tools that release
//! no longer lists (shell, shell_command, read_file, list_dir, grep_files, update_plan, the JSON
//! apply_patch) keep spec/tools.md §1's text.

use serde_json::{Map, Value};

/// The API shape of the definitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// OpenAI Responses API: function tools and custom (freeform) tools.
    Responses,
    /// Chat Completions: function tools only, nested under `function`.
    ChatCompletions,
}

/// A served tool's definition, in the Responses shape.
struct Definition {
    name: &'static str,
    json: &'static str,
}

const SHELL: Definition = Definition {
    name: "shell",
    json: include_str!("definitions/shell.json"),
};
const SHELL_COMMAND: Definition = Definition {
    name: "shell_command",
    json: include_str!("definitions/shell_command.json"),
};
const EXEC_COMMAND: Definition = Definition {
    name: "exec_command",
    json: include_str!("definitions/exec_command.json"),
};
const WRITE_STDIN: Definition = Definition {
    name: "write_stdin",
    json: include_str!("definitions/write_stdin.json"),
};
const READ_FILE: Definition = Definition {
    name: "read_file",
    json: include_str!("definitions/read_file.json"),
};
const LIST_DIR: Definition = Definition {
    name: "list_dir",
    json: include_str!("definitions/list_dir.json"),
};
const GREP_FILES: Definition = Definition {
    name: "grep_files",
    json: include_str!("definitions/grep_files.json"),
};
const UPDATE_PLAN: Definition = Definition {
    name: "update_plan",
    json: include_str!("definitions/update_plan.json"),
};
/// Without `detail`, as the pinned Codex (0.171) lists it by default: it lists `detail`
/// (`"enum": ["high", "original"]`) only when the model supports original detail and its stable,
/// default-on `unified_image_budget` feature is off. Invoke still honours `detail: "original"`.
const VIEW_IMAGE: Definition = Definition {
    name: "view_image",
    json: include_str!("definitions/view_image.json"),
};

/// Every stored function definition (apply_patch is built, see below).
const DEFINITIONS: &[&Definition] = &[
    &SHELL,
    &SHELL_COMMAND,
    &EXEC_COMMAND,
    &WRITE_STDIN,
    &READ_FILE,
    &LIST_DIR,
    &GREP_FILES,
    &UPDATE_PLAN,
    &VIEW_IMAGE,
];

/// Which shell tool a session offers (Codex's `ConfigShellToolType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ShellTool {
    /// `exec_command` + `write_stdin`: Codex's default.
    #[default]
    UnifiedExec,
    /// `shell_command`.
    ShellCommand,
    /// `shell`.
    Shell,
    /// No shell tool.
    None,
}

/// The apply_patch form a session offers (Codex's `ApplyPatchToolType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ApplyPatchTool {
    /// The custom tool with the Lark grammar: Codex's default. Chat Completions has no custom
    /// tools and gets the function form instead.
    #[default]
    Freeform,
    /// The function tool with one `input` parameter.
    Function,
    /// No apply_patch.
    None,
}

/// A session's tool set, mirroring Codex's `ToolsConfig`. The default is Codex's default set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolSet {
    pub shell: ShellTool,
    pub apply_patch: ApplyPatchTool,
    pub update_plan: bool,
    pub view_image: bool,
    /// The model takes no image input: view_image refuses (Codex checks the model's modalities).
    pub no_image_input: bool,
}

impl Default for ToolSet {
    fn default() -> Self {
        Self {
            shell: ShellTool::default(),
            apply_patch: ApplyPatchTool::default(),
            update_plan: true,
            view_image: true,
            no_image_input: false,
        }
    }
}

/// Codex's refusal of a tool the model cannot see (spec/tools.md §0).
pub fn unsupported_call(name: &str) -> String {
    format!("unsupported call: {name}")
}

/// view_image for a model without image input (`codex-rs/core/src/tools/handlers/view_image.rs`).
pub const VIEW_IMAGE_UNSUPPORTED: &str =
    "view_image is not allowed because you do not support image inputs";

/// Whether Codex lets the model call `name` in parallel with other calls
/// (`supports_parallel_tool_calls` in `codex-rs/core/src/tools/spec.rs`): the read-only file
/// tools, view_image and the command tools that start a command are; write_stdin (it drives one
/// running process), update_plan and apply_patch are not.
pub fn is_parallel_safe(name: &str) -> bool {
    matches!(
        name,
        "shell"
            | "shell_command"
            | "exec_command"
            | "read_file"
            | "list_dir"
            | "grep_files"
            | "view_image"
    )
}

impl ToolSet {
    /// The set a `ListTools` without a session lists: `shell` (as before sessions chose their
    /// shell tool) and Codex's defaults for the rest.
    pub fn sessionless() -> Self {
        Self {
            shell: ShellTool::Shell,
            ..Self::default()
        }
    }

    fn shell_definitions(&self) -> &'static [&'static Definition] {
        match self.shell {
            ShellTool::UnifiedExec => &[&EXEC_COMMAND, &WRITE_STDIN],
            ShellTool::ShellCommand => &[&SHELL_COMMAND],
            ShellTool::Shell => &[&SHELL],
            ShellTool::None => &[],
        }
    }

    /// The names the set lists, in order (before `exclude`).
    pub fn names(&self) -> Vec<&'static str> {
        let mut names: Vec<&'static str> =
            self.shell_definitions().iter().map(|d| d.name).collect();
        names.extend([READ_FILE.name, LIST_DIR.name, GREP_FILES.name]);
        if self.update_plan {
            names.push(UPDATE_PLAN.name);
        }
        if self.apply_patch != ApplyPatchTool::None {
            names.push("apply_patch");
        }
        if self.view_image {
            names.push(VIEW_IMAGE.name);
        }
        names
    }

    /// Whether Invoke runs a call to `name`: a listed tool, or, while any shell tool is
    /// offered, one of the shell aliases Codex always registers with it (`shell`,
    /// `container.exec`, `shell_command`; `codex-rs/core/src/tools/spec.rs`, "Always register
    /// shell aliases so older prompts remain compatible").
    pub fn accepts(&self, name: &str) -> bool {
        if self.shell != ShellTool::None
            && matches!(name, "shell" | "container.exec" | "shell_command")
        {
            return true;
        }
        self.names().contains(&name)
    }

    /// The model text for a call Invoke must not run, if any: `unsupported call: NAME` for a
    /// tool outside the set, Codex's image-input refusal for view_image.
    pub fn refusal(&self, name: &str) -> Option<String> {
        if !self.accepts(name) {
            return Some(unsupported_call(name));
        }
        if name == VIEW_IMAGE.name && self.no_image_input {
            return Some(VIEW_IMAGE_UNSUPPORTED.to_string());
        }
        None
    }
}

/// What `ListTools` answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedTools {
    /// The JSON array for the API request's `tools` field.
    pub json: String,
    /// The listed names, in order.
    pub names: Vec<&'static str>,
    /// The listed names that are parallel-safe, in order.
    pub parallel_safe: Vec<&'static str>,
}

/// The freeform apply_patch tool's Lark grammar (spec/tools.md §5.1), byte for byte.
const APPLY_PATCH_GRAMMAR: &str = include_str!("definitions/apply_patch.lark");
/// corral's description of the JSON apply_patch variant.
const APPLY_PATCH_JSON_DESCRIPTION: &str =
    include_str!("definitions/apply_patch_json_description.txt");

/// apply_patch as a custom (freeform) tool: the Responses API default.
fn apply_patch_freeform() -> String {
    serde_json::json!({
        "type": "custom",
        "name": "apply_patch",
        "description": "The `apply_patch` tool can be used to edit files. This is a FREEFORM tool, so do not wrap the patch in JSON.",
        "format": {"type": "grammar", "syntax": "lark", "definition": APPLY_PATCH_GRAMMAR},
    })
    .to_string()
}

/// apply_patch as a function tool with one `input` parameter (Chat Completions).
fn apply_patch_function() -> String {
    serde_json::json!({
        "type": "function",
        "name": "apply_patch",
        "description": APPLY_PATCH_JSON_DESCRIPTION,
        "strict": false,
        "parameters": {
            "type": "object",
            "properties": {"input": {"type": "string", "description": "The entire contents of the apply_patch command"}},
            "required": ["input"],
            "additionalProperties": false,
        },
    })
    .to_string()
}

/// Names of the tools `ListTools` offers without a session.
pub fn tool_names() -> Vec<&'static str> {
    ToolSet::sessionless().names()
}

#[cfg(test)]
/// The JSON array for the API request's `tools` field without a session, leaving out the names
/// in `exclude`.
pub fn tool_definitions(format: ToolFormat, exclude: &[String]) -> String {
    list_tools(&ToolSet::sessionless(), format, exclude).json
}

/// The tools of `set` in `format`, leaving out the names in `exclude`.
pub fn list_tools(set: &ToolSet, format: ToolFormat, exclude: &[String]) -> ListedTools {
    let mut items = Vec::new();
    let mut names = Vec::new();
    for name in set.names() {
        if exclude.iter().any(|e| e == name) {
            continue;
        }
        let json = match name {
            "apply_patch" => match (format, set.apply_patch) {
                (ToolFormat::Responses, ApplyPatchTool::Freeform) => Some(apply_patch_freeform()),
                (ToolFormat::Responses, _) => Some(apply_patch_function()),
                (ToolFormat::ChatCompletions, _) => chat_completions_shape(&apply_patch_function()),
            },
            _ => {
                let def = DEFINITIONS.iter().find(|d| d.name == name).map(|d| d.json);
                def.and_then(|json| match format {
                    ToolFormat::Responses => Some(json.to_string()),
                    ToolFormat::ChatCompletions => chat_completions_shape(json),
                })
            }
        };
        if let Some(json) = json {
            items.push(json);
            names.push(name);
        }
    }
    let parallel_safe = names
        .iter()
        .copied()
        .filter(|n| is_parallel_safe(n))
        .collect();
    ListedTools {
        json: format!("[{}]", items.join(",")),
        names,
        parallel_safe,
    }
}

/// `{"type":"function","function":{name, description, strict, parameters}}`; custom tools have
/// no Chat Completions form and are omitted (spec/tools.md §1).
fn chat_completions_shape(responses_json: &str) -> Option<String> {
    let Value::Object(mut tool) = serde_json::from_str::<Value>(responses_json).ok()? else {
        return None;
    };
    if tool.get("type") != Some(&Value::String("function".into())) {
        return None;
    }
    tool.shift_remove("type");
    let mut outer = Map::new();
    outer.insert("type".into(), Value::String("function".into()));
    outer.insert("function".into(), Value::Object(tool));
    Some(Value::Object(outer).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_definitions_are_the_spec_bytes() {
        let json = tool_definitions(ToolFormat::Responses, &[]);
        assert!(json.starts_with(
            r#"[{"type":"function","name":"shell","description":"Runs a shell command"#
        ));
        let parsed: Vec<Value> = serde_json::from_str(&json).unwrap();
        assert_eq!(parsed.len(), tool_names().len());
        let patch = parsed.iter().find(|t| t["name"] == "apply_patch").unwrap();
        assert_eq!(patch["type"], "custom");
        let grammar = patch["format"]["definition"].as_str().unwrap();
        assert_eq!(grammar.len(), 578);
        assert!(grammar.starts_with("start: begin_patch hunk+ end_patch\n"));
        assert!(json.contains(r#""format":{"type":"grammar","syntax":"lark","definition":"start: begin_patch hunk+ end_patch\nbegin_patch: \"*** Begin Patch\" LF\nend_patch: \"*** End Patch\" LF?\n\nhunk: add_hunk | delete_hunk | update_hunk\nadd_hunk: \"*** Add File: \" filename LF add_line+\ndelete_hunk: \"*** Delete File: \" filename LF\nupdate_hunk: \"*** Update File: \" filename LF change_move? change?\n\nfilename: /(.+)/\nadd_line: \"+\" /(.*)/ LF -> line\n\nchange_move: \"*** Move to: \" filename LF\nchange: (change_context | change_line)+ eof_line?\nchange_context: (\"@@\" | \"@@ \" /(.+)/) LF\nchange_line: (\"+\" | \"-\" | \" \") /(.*)/ LF\neof_line: \"*** End of File\" LF\n\n%import common.LF\n"}}"#));
        for d in DEFINITIONS {
            assert!(!d.json.ends_with('\n'));
            let v: Value = serde_json::from_str(d.json).unwrap();
            assert_eq!(v["name"], d.name);
            // Byte-stable: re-serialising (preserve_order) gives the stored bytes.
            assert_eq!(v.to_string(), d.json, "{} is canonical", d.name);
        }
        for d in [
            &SHELL,
            &READ_FILE,
            &LIST_DIR,
            &GREP_FILES,
            &UPDATE_PLAN,
            &VIEW_IMAGE,
        ] {
            assert!(json.contains(d.json), "{} stored verbatim", d.name);
        }
    }

    #[test]
    fn each_shell_tool_lists_its_definitions() {
        let names = |shell| {
            ToolSet {
                shell,
                ..ToolSet::default()
            }
            .names()
        };
        let rest = [
            "read_file",
            "list_dir",
            "grep_files",
            "update_plan",
            "apply_patch",
            "view_image",
        ];
        let with = |first: &[&'static str]| [first, &rest[..]].concat();
        assert_eq!(
            names(ShellTool::UnifiedExec),
            with(&["exec_command", "write_stdin"])
        );
        assert_eq!(names(ShellTool::ShellCommand), with(&["shell_command"]));
        assert_eq!(names(ShellTool::Shell), with(&["shell"]));
        assert_eq!(names(ShellTool::None), with(&[]));
        assert_eq!(ToolSet::default().shell, ShellTool::UnifiedExec);
    }

    #[test]
    fn listing_follows_the_set_and_marks_parallel_tools() {
        let set = ToolSet {
            shell: ShellTool::ShellCommand,
            apply_patch: ApplyPatchTool::Function,
            update_plan: false,
            view_image: false,
            no_image_input: false,
        };
        let listed = list_tools(&set, ToolFormat::Responses, &[]);
        assert_eq!(
            listed.names,
            [
                "shell_command",
                "read_file",
                "list_dir",
                "grep_files",
                "apply_patch"
            ]
        );
        assert_eq!(
            listed.parallel_safe,
            ["shell_command", "read_file", "list_dir", "grep_files"]
        );
        let parsed: Vec<Value> = serde_json::from_str(&listed.json).unwrap();
        let names: Vec<_> = parsed.iter().map(|t| t["name"].as_str().unwrap()).collect();
        assert_eq!(names, listed.names);
        assert_eq!(parsed[4]["type"], "function");
        assert!(listed.json.starts_with(&format!("[{}", SHELL_COMMAND.json)));

        let unified = list_tools(&ToolSet::default(), ToolFormat::Responses, &[]);
        assert_eq!(
            unified.parallel_safe,
            [
                "exec_command",
                "read_file",
                "list_dir",
                "grep_files",
                "view_image"
            ]
        );
    }

    #[test]
    fn refusals_follow_the_set() {
        let none = ToolSet {
            shell: ShellTool::None,
            apply_patch: ApplyPatchTool::None,
            update_plan: false,
            view_image: false,
            no_image_input: false,
        };
        for name in [
            "shell",
            "container.exec",
            "shell_command",
            "exec_command",
            "apply_patch",
        ] {
            assert_eq!(
                none.refusal(name),
                Some(format!("unsupported call: {name}"))
            );
        }
        assert_eq!(none.refusal("read_file"), None);
        let unified = ToolSet::default();
        // Codex keeps the shell aliases registered whatever shell tool it lists.
        for name in [
            "shell",
            "container.exec",
            "shell_command",
            "exec_command",
            "write_stdin",
        ] {
            assert_eq!(unified.refusal(name), None, "{name}");
        }
        let shell = ToolSet::sessionless();
        assert_eq!(
            shell.refusal("write_stdin").as_deref(),
            Some("unsupported call: write_stdin")
        );
        let blind = ToolSet {
            no_image_input: true,
            ..ToolSet::default()
        };
        assert_eq!(
            blind.refusal("view_image").as_deref(),
            Some(VIEW_IMAGE_UNSUPPORTED)
        );
    }

    #[test]
    fn chat_completions_nests_the_function_with_nothing_else_on_top() {
        let json = tool_definitions(ToolFormat::ChatCompletions, &[]);
        let parsed: Vec<Value> = serde_json::from_str(&json).unwrap();
        for tool in &parsed {
            let obj = tool.as_object().unwrap();
            assert_eq!(obj.keys().collect::<Vec<_>>(), ["type", "function"]);
            let f = obj["function"].as_object().unwrap();
            assert_eq!(
                f.keys().collect::<Vec<_>>(),
                ["name", "description", "strict", "parameters"]
            );
            assert_eq!(f["strict"], Value::Bool(false));
        }
        assert!(
            json.starts_with(r#"[{"type":"function","function":{"name":"shell","description":"#)
        );
    }

    #[test]
    fn exclude_leaves_tools_out() {
        let json = tool_definitions(ToolFormat::Responses, &["read_file".to_string()]);
        assert!(!json.contains(r#""name":"read_file""#));
        assert!(json.contains(r#""name":"list_dir""#));
    }
}
