//! The model-facing tool definitions, stored verbatim from spec/tools.md §1 (Responses API
//! shape) so they stay byte-exact, and reshaped for Chat Completions on request.

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

/// Every tool the bridge serves, in the order they are listed.
const DEFINITIONS: &[Definition] = &[
    Definition {
        name: "shell",
        json: include_str!("definitions/shell.json"),
    },
    Definition {
        name: "read_file",
        json: include_str!("definitions/read_file.json"),
    },
    Definition {
        name: "list_dir",
        json: include_str!("definitions/list_dir.json"),
    },
    Definition {
        name: "grep_files",
        json: include_str!("definitions/grep_files.json"),
    },
];

/// Tools the bridge serves but does not list by default (the unified-exec pair, listed when a
/// session enables unified exec).
const UNLISTED: &[Definition] = &[
    Definition {
        name: "exec_command",
        json: include_str!("definitions/exec_command.json"),
    },
    Definition {
        name: "write_stdin",
        json: include_str!("definitions/write_stdin.json"),
    },
];

/// The Responses-shape definition of a function tool the bridge serves, listed or not.
pub fn function_definition(name: &str) -> Option<&'static str> {
    DEFINITIONS
        .iter()
        .chain(UNLISTED)
        .find(|d| d.name == name)
        .map(|d| d.json)
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
        "description": "Use the `apply_patch` tool to edit files. This is a FREEFORM tool, so do not wrap the patch in JSON.",
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

/// Names of the tools `ListTools` offers.
pub fn tool_names() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = DEFINITIONS.iter().map(|d| d.name).collect();
    names.push("apply_patch");
    names
}

/// The JSON array for the API request's `tools` field, leaving out the names in `exclude`.
pub fn tool_definitions(format: ToolFormat, exclude: &[String]) -> String {
    let mut items: Vec<String> = DEFINITIONS
        .iter()
        .filter(|d| !exclude.iter().any(|e| e == d.name))
        .filter_map(|d| match format {
            ToolFormat::Responses => Some(d.json.to_string()),
            ToolFormat::ChatCompletions => chat_completions_shape(d.json),
        })
        .collect();
    if !exclude.iter().any(|e| e == "apply_patch") {
        items.push(match format {
            ToolFormat::Responses => apply_patch_freeform(),
            ToolFormat::ChatCompletions => {
                chat_completions_shape(&apply_patch_function()).unwrap_or_default()
            }
        });
    }
    format!("[{}]", items.join(","))
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
        assert_eq!(parsed.len(), DEFINITIONS.len() + 1);
        let patch = parsed.last().unwrap();
        assert_eq!(patch["type"], "custom");
        let grammar = patch["format"]["definition"].as_str().unwrap();
        assert_eq!(grammar.len(), 578);
        assert!(grammar.starts_with("start: begin_patch hunk+ end_patch\n"));
        assert!(json.ends_with(r#""format":{"type":"grammar","syntax":"lark","definition":"start: begin_patch hunk+ end_patch\nbegin_patch: \"*** Begin Patch\" LF\nend_patch: \"*** End Patch\" LF?\n\nhunk: add_hunk | delete_hunk | update_hunk\nadd_hunk: \"*** Add File: \" filename LF add_line+\ndelete_hunk: \"*** Delete File: \" filename LF\nupdate_hunk: \"*** Update File: \" filename LF change_move? change?\n\nfilename: /(.+)/\nadd_line: \"+\" /(.*)/ LF -> line\n\nchange_move: \"*** Move to: \" filename LF\nchange: (change_context | change_line)+ eof_line?\nchange_context: (\"@@\" | \"@@ \" /(.+)/) LF\nchange_line: (\"+\" | \"-\" | \" \") /(.*)/ LF\neof_line: \"*** End of File\" LF\n\n%import common.LF\n"}}]"#));
        for d in DEFINITIONS {
            assert!(json.contains(d.json), "{} stored verbatim", d.name);
            assert!(!d.json.ends_with('\n'));
        }
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
    fn unified_exec_definitions_are_served_but_not_listed() {
        let listed = tool_definitions(ToolFormat::Responses, &[]);
        assert!(!listed.contains(r#""name":"exec_command""#));
        assert!(!listed.contains(r#""name":"write_stdin""#));
        let exec = function_definition("exec_command").unwrap();
        assert!(exec.starts_with(r#"{"type":"function","name":"exec_command","description":"Runs a command in a PTY, returning output or a session ID for ongoing interaction.","strict":false,"parameters":{"type":"object","properties":{"cmd":{"type":"string","description":"Shell command to execute."},"#));
        assert!(exec.ends_with(r#""required":["cmd"],"additionalProperties":false}}"#));
        let v: Value = serde_json::from_str(exec).unwrap();
        let props: Vec<&String> = v["parameters"]["properties"]
            .as_object()
            .unwrap()
            .keys()
            .collect();
        assert_eq!(
            props,
            [
                "cmd",
                "justification",
                "login",
                "max_output_tokens",
                "prefix_rule",
                "sandbox_permissions",
                "shell",
                "tty",
                "workdir",
                "yield_time_ms"
            ]
        );
        let write = function_definition("write_stdin").unwrap();
        assert_eq!(
            write,
            r#"{"type":"function","name":"write_stdin","description":"Writes characters to an existing unified exec session and returns recent output.","strict":false,"parameters":{"type":"object","properties":{"chars":{"type":"string","description":"Bytes to write to stdin (may be empty to poll)."},"max_output_tokens":{"type":"number","description":"Maximum number of tokens to return. Excess output will be truncated."},"session_id":{"type":"number","description":"Identifier of the running unified exec session."},"yield_time_ms":{"type":"number","description":"How long to wait (in milliseconds) for output before yielding."}},"required":["session_id"],"additionalProperties":false}}"#
        );
        assert!(chat_completions_shape(write).is_some());
    }

    #[test]
    fn exclude_leaves_tools_out() {
        let json = tool_definitions(ToolFormat::Responses, &["read_file".to_string()]);
        assert!(!json.contains(r#""name":"read_file""#));
        assert!(json.contains(r#""name":"list_dir""#));
    }
}
