//! The command line's shape: clap's definitions of the client commands and of the options they
//! share (connection, session), and what the connection options mean for a tcp: target. Parsing
//! only; what a command does is mod.rs's dispatch and the command's own module.

use crate::client::connect::TcpAuth;
use clap::{Args, Subcommand, ValueEnum};
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

pub use crate::socket::TOKEN_ENV;

impl Common {
    /// The TLS settings and token for a tcp: target. `$CORRAL_TOKEN` is used only for TCP
    /// targets, so a shell that exports it can still use Unix sockets; an explicit --token for
    /// a Unix socket is refused as a mistake.
    pub(super) fn tcp_auth(&self, target: &str) -> Result<TcpAuth, String> {
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
    pub approval_policy: Option<crate::client::approve::PolicyArg>,
    /// Leave /tmp out of the temporary session's writable roots (needed when the daemon keeps
    /// its own state there).
    #[arg(long)]
    pub exclude_slash_tmp: bool,
    /// Leave $TMPDIR (of the session's environment) out of the temporary session's writable
    /// roots.
    #[arg(long)]
    pub exclude_tmpdir_env_var: bool,
}

/// How a new session's commands reach the network.
#[derive(Debug, Clone, Default, Args)]
pub struct NetworkOpts {
    /// `--network` (or `--network on`): the host's network; `--network proxy`: only the hosts
    /// --allow-domain names, through corral's egress proxy; default: off.
    #[arg(long, value_enum, value_name = "MODE", num_args = 0..=1, default_missing_value = "on")]
    pub network: Option<NetworkArg>,
    /// With --network proxy: a host commands may reach (`example.com`, `*.example.com`,
    /// optionally `:PORT` or `:PORT,PORT`); repeatable.
    #[arg(long = "allow-domain", value_name = "HOST")]
    pub allow_domains: Vec<String>,
    /// With --network proxy: a host refused even when an allow rule matches; repeatable.
    #[arg(long = "deny-domain", value_name = "HOST")]
    pub deny_domains: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum NetworkArg {
    Off,
    On,
    Proxy,
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
    Exec(crate::client::exec::ExecArgs),
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
        #[command(flatten)]
        network: NetworkOpts,
        /// Environment for commands, NAME=VALUE (repeatable).
        #[arg(long = "env", value_name = "NAME=VALUE")]
        env: Vec<String>,
        /// When commands need your approval (default: none, nothing is asked).
        #[arg(long, value_enum, value_name = "POLICY")]
        approval_policy: Option<crate::client::approve::PolicyArg>,
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
    /// A `--network proxy` session's latest egress decisions, oldest first.
    EgressLog {
        /// The session's id.
        id: String,
    },
    /// Replace a `--network proxy` session's allow and deny rules (new connections follow).
    SetNetworkRules {
        /// The session's id.
        id: String,
        /// A host its commands may reach (`example.com`, `*.example.com`, optionally
        /// `:PORT` or `:PORT,PORT`); repeatable. None: nothing is reachable.
        #[arg(long = "allow-domain", value_name = "HOST")]
        allow_domains: Vec<String>,
        /// A host refused even when an allow rule matches; repeatable.
        #[arg(long = "deny-domain", value_name = "HOST")]
        deny_domains: Vec<String>,
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
    Cp(crate::client::cp::CpArgs),
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
        approvals: crate::client::approve::Answer,
        #[command(flatten)]
        session: SessionOpts,
    },
    /// Serve a session's tools to an MCP client on stdin/stdout (register this command as an
    /// MCP server).
    Mcp(crate::client::mcp::McpArgs),
    /// Serve Codex's exec-server protocol (WebSocket or stdio), so an unmodified Codex started
    /// with CODEX_EXEC_SERVER_URL runs every tool call in corral's sandbox.
    ExecServer(crate::client::exec_server::ExecServerArgs),
}
