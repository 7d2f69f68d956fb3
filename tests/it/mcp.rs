//! `corral mcp` against a real daemon: the MCP front is a child process with stdio pipes (or a
//! socket pair, as Node-based MCP hosts give), and the test speaks MCP's JSON-RPC to it line by
//! line, as an MCP client does.

use crate::common::{self, Daemon, eventually, host_pids, scratch};
use corral::api::{self, SandboxMode};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, Command};

/// Longest wait for one MCP answer (a debug build on a busy machine).
const ANSWER: Duration = Duration::from_secs(30);

/// A running `corral mcp` and the client end of its stdio.
struct Mcp {
    child: Child,
    stdin: Option<Box<dyn AsyncWrite + Unpin + Send>>,
    stdout: Lines<BufReader<Box<dyn AsyncRead + Unpin + Send>>>,
    stderr: PathBuf,
    _logs: tempfile::TempDir,
    next_id: u64,
}

impl Mcp {
    /// Starts `corral --socket SOCKET mcp ARGS...` and completes the MCP handshake; returns the
    /// front and the `initialize` result.
    async fn start(d: &Daemon, args: &[&str]) -> (Mcp, Value) {
        Self::start_over(d, args, false).await
    }

    /// [`Mcp::start`] with stdin and stdout on one end of a socket pair when `socket`.
    async fn start_over(d: &Daemon, args: &[&str], socket: bool) -> (Mcp, Value) {
        let logs = tempfile::tempdir().unwrap();
        let stderr = logs.path().join("mcp.stderr");
        let mut command = Command::new(common::CORRAL);
        command
            .args(["--socket", d.target(), "mcp"])
            .args(args)
            .stderr(std::fs::File::create(&stderr).unwrap())
            .kill_on_drop(true);
        type Ends = (
            Box<dyn AsyncWrite + Unpin + Send>,
            Box<dyn AsyncRead + Unpin + Send>,
        );
        let (child, (stdin, stdout)): (Child, Ends) = if socket {
            let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
            command
                .stdin(Stdio::from(std::os::fd::OwnedFd::from(
                    theirs.try_clone().unwrap(),
                )))
                .stdout(Stdio::from(std::os::fd::OwnedFd::from(theirs)));
            let child = command.spawn().expect("spawn corral mcp");
            ours.set_nonblocking(true).unwrap();
            // Dropping the write half shuts the socket down for writing: the front sees EOF.
            let (read, write) = tokio::net::UnixStream::from_std(ours).unwrap().into_split();
            (child, (Box::new(write), Box::new(read)))
        } else {
            let mut child = command
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn corral mcp");
            let ends: Ends = (
                Box::new(child.stdin.take().unwrap()),
                Box::new(child.stdout.take().unwrap()),
            );
            (child, ends)
        };
        let mut mcp = Mcp {
            stdin: Some(stdin),
            stdout: BufReader::new(stdout).lines(),
            child,
            stderr,
            _logs: logs,
            next_id: 1,
        };
        let init = mcp
            .request(
                "initialize",
                json!({
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "corral-tests", "version": "1"},
                }),
            )
            .await;
        let init = mcp.result(init);
        mcp.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        (mcp, init)
    }

    fn stderr_text(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    async fn send(&mut self, message: Value) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin
            .write_all(format!("{message}\n").as_bytes())
            .await
            .unwrap();
        stdin.flush().await.unwrap();
    }

    /// Sends a request and returns the answer with its id. Every line on stdout must be a
    /// JSON-RPC 2.0 message: stdout is the protocol and nothing else.
    async fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        loop {
            let line = tokio::time::timeout(ANSWER, self.stdout.next_line())
                .await
                .unwrap_or_else(|_| {
                    panic!("no answer to {method}; stderr:\n{}", self.stderr_text())
                })
                .unwrap()
                .unwrap_or_else(|| panic!("stdout closed; stderr:\n{}", self.stderr_text()));
            let message: Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("not JSON on stdout ({e}): {line}"));
            assert_eq!(message["jsonrpc"], "2.0", "{line}");
            if message["id"] == json!(id) {
                return message;
            }
        }
    }

    fn result(&self, answer: Value) -> Value {
        match answer.get("result") {
            Some(result) => result.clone(),
            None => panic!("error answer: {answer}; stderr:\n{}", self.stderr_text()),
        }
    }

    /// tools/call; returns (the one text item, isError).
    async fn call(&mut self, name: &str, arguments: Value) -> (String, bool) {
        let answer = self
            .request("tools/call", json!({"name": name, "arguments": arguments}))
            .await;
        let result = self.result(answer);
        let content = result["content"].as_array().expect("content array");
        assert_eq!(content.len(), 1, "{result}");
        assert_eq!(content[0]["type"], "text", "{result}");
        let text = content[0]["text"].as_str().unwrap().to_string();
        (text, result["isError"].as_bool().unwrap_or(false))
    }

    /// Closes stdin (how an MCP client ends a stdio server) and waits for the exit.
    async fn finish(mut self) -> ExitStatus {
        drop(self.stdin.take());
        tokio::time::timeout(ANSWER, self.child.wait())
            .await
            .expect("corral mcp exits when its stdin closes")
            .unwrap()
    }
}

/// The `Process running with session ID {n}` of an exec_command answer.
fn process_id_of(text: &str) -> i64 {
    text.lines()
        .find_map(|l| l.strip_prefix("Process running with session ID "))
        .unwrap_or_else(|| panic!("no running process in: {text}"))
        .parse()
        .unwrap()
}

fn path_arg(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The handshake, tools/list against the daemon's own listing, calls that succeed and fail,
/// unified exec state across calls, and an unknown tool.
#[tokio::test]
async fn lists_and_calls_the_session_tools() {
    let d = Daemon::start(&[]).await;
    let cwd = scratch();
    std::fs::write(cwd.path().join("hello.txt"), "hello from the host\n").unwrap();
    let (mut mcp, init) = Mcp::start(
        &d,
        &["--cwd", path_arg(cwd.path()), "--mode", "workspace-write"],
    )
    .await;
    assert_eq!(init["serverInfo"]["name"], "corral", "{init}");
    assert_eq!(init["protocolVersion"], "2025-06-18", "{init}");
    assert!(init["capabilities"]["tools"].is_object(), "{init}");

    let answer = mcp.request("tools/list", json!({})).await;
    let tools = mcp.result(answer)["tools"].as_array().unwrap().clone();
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    // The same tools, in the same order, as the bridge lists for a default session.
    let s = d.open(cwd.path(), SandboxMode::WorkspaceWrite).await;
    let listed = d
        .bridge()
        .await
        .list_tools(api::ListToolsRequest {
            format: api::ToolFormat::ChatCompletions as i32,
            session_id: s,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(names, listed.names);
    assert!(names.contains(&"exec_command") && names.contains(&"write_stdin"));
    for tool in &tools {
        assert_eq!(tool["inputSchema"]["type"], "object", "{tool}");
        assert!(!tool["description"].as_str().unwrap().is_empty(), "{tool}");
    }
    // Annotations: the tools that change nothing say so (Codex runs them without approval).
    for tool in &tools {
        let name = tool["name"].as_str().unwrap();
        let read_only = matches!(
            name,
            "read_file" | "list_dir" | "grep_files" | "view_image" | "update_plan"
        );
        assert_eq!(
            tool["annotations"]["readOnlyHint"],
            json!(read_only),
            "{tool}"
        );
        if !read_only {
            assert_eq!(
                tool["annotations"]["destructiveHint"],
                json!(true),
                "{tool}"
            );
        }
    }
    // apply_patch, freeform in a default session, is listed (and called) as its JSON form.
    let patch = tools.iter().find(|t| t["name"] == "apply_patch").unwrap();
    assert_eq!(patch["inputSchema"]["required"], json!(["input"]));

    let (text, is_error) = mcp
        .call("exec_command", json!({"cmd": "echo hi-from-mcp; pwd"}))
        .await;
    assert!(!is_error, "{text}");
    assert!(text.contains("Process exited with code 0"), "{text}");
    assert!(text.contains("hi-from-mcp"), "{text}");
    assert!(text.contains(path_arg(cwd.path())), "{text}");

    let (text, is_error) = mcp
        .call("read_file", json!({"file_path": "hello.txt"}))
        .await;
    assert!(!is_error, "{text}");
    assert!(text.contains("hello from the host"), "{text}");

    // A tool that fails answers with isError and the tool's own text, not a protocol error.
    let (text, is_error) = mcp
        .call("write_stdin", json!({"session_id": 999999, "chars": ""}))
        .await;
    assert!(is_error);
    assert_eq!(text, "write_stdin failed: Unknown process id 999999");
    let (text, is_error) = mcp
        .call("read_file", json!({"file_path": "absent.txt"}))
        .await;
    assert!(is_error, "{text}");

    // Unified exec keeps its process between calls: what write_stdin sends, the process reads.
    let (text, is_error) = mcp
        .call(
            "exec_command",
            json!({"cmd": "read line; echo got:$line", "tty": true, "yield_time_ms": 300}),
        )
        .await;
    assert!(!is_error, "{text}");
    let id = process_id_of(&text);
    let (text, is_error) = mcp
        .call(
            "write_stdin",
            json!({"session_id": id, "chars": "abc\n", "yield_time_ms": 2000}),
        )
        .await;
    assert!(!is_error, "{text}");
    assert!(text.contains("got:abc"), "{text}");

    // JSON null is "absent" for every optional argument (strict-schema clients send it).
    let (text, is_error) = mcp
        .call(
            "exec_command",
            json!({"cmd": "echo null-is-absent", "tty": null, "yield_time_ms": null,
                "workdir": null, "shell": null, "login": null, "max_output_tokens": null,
                "sandbox_permissions": null, "justification": null, "prefix_rule": null}),
        )
        .await;
    assert!(!is_error && text.contains("null-is-absent"), "{text}");
    let (text, is_error) = mcp
        .call(
            "exec_command",
            json!({"cmd": "sleep 2", "tty": null, "yield_time_ms": 300}),
        )
        .await;
    assert!(!is_error, "{text}");
    let id = process_id_of(&text);
    let (text, is_error) = mcp
        .call(
            "write_stdin",
            json!({"session_id": id, "chars": null, "yield_time_ms": null,
                "max_output_tokens": null}),
        )
        .await;
    assert!(!is_error, "{text}");
    assert!(text.contains("Process exited with code 0"), "{text}");
    let (text, is_error) = mcp
        .call(
            "read_file",
            json!({"file_path": "hello.txt", "offset": null, "limit": null, "mode": null,
                "indentation": null}),
        )
        .await;
    assert!(!is_error && text.contains("hello from the host"), "{text}");

    // apply_patch through its JSON form writes in a workspace-write session.
    let (text, is_error) = mcp
        .call(
            "apply_patch",
            json!({"input": "*** Begin Patch\n*** Add File: made.txt\n+made by mcp\n*** End Patch\n"}),
        )
        .await;
    assert!(!is_error, "{text}");
    assert_eq!(
        std::fs::read_to_string(cwd.path().join("made.txt")).unwrap(),
        "made by mcp\n"
    );

    // An unknown tool is a protocol error (invalid params), as the MCP spec says.
    let answer = mcp
        .request("tools/call", json!({"name": "rm_rf", "arguments": {}}))
        .await;
    assert_eq!(answer["error"]["code"], -32602, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("unknown tool: rm_rf"),
        "{answer}"
    );

    assert!(mcp.finish().await.success());
}

/// The default mode is read-only: writes are refused (isError) and nothing reaches the host,
/// by apply_patch or by a command.
#[tokio::test]
async fn read_only_by_default_refuses_writes() {
    let d = Daemon::start(&[]).await;
    let cwd = scratch();
    let (mut mcp, init) = Mcp::start(&d, &["--cwd", path_arg(cwd.path())]).await;
    assert!(
        init["instructions"].as_str().unwrap().contains("read-only"),
        "{init}"
    );
    let (text, is_error) = mcp
        .call(
            "apply_patch",
            json!({"input": "*** Begin Patch\n*** Add File: nope.txt\n+x\n*** End Patch\n"}),
        )
        .await;
    assert!(is_error, "{text}");
    let (text, _) = mcp
        .call(
            "exec_command",
            json!({"cmd": "echo x > nope2.txt; echo rc=$?"}),
        )
        .await;
    assert!(text.contains("rc=1"), "{text}");
    assert!(!cwd.path().join("nope.txt").exists());
    assert!(!cwd.path().join("nope2.txt").exists());
    // Reading is allowed; view_image answers with an MCP image item, not the text fallback.
    let (text, is_error) = mcp.call("list_dir", json!({"dir_path": "."})).await;
    assert!(!is_error, "{text}");
    let img = image::RgbaImage::from_pixel(4, 3, image::Rgba([200, 30, 60, 255]));
    let mut png = std::io::Cursor::new(Vec::new());
    image::DynamicImage::ImageRgba8(img)
        .write_to(&mut png, image::ImageFormat::Png)
        .unwrap();
    std::fs::write(cwd.path().join("shot.png"), png.get_ref()).unwrap();
    let answer = mcp
        .request(
            "tools/call",
            json!({"name": "view_image", "arguments": {"path": "shot.png"}}),
        )
        .await;
    let result = mcp.result(answer);
    use base64::Engine;
    assert_eq!(
        result["content"],
        json!([{
            "type": "image",
            "mimeType": "image/png",
            "data": base64::engine::general_purpose::STANDARD.encode(png.get_ref()),
        }]),
        "{result}"
    );
    assert!(mcp.finish().await.success());
}

/// The session `corral mcp` opened dies with it (its processes are killed) when the client
/// closes stdin, and also on SIGTERM — with stdio on pipes or on a socket (where the front's
/// pending read of stdin cannot be cancelled, so it must not wait for it to exit).
#[tokio::test]
async fn owned_session_closes_on_eof_and_on_sigterm() {
    let d = Daemon::start(&[]).await;
    let cwd = scratch();
    for (marker, by_signal, socket) in [
        ("4242.171", false, false),
        ("4242.172", true, false),
        ("4242.173", false, true),
        ("4242.174", true, true),
    ] {
        let (mut mcp, _) = Mcp::start_over(&d, &["--cwd", path_arg(cwd.path())], socket).await;
        let (text, is_error) = mcp
            .call(
                "exec_command",
                json!({"cmd": format!("sleep {marker}"), "yield_time_ms": 300}),
            )
            .await;
        assert!(!is_error, "{text}");
        process_id_of(&text);
        let pattern = format!("[s]leep {marker}");
        assert_eq!(host_pids(&pattern).len(), 1, "the process runs");
        let status = if by_signal {
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(mcp.child.id().unwrap() as i32),
                nix::sys::signal::Signal::SIGTERM,
            )
            .unwrap();
            tokio::time::timeout(ANSWER, mcp.child.wait())
                .await
                .expect("exits on SIGTERM")
                .unwrap()
        } else {
            mcp.finish().await
        };
        assert!(status.success(), "{status:?}");
        assert!(
            eventually(Duration::from_secs(10), || host_pids(&pattern).is_empty()).await,
            "the session's process outlived corral mcp (by_signal: {by_signal}, socket: {socket})"
        );
    }
}

/// --session serves an existing session and leaves it open; a gRPC error (the session closed
/// behind the front's back) is a tool error carrying the status, not a protocol error.
#[tokio::test]
async fn attached_session_stays_open_and_grpc_errors_are_tool_errors() {
    let d = Daemon::start(&[]).await;
    let cwd = scratch();
    let s = d.open(cwd.path(), SandboxMode::ReadOnly).await;
    let (mut mcp, _) = Mcp::start(&d, &["--session", &s]).await;
    let (text, is_error) = mcp
        .call("exec_command", json!({"cmd": "echo attached"}))
        .await;
    assert!(!is_error && text.contains("attached"), "{text}");
    assert!(mcp.finish().await.success());
    // Still open after the front exits.
    let (text, ok) = d
        .invoke(
            &s,
            "exec_command",
            &json!({"cmd": "echo still-open"}).to_string(),
        )
        .await;
    assert!(ok && text.contains("still-open"), "{text}");

    let (mut mcp, _) = Mcp::start(&d, &["--session", &s]).await;
    d.sessions()
        .await
        .close_session(api::CloseSessionRequest {
            session_id: s.clone(),
        })
        .await
        .unwrap();
    let (text, is_error) = mcp.call("exec_command", json!({"cmd": "echo gone"})).await;
    assert!(is_error, "{text}");
    assert!(text.starts_with("NotFound: "), "{text}");
    assert!(mcp.finish().await.success());

    // Attaching to a session that does not exist fails before serving: an error on stderr,
    // nothing on stdout, exit status 2.
    let out = Command::new(common::CORRAL)
        .args(["--socket", d.target(), "mcp", "--session", &s])
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("error: session") && stderr.contains("NotFound"),
        "{stderr}"
    );
}

/// The front keeps its session from idle expiry while the client is connected; an untouched
/// session with the same timeout does expire.
#[tokio::test]
async fn session_stays_alive_while_connected() {
    let d = Daemon::start(&["--session-idle-timeout", "1"]).await;
    let cwd = scratch();
    let idle = d.open(cwd.path(), SandboxMode::ReadOnly).await;
    let (mut mcp, _) = Mcp::start(&d, &["--cwd", path_arg(cwd.path())]).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (text, is_error) = mcp.call("exec_command", json!({"cmd": "echo alive"})).await;
    assert!(!is_error && text.contains("alive"), "{text}");
    let expired = d
        .bridge()
        .await
        .invoke(api::InvokeRequest {
            session_id: idle,
            name: "exec_command".into(),
            arguments: json!({"cmd": "true"}).to_string(),
            call_id: "c".into(),
            freeform: false,
        })
        .await
        .unwrap_err();
    assert_eq!(expired.code(), tonic::Code::NotFound);
    assert!(mcp.finish().await.success());
}

/// A request the client cancels (notifications/cancelled) drops its gRPC call: the daemon kills
/// the command, and no answer is sent for it.
#[tokio::test]
async fn a_cancelled_call_kills_its_command() {
    let d = Daemon::start(&[]).await;
    let cwd = scratch();
    let s = d
        .open_with(api::OpenSessionRequest {
            cwd: cwd.path().to_string_lossy().into_owned(),
            mode: SandboxMode::ReadOnly as i32,
            env: common::session_env(cwd.path()),
            shell_tool: api::ShellTool::Shell as i32,
            ..Default::default()
        })
        .await;
    let (mut mcp, _) = Mcp::start(&d, &["--session", &s]).await;
    let id = mcp.next_id;
    mcp.next_id += 1;
    mcp.send(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": "shell", "arguments": {"command": ["sleep", "4242.31"], "timeout_ms": 120_000}}}))
        .await;
    let pattern = "[s]leep 4242.31";
    assert!(
        eventually(Duration::from_secs(10), || host_pids(pattern).len() == 1).await,
        "the command started"
    );
    mcp.send(
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": id, "reason": "test"}}),
    )
    .await;
    // Well inside the command's own timeout: only the cancellation can have ended it.
    assert!(
        eventually(Duration::from_secs(20), || host_pids(pattern).is_empty()).await,
        "the cancelled command still runs"
    );
    // The next answer is the next request's: nothing came for the cancelled one (request()
    // skips only messages with other ids, so look at what arrives first).
    let next = mcp.next_id;
    mcp.send(json!({"jsonrpc": "2.0", "id": next, "method": "ping"}))
        .await;
    mcp.next_id += 1;
    let line = tokio::time::timeout(ANSWER, mcp.stdout.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let first: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(first["id"], json!(next), "{first}");
    assert!(mcp.finish().await.success());
}

/// Starts `corral ARGS...` as an MCP or exec-server client would, sends `initialize`, and
/// returns the exit status, stderr, and the one answer it got (`Value::Null` if none).
async fn refused_start(args: &[&str], jsonrpc: bool) -> (Option<i32>, String, Value) {
    let mut child = Command::new(common::CORRAL)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut request = json!({"id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "corral-tests", "version": "1"}}});
    if jsonrpc {
        request["jsonrpc"] = json!("2.0");
    }
    let mut stdin = child.stdin.take().unwrap();
    // A notification first: skipped, not answered.
    stdin
        .write_all(format!("{}\n{request}\n", json!({"method": "noise"})).as_bytes())
        .await
        .unwrap();
    let out = tokio::time::timeout(ANSWER, child.wait_with_output())
        .await
        .expect("the front exits after answering initialize")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lines = stdout.lines();
    let answer = lines
        .next()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .unwrap_or(Value::Null);
    assert_eq!(lines.next(), None, "one answer only: {stdout}");
    drop(stdin);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        answer,
    )
}

/// A front that cannot start says why on stderr and in its answer to `initialize` (MCP
/// clients and Codex show no stderr), then exits 2: no daemon, a refused session, and the
/// exec-server's stdio form (whose dialect has no `jsonrpc` member).
#[tokio::test]
async fn a_front_that_cannot_start_answers_initialize_with_the_reason() {
    let nowhere = common::outside();
    let socket = nowhere.path().join("nope.sock");
    let socket = socket.to_str().unwrap();
    for (args, jsonrpc) in [
        (vec!["--socket", socket, "mcp"], true),
        (
            vec!["--socket", socket, "exec-server", "--listen", "stdio"],
            false,
        ),
    ] {
        let (code, stderr, answer) = refused_start(&args, jsonrpc).await;
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("cannot connect to"), "{stderr}");
        assert_eq!(answer["id"], 1, "{answer}");
        assert_eq!(answer["error"]["code"], -32603, "{answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("cannot start: cannot connect to") && message.contains(socket),
            "{message}"
        );
        assert_eq!(answer.get("jsonrpc").is_some(), jsonrpc, "{answer}");
    }

    let d = Daemon::start(&[]).await;
    let (code, stderr, answer) =
        refused_start(&["--socket", d.target(), "mcp", "--session", "nope"], true).await;
    assert_eq!(code, Some(2), "{stderr}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("corral mcp cannot start: session nope: NotFound: "),
        "{message}"
    );
    assert!(stderr.contains("session nope: NotFound"), "{stderr}");
}

/// `--mode workspace-write` against a daemon whose socket lies under /tmp: the refusal names
/// the socket's directory and the flag that fixes it (on stderr and in the answer to
/// `initialize`), the flag works, and the gRPC refusal names the field in a BadRequest. The
/// same for a `$TMPDIR` root and `--exclude-tmpdir-env-var`.
#[tokio::test]
async fn workspace_write_with_the_socket_under_tmp_names_the_flag_that_fixes_it() {
    let state = tempfile::tempdir_in("/tmp").unwrap();
    let socket = state.path().join("corral.sock");
    let d = Daemon::start_at(&socket, &[], &[], Stdio::null()).await;
    let cwd = common::outside();
    let dir = path_arg(cwd.path());
    let (code, stderr, answer) = refused_start(
        &[
            "--socket",
            d.target(),
            "mcp",
            "--mode",
            "workspace-write",
            "--cwd",
            dir,
        ],
        true,
    )
    .await;
    assert_eq!(code, Some(2), "{stderr}");
    let message = answer["error"]["message"].as_str().unwrap();
    for want in [
        "writable root /tmp contains corral's own state",
        "the directory of the daemon's socket",
        "`--exclude-slash-tmp`",
    ] {
        assert!(message.contains(want), "{want}: {message}");
        assert!(stderr.contains(want), "{want}: {stderr}");
    }

    let (mut mcp, _) = Mcp::start(
        &d,
        &[
            "--mode",
            "workspace-write",
            "--exclude-slash-tmp",
            "--cwd",
            dir,
        ],
    )
    .await;
    let (text, is_error) = mcp
        .call("exec_command", json!({"cmd": "echo made > made.txt"}))
        .await;
    assert!(!is_error, "{text}");
    assert!(cwd.path().join("made.txt").exists(), "{text}");
    assert!(mcp.finish().await.success());

    // gRPC: the field that brought the root in, in a google.rpc.BadRequest.
    use tonic_types::StatusExt;
    let open = |exclude_slash_tmp: bool, tmpdir: Option<&Path>| api::OpenSessionRequest {
        cwd: dir.to_string(),
        mode: SandboxMode::WorkspaceWrite as i32,
        exclude_slash_tmp,
        env: tmpdir
            .map(|t| [("TMPDIR".to_string(), t.display().to_string())].into())
            .unwrap_or_default(),
        ..Default::default()
    };
    let tmpdir = std::fs::canonicalize(state.path()).unwrap();
    for (req, field) in [
        (open(false, None), "exclude_slash_tmp"),
        (open(true, Some(&tmpdir)), "exclude_tmpdir_env_var"),
    ] {
        let err = d.try_open_with(req).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        let bad = err.get_details_bad_request().expect("a BadRequest");
        assert_eq!(bad.field_violations[0].field, field, "{}", err.message());
    }
    // And the CLI flag for $TMPDIR.
    let tmpdir_env = format!("TMPDIR={}", tmpdir.display());
    let open_session = |extra: &[&str]| {
        let mut args = vec![
            "--socket",
            d.target(),
            "open-session",
            "--mode",
            "workspace-write",
            "--cwd",
            dir,
            "--exclude-slash-tmp",
            "--env",
            &tmpdir_env,
        ];
        args.extend_from_slice(extra);
        std::process::Command::new(common::CORRAL)
            .args(args)
            .output()
            .unwrap()
    };
    let out = open_session(&[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("`--exclude-tmpdir-env-var`"), "{stderr}");
    let out = open_session(&["--exclude-tmpdir-env-var"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
