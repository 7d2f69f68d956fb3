//! One connection of the exec-server front: the handshake, then each request answered by its
//! method — `process/*` on corral's Processes service, `fs/*` on its Files service, every call
//! in the corral session that enforces the sandbox Codex asked for. Requests after the
//! handshake run concurrently (a long `process/read` blocks nothing else); answers and
//! notifications leave through one bounded outbox, so a client that stops reading stalls only
//! itself.

use super::process::Process;
use super::rpc::{self, Frame, Incoming, RpcError};
use super::sandbox::{self, Mode};
use super::sessions::{ExecSession, Registry};
use super::{Channel, fs, uri};
use crate::api;
use base64::Engine;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Outgoing messages queued per connection before the senders wait.
pub const OUTBOX: usize = 256;

/// The longest `process/read` wait honoured.
const MAX_READ_WAIT: Duration = Duration::from_secs(30);

/// What every connection of this front shares.
pub struct Front {
    pub channel: Channel,
    /// The widest sandbox this front opens (`--max-mode`).
    pub max: Mode,
    /// The front's working directory: the environment's `cwd`, and where sandbox-less reads
    /// run.
    pub cwd: PathBuf,
    pub home: PathBuf,
    pub shell: PathBuf,
    pub registry: Arc<Registry>,
}

/// Serves one connection: `incoming` are its text frames (or lines), `outbox` takes what is
/// sent back. Returns when the client goes away or breaks the protocol.
pub async fn serve_connection(
    front: Arc<Front>,
    mut incoming: mpsc::Receiver<String>,
    outbox: mpsc::Sender<Value>,
) {
    let mut session: Option<Arc<ExecSession>> = None;
    while let Some(text) = incoming.recv().await {
        let frame = match rpc::parse_frame(&text) {
            Ok(f) => f,
            Err(e) => {
                let _ = outbox.send(rpc::error(json!(-1), &e)).await;
                continue;
            }
        };
        let messages = match frame {
            Frame::One(v) => vec![v],
            Frame::Batch(items) => {
                // A batch is answered as one array, in order.
                let answers = answer_batch(&front, &mut session, &outbox, items).await;
                let _ = outbox.send(Value::Array(answers)).await;
                continue;
            }
        };
        for value in messages {
            match rpc::parse_one(value) {
                Err(e) => {
                    let _ = outbox.send(rpc::error(json!(-1), &e)).await;
                }
                Ok(Incoming::Response) => {
                    tracing::warn!("the client sent a response; closing the connection");
                    return finish(&front, session, &outbox);
                }
                Ok(Incoming::Notification { method, .. }) if method == "initialized" => {}
                Ok(Incoming::Notification { method, .. }) => {
                    tracing::warn!("unexpected notification `{method}`; closing the connection");
                    return finish(&front, session, &outbox);
                }
                Ok(Incoming::Request { id, method, params }) if method == "initialize" => {
                    let answer = match initialize(&front, &mut session, &outbox, params) {
                        Ok(v) => rpc::result(id, v),
                        Err(e) => rpc::error(id, &e),
                    };
                    let _ = outbox.send(answer).await;
                }
                Ok(Incoming::Request { id, method, params }) => {
                    let Some(s) = session.clone() else {
                        let e = RpcError::new(rpc::INVALID_REQUEST, "send `initialize` first");
                        let _ = outbox.send(rpc::error(id, &e)).await;
                        continue;
                    };
                    let (front, outbox) = (front.clone(), outbox.clone());
                    tokio::spawn(async move {
                        let answer = match call(&front, &s, &method, params).await {
                            Ok(v) => rpc::result(id, v),
                            Err(e) => rpc::error(id, &e),
                        };
                        let _ = outbox.send(answer).await;
                    });
                }
            }
        }
    }
    finish(&front, session, &outbox)
}

fn finish(front: &Arc<Front>, session: Option<Arc<ExecSession>>, outbox: &mpsc::Sender<Value>) {
    if let Some(s) = session {
        front.registry.detach(&s, outbox);
    }
}

async fn answer_batch(
    front: &Arc<Front>,
    session: &mut Option<Arc<ExecSession>>,
    outbox: &mpsc::Sender<Value>,
    items: Vec<Value>,
) -> Vec<Value> {
    let mut answers = Vec::with_capacity(items.len());
    for item in items {
        let answer = match rpc::parse_one(item) {
            Ok(Incoming::Request { id, method, params }) => {
                let r = if method == "initialize" {
                    initialize(front, session, outbox, params)
                } else if let Some(s) = session.clone() {
                    call(front, &s, &method, params).await
                } else {
                    Err(RpcError::new(
                        rpc::INVALID_REQUEST,
                        "send `initialize` first",
                    ))
                };
                match r {
                    Ok(v) => rpc::result(id, v),
                    Err(e) => rpc::error(id, &e),
                }
            }
            Ok(_) => rpc::error(
                json!(-1),
                &RpcError::new(rpc::INVALID_REQUEST, "a batch may hold requests only"),
            ),
            Err(e) => rpc::error(json!(-1), &e),
        };
        answers.push(answer);
    }
    answers
}

fn initialize(
    front: &Arc<Front>,
    session: &mut Option<Arc<ExecSession>>,
    outbox: &mpsc::Sender<Value>,
    params: Value,
) -> Result<Value, RpcError> {
    if session.is_some() {
        return Err(RpcError::new(rpc::INVALID_REQUEST, "already initialized"));
    }
    let resume = params
        .get("resumeSessionId")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty());
    let s = match resume {
        Some(id) => front.registry.resume(id, outbox.clone())?,
        None => front
            .registry
            .create(front.channel.clone(), outbox.clone())?,
    };
    *session = Some(s.clone());
    Ok(json!({ "sessionId": s.id, "environmentInfo": environment_info(front) }))
}

/// What Codex learns of this environment. Every capability flag is false: corral serves none of
/// the methods they gate, and Codex then does not call them.
fn environment_info(front: &Front) -> Value {
    let shell_name = front
        .shell
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "sh".into());
    json!({
        "shell": { "name": shell_name, "path": front.shell.to_string_lossy() },
        "executorVersion": env!("CARGO_PKG_VERSION"),
        "cwd": uri::from_path(&front.cwd),
        "userHomeDir": uri::from_path(&front.home),
        "platformOs": "linux",
        "temporaryDirectories": [],
        "tempDir": "file:///tmp",
        "capabilities": {
            "networkProxyLaunch": false,
            "networkProxyReviewDomains": false,
            "networkProxyTransparentTcp": false,
            "credentialMasking": false,
            "credentialMaskingCustomProviders": false,
            "capabilityDiscoverySandbox": false,
            "fsWatchMissing": false,
            "capabilityDiscoveryV2": false,
            "environmentConfigRead": false,
            "httpHeaderEnvVars": false,
            "sandboxedFileStreaming": false,
            "fileWriteStreaming": false,
            "shellSnapshotV2": false,
            "windowsMxc": false,
            "linuxRootWritePreservesDevices": false,
            "linuxApprovedRootWritePreservesRestrictions": false,
        },
    })
}

async fn call(
    front: &Arc<Front>,
    s: &Arc<ExecSession>,
    method: &str,
    params: Value,
) -> Result<Value, RpcError> {
    match method {
        "environment/info" => Ok(environment_info(front)),
        "environment/status" => Ok(json!({ "status": "ready" })),
        "process/start" => start(front, s, params).await,
        "process/read" => read(s, params).await,
        "process/write" => write(s, params).await,
        "process/signal" => signal(s, params).await,
        "process/terminate" => terminate(s, params).await,
        m if m.starts_with("fs/") && fs::serves(m) => fs::call(front, s, m, params).await,
        other => Err(RpcError::new(
            rpc::METHOD_NOT_FOUND,
            format!(
                "corral's exec-server does not implement `{other}` (the capability that gates \
                 it is false)"
            ),
        )),
    }
}

/// The string member `name` of `params`.
pub fn string<'a>(params: &'a Value, name: &str) -> Result<&'a str, RpcError> {
    params
        .get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| RpcError::invalid_params(format!("`{name}` (a string) is required")))
}

fn process_of(s: &ExecSession, params: &Value) -> Result<Arc<Process>, RpcError> {
    let id = string(params, "processId")?;
    s.process(id).ok_or_else(|| {
        RpcError::new(
            rpc::INVALID_REQUEST,
            format!("unknown process `{id}` in this session"),
        )
    })
}

async fn start(front: &Front, s: &Arc<ExecSession>, params: Value) -> Result<Value, RpcError> {
    let id = string(&params, "processId")?.to_string();
    let argv: Vec<String> = match params.get("argv") {
        Some(Value::Array(a)) if !a.is_empty() => a
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<_>>()
            .ok_or_else(|| RpcError::invalid_params("`argv` must hold strings"))?,
        _ => return Err(RpcError::invalid_params("`argv` must be a non-empty array")),
    };
    let cwd = uri::to_path("cwd", params.get("cwd").unwrap_or(&Value::Null))?;
    if params.get("enforceManagedNetwork").and_then(Value::as_bool) == Some(true) {
        return Err(RpcError::invalid_params(
            "corral's exec-server has no managed network proxy: enforceManagedNetwork cannot \
             be honoured (run Codex without a managed network policy, or with the network \
             off)",
        ));
    }
    let tty = params.get("tty").and_then(Value::as_bool).unwrap_or(false);
    let pipe_stdin = params
        .get("pipeStdin")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let spec = sandbox::session_for(
        params.get("sandbox").unwrap_or(&Value::Null),
        &cwd,
        front.max,
    )?;
    // What the command gets on top of the session's environment (built by the daemon from the
    // user's passwd entry): the policy's `set`, then `env`. corral's session environment is
    // its own, never this front's: `inherit` and `exclude` apply to nothing here.
    let mut env = std::collections::HashMap::new();
    for source in [
        params.get("envPolicy").and_then(|p| p.get("set")),
        params.get("env"),
    ]
    .into_iter()
    .flatten()
    {
        if let Some(m) = source.as_object() {
            for (k, v) in m {
                if let Some(v) = v.as_str() {
                    env.insert(k.clone(), v.to_string());
                }
            }
        }
    }
    s.claim(&id)?;
    let corral_session = s.corral_session(&spec).await?;
    let mut client = s.processes_client();
    let started = client
        .start_process(api::StartProcessRequest {
            session_id: corral_session.clone(),
            command: Some(api::start_process_request::Command::Argv(api::Argv {
                args: argv,
            })),
            workdir: cwd.to_string_lossy().into_owned(),
            tty,
            env,
            ..Default::default()
        })
        .await
        .map_err(|st| rpc_error(&st))?
        .into_inner();
    if started.approval.is_some() {
        return Err(RpcError::internal(
            "the corral session asked for an approval; exec-server sessions never do",
        ));
    }
    let stdin = tty || pipe_stdin;
    let mut p = Process::new(
        id.clone(),
        corral_session.clone(),
        started.process_id,
        tty,
        stdin,
    );
    p.sandboxed = spec.mode != Mode::DangerFullAccess;
    let p = Arc::new(p);
    if !stdin {
        // Codex's semantics: without pipeStdin a pipe process has no stdin (EOF at once).
        let _ = client
            .write_process(api::WriteProcessRequest {
                session_id: corral_session,
                process_id: started.process_id,
                data: Vec::new(),
                close_stdin: true,
            })
            .await;
    }
    s.insert(p.clone());
    let session = s.clone();
    tokio::spawn(async move {
        p.clone().pump(client, session.outbox.clone()).await;
        session.retire(&p).await;
    });
    let sandbox_type = if spec.mode == Mode::DangerFullAccess {
        "none"
    } else {
        "linuxSeccomp"
    };
    Ok(json!({ "processId": id, "sandboxType": sandbox_type }))
}

async fn read(s: &ExecSession, params: Value) -> Result<Value, RpcError> {
    let p = process_of(s, &params)?;
    let after = params.get("afterSeq").and_then(Value::as_u64).unwrap_or(0);
    let max = params
        .get("maxBytes")
        .and_then(Value::as_u64)
        .map_or(super::process::RETAINED_BYTES, |m| m as usize);
    let wait = params
        .get("waitMs")
        .and_then(Value::as_u64)
        .map_or(Duration::ZERO, Duration::from_millis)
        .min(MAX_READ_WAIT);
    Ok(p.read(after, max, wait).await)
}

async fn write(s: &ExecSession, params: Value) -> Result<Value, RpcError> {
    let status = |st: &str| Ok(json!({ "status": st }));
    let Some(p) = string(&params, "processId")
        .ok()
        .and_then(|id| s.process(id))
    else {
        return status("unknownProcess");
    };
    let data = base64::engine::general_purpose::STANDARD
        .decode(string(&params, "chunk")?)
        .map_err(|e| RpcError::invalid_params(format!("`chunk` is not base64: {e}")))?;
    let write_id = string(&params, "writeId")?;
    if !p.stdin_open.load(std::sync::atomic::Ordering::SeqCst) || !p.running() {
        return status("stdinClosed");
    }
    if !p.first_write(write_id) {
        return status("accepted");
    }
    match s
        .processes_client()
        .write_process(api::WriteProcessRequest {
            session_id: p.corral_session.clone(),
            process_id: p.corral_id,
            data,
            close_stdin: false,
        })
        .await
    {
        Ok(_) => status("accepted"),
        Err(st) if st.code() == tonic::Code::FailedPrecondition => {
            p.close_stdin();
            status("stdinClosed")
        }
        Err(st) if st.code() == tonic::Code::NotFound => status("unknownProcess"),
        Err(st) => Err(rpc_error(&st)),
    }
}

async fn signal(s: &ExecSession, params: Value) -> Result<Value, RpcError> {
    let p = process_of(s, &params)?;
    let signal = match string(&params, "signal")? {
        "interrupt" => "INT",
        other => {
            return Err(RpcError::invalid_params(format!(
                "unknown signal {other:?} (interrupt)"
            )));
        }
    };
    s.processes_client()
        .signal_process(api::SignalProcessRequest {
            session_id: p.corral_session.clone(),
            process_id: p.corral_id,
            signal: signal.into(),
        })
        .await
        .map_err(|st| rpc_error(&st))?;
    Ok(json!({}))
}

/// Ends a process. A process this session does not hold, or already terminated, answers
/// `running: false` and kills nothing, as Codex 0.171's own server does: Codex terminates a TTY
/// process twice at the end of a turn (tests/codex/trace-0.171.0.jsonl). The process stays
/// readable until the pump retires it ([`ExecSession::retire`]).
async fn terminate(s: &ExecSession, params: Value) -> Result<Value, RpcError> {
    let id = string(&params, "processId")?;
    let Some(p) = s.process(id) else {
        return Ok(json!({ "running": false }));
    };
    let running = p.running();
    if !p.mark_terminated() {
        return Ok(json!({ "running": false }));
    }
    match s
        .processes_client()
        .terminate_process(api::TerminateProcessRequest {
            session_id: p.corral_session.clone(),
            process_id: p.corral_id,
        })
        .await
    {
        // NotFound: corral forgot it already (retired after its close).
        Ok(_) => {}
        Err(st) if st.code() == tonic::Code::NotFound => {}
        Err(st) => return Err(rpc_error(&st)),
    }
    Ok(json!({ "running": running }))
}

/// A corral status as a JSON-RPC error: a missing path is Codex's `-32004` with the OS error's
/// text, bad input `-32602`, anything else `-32603` with corral's message (which names the
/// rule that refused).
pub fn rpc_error(status: &tonic::Status) -> RpcError {
    match status.code() {
        tonic::Code::NotFound => RpcError::new(rpc::NOT_FOUND, status.message()),
        tonic::Code::InvalidArgument => RpcError::invalid_params(status.message()),
        _ => RpcError::internal(status.message()),
    }
}
