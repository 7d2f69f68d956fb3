//! The README's MCP recipes, run by the real clients they are written for (issue 21: every real
//! client works as written). Each client is the pinned release CI installs — Codex
//! (`tests/codex/VERSION`, CORRAL_CODEX) and Claude Code (`tests/claude/VERSION`,
//! CORRAL_CLAUDE) — configured exactly as the README's "MCP" section says, with `corral mcp`
//! pointed at a real daemon; the model is a scripted mock on loopback that calls corral's tools.
//! Judged on the host: what the sandbox may write is there, what it may not is not, and the
//! daemon's audit log has each call.

use crate::codex_support::{
    self, MockModel, Turn, codex, codex_exec, codex_home, message, output_of,
};
use crate::common::{self, Daemon, outside, scratch};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// The `corral mcp` arguments of the README's recipes, for a daemon at `socket` and a project at
/// `ws`: a workspace-write session there.
fn recipe_args(socket: &Path, ws: &Path) -> Vec<String> {
    let mut args: Vec<String> = [
        "mcp",
        "--socket",
        socket.to_str().unwrap(),
        "--mode",
        "workspace-write",
        "--cwd",
        ws.to_str().unwrap(),
    ]
    .map(String::from)
    .to_vec();
    // The test daemons' sockets lie under /var/tmp, so the recipe needs no
    // `--exclude-slash-tmp`; one under /tmp would (the README says so).
    if socket.starts_with("/tmp") {
        args.push("--exclude-slash-tmp".into());
    }
    args
}

/// One line per call of the daemon's audit log.
fn audit_lines(log: &Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The audit line of the call of `tool` whose targets mention `needle`.
fn audited<'a>(lines: &'a [Value], tool: &str, needle: &str) -> Option<&'a Value> {
    lines
        .iter()
        .find(|l| l["tool"] == tool && l["targets"].to_string().contains(needle))
}

/// The command the model runs through corral's exec_command: a write inside the workspace and
/// one outside it (`leak`, in no writable root).
fn write_command(leak: &Path) -> String {
    codex_support::sandboxed_writes_command(leak, "made-by-corral")
}

// ---------------------------------------------------------------------------------------------
// Codex

/// A model function call of a tool in `namespace` (how Codex 0.171 names an MCP server's tools
/// once `tool_search` has exposed them: namespace `mcp__SERVER`, the tool's own name).
fn namespaced_call(namespace: &str, name: &str, call_id: &str, arguments: Value) -> Value {
    json!({"type": "function_call", "namespace": namespace, "name": name, "call_id": call_id,
           "arguments": arguments.to_string()})
}

/// The text Codex sent back for call `call_id`: an MCP tool's output is a list of content
/// items; their texts, joined.
fn text_of(request: &Value, call_id: &str) -> String {
    let raw = output_of(request, call_id);
    match serde_json::from_str::<Value>(&raw) {
        Ok(Value::Array(items)) => items
            .iter()
            .filter_map(|i| i["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => raw,
    }
}

/// The tools `tool_search` call `call_id` exposed to the model, as `(namespace, name)`.
fn searched_tools(request: &Value, call_id: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for item in request["input"].as_array().into_iter().flatten() {
        if item["type"] != "tool_search_output" || item["call_id"] != call_id {
            continue;
        }
        for ns in item["tools"].as_array().into_iter().flatten() {
            for tool in ns["tools"].as_array().into_iter().flatten() {
                found.push((
                    ns["name"].as_str().unwrap_or_default().to_string(),
                    tool["name"].as_str().unwrap_or_default().to_string(),
                ));
            }
        }
    }
    found
}

/// The README's Codex recipe: `[mcp_servers.corral]` in `config.toml` with
/// `default_tools_approval_mode = "approve"`, and `codex exec`. The mock model does what a model
/// does with Codex 0.171 (MCP tools are deferred: not in the request's `tools`, found through
/// `tool_search`): it searches, gets corral's tools as namespace `mcp__corral`, runs
/// exec_command (a write inside the workspace and one outside) and read_file through them.
#[tokio::test]
async fn codex_runs_corrals_tools_through_the_readme_recipe() {
    codex_turn(true).await;
}

/// The recipe without its `default_tools_approval_mode` line, as the README says: `codex exec`
/// still runs the read-only read_file, and refuses exec_command (nothing runs, nothing written).
#[tokio::test]
async fn codex_without_the_approval_line_runs_only_the_read_only_tools() {
    codex_turn(false).await;
}

/// A turn's stage: a daemon with its audit log, a workspace holding `host.txt`, and a path
/// outside every writable root that the sandboxed command tries to write.
struct Stage {
    daemon: Daemon,
    audit: PathBuf,
    ws_path: PathBuf,
    leak: PathBuf,
    _dirs: [tempfile::TempDir; 3],
}

impl Stage {
    async fn new() -> Stage {
        let logs = outside();
        let audit = logs.path().join("audit.log");
        let daemon = Daemon::start(&["--audit-log", audit.to_str().unwrap()]).await;
        let ws = scratch();
        let ws_path = std::fs::canonicalize(ws.path()).unwrap();
        std::fs::write(ws_path.join("host.txt"), "written-on-the-host\n").unwrap();
        let forbidden = outside();
        let leak = forbidden.path().join("leak");
        Stage {
            daemon,
            audit,
            ws_path,
            leak,
            _dirs: [logs, ws, forbidden],
        }
    }
}

async fn codex_turn(approve: bool) {
    // Fail early, before a daemon starts, when the pinned Codex is missing.
    codex();
    let stage = Stage::new().await;
    let d = &stage.daemon;
    let (audit, ws_path, leak) = (
        stage.audit.clone(),
        stage.ws_path.clone(),
        stage.leak.clone(),
    );
    let cmd = write_command(&leak);

    let turns: Vec<Turn> = vec![
        Box::new(|_| {
            vec![
                json!({"type": "tool_search_call", "call_id": "s1", "execution": "client",
                        "status": "completed",
                        "arguments": {"query": "corral exec_command read_file", "limit": 20}}),
            ]
        }),
        Box::new(move |_| {
            vec![namespaced_call(
                "mcp__corral",
                "exec_command",
                "c1",
                json!({"cmd": cmd, "yield_time_ms": 10000}),
            )]
        }),
        Box::new(|_| {
            vec![namespaced_call(
                "mcp__corral",
                "read_file",
                "c2",
                json!({"file_path": "host.txt"}),
            )]
        }),
        Box::new(|_| vec![message("done")]),
    ];
    let model = MockModel::start(turns).await;
    let home = codex_home(&model);
    // The README's recipe, with this test's binary, daemon and workspace.
    let toml_str = |s: &str| serde_json::to_string(s).unwrap();
    let args: Vec<String> = recipe_args(&d.socket, &ws_path)
        .iter()
        .map(|a| toml_str(a))
        .collect();
    let mut config = std::fs::read_to_string(home.path().join("config.toml")).unwrap();
    config.push_str(&format!(
        "\n[mcp_servers.corral]\ncommand = {}\nargs = [{}]\n",
        toml_str(common::CORRAL),
        args.join(", ")
    ));
    if approve {
        config.push_str("default_tools_approval_mode = \"approve\"\n");
    }
    std::fs::write(home.path().join("config.toml"), config).unwrap();

    let started = std::time::Instant::now();
    let (code, out) = codex_exec(home.path(), None, &ws_path, "workspace-write").await;
    assert_eq!(code, 0, "{out}");
    let requests = model.requests();
    assert_eq!(requests.len(), 4, "{out}");
    // MCP tools are deferred in Codex 0.171: the first request lists none of corral's tools,
    // only tool_search, which finds them as namespace mcp__corral.
    let first_tools = requests[0]["tools"].to_string();
    assert!(first_tools.contains("\"tool_search\""), "{first_tools}");
    assert!(!first_tools.contains("mcp__corral"), "{first_tools}");
    let found = searched_tools(&requests[1], "s1");
    for tool in ["exec_command", "read_file"] {
        assert!(
            found.contains(&("mcp__corral".to_string(), tool.to_string())),
            "tool_search found {found:?}"
        );
    }
    let c1 = text_of(&requests[2], "c1");
    let lines = audit_lines(&audit);
    if approve {
        // exec_command ran in corral's sandbox.
        codex_support::assert_sandboxed_writes(&ws_path, &leak, &c1, "made-by-corral");
        let exec = audited(&lines, "exec_command", "made-by-corral > inside.txt")
            .unwrap_or_else(|| panic!("no exec_command in the audit log: {lines:?}"));
        assert_eq!(exec["mode"], "workspace-write", "{exec}");
    } else {
        // Refused by Codex before it reached corral.
        assert!(c1.contains("requires approval"), "{c1}");
        assert!(!ws_path.join("inside.txt").exists());
        assert!(
            lines.iter().all(|l| l["tool"] != "exec_command"),
            "{lines:?}"
        );
    }
    // The read-only tool answered, with no approval asked, and the daemon ran it.
    let c2 = text_of(&requests[3], "c2");
    assert!(c2.contains("written-on-the-host"), "{c2}");
    let read = audited(&lines, "read_file", "host.txt")
        .unwrap_or_else(|| panic!("no read_file in the audit log: {lines:?}"));
    assert_eq!(read["outcome"], "ok", "{read}");
    assert_eq!(read["mode"], "workspace-write", "{read}");
    eprintln!("codex exec with corral mcp: {:?}", started.elapsed());
}

// ---------------------------------------------------------------------------------------------
// Claude Code

/// The pinned Claude Code: CORRAL_CLAUDE, else where `.ci/run` installs it.
fn claude() -> PathBuf {
    codex_support::pinned_npm_bin(
        "Claude Code",
        "claude",
        "CORRAL_CLAUDE",
        "claude-code",
        "@anthropic-ai/claude-code",
        "claude",
    )
}

/// A scripted Claude: the answer to a request is the content blocks (`tool_use`, `text`) of the
/// turn numbered by how many tool results the request's conversation holds (0 for the prompt
/// alone), so a request Claude Code makes on the side does not move the script on.
type ClaudeTurn = Box<dyn Fn(&Value) -> Vec<Value> + Send + Sync>;

/// A mock of the Anthropic Messages API on loopback (`ANTHROPIC_BASE_URL`): `POST /v1/messages`
/// answered from the script, streamed as Claude Code asks (SSE: message_start, per block
/// content_block_start/delta/stop, message_delta with the stop reason, message_stop) or as one
/// JSON message; `count_tokens` answered; anything else 404.
struct MockClaude {
    url: String,
    requests: Arc<Mutex<Vec<Value>>>,
}

impl MockClaude {
    async fn start(turns: Vec<ClaudeTurn>) -> MockClaude {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let requests: Arc<Mutex<Vec<Value>>> = Arc::default();
        let turns = Arc::new(turns);
        let seen = requests.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (turns, seen) = (turns.clone(), seen.clone());
                tokio::spawn(async move {
                    let _ = serve_claude(stream, turns, seen).await;
                });
            }
        });
        MockClaude { url, requests }
    }

    /// The `/v1/messages` requests received, in order.
    fn requests(&self) -> Vec<Value> {
        self.requests.lock().unwrap().clone()
    }
}

/// The `tool_result` blocks of a Messages request's conversation, in order.
fn tool_results(request: &Value) -> Vec<Value> {
    request["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        .filter(|c| c["type"] == "tool_result")
        .collect()
}

/// The text of the tool result for `tool_use_id` in a request (a string or text blocks).
fn tool_result_text(request: &Value, tool_use_id: &str) -> String {
    let results = tool_results(request);
    let Some(result) = results.iter().find(|r| r["tool_use_id"] == tool_use_id) else {
        return String::new();
    };
    match &result["content"] {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .map(|b| match b["text"].as_str() {
                Some(t) => t.to_string(),
                None => b.to_string(),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        other => other.to_string(),
    }
}

fn tool_use(id: &str, name: &str, input: Value) -> Value {
    json!({"type": "tool_use", "id": id, "name": name, "input": input})
}

fn text_block(text: &str) -> Value {
    json!({"type": "text", "text": text})
}

async fn serve_claude(
    stream: TcpStream,
    turns: Arc<Vec<ClaudeTurn>>,
    seen: Arc<Mutex<Vec<Value>>>,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream);
    while let Some((head, body)) = codex_support::read_request(&mut reader).await? {
        let line = head.first().cloned().unwrap_or_default();
        let json_answer = |status: &str, body: Value| {
            let body = body.to_string();
            format!(
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n\
                 {body}",
                body.len()
            )
        };
        let response = if line.starts_with("POST /v1/messages/count_tokens") {
            json_answer("200 OK", json!({"input_tokens": 1}))
        } else if line.starts_with("POST /v1/messages") {
            let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let n = {
                let mut seen = seen.lock().unwrap();
                seen.push(request.clone());
                seen.len()
            };
            let blocks = match turns.get(tool_results(&request).len()) {
                Some(turn) => turn(&request),
                None => vec![text_block("done")],
            };
            let stop = if blocks.iter().any(|b| b["type"] == "tool_use") {
                "tool_use"
            } else {
                "end_turn"
            };
            let id = format!("msg_{n}");
            let usage = json!({"input_tokens": 1, "output_tokens": 1});
            if request["stream"] == true {
                let mut events = vec![json!({"type": "message_start", "message": {
                    "id": id, "type": "message", "role": "assistant", "model": request["model"],
                    "content": [], "stop_reason": null, "stop_sequence": null, "usage": usage}})];
                for (index, block) in blocks.iter().enumerate() {
                    let (start, delta) = if block["type"] == "tool_use" {
                        (
                            json!({"type": "tool_use", "id": block["id"], "name": block["name"],
                                   "input": {}}),
                            json!({"type": "input_json_delta",
                                   "partial_json": block["input"].to_string()}),
                        )
                    } else {
                        (
                            json!({"type": "text", "text": ""}),
                            json!({"type": "text_delta", "text": block["text"]}),
                        )
                    };
                    events.push(json!({"type": "content_block_start", "index": index,
                                       "content_block": start}));
                    events.push(
                        json!({"type": "content_block_delta", "index": index, "delta": delta}),
                    );
                    events.push(json!({"type": "content_block_stop", "index": index}));
                }
                events.push(json!({"type": "message_delta", "delta": {
                    "stop_reason": stop, "stop_sequence": null}, "usage": {"output_tokens": 1}}));
                events.push(json!({"type": "message_stop"}));
                let sse: String = events
                    .iter()
                    .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap()))
                    .collect();
                format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\
                     \r\n{sse}",
                    sse.len()
                )
            } else {
                json_answer(
                    "200 OK",
                    json!({"id": id, "type": "message", "role": "assistant",
                           "model": request["model"], "content": blocks, "stop_reason": stop,
                           "stop_sequence": null, "usage": usage}),
                )
            }
        } else {
            json_answer(
                "404 Not Found",
                json!({"type": "error", "error": {"type": "not_found_error", "message": line}}),
            )
        };
        reader.get_mut().write_all(response.as_bytes()).await?;
    }
    Ok(())
}

/// Claude Code's own state for one test: its config directory and HOME, both fresh (nothing of
/// this machine's user settings), in the project `ws`.
struct ClaudeHome {
    dir: tempfile::TempDir,
}

impl ClaudeHome {
    fn new() -> ClaudeHome {
        ClaudeHome { dir: outside() }
    }

    /// `claude ARGS...` in `cwd` with a clean environment: PATH, this HOME and config dir, the
    /// mock as the API (when given) with a dummy key, and no traffic but the model's.
    async fn run(&self, cwd: &Path, model: Option<&MockClaude>, args: &[&str]) -> (i32, String) {
        let home = self.dir.path().join("home");
        std::fs::create_dir_all(&home).unwrap();
        let mut cmd = tokio::process::Command::new(claude());
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", &home)
            .env("CLAUDE_CONFIG_DIR", self.dir.path().join("config"))
            .env("DISABLE_TELEMETRY", "1")
            .env("DISABLE_ERROR_REPORTING", "1")
            .env("DISABLE_AUTOUPDATER", "1")
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1");
        if let Some(model) = model {
            cmd.env("ANTHROPIC_BASE_URL", &model.url)
                .env("ANTHROPIC_API_KEY", "sk-ant-test-dummy");
        }
        let out = cmd
            .args(args)
            .current_dir(cwd)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(Duration::from_secs(50), out)
            .await
            .unwrap_or_else(|_| panic!("claude {args:?} did not finish in 50 s"))
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }

    /// The README's `claude mcp add corral -- corral mcp ...`, run in the project `ws`.
    async fn add_corral(&self, name: &str, socket: &Path, ws: &Path) {
        let recipe = recipe_args(socket, ws);
        let mut args = vec!["mcp", "add", name, "--", common::CORRAL];
        args.extend(recipe.iter().map(String::as_str));
        let (code, out) = self.run(ws, None, &args).await;
        assert_eq!(code, 0, "{out}");
        assert!(
            out.contains(&format!("Added stdio MCP server {name}")),
            "{out}"
        );
    }
}

/// How the Claude Code test configures corral.
enum ClaudeRecipe {
    /// `claude mcp add corral -- corral mcp ...` in the project (its local config).
    McpAdd,
    /// A JSON file of `mcpServers` given with `--mcp-config FILE`.
    McpConfigFile,
}

/// The README's Claude Code recipe and `claude -p PROMPT --allowedTools mcp__corral`. The mock
/// model does what a model does with Claude Code 2.1 (MCP tools are deferred: named in the
/// system prompt, their schemas loaded with ToolSearch): it selects corral's exec_command and
/// read_file, runs exec_command (a write inside the workspace and one outside), read_file,
/// and ends the turn.
#[tokio::test]
async fn claude_code_runs_corrals_tools_through_the_readme_recipe() {
    claude_turn(ClaudeRecipe::McpAdd).await;
}

/// The same turn with the recipe's server as a `--mcp-config` file (the `mcpServers` JSON that
/// Claude Desktop's config and a project's `.mcp.json` hold too).
#[tokio::test]
async fn claude_code_runs_corrals_tools_from_an_mcp_config_file() {
    claude_turn(ClaudeRecipe::McpConfigFile).await;
}

async fn claude_turn(recipe: ClaudeRecipe) {
    // Fail early, before a daemon starts, when the pinned Claude Code is missing.
    claude();
    let stage = Stage::new().await;
    let d = &stage.daemon;
    let (audit, ws_path, leak) = (
        stage.audit.clone(),
        stage.ws_path.clone(),
        stage.leak.clone(),
    );
    let cmd = write_command(&leak);

    let turns: Vec<ClaudeTurn> = vec![
        Box::new(|_| {
            vec![tool_use(
                "toolu_search",
                "ToolSearch",
                json!({"query": "select:mcp__corral__exec_command,mcp__corral__read_file"}),
            )]
        }),
        Box::new(move |_| {
            vec![tool_use(
                "toolu_exec",
                "mcp__corral__exec_command",
                json!({"cmd": cmd, "yield_time_ms": 10000}),
            )]
        }),
        Box::new(|_| {
            vec![tool_use(
                "toolu_read",
                "mcp__corral__read_file",
                json!({"file_path": "host.txt"}),
            )]
        }),
        Box::new(|_| vec![text_block("all-done-by-the-mock")]),
    ];
    let model = MockClaude::start(turns).await;
    let home = ClaudeHome::new();
    let config_file = audit.with_file_name("corral-mcp.json");
    let mut args = vec![
        "-p",
        "run the scripted turn",
        "--allowedTools",
        "mcp__corral",
    ];
    match recipe {
        ClaudeRecipe::McpAdd => home.add_corral("corral", &d.socket, &ws_path).await,
        ClaudeRecipe::McpConfigFile => {
            let config = json!({"mcpServers": {"corral": {
                "command": common::CORRAL, "args": recipe_args(&d.socket, &ws_path)}}});
            std::fs::write(&config_file, config.to_string()).unwrap();
            args.extend(["--mcp-config", config_file.to_str().unwrap()]);
        }
    }
    let started = std::time::Instant::now();
    let (code, out) = home.run(&ws_path, Some(&model), &args).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("all-done-by-the-mock"), "{out}");
    let requests = model.requests();
    // corral's tools are offered (deferred: named, schemas not loaded) by the names Claude Code
    // gives an MCP server's tools.
    let first = requests
        .first()
        .expect("Claude Code asked the model")
        .to_string();
    assert!(
        first.contains("mcp__corral__exec_command") && first.contains("mcp__corral__read_file"),
        "corral's tools are not offered: {first}"
    );
    let last = requests.last().unwrap();
    assert_eq!(tool_results(last).len(), 3, "{out}\n{last}");
    // ToolSearch loaded corral's tools.
    let search = tool_result_text(last, "toolu_search");
    assert!(search.contains("mcp__corral__exec_command"), "{search}");
    // exec_command ran in corral's sandbox and its output came back to the model.
    let exec = tool_result_text(last, "toolu_exec");
    codex_support::assert_sandboxed_writes(&ws_path, &leak, &exec, "made-by-corral");
    assert!(exec.contains("Process exited with code 0"), "{exec}");
    // The read-only tool answered.
    let read = tool_result_text(last, "toolu_read");
    assert!(read.contains("written-on-the-host"), "{read}");
    // The daemon ran both calls, in a workspace-write session.
    let lines = audit_lines(&audit);
    let exec = audited(&lines, "exec_command", "made-by-corral > inside.txt")
        .unwrap_or_else(|| panic!("no exec_command in the audit log: {lines:?}"));
    assert_eq!(exec["mode"], "workspace-write", "{exec}");
    let read = audited(&lines, "read_file", "host.txt")
        .unwrap_or_else(|| panic!("no read_file in the audit log: {lines:?}"));
    assert_eq!(read["outcome"], "ok", "{read}");
    eprintln!("claude -p with corral mcp: {:?}", started.elapsed());
}

/// Without `--allowedTools`, `claude -p` runs none of corral's tools, not even the read-only
/// ones (the README says to pass it): each call answers a permission error and nothing runs.
#[tokio::test]
async fn claude_code_asks_permission_for_every_corral_tool() {
    claude();
    let logs = outside();
    let audit = logs.path().join("audit.log");
    let d = Daemon::start(&["--audit-log", audit.to_str().unwrap()]).await;
    let ws = scratch();
    let ws_path = std::fs::canonicalize(ws.path()).unwrap();
    std::fs::write(ws_path.join("host.txt"), "written-on-the-host\n").unwrap();
    let turns: Vec<ClaudeTurn> = vec![
        Box::new(|_| {
            vec![tool_use(
                "toolu_search",
                "ToolSearch",
                json!({"query": "select:mcp__corral__exec_command,mcp__corral__read_file"}),
            )]
        }),
        Box::new(|_| {
            vec![tool_use(
                "toolu_exec",
                "mcp__corral__exec_command",
                json!({"cmd": "echo x > unapproved.txt"}),
            )]
        }),
        Box::new(|_| {
            vec![tool_use(
                "toolu_read",
                "mcp__corral__read_file",
                json!({"file_path": "host.txt"}),
            )]
        }),
        Box::new(|_| vec![text_block("all-done-by-the-mock")]),
    ];
    let model = MockClaude::start(turns).await;
    let home = ClaudeHome::new();
    home.add_corral("corral", &d.socket, &ws_path).await;
    let (code, out) = home
        .run(&ws_path, Some(&model), &["-p", "run the scripted turn"])
        .await;
    assert_eq!(code, 0, "{out}");
    let requests = model.requests();
    let last = requests.last().expect("Claude Code asked the model");
    for id in ["toolu_exec", "toolu_read"] {
        let text = tool_result_text(last, id);
        assert!(text.contains("permission"), "{id}: {text}");
    }
    assert!(!ws_path.join("unapproved.txt").exists());
    let lines = audit_lines(&audit);
    assert!(
        lines
            .iter()
            .all(|l| l["tool"] != "exec_command" && l["tool"] != "read_file"),
        "{lines:?}"
    );
}

/// `claude mcp list` and `claude mcp get corral` start each configured server and report it: the
/// recipe's server connected; one whose socket has no daemon failed, with corral's reason (the
/// front answers `initialize` with it).
#[tokio::test]
async fn claude_mcp_list_reports_corral_connected_and_a_broken_recipe_failed() {
    claude();
    let d = Daemon::start(&[]).await;
    let ws = scratch();
    let ws_path = std::fs::canonicalize(ws.path()).unwrap();
    let home = ClaudeHome::new();
    home.add_corral("corral", &d.socket, &ws_path).await;
    let nowhere = d.socket.with_file_name("no-daemon.sock");
    home.add_corral("broken", &nowhere, &ws_path).await;

    let (code, out) = home.run(&ws_path, None, &["mcp", "list"]).await;
    assert_eq!(code, 0, "{out}");
    let line = |name: &str| {
        out.lines()
            .find(|l| l.starts_with(&format!("{name}: ")))
            .unwrap_or_else(|| panic!("no {name} in {out}"))
            .to_string()
    };
    assert!(line("corral").contains("Connected"), "{out}");
    let broken = line("broken");
    assert!(
        broken.contains("Failed to connect") && broken.contains("is `corral serve` running?"),
        "{out}"
    );

    let (code, out) = home.run(&ws_path, None, &["mcp", "get", "corral"]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("Status: ✔ Connected"), "{out}");
    let (_, out) = home.run(&ws_path, None, &["mcp", "get", "broken"]).await;
    assert!(out.contains("Failed to connect"), "{out}");
    assert!(out.contains("corral mcp cannot start"), "{out}");
}
