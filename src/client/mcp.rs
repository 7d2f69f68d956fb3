//! `corral mcp`: serves one session's model-facing tools to an MCP client over stdio.
//!
//! A thin client of the daemon (DESIGN.md §5), never part of it: `tools/list` is the bridge's
//! `ListTools` in the Chat Completions shape (function tools only, so apply_patch is the function
//! with one `input` parameter and every tool has a JSON schema), and `tools/call` is the bridge's
//! `Invoke`, whose text and success flag become the MCP result and `isError`. All state (unified
//! exec processes, the sandbox) lives in the daemon's session; this process holds only its id.
//!
//! Stdout carries the protocol and nothing else: diagnostics go to stderr.

use crate::api::{self, bridge_client::BridgeClient, sessions_client::SessionsClient};
use clap::Args;
use rmcp::ServiceExt;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData,
    Implementation, InitializeResult, ListToolsResult, PaginatedRequestParams, ServerCapabilities,
    Tool, ToolAnnotations,
};
use rmcp::service::{RequestContext, RoleServer};
use serde_json::{Map, Value};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
// The CLI's connection (a channel with the TCP bearer token, when one is set).
use super::connect::Connection as Channel;

use super::cli::{Failure, ModeArg, open_session_request, status_text};

/// Options of `corral mcp`.
#[derive(Debug, Clone, Args)]
pub struct McpArgs {
    /// Serve this open session (left open on exit) instead of opening one (closed on exit).
    #[arg(long, value_name = "ID", conflicts_with_all = ["cwd", "mode", "writable_roots", "network", "env", "exclude_slash_tmp", "exclude_tmpdir_env_var"])]
    pub session: Option<String>,
    /// Working directory of the session (default: the current directory).
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<PathBuf>,
    /// Sandbox mode of the session. Read-only by default, as every corral command: an MCP
    /// client's configuration grants writes explicitly (`--mode workspace-write`).
    #[arg(long, value_enum, default_value_t = ModeArg::ReadOnly)]
    pub mode: ModeArg,
    /// Extra writable directories (workspace-write).
    #[arg(long = "writable-root", value_name = "DIR")]
    pub writable_roots: Vec<PathBuf>,
    #[command(flatten)]
    pub network: super::cli::NetworkOpts,
    /// Environment for commands, NAME=VALUE (repeatable).
    #[arg(long = "env", value_name = "NAME=VALUE")]
    pub env: Vec<String>,
    /// Leave /tmp out of the writable roots (needed when the daemon keeps its own state
    /// there).
    #[arg(long)]
    pub exclude_slash_tmp: bool,
    /// Leave $TMPDIR (of the session's environment, see --env) out of the writable roots.
    #[arg(long)]
    pub exclude_tmpdir_env_var: bool,
}

/// Opens (or attaches to) the session, serves MCP on stdin/stdout until the client closes stdin
/// or a termination signal arrives, then closes the session it opened. Returns the exit status.
/// A failure before the MCP handshake is the answer to the client's `initialize` too (the CLI
/// sends it); one after it is only printed.
pub(super) async fn serve(channel: Channel, args: McpArgs) -> Result<i32, Failure> {
    init_logging();
    let (session_id, owned) = match &args.session {
        Some(id) => (id.clone(), false),
        None => {
            let mut request = open_session_request(
                args.cwd.clone(),
                args.mode,
                &args.writable_roots,
                &args.network,
                &args.env,
            )?;
            request.exclude_slash_tmp = args.exclude_slash_tmp;
            request.exclude_tmpdir_env_var = args.exclude_tmpdir_env_var;
            let resp = SessionsClient::new(channel.clone())
                .open_session(request)
                .await
                .map_err(status_text)?
                .into_inner();
            (resp.session_id, true)
        }
    };
    let result = serve_session(channel.clone(), &session_id, &args).await;
    if owned {
        // Kills the session's processes and frees its worker now, not at idle expiry.
        if let Err(s) = SessionsClient::new(channel)
            .close_session(api::CloseSessionRequest {
                session_id: session_id.clone(),
            })
            .await
        {
            tracing::warn!("closing session {session_id}: {}", status_text(s));
        }
    }
    result
}

async fn serve_session(channel: Channel, session_id: &str, args: &McpArgs) -> Result<i32, Failure> {
    // Listed once: a session's tool set is fixed when it opens. Listing also proves the session
    // exists and is ours before the client is told anything.
    let listed = BridgeClient::new(channel.clone())
        .max_decoding_message_size(super::MAX_MESSAGE_BYTES)
        .list_tools(api::ListToolsRequest {
            format: api::ToolFormat::ChatCompletions as i32,
            session_id: session_id.to_string(),
            ..Default::default()
        })
        .await
        .map_err(|s| format!("session {session_id}: {}", status_text(s)))?
        .into_inner();
    let tools = mcp_tools(&listed.tools_json)?;
    let instructions = match &args.session {
        Some(_) => format!("corral session {session_id}: every tool runs in its sandbox."),
        None => format!(
            "Every tool runs in a corral sandbox ({} mode, working directory {}).",
            mode_name(args.mode),
            args.cwd
                .as_deref()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| std::env::current_dir()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default()),
        ),
    };
    let front = Front {
        channel: channel.clone(),
        session_id: session_id.to_string(),
        tools: Arc::new(tools),
        instructions,
    };
    let keepalive = tokio::spawn(keep_alive(channel, session_id.to_string()));
    let running = front
        .serve(rmcp::transport::io::stdio_pipes())
        .await
        .map_err(|e| Failure::after_handshake(format!("MCP initialization failed: {e}")))?;
    let cancel = running.cancellation_token();
    let outcome = tokio::select! {
        quit = running.waiting() => quit.map(|_| 0).map_err(|e| format!("MCP service: {e}")),
        signal = termination() => {
            cancel.cancel();
            signal.map(|()| 0)
        }
    };
    keepalive.abort();
    outcome.map_err(Failure::after_handshake)
}

/// The MCP server: the session it serves and its tools, as MCP lists them.
#[derive(Clone)]
struct Front {
    channel: Channel,
    session_id: String,
    tools: Arc<Vec<Tool>>,
    instructions: String,
}

impl rmcp::ServerHandler for Front {
    fn get_info(&self) -> InitializeResult {
        InitializeResult::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("corral", env!("CARGO_PKG_VERSION")))
            .with_instructions(self.instructions.clone())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        // A handful of tools: one page.
        Ok(ListToolsResult::with_all_items(self.tools.to_vec()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools.iter().find(|t| t.name == name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        // The spec makes an unknown tool a protocol error; everything past this point is the
        // tool's own answer, which the model reads (isError when it failed).
        if self.get_tool(&request.name).is_none() {
            let offered: Vec<&str> = self.tools.iter().map(|t| t.name.as_ref()).collect();
            return Err(ErrorData::invalid_params(
                format!(
                    "unknown tool: {}; this session offers {}",
                    request.name,
                    offered.join(", ")
                ),
                None,
            ));
        }
        let arguments = Value::Object(request.arguments.unwrap_or_default()).to_string();
        let mut bridge = BridgeClient::new(self.channel.clone())
            .max_decoding_message_size(super::MAX_MESSAGE_BYTES);
        let invoke = bridge.invoke(api::InvokeRequest {
            session_id: self.session_id.clone(),
            name: request.name.to_string(),
            arguments,
            call_id: format!("mcp_{}", context.id),
            // Chat Completions lists every tool (apply_patch too) as a function tool.
            freeform: false,
        });
        // A cancelled MCP request drops the gRPC call, and the daemon kills what it started.
        let result = tokio::select! {
            r = invoke => r,
            () = context.ct.cancelled() => {
                return Err(ErrorData::internal_error("cancelled by the client", None));
            }
        };
        Ok(match result {
            Ok(resp) => tool_result(resp.into_inner()).into(),
            Err(status) => {
                CallToolResult::error(vec![ContentBlock::text(status_text(status))]).into()
            }
        })
    }
}

/// The MCP result of a bridge answer: its content items when it has some (view_image's image),
/// else its text; `isError` when Codex would have reported failure.
fn tool_result(resp: api::InvokeResponse) -> CallToolResult {
    let mut content: Vec<ContentBlock> = resp
        .content_items
        .into_iter()
        .filter_map(|c| match c.item? {
            api::output_content_item::Item::InputText(text) => Some(ContentBlock::text(text)),
            api::output_content_item::Item::InputImage(image) => Some(image_block(&image)),
        })
        .collect();
    if content.is_empty() {
        content.push(ContentBlock::text(resp.output));
    }
    if resp.success {
        CallToolResult::success(content)
    } else {
        CallToolResult::error(content)
    }
}

/// An image content block from a `data:MIME;base64,DATA` URL (the only kind view_image makes);
/// anything else is passed on as text rather than dropped.
fn image_block(image: &api::InputImage) -> ContentBlock {
    match image
        .image_url
        .strip_prefix("data:")
        .and_then(|rest| rest.split_once(";base64,"))
    {
        Some((mime, data)) => ContentBlock::image(data, mime),
        None => ContentBlock::text(image.image_url.clone()),
    }
}

/// MCP tool definitions from the bridge's Chat Completions JSON
/// (`[{"type":"function","function":{name, description, strict, parameters}}]`).
fn mcp_tools(tools_json: &str) -> Result<Vec<Tool>, String> {
    let items: Vec<Value> = serde_json::from_str(tools_json)
        .map_err(|e| format!("the daemon's tool list is not JSON: {e}"))?;
    items
        .into_iter()
        .map(|item| {
            let function = item.get("function").unwrap_or(&item);
            let name = function
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| format!("a listed tool has no name: {item}"))?
                .to_string();
            let description = function
                .get("description")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            // MCP requires an object schema; a tool without parameters takes none.
            let schema = match function.get("parameters") {
                Some(Value::Object(schema)) => schema.clone(),
                _ => {
                    let mut schema = Map::new();
                    schema.insert("type".into(), Value::String("object".into()));
                    schema
                }
            };
            let tool = Tool::new(name, description, schema);
            Ok(match annotations(&tool.name) {
                Some(a) => tool.annotate(a),
                None => tool,
            })
        })
        .collect()
}

/// A tool's MCP annotations, from what the bridge says the tool does (one place for every
/// front): `readOnlyHint` true on the tools that change nothing, which Codex then runs without
/// an approval; false, and `destructiveHint`, on those that run commands or write files.
fn annotations(name: &str) -> Option<ToolAnnotations> {
    let effects = crate::calls::tool_effects(name)?;
    let mut a = ToolAnnotations::new().read_only(effects.read_only);
    if !effects.read_only {
        a = a.destructive(effects.destructive);
    }
    Some(a)
}

/// Keeps the session from idle expiry while the MCP client is connected (an agent may think for
/// longer than the daemon's idle timeout); the daemon still expires it if this process dies.
async fn keep_alive(channel: Channel, session_id: String) {
    let idle = SessionsClient::new(channel.clone())
        .get_capabilities(api::GetCapabilitiesRequest {})
        .await
        .map(|c| c.into_inner().session_idle_timeout_seconds)
        .unwrap_or(0);
    if idle == 0 {
        return;
    }
    let period = Duration::from_millis(idle * 1000 / 3).max(Duration::from_millis(200));
    let mut bridge = BridgeClient::new(channel).max_decoding_message_size(super::MAX_MESSAGE_BYTES);
    loop {
        tokio::time::sleep(period).await;
        // Any call naming the session marks it used; ListTools is the cheapest.
        let touched = bridge
            .list_tools(api::ListToolsRequest {
                format: api::ToolFormat::ChatCompletions as i32,
                session_id: session_id.clone(),
                ..Default::default()
            })
            .await;
        if let Err(s) = touched
            && s.code() == tonic::Code::NotFound
        {
            tracing::warn!("session {session_id} is gone: {}", s.message());
            return;
        }
    }
}

/// Resolves on SIGTERM, SIGINT or SIGHUP (how MCP clients stop a server that outlives its stdin).
async fn termination() -> Result<(), String> {
    use tokio::signal::unix::{SignalKind, signal};
    let install = |kind| signal(kind).map_err(|e| format!("cannot watch signals: {e}"));
    let (mut term, mut int, mut hup) = (
        install(SignalKind::terminate())?,
        install(SignalKind::interrupt())?,
        install(SignalKind::hangup())?,
    );
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
        _ = hup.recv() => {}
    }
    Ok(())
}

/// Diagnostics (rmcp's included) to stderr, warnings and up unless RUST_LOG says otherwise.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    use std::io::IsTerminal;
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(filter)
        // A closed stderr must not end the server (tracing would panic reporting it).
        .log_internal_errors(false)
        .try_init();
}

fn mode_name(mode: ModeArg) -> &'static str {
    match mode {
        ModeArg::ReadOnly => "read-only",
        ModeArg::WorkspaceWrite => "workspace-write",
        ModeArg::DangerFullAccess => "danger-full-access",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calls::{ToolFormat, ToolSet, list_tools};

    #[test]
    fn every_listed_tool_becomes_an_mcp_tool_with_an_object_schema() {
        let listed = list_tools(&ToolSet::sessionless(), ToolFormat::ChatCompletions, &[]);
        let tools = mcp_tools(&listed.json).unwrap();
        let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
        assert_eq!(names, listed.names);
        for tool in &tools {
            assert_eq!(tool.input_schema.get("type"), Some(&Value::from("object")));
            assert!(!tool.description.as_deref().unwrap_or_default().is_empty());
        }
        // Read-only tools say so (Codex runs them with no approval); the others do not.
        let hints = |name: &str| {
            let tool = tools.iter().find(|t| t.name == name).unwrap();
            let a = tool.annotations.as_ref().expect("annotations");
            (a.read_only_hint, a.destructive_hint)
        };
        for name in [
            "read_file",
            "list_dir",
            "grep_files",
            "view_image",
            "update_plan",
        ] {
            assert_eq!(hints(name), (Some(true), None), "{name}");
        }
        for name in ["shell", "apply_patch"] {
            assert_eq!(hints(name), (Some(false), Some(true)), "{name}");
        }
        // The freeform apply_patch is offered as its function form.
        let patch = tools.iter().find(|t| t.name == "apply_patch").unwrap();
        assert_eq!(patch.input_schema["required"], serde_json::json!(["input"]));
    }

    #[test]
    fn a_tool_without_parameters_takes_an_empty_object() {
        let tools = mcp_tools(r#"[{"type":"function","function":{"name":"t","description":"d"}}]"#)
            .unwrap();
        assert_eq!(
            tools[0].input_schema.get("type"),
            Some(&Value::from("object"))
        );
        assert!(mcp_tools(r#"[{"type":"function","function":{}}]"#).is_err());
        assert!(mcp_tools("not json").is_err());
    }

    #[test]
    fn bridge_answers_map_to_text_or_image_content_and_is_error() {
        let ok = tool_result(api::InvokeResponse {
            call_id: "c".into(),
            output: "hello".into(),
            success: true,
            ..Default::default()
        });
        let v = serde_json::to_value(&ok).unwrap();
        assert_eq!(
            v["content"],
            serde_json::json!([{"type": "text", "text": "hello"}])
        );
        assert_eq!(v["isError"], Value::Bool(false));

        let failed = tool_result(api::InvokeResponse {
            output: "nope".into(),
            success: false,
            ..Default::default()
        });
        assert_eq!(
            serde_json::to_value(&failed).unwrap()["isError"],
            Value::Bool(true)
        );

        let image = tool_result(api::InvokeResponse {
            output: "attached local image path".into(),
            success: true,
            content_items: vec![api::OutputContentItem {
                item: Some(api::output_content_item::Item::InputImage(
                    api::InputImage {
                        image_url: "data:image/png;base64,AAAA".into(),
                        detail: String::new(),
                    },
                )),
            }],
            ..Default::default()
        });
        let v = serde_json::to_value(&image).unwrap();
        assert_eq!(v["content"][0]["type"], "image");
        assert_eq!(v["content"][0]["mimeType"], "image/png");
        assert_eq!(v["content"][0]["data"], "AAAA");
    }
}
