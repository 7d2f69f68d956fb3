//! Client subcommands. Readable output by default, `--json` for scripts; an error is one line
//! on stderr and exit status 2; a tool that reports failure exits 1.

use crate::api::{
    self, bridge_client::BridgeClient, sessions_client::SessionsClient, tools_client::ToolsClient,
};
use crate::client::connect::{Connection, TcpAuth, connect_with};
use clap::{Args, Subcommand, ValueEnum};
use serde_json::json;
use std::path::PathBuf;

/// Options every client command shares (ignored by `serve`).
#[derive(Debug, Clone, Args)]
pub struct Common {
    /// Client commands: the daemon to call, a socket path, unix:PATH or tcp:HOST:PORT (default:
    /// $CORRAL_SOCKET, else this user's daemon if it is listening, else the system daemon). The
    /// socket must be owned by root or you, in a directory owned by root or you that is not
    /// group/world-writable. Not used by `serve` (see --listen).
    #[arg(long, global = true, value_name = "ADDR")]
    pub socket: Option<String>,
    /// Client commands: print machine-readable JSON.
    #[arg(long, global = true)]
    pub json: bool,
    /// Client commands, tcp: only: speak TLS and trust the daemon's certificate if this CA
    /// (PEM) signed it.
    #[arg(long, global = true, value_name = "PEM")]
    pub tls_ca: Option<PathBuf>,
    /// Client commands, tcp: only: a client certificate (PEM) for mTLS, with --tls-key. Not
    /// used by `serve` (see its --tls-cert).
    #[arg(long, global = true, value_name = "PEM")]
    pub tls_cert: Option<PathBuf>,
    /// Client commands, tcp: only: the client certificate's private key (PEM). Not used by
    /// `serve` (see its --tls-key).
    #[arg(long, global = true, value_name = "PEM")]
    pub tls_key: Option<PathBuf>,
    /// Client commands, tcp: only: the name the daemon's certificate must carry, when it is not
    /// the HOST of tcp:HOST:PORT.
    #[arg(long, global = true, value_name = "NAME")]
    pub tls_server_name: Option<String>,
    /// Client commands, tcp: with TLS only: a bearer token the daemon maps to a local user
    /// ([[tokens]] in its config). Default: $CORRAL_TOKEN, which other users cannot read the
    /// way they can read a command line. Never sent over a Unix socket or plain TCP.
    #[arg(long, global = true, value_name = "TOKEN")]
    pub token: Option<String>,
}

/// Where the token comes from when --token is not given.
pub const TOKEN_ENV: &str = "CORRAL_TOKEN";

impl Common {
    /// The TLS settings and token for a tcp: target. `$CORRAL_TOKEN` is used only for TCP
    /// targets, so a shell that exports it can still use Unix sockets; an explicit --token for
    /// a Unix socket is refused as a mistake.
    fn tcp_auth(&self, target: &str) -> Result<TcpAuth, String> {
        let tcp = target.starts_with("tcp:");
        if self.token.is_some() && !tcp {
            return Err(format!(
                "--token is for tcp: addresses; {target} is a Unix socket, where the kernel says                  who you are"
            ));
        }
        let token = match &self.token {
            Some(t) => Some(t.clone()),
            None if tcp => std::env::var(TOKEN_ENV).ok().filter(|t| !t.is_empty()),
            None => None,
        };
        Ok(TcpAuth {
            ca: self.tls_ca.clone(),
            cert: self.tls_cert.clone(),
            key: self.tls_key.clone(),
            server_name: self.tls_server_name.clone(),
            token,
        })
    }
}

/// Options of commands that run in a session.
#[derive(Debug, Clone, Args)]
pub struct SessionOpts {
    /// Use this open session instead of opening a temporary one.
    #[arg(long, value_name = "ID")]
    pub session: Option<String>,
    /// Working directory of the temporary session (default: the current directory).
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<PathBuf>,
    /// Mode of the temporary session.
    #[arg(long, value_enum, default_value_t = ModeArg::ReadOnly)]
    pub mode: ModeArg,
    /// Approval policy of the temporary session (default: none, nothing is asked).
    #[arg(long, value_enum, value_name = "POLICY")]
    pub approval_policy: Option<super::approve::PolicyArg>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ModeArg {
    ReadOnly,
    WorkspaceWrite,
    DangerFullAccess,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum FormatArg {
    Responses,
    Chat,
}

#[derive(Debug, Clone, Subcommand)]
pub enum ClientCommand {
    /// Check the daemon's health service.
    Health,
    /// Show the daemon's version, tools and sandbox layers.
    Capabilities,
    /// Print the model-facing tool definitions.
    Tools {
        #[arg(long, value_enum, default_value_t = FormatArg::Responses)]
        format: FormatArg,
    },
    /// Open a session and print its id (it stays open until closed or idle).
    OpenSession {
        /// Working directory (default: the current directory).
        #[arg(long, value_name = "DIR")]
        cwd: Option<PathBuf>,
        #[arg(long, value_enum, default_value_t = ModeArg::ReadOnly)]
        mode: ModeArg,
        /// Extra writable directories (workspace-write).
        #[arg(long = "writable-root", value_name = "DIR")]
        writable_roots: Vec<PathBuf>,
        /// Turn the network on.
        #[arg(long)]
        network: bool,
        /// Environment for commands, NAME=VALUE (repeatable).
        #[arg(long = "env", value_name = "NAME=VALUE")]
        env: Vec<String>,
        /// When commands need your approval (default: none, nothing is asked).
        #[arg(long, value_enum, value_name = "POLICY")]
        approval_policy: Option<super::approve::PolicyArg>,
    },
    /// Close a session.
    CloseSession { id: String },
    /// Read a file with line numbers.
    ReadFile {
        path: String,
        #[arg(long)]
        offset: Option<u64>,
        #[arg(long)]
        limit: Option<u64>,
        #[command(flatten)]
        session: SessionOpts,
    },
    /// List a directory.
    ListDir {
        path: String,
        #[arg(long)]
        offset: Option<u64>,
        #[arg(long)]
        limit: Option<u64>,
        #[arg(long)]
        depth: Option<u64>,
        #[command(flatten)]
        session: SessionOpts,
    },
    /// Copy a file or directory into or out of a session: `corral cp ./dir :dest` uploads,
    /// `corral cp :out.bin ./out.bin` downloads (exactly one side is remote, `:PATH`).
    Cp(super::cp::CpArgs),
    /// Run one model tool call through the bridge: NAME and its JSON arguments.
    Invoke {
        name: String,
        arguments: String,
        #[arg(long, default_value = "call_cli")]
        call_id: String,
        /// The arguments are a freeform (custom tool) payload, not JSON.
        #[arg(long)]
        freeform: bool,
        /// How approval requests are answered: asked on the terminal (without one: denied), or
        /// decided in advance.
        #[arg(long, value_enum, default_value_t, value_name = "ANSWER")]
        approvals: super::approve::Answer,
        #[command(flatten)]
        session: SessionOpts,
    },
    /// Serve a session's tools to an MCP client on stdin/stdout (register this command as an
    /// MCP server).
    Mcp(super::mcp::McpArgs),
}

/// Runs a client command; returns the process exit status.
pub async fn run(common: Common, command: ClientCommand) -> i32 {
    match execute(&common, command).await {
        Ok(code) => code,
        Err(message) => {
            eprintln!("error: {message}");
            2
        }
    }
}

/// `{layer} (unavailable|degraded): {detail}` for each sandbox layer the daemon does not
/// enforce (empty when all are, or when it cannot be asked).
async fn layer_problems(channel: Connection) -> Vec<String> {
    let Ok(caps) = SessionsClient::new(channel)
        .get_capabilities(api::GetCapabilitiesRequest {})
        .await
    else {
        return Vec::new();
    };
    caps.into_inner()
        .layers
        .iter()
        .filter_map(|l| {
            let state = match api::LayerStatus::try_from(l.status) {
                Ok(api::LayerStatus::Unavailable) => "unavailable",
                Ok(api::LayerStatus::Degraded) => "degraded",
                _ => return None,
            };
            Some(format!("{} ({state}): {}", l.name, l.detail))
        })
        .collect()
}

pub(super) fn status_text(s: tonic::Status) -> String {
    format!("{:?}: {}", s.code(), s.message())
}

async fn execute(common: &Common, command: ClientCommand) -> Result<i32, String> {
    // The socket rule shared with `corral serve`: --socket > CORRAL_SOCKET > this user's daemon
    // (if one is listening) > the system daemon, which serves every local user as themselves.
    let target = crate::daemon::socket::choose(
        common.socket.as_deref(),
        crate::daemon::socket::Side::Client,
    )?;
    let channel = connect_with(&target, &common.tcp_auth(&target)?).await?;
    match command {
        ClientCommand::Cp(args) => super::cp::run(common, channel, args).await,
        ClientCommand::Health => {
            let mut client = tonic_health::pb::health_client::HealthClient::new(channel.clone());
            let resp = client
                .check(tonic_health::pb::HealthCheckRequest {
                    service: String::new(),
                })
                .await
                .map_err(status_text)?
                .into_inner();
            let status =
                tonic_health::pb::health_check_response::ServingStatus::try_from(resp.status)
                    .map(|s| s.as_str_name().to_string())
                    .unwrap_or_else(|_| resp.status.to_string());
            // grpc.health.v1 carries no reason: the layers that are not in force say what is
            // missing and how to fix the host.
            let problems = layer_problems(channel).await;
            if common.json {
                println!("{}", json!({ "status": status, "problems": problems }));
            } else {
                println!("{status}");
                for problem in &problems {
                    eprintln!("{problem}");
                }
            }
            Ok(if status == "SERVING" { 0 } else { 1 })
        }
        ClientCommand::Capabilities => {
            let caps = SessionsClient::new(channel)
                .get_capabilities(api::GetCapabilitiesRequest {})
                .await
                .map_err(status_text)?
                .into_inner();
            let layers: Vec<_> = caps
                .layers
                .iter()
                .map(|l| {
                    json!({
                        "name": l.name,
                        "status": api::LayerStatus::try_from(l.status).map(|s| s.as_str_name()).unwrap_or("?"),
                        "detail": l.detail,
                    })
                })
                .collect();
            let value = json!({
                "api_version": caps.api_version,
                "server_version": caps.server_version,
                "tools": caps.tools,
                "landlock_abi": caps.landlock_abi,
                "layers": layers,
            });
            println!(
                "{}",
                serde_json::to_string_pretty(&value).unwrap_or_default()
            );
            Ok(0)
        }
        ClientCommand::OpenSession {
            cwd,
            mode,
            writable_roots,
            network,
            env,
            approval_policy,
        } => {
            let mut request = open_session_request(cwd, mode, &writable_roots, network, &env)?;
            if let Some(p) = approval_policy {
                request.approval_policy = p.api() as i32;
            }
            let resp = SessionsClient::new(channel)
                .open_session(request)
                .await
                .map_err(status_text)?
                .into_inner();
            if common.json {
                println!(
                    "{}",
                    json!({"session_id": resp.session_id, "writable_roots": resp.writable_roots,
                        "skipped_writable_roots": resp.skipped_writable_roots})
                );
            } else {
                println!("{}", resp.session_id);
            }
            Ok(0)
        }
        ClientCommand::CloseSession { id } => {
            SessionsClient::new(channel)
                .close_session(api::CloseSessionRequest { session_id: id })
                .await
                .map_err(status_text)?;
            Ok(0)
        }
        ClientCommand::Tools { format } => {
            let format = match format {
                FormatArg::Responses => api::ToolFormat::Responses,
                FormatArg::Chat => api::ToolFormat::ChatCompletions,
            };
            let resp = BridgeClient::new(channel)
                .max_decoding_message_size(super::MAX_MESSAGE_BYTES)
                .list_tools(api::ListToolsRequest {
                    format: format as i32,
                    ..Default::default()
                })
                .await
                .map_err(status_text)?
                .into_inner();
            if common.json {
                println!("{}", resp.tools_json);
            } else {
                let value: serde_json::Value =
                    serde_json::from_str(&resp.tools_json).map_err(|e| e.to_string())?;
                println!(
                    "{}",
                    serde_json::to_string_pretty(&value).unwrap_or_default()
                );
            }
            Ok(0)
        }
        ClientCommand::ReadFile {
            path,
            offset,
            limit,
            session,
        } => {
            let (id, temporary) = open(&channel, &session).await?;
            let result = ToolsClient::new(channel.clone())
                .max_decoding_message_size(super::MAX_MESSAGE_BYTES)
                .read_file(api::ReadFileRequest {
                    session_id: id.clone(),
                    file_path: path,
                    offset,
                    limit,
                    ..Default::default()
                })
                .await;
            close(&channel, &id, temporary).await;
            let resp = result.map_err(status_text)?.into_inner();
            if common.json {
                let lines: Vec<_> = resp
                    .lines
                    .iter()
                    .map(|l| json!({"number": l.number, "text": l.text}))
                    .collect();
                println!(
                    "{}",
                    json!({"path": resp.path, "lines": lines, "text": resp.text})
                );
            } else {
                println!("{}", resp.text);
            }
            Ok(0)
        }
        ClientCommand::ListDir {
            path,
            offset,
            limit,
            depth,
            session,
        } => {
            let (id, temporary) = open(&channel, &session).await?;
            let result = ToolsClient::new(channel.clone())
                .max_decoding_message_size(super::MAX_MESSAGE_BYTES)
                .list_dir(api::ListDirRequest {
                    session_id: id.clone(),
                    dir_path: path,
                    offset,
                    limit,
                    depth,
                })
                .await;
            close(&channel, &id, temporary).await;
            let resp = result.map_err(status_text)?.into_inner();
            if common.json {
                let entries: Vec<_> = resp
                    .entries
                    .iter()
                    .map(|e| json!({"relative_path": e.relative_path, "name": e.name, "depth": e.depth,
                        "kind": api::EntryKind::try_from(e.kind).map(|k| k.as_str_name()).unwrap_or("?")}))
                    .collect();
                println!(
                    "{}",
                    json!({"absolute_path": resp.absolute_path, "entries": entries,
                        "more_entries": resp.more_entries, "text": resp.text})
                );
            } else {
                println!("{}", resp.text);
            }
            Ok(0)
        }
        ClientCommand::Invoke {
            name,
            arguments,
            call_id,
            freeform,
            approvals,
            session,
        } => {
            let (id, temporary) = open(&channel, &session).await?;
            let result = BridgeClient::new(channel.clone())
                .max_decoding_message_size(super::MAX_MESSAGE_BYTES)
                .invoke(api::InvokeRequest {
                    session_id: id.clone(),
                    name,
                    arguments,
                    call_id,
                    freeform,
                })
                .await;
            // An approval request is answered (asked on the terminal) before the session goes.
            let result = match result {
                Ok(resp) => {
                    super::approve::settle(&channel, &id, resp.into_inner(), approvals).await
                }
                Err(s) => Err(status_text(s)),
            };
            close(&channel, &id, temporary).await;
            let resp = result?;
            if common.json {
                println!(
                    "{}",
                    json!({"call_id": resp.call_id, "output": resp.output, "success": resp.success})
                );
            } else {
                println!("{}", resp.output);
            }
            Ok(if resp.success { 0 } else { 1 })
        }
        ClientCommand::Mcp(args) => super::mcp::serve(channel, args).await,
    }
}

/// The session to use: the given one, or a temporary one (closed afterwards).
pub(super) async fn open(
    channel: &Connection,
    opts: &SessionOpts,
) -> Result<(String, bool), String> {
    if let Some(id) = &opts.session {
        return Ok((id.clone(), false));
    }
    let cwd = match &opts.cwd {
        Some(dir) => {
            std::path::absolute(dir).map_err(|e| format!("--cwd {}: {e}", dir.display()))?
        }
        None => std::env::current_dir().map_err(|e| format!("current directory: {e}"))?,
    };
    let mode = match opts.mode {
        ModeArg::ReadOnly => api::SandboxMode::ReadOnly,
        ModeArg::WorkspaceWrite => api::SandboxMode::WorkspaceWrite,
        ModeArg::DangerFullAccess => api::SandboxMode::DangerFullAccess,
    };
    let resp = SessionsClient::new(channel.clone())
        .open_session(api::OpenSessionRequest {
            cwd: cwd.to_string_lossy().into_owned(),
            mode: mode as i32,
            approval_policy: opts
                .approval_policy
                .map_or(api::ApprovalPolicy::Unspecified, |p| p.api())
                as i32,
            ..Default::default()
        })
        .await
        .map_err(status_text)?
        .into_inner();
    Ok((resp.session_id, true))
}

/// The OpenSession request of `open-session`'s (and `mcp`'s) flags.
pub(super) fn open_session_request(
    cwd: Option<PathBuf>,
    mode: ModeArg,
    writable_roots: &[PathBuf],
    network: bool,
    env: &[String],
) -> Result<api::OpenSessionRequest, String> {
    let cwd = absolute(cwd)?;
    let mut vars = std::collections::HashMap::new();
    for kv in env {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("--env {kv}: expected NAME=VALUE"))?;
        vars.insert(k.to_string(), v.to_string());
    }
    Ok(api::OpenSessionRequest {
        cwd: cwd.to_string_lossy().into_owned(),
        mode: mode_of(mode) as i32,
        writable_roots: writable_roots
            .iter()
            .map(|p| absolute(Some(p.clone())).map(|p| p.to_string_lossy().into_owned()))
            .collect::<Result<_, _>>()?,
        network_access: network,
        env: vars,
        ..Default::default()
    })
}

/// `dir` made absolute, or the current directory.
fn absolute(dir: Option<PathBuf>) -> Result<PathBuf, String> {
    match dir {
        Some(dir) => std::path::absolute(&dir).map_err(|e| format!("{}: {e}", dir.display())),
        None => std::env::current_dir().map_err(|e| format!("current directory: {e}")),
    }
}

fn mode_of(mode: ModeArg) -> api::SandboxMode {
    match mode {
        ModeArg::ReadOnly => api::SandboxMode::ReadOnly,
        ModeArg::WorkspaceWrite => api::SandboxMode::WorkspaceWrite,
        ModeArg::DangerFullAccess => api::SandboxMode::DangerFullAccess,
    }
}

pub(super) async fn close(channel: &Connection, id: &str, temporary: bool) {
    if temporary {
        let _ = SessionsClient::new(channel.clone())
            .close_session(api::CloseSessionRequest {
                session_id: id.to_string(),
            })
            .await;
    }
}
