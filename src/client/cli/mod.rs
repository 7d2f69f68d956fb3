//! Client subcommands. Readable output by default, `--json` for scripts; an error is one line
//! on stderr and exit status 2; a tool that reports failure exits 1.

use crate::api::{
    self, bridge_client::BridgeClient, sessions_client::SessionsClient, tools_client::ToolsClient,
};
use crate::client::connect::{Connection, TcpAuth, connect_with};
use clap::{Args, Subcommand, ValueEnum};
use serde_json::json;
use std::path::PathBuf;

/// Options every client command shares (ignored by `serve`). Listed after each command's own
/// options, under their own heading.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Connection options (client commands)")]
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
    /// Leave /tmp out of the temporary session's writable roots (needed when the daemon keeps
    /// its own state there).
    #[arg(long)]
    pub exclude_slash_tmp: bool,
    /// Leave $TMPDIR (of the session's environment) out of the temporary session's writable
    /// roots.
    #[arg(long)]
    pub exclude_tmpdir_env_var: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ModeArg {
    ReadOnly,
    WorkspaceWrite,
    DangerFullAccess,
}

/// A session's shell tool (OpenSession's `shell_tool`).
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ShellToolArg {
    /// exec_command and write_stdin (Codex's default).
    UnifiedExec,
    ShellCommand,
    Shell,
    None,
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
    /// Show the daemon's version, tools, profiles, session limits and sandbox layers.
    Capabilities,
    /// Print the model-facing tool definitions (JSON, as they go in the API's `tools`).
    Tools {
        /// The API shape: the Responses API's or Chat Completions' `tools`.
        #[arg(long, value_enum, default_value_t = FormatArg::Responses)]
        format: FormatArg,
        /// The tools this open session offers (default: what a new session offers).
        #[arg(long, value_name = "ID")]
        session: Option<String>,
        /// Without --session: the shell tool of the new session to describe.
        #[arg(long, value_enum, default_value_t = ShellToolArg::UnifiedExec, conflicts_with = "session")]
        shell_tool: ShellToolArg,
    },
    /// List your open sessions.
    Sessions,
    /// List the processes your sessions keep (started by exec_command or StartProcess).
    Ps {
        /// Only this session's processes.
        #[arg(long, value_name = "ID")]
        session: Option<String>,
    },
    /// Run a command in a session, its output streamed live; exits with the command's status
    /// (124 on timeout, 128+N when killed by signal N).
    Exec(super::exec::ExecArgs),
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
        /// Leave /tmp out of the writable roots (needed when the daemon keeps its own state
        /// there).
        #[arg(long)]
        exclude_slash_tmp: bool,
        /// Leave $TMPDIR (of the session's environment, see --env) out of the writable roots.
        #[arg(long)]
        exclude_tmpdir_env_var: bool,
    },
    /// Close a session.
    CloseSession {
        /// The session's id (`corral sessions` lists yours).
        id: String,
    },
    /// Read a file with line numbers.
    ReadFile {
        /// The file: absolute, or relative to the session's working directory.
        path: String,
        /// The first line to show, 1-based (default 1).
        #[arg(long, value_name = "LINE")]
        offset: Option<u64>,
        /// How many lines to show (default 2000).
        #[arg(long, value_name = "LINES")]
        limit: Option<u64>,
        #[command(flatten)]
        session: SessionOpts,
    },
    /// List a directory.
    ListDir {
        /// The directory: absolute, or relative to the session's working directory.
        path: String,
        /// The first entry to show, 1-based (default 1).
        #[arg(long, value_name = "ENTRY")]
        offset: Option<u64>,
        /// How many entries to show (default 25).
        #[arg(long, value_name = "ENTRIES")]
        limit: Option<u64>,
        /// How many levels deep to list (default 2).
        #[arg(long, value_name = "LEVELS")]
        depth: Option<u64>,
        #[command(flatten)]
        session: SessionOpts,
    },
    /// Copy a file or directory into or out of a session: `corral cp ./dir :dest` uploads,
    /// `corral cp :out.bin ./out.bin` downloads (exactly one side is remote, `:PATH`).
    Cp(super::cp::CpArgs),
    /// Run one model tool call through the bridge: NAME and its arguments, exactly as a model
    /// sends them. apply_patch takes Codex's patch format (`*** Begin Patch` …), not a unified
    /// diff: `corral invoke apply_patch --freeform @change.patch`.
    Invoke {
        /// The tool's name (`corral tools` lists them), e.g. exec_command, read_file.
        name: String,
        /// The arguments: a JSON object (or, with --freeform, the raw input); `-` reads them
        /// from stdin, `@FILE` from FILE.
        #[arg(allow_hyphen_values = true, value_name = "ARGUMENTS")]
        arguments: String,
        /// The call id echoed in the result (as a model's `call_id`).
        #[arg(long, default_value = "call_cli", value_name = "ID")]
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
    /// Serve Codex's exec-server protocol (WebSocket or stdio), so an unmodified Codex started
    /// with CODEX_EXEC_SERVER_URL runs every tool call in corral's sandbox.
    ExecServer(super::exec_server::ExecServerArgs),
}

/// A client command's failure: what went wrong, and the gRPC status code when the daemon
/// answered with one (a connection or argument problem has none).
#[derive(Debug)]
pub(super) struct Failure {
    pub code: Option<tonic::Code>,
    pub message: String,
    /// A stdio front (`corral mcp`, `corral exec-server --listen stdio`) failed before its
    /// client's `initialize` was read: the reason is also the answer to it.
    pub before_handshake: bool,
}

impl From<String> for Failure {
    fn from(message: String) -> Self {
        Self {
            code: None,
            message,
            before_handshake: true,
        }
    }
}

impl From<tonic::Status> for Failure {
    fn from(s: tonic::Status) -> Self {
        Self {
            code: Some(s.code()),
            message: s.message().to_string(),
            before_handshake: true,
        }
    }
}

/// Where a command reports plain text (cp), a failure is its one line.
impl From<Failure> for String {
    fn from(f: Failure) -> String {
        f.text()
    }
}

impl Failure {
    /// A stdio front's failure after its client's handshake began (nothing left to answer).
    pub fn after_handshake(message: String) -> Self {
        Self {
            code: None,
            message,
            before_handshake: false,
        }
    }

    /// One line for a person: `NotFound: …`, or the message alone.
    fn text(&self) -> String {
        match self.code {
            Some(code) => format!("{code:?}: {}", self.message),
            None => self.message.clone(),
        }
    }

    /// `{"error": {"code": "NOT_FOUND", "message": …}}` for --json (`code` is null when the
    /// daemon was not reached or did not answer with a status).
    fn json(&self) -> serde_json::Value {
        json!({"error": {"code": self.code.map(crate::grpc_code_name), "message": self.message}})
    }
}

/// Runs a client command; returns the process exit status.
pub async fn run(common: Common, command: ClientCommand) -> i32 {
    let stdio_front = stdio_front(&command);
    match execute(&common, command).await {
        Ok(code) => code,
        Err(failure) => {
            if common.json {
                eprintln!("{}", failure.json());
            } else {
                eprintln!("error: {}", failure.text());
            }
            // A client that started the front sees stderr nowhere: its `initialize` is
            // answered with the reason, whatever failed (the daemon, the session, an option).
            if let Some((protocol, name)) = stdio_front
                && failure.before_handshake
            {
                let reason = format!("{name} cannot start: {}", failure.text());
                super::handshake::refuse(protocol, &reason).await;
            }
            2
        }
    }
}

/// The protocol and name of a front that serves its client on stdin/stdout, if `command` is one.
fn stdio_front(command: &ClientCommand) -> Option<(super::handshake::Protocol, &'static str)> {
    use super::handshake::Protocol;
    match command {
        ClientCommand::Mcp(_) => Some((Protocol::Mcp, "corral mcp")),
        ClientCommand::ExecServer(args) if args.listen == "stdio" => {
            Some((Protocol::ExecServer, "corral exec-server"))
        }
        _ => None,
    }
}

pub(super) fn status_text(s: tonic::Status) -> String {
    format!("{:?}: {}", s.code(), s.message())
}

async fn execute(common: &Common, command: ClientCommand) -> Result<i32, Failure> {
    // The socket rule shared with `corral serve`: --socket > CORRAL_SOCKET > this user's daemon
    // (if one is listening) > the system daemon, which serves every local user as themselves.
    let target = crate::daemon::socket::choose(
        common.socket.as_deref(),
        crate::daemon::socket::Side::Client,
    )?;
    let channel = connect_with(&target, &common.tcp_auth(&target)?).await?;
    match command {
        ClientCommand::Cp(args) => Ok(super::cp::run(common, channel, args).await?),
        ClientCommand::Health => super::info::health(common, channel).await,
        ClientCommand::Capabilities => super::info::capabilities(common, channel).await,
        ClientCommand::Tools {
            format,
            session,
            shell_tool,
        } => super::info::tools(common, channel, format, session, shell_tool).await,
        ClientCommand::Sessions => super::inventory::sessions(common, channel).await,
        ClientCommand::Ps { session } => {
            super::inventory::processes(common, channel, session).await
        }
        ClientCommand::Exec(args) => super::exec::run(common, channel, args).await,
        ClientCommand::OpenSession {
            cwd,
            mode,
            writable_roots,
            network,
            env,
            approval_policy,
            exclude_slash_tmp,
            exclude_tmpdir_env_var,
        } => {
            let mut request = open_session_request(cwd, mode, &writable_roots, network, &env)?;
            request.exclude_slash_tmp = exclude_slash_tmp;
            request.exclude_tmpdir_env_var = exclude_tmpdir_env_var;
            if let Some(p) = approval_policy {
                request.approval_policy = p.api() as i32;
            }
            let resp = SessionsClient::new(channel)
                .open_session(request)
                .await?
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
                .await?;
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
            let resp = result?.into_inner();
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
            let resp = result?.into_inner();
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
            let arguments = argument_text(&arguments)?;
            let (id, temporary) = open(&channel, &session).await?;
            let result = BridgeClient::new(channel.clone())
                .max_decoding_message_size(super::MAX_MESSAGE_BYTES)
                .invoke(api::InvokeRequest {
                    session_id: id.clone(),
                    name: name.clone(),
                    arguments: arguments.clone(),
                    call_id,
                    freeform,
                })
                .await;
            // An approval request is answered (asked on the terminal) before the session goes.
            let result = match result {
                Ok(resp) => super::approve::settle(&channel, &id, resp.into_inner(), approvals)
                    .await
                    .map_err(Failure::from),
                Err(s) => Err(Failure::from(s)),
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
            if !resp.success
                && let Some(hint) = patch_hint(&name, &arguments, freeform)
            {
                eprintln!("hint: {hint}");
            }
            Ok(if resp.success { 0 } else { 1 })
        }
        ClientCommand::Mcp(args) => super::mcp::serve(channel, args).await,
        ClientCommand::ExecServer(args) => Ok(super::exec_server::serve(channel, args).await?),
    }
}

/// The ARGUMENTS of `invoke`: `-` is stdin, `@FILE` a file's contents, anything else itself.
/// A patch or a long script then need not fit in argv, nor survive the shell's quoting.
fn argument_text(arguments: &str) -> Result<String, String> {
    use std::io::Read;
    if arguments == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| format!("reading the arguments from stdin: {e}"))?;
        return Ok(text);
    }
    match arguments.strip_prefix('@') {
        Some(file) => std::fs::read_to_string(file)
            .map_err(|e| format!("reading the arguments from {file}: {e}")),
        None => Ok(arguments.to_string()),
    }
}

/// What to tell a person whose apply_patch failed because of the input's format: Codex's
/// patch grammar is not a unified diff, and its freeform form is not JSON.
fn patch_hint(name: &str, arguments: &str, freeform: bool) -> Option<&'static str> {
    if name != "apply_patch" {
        return None;
    }
    let text = if freeform {
        arguments.to_string()
    } else {
        serde_json::from_str::<serde_json::Value>(arguments)
            .ok()
            .and_then(|v| v.get("input").and_then(|i| i.as_str()).map(String::from))
            .unwrap_or_else(|| arguments.to_string())
    };
    let unified = text
        .lines()
        .any(|l| l.starts_with("diff --git ") || l.starts_with("+++ ") || l.starts_with("@@ -"))
        && !text.contains("*** Begin Patch");
    if unified {
        return Some(
            "this looks like a unified diff; apply_patch takes Codex's patch format: \
             `*** Begin Patch`, then `*** Update File: PATH` (or Add/Delete File), `@@` hunks \
             of ` `/`-`/`+` lines, and `*** End Patch` (README, \"The CLI client\")",
        );
    }
    if !freeform && text.trim_start().starts_with("*** Begin Patch") {
        return Some(
            "a raw patch is a freeform input: add --freeform (or pass {\"input\": PATCH} as JSON)",
        );
    }
    None
}

/// The session to use: the given one, or a temporary one (closed afterwards).
pub(super) async fn open(
    channel: &Connection,
    opts: &SessionOpts,
) -> Result<(String, bool), Failure> {
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
            exclude_slash_tmp: opts.exclude_slash_tmp,
            exclude_tmpdir_env_var: opts.exclude_tmpdir_env_var,
            ..Default::default()
        })
        .await?
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
