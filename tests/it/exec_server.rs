//! `corral exec-server` driven by the real, pinned Codex (`tests/codex/VERSION`; CI installs it
//! and sets CORRAL_CODEX): an unmodified `codex exec` with CODEX_EXEC_SERVER_URL pointing at the
//! front runs a scripted turn — the model is a mock of the Responses API on loopback — and
//! every tool call lands in corral's sandbox. Judged on the host: what the sandbox may write
//! is there, what it may not is not, and the daemon's audit log names each call.

use crate::codex_support::{
    self, Front, MockModel, codex, codex_exec, codex_home, output_of, scripted_turns, write_pixel,
};
use crate::common::{self, Daemon, outside, scratch};
use serde_json::{Value, json};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// The whole turn: a command that writes inside the workspace and tries outside, a TTY process
/// driven with write_stdin, a freeform apply_patch, a view_image. Everything Codex ran went
/// through corral: the write outside is refused by corral's sandbox (read-only filesystem),
/// the rest is on the host, and the audit log has each call.
#[tokio::test]
async fn codex_exec_runs_its_tools_in_corral() {
    scripted_turn(Transport::WebSocket).await;
}

/// The same turn with the front as Codex's stdio environment (`environments.toml`, `program =
/// "corral"`), as Codex reaches an executor over ssh.
#[tokio::test]
async fn codex_exec_runs_its_tools_in_corral_over_stdio() {
    scripted_turn(Transport::Stdio).await;
}

enum Transport {
    WebSocket,
    Stdio,
}

async fn scripted_turn(transport: Transport) {
    // Fail early, before a daemon starts, when the pinned Codex is missing.
    codex();
    let logs = outside();
    let audit = logs.path().join("audit.log");
    let d = Daemon::start(&["--audit-log", audit.to_str().unwrap()]).await;
    let ws = scratch();
    let ws_path = std::fs::canonicalize(ws.path()).unwrap();
    let forbidden = outside();
    let leak = forbidden.path().join("leak");
    write_pixel(&ws_path);
    let turns = scripted_turns(&ws_path, &leak);
    let model = MockModel::start(turns).await;
    let home = codex_home(&model);
    let (code, out) = match transport {
        Transport::WebSocket => {
            let front = Front::start(&d, &ws_path, &[]).await;
            codex_exec(home.path(), Some(&front.url), &ws_path, "workspace-write").await
        }
        Transport::Stdio => {
            let toml_str = |s: &str| serde_json::to_string(s).unwrap();
            std::fs::write(
                home.path().join("environments.toml"),
                format!(
                    "default = \"corral\"\ninclude_local = false\n\n[[environments]]\nid = \
                     \"corral\"\nprogram = {}\nargs = [\"--socket\", {}, \"exec-server\", \
                     \"--listen\", \"stdio\"]\ncwd = {}\n",
                    toml_str(common::CORRAL),
                    toml_str(&format!("unix:{}", d.socket.display())),
                    toml_str(&ws_path.to_string_lossy()),
                ),
            )
            .unwrap();
            codex_exec(home.path(), None, &ws_path, "workspace-write").await
        }
    };
    assert_eq!(code, 0, "{out}");
    let requests = model.requests();
    assert_eq!(requests.len(), 6, "{out}");
    // The command ran, confined by corral: its write inside is on the host, the one outside
    // was refused by the sandbox.
    let c1 = output_of(&requests[1], "c1");
    codex_support::assert_sandboxed_writes(&ws_path, &leak, &c1, "made-by-codex");
    // The TTY process got what write_stdin sent.
    let c3 = output_of(&requests[3], "c3");
    assert!(c3.contains("hello-tty"), "{c3}");
    // apply_patch wrote through corral.
    let c4 = output_of(&requests[4], "c4");
    let items = |r: &Value| -> Vec<Value> {
        r["input"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|i| i["type"] != "message")
            .cloned()
            .collect()
    };
    assert!(!c4.is_empty(), "{:?}", items(&requests[4]));
    assert_eq!(
        std::fs::read_to_string(ws_path.join("patched.txt"))
            .unwrap_or_else(|e| panic!("{e}: {c4}")),
        "added-by-apply-patch\n"
    );
    // view_image read the image through corral: the model got it.
    let last = requests[5].to_string();
    assert!(
        last.contains("data:image/png;base64,"),
        "{:?}",
        items(&requests[5])
    );
    // The audit log names the calls (the front is corral's client: every one went through the
    // daemon's pipeline).
    let log = std::fs::read_to_string(&audit).unwrap();
    assert!(log.contains("made-by-codex > inside.txt"), "{log}");
    assert!(log.contains("patched.txt"), "{log}");
}

/// A JSON-RPC client of the front over WebSocket, as Codex speaks it.
struct Rpc {
    ws: tokio_tungstenite::WebSocketStream<TcpStream>,
    next: u64,
    /// Notifications received while waiting for answers.
    notes: Vec<Value>,
}

impl Rpc {
    async fn connect(url: &str) -> Rpc {
        let addr = url.trim_start_matches("ws://");
        let tcp = TcpStream::connect(addr).await.unwrap();
        let (ws, _) = tokio_tungstenite::client_async(url, tcp).await.unwrap();
        Rpc {
            ws,
            next: 1,
            notes: Vec::new(),
        }
    }

    async fn send_text(&mut self, text: String) {
        use futures_util::SinkExt;
        self.ws
            .send(tokio_tungstenite::tungstenite::Message::text(text))
            .await
            .unwrap();
    }

    async fn next_message(&mut self) -> Value {
        use futures_util::StreamExt;
        loop {
            let msg = tokio::time::timeout(Duration::from_secs(30), self.ws.next())
                .await
                .expect("an answer within 30 s")
                .expect("the connection stays open")
                .unwrap();
            if let tokio_tungstenite::tungstenite::Message::Text(t) = msg {
                return serde_json::from_str(&t).unwrap();
            }
        }
    }

    /// Sends a request; its answer (`result` or `error`), keeping notifications seen meanwhile.
    async fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next;
        self.next += 1;
        self.send_text(json!({"id": id, "method": method, "params": params}).to_string())
            .await;
        loop {
            let v = self.next_message().await;
            if v["id"] == json!(id) {
                return v;
            }
            self.notes.push(v);
        }
    }

    /// Waits for the notification `method` about process `pid`.
    async fn notification(&mut self, method: &str, pid: &str) -> Value {
        loop {
            if let Some(i) = self
                .notes
                .iter()
                .position(|n| n["method"] == method && n["params"]["processId"] == pid)
            {
                return self.notes.remove(i);
            }
            let v = self.next_message().await;
            self.notes.push(v);
        }
    }

    async fn initialize(&mut self, resume: Option<&str>) -> Value {
        let r = self
            .call(
                "initialize",
                json!({"clientName": "test", "resumeSessionId": resume}),
            )
            .await;
        self.send_text(json!({"method": "initialized", "params": {}}).to_string())
            .await;
        r
    }
}

fn managed_workspace_write(ws: &Path) -> Value {
    let root = url::Url::from_file_path(ws).unwrap().to_string();
    let special = |kind: &str| json!({"type": "special", "value": {"kind": kind}});
    json!({
        "permissions": {"type": "managed", "network": "restricted", "file_system": {
            "type": "restricted",
            "entries": [
                {"path": special("root"), "access": "read"},
                {"path": special("project_roots"), "access": "write"},
            ]}},
        "cwd": root,
        "workspaceRoots": [root],
    })
}

fn b64(data: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// The protocol as Codex uses it, and every bad input of the issue: the handshake, process
/// start/notifications/read cursor/write/terminate, fs calls confined by the sandbox asked for,
/// and the refusals (before initialize, malformed JSON, unknown method, duplicate or unknown
/// process, no stdin, native path, a sandbox wider than the front allows, a write outside the
/// workspace).
#[tokio::test]
async fn the_protocol_and_its_refusals() {
    let d = Daemon::start(&[]).await;
    let ws = scratch();
    let ws_path = std::fs::canonicalize(ws.path()).unwrap();
    let front = Front::start(&d, &ws_path, &[]).await;
    let mut c = Rpc::connect(&front.url).await;
    // Nothing before initialize; malformed JSON answered with id -1, the connection kept.
    let r = c.call("environment/info", json!({})).await;
    assert_eq!(r["error"]["code"], -32600, "{r}");
    c.send_text("{not json".into()).await;
    let r = c.next_message().await;
    assert_eq!(
        (r["id"].clone(), r["error"]["code"].clone()),
        (json!(-1), json!(-32600))
    );
    let init = c.initialize(None).await;
    let info = &init["result"]["environmentInfo"];
    assert!(
        init["result"]["sessionId"]
            .as_str()
            .is_some_and(|s| s.len() == 36),
        "{init}"
    );
    assert_eq!(info["platformOs"], "linux");
    assert!(
        info["capabilities"]
            .as_object()
            .unwrap()
            .values()
            .all(|v| v == false),
        "{info}"
    );
    assert_eq!(
        c.call("environment/status", Value::Null).await["result"]["status"],
        "ready"
    );
    let r = c.call("http/request", json!({})).await;
    assert_eq!(r["error"]["code"], -32601, "{r}");

    let sandbox = managed_workspace_write(&ws_path);
    let cwd = url::Url::from_file_path(&ws_path).unwrap().to_string();
    let start = |id: &str, argv: Value, extra: Value| {
        let mut p = json!({"processId": id, "argv": argv, "cwd": cwd, "env": {}, "tty": false,
            "sandbox": sandbox});
        for (k, v) in extra.as_object().unwrap() {
            p[k] = v.clone();
        }
        p
    };
    // A process: its output, exit and close come as notifications with seq 1, 2, 3.
    let r = c
        .call(
            "process/start",
            start(
                "p1",
                json!(["/bin/sh", "-c", "printf hi; id -u"]),
                json!({}),
            ),
        )
        .await;
    assert_eq!(r["result"]["processId"], "p1", "{r}");
    assert_eq!(r["result"]["sandboxType"], "linuxSeccomp");
    let out = c.notification("process/output", "p1").await;
    assert_eq!(out["params"]["seq"], 1);
    assert_eq!(out["params"]["stream"], "stdout");
    let exited = c.notification("process/exited", "p1").await;
    assert_eq!(exited["params"]["exitCode"], 0);
    let closed = c.notification("process/closed", "p1").await;
    assert!(closed["params"]["seq"].as_u64() > exited["params"]["seq"].as_u64());
    // The read cursor sees the same output.
    let r = c
        .call("process/read", json!({"processId": "p1", "afterSeq": 0}))
        .await;
    let text: String = r["result"]["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|ch| {
            use base64::Engine;
            String::from_utf8(
                base64::engine::general_purpose::STANDARD
                    .decode(ch["chunk"].as_str().unwrap())
                    .unwrap(),
            )
            .unwrap()
        })
        .collect();
    assert!(text.starts_with("hi"), "{r}");
    assert_eq!(r["result"]["exited"], true);
    // A failure the sandbox caused is flagged sandboxDenied (Codex then offers its retry); an
    // ordinary failure is not.
    let forbidden_dir = outside();
    let denied_cmd = format!("echo x > {}/f", forbidden_dir.path().display());
    c.call(
        "process/start",
        start("den", json!(["/bin/sh", "-c", denied_cmd]), json!({})),
    )
    .await;
    let exited = c.notification("process/exited", "den").await;
    assert_eq!(exited["params"]["sandboxDenied"], true, "{exited}");
    assert!(!forbidden_dir.path().join("f").exists());
    c.call(
        "process/start",
        start("fail", json!(["/bin/sh", "-c", "exit 3"]), json!({})),
    )
    .await;
    let exited = c.notification("process/exited", "fail").await;
    assert_eq!(
        (
            exited["params"]["exitCode"].clone(),
            exited["params"]["sandboxDenied"].clone()
        ),
        (json!(3), json!(false))
    );
    // No stdin without pipeStdin; unknown and duplicate processes.
    let r = c
        .call(
            "process/write",
            json!({"processId": "p1", "chunk": b64(b"x"), "writeId": "1"}),
        )
        .await;
    assert_eq!(r["result"]["status"], "stdinClosed", "{r}");
    let r = c
        .call(
            "process/write",
            json!({"processId": "nope", "chunk": b64(b"x"), "writeId": "1"}),
        )
        .await;
    assert_eq!(r["result"]["status"], "unknownProcess", "{r}");
    let r = c
        .call("process/start", start("p1", json!(["true"]), json!({})))
        .await;
    assert_eq!(r["error"]["code"], -32600, "{r}");
    let r = c.call("process/read", json!({"processId": "nope"})).await;
    assert_eq!(r["error"]["code"], -32600, "{r}");
    assert_eq!(
        c.call("process/terminate", json!({"processId": "p1"}))
            .await["result"]["running"],
        false
    );
    // Bad params: empty argv, a native path, a sandbox wider than --max-mode.
    let r = c
        .call("process/start", start("p2", json!([]), json!({})))
        .await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    let r = c
        .call(
            "process/start",
            start("p3", json!(["true"]), json!({"cwd": ws_path})),
        )
        .await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    let r = c
        .call(
            "process/start",
            start(
                "p4",
                json!(["true"]),
                json!({"sandbox": {"permissions": {"type": "disabled"}}}),
            ),
        )
        .await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--max-mode"),
        "{r}"
    );
    // A piped stdin process takes writes (a repeated writeId is written once).
    let r = c
        .call(
            "process/start",
            start("cat", json!(["cat"]), json!({"pipeStdin": true})),
        )
        .await;
    assert!(r.get("result").is_some(), "{r}");
    for _ in 0..2 {
        let r = c
            .call(
                "process/write",
                json!({"processId": "cat", "chunk": b64(b"ping\n"), "writeId": "w1"}),
            )
            .await;
        assert_eq!(r["result"]["status"], "accepted", "{r}");
    }
    let r = c
        .call(
            "process/read",
            json!({"processId": "cat", "afterSeq": 0, "waitMs": 5000}),
        )
        .await;
    assert_eq!(r["result"]["chunks"].as_array().unwrap().len(), 1, "{r}");
    assert_eq!(r["result"]["chunks"][0]["chunk"], b64(b"ping\n"));
    assert_eq!(
        c.call("process/terminate", json!({"processId": "cat"}))
            .await["result"]["running"],
        true
    );
    // A terminated process stays readable to its end, as in Codex's server (which keeps it
    // 30 s), and a second terminate kills nothing.
    c.notification("process/closed", "cat").await;
    let r = c
        .call(
            "process/read",
            json!({"processId": "cat", "afterSeq": 1, "waitMs": 5000}),
        )
        .await;
    assert_eq!(r["result"]["closed"], true, "{r}");
    assert_eq!(r["result"]["chunks"], json!([]), "{r}");
    assert_eq!(
        c.call("process/terminate", json!({"processId": "cat"}))
            .await["result"]["running"],
        false
    );

    // fs: a missing path is -32004; a write inside the workspace lands; one outside is refused
    // and nothing appears.
    let uri = |p: &Path| url::Url::from_file_path(p).unwrap().to_string();
    let r = c
        .call(
            "fs/getMetadata",
            json!({"path": uri(&ws_path.join("missing")), "sandbox": null}),
        )
        .await;
    assert_eq!(r["error"]["code"], -32004, "{r}");
    let r = c
        .call(
            "fs/writeFile",
            json!({"path": uri(&ws_path.join("w.txt")), "dataBase64": b64(b"w\n"), "sandbox": sandbox}),
        )
        .await;
    assert!(r.get("result").is_some(), "{r}");
    assert_eq!(
        std::fs::read_to_string(ws_path.join("w.txt")).unwrap(),
        "w\n"
    );
    let r = c
        .call(
            "fs/getMetadata",
            json!({"path": uri(&ws_path.join("w.txt")), "sandbox": null}),
        )
        .await;
    assert_eq!(
        (r["result"]["isFile"].clone(), r["result"]["size"].clone()),
        (json!(true), json!(2))
    );
    let forbidden = outside();
    let r = c
        .call(
            "fs/writeFile",
            json!({"path": uri(&forbidden.path().join("x")), "dataBase64": b64(b"x"), "sandbox": sandbox}),
        )
        .await;
    assert!(r.get("error").is_some(), "{r}");
    assert!(!forbidden.path().join("x").exists());
    let r = c
        .call(
            "fs/writeFile",
            json!({"path": uri(&ws_path.join(".git")), "dataBase64": b64(b"x"), "sandbox": sandbox}),
        )
        .await;
    assert!(r.get("error").is_some(), "{r}");
    assert!(!ws_path.join(".git").exists());
    // A write without a sandbox runs read-only: refused.
    let r = c
        .call(
            "fs/writeFile",
            json!({"path": uri(&ws_path.join("n.txt")), "dataBase64": b64(b"x"), "sandbox": null}),
        )
        .await;
    assert!(r.get("error").is_some(), "{r}");
    assert!(!ws_path.join("n.txt").exists());
    let r = c
        .call(
            "fs/readDirectory",
            json!({"path": uri(&ws_path), "sandbox": null}),
        )
        .await;
    let names: Vec<&str> = r["result"]["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["fileName"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["w.txt"], "{r}");
}

/// The HTTP side: `/readyz`; an upgrade with an `Origin` (a browser page) is refused; with a
/// token configured, an upgrade without it or with a wrong one is refused and the right one
/// connects. A front off loopback without a token does not start.
#[tokio::test]
async fn readyz_origin_and_token() {
    let d = Daemon::start(&[]).await;
    let ws = scratch();
    let token = "s3cret-token";
    let digest = {
        use sha2::Digest;
        sha2::Sha256::digest(token.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    let front = Front::start(&d, ws.path(), &["--token-sha256", &digest]).await;
    let addr = front.url.trim_start_matches("ws://").to_string();
    let raw = |request: String| {
        let addr = addr.clone();
        async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(request.as_bytes()).await.unwrap();
            let mut out = vec![0; 4096];
            let n = s.read(&mut out).await.unwrap();
            String::from_utf8_lossy(&out[..n]).into_owned()
        }
    };
    let r = raw(format!("GET /readyz HTTP/1.1\r\nhost: {addr}\r\n\r\n")).await;
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    let upgrade = |extra: &str| {
        format!(
            "GET / HTTP/1.1\r\nhost: {addr}\r\nconnection: Upgrade\r\nupgrade: websocket\r\n\
             sec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n{extra}\r\n"
        )
    };
    let r = raw(upgrade(&format!(
        "authorization: Bearer {token}\r\norigin: http://evil.example\r\n"
    )))
    .await;
    assert!(r.starts_with("HTTP/1.1 403"), "{r}");
    let r = raw(upgrade("")).await;
    assert!(r.starts_with("HTTP/1.1 401"), "{r}");
    let r = raw(upgrade("authorization: Bearer wrong\r\n")).await;
    assert!(r.starts_with("HTTP/1.1 401"), "{r}");
    let r = raw(upgrade(&format!("authorization: Bearer {token}\r\n"))).await;
    assert!(r.starts_with("HTTP/1.1 101"), "{r}");
    // Off loopback without a token: refused at start, saying why.
    let out = std::process::Command::new(common::CORRAL)
        .args(["--socket", &format!("unix:{}", d.socket.display())])
        .args(["exec-server", "--listen", "ws://0.0.0.0:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not a loopback address"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A session outlives its connection: a process started before a disconnect keeps running,
/// and a new connection that resumes the session reads what it printed meanwhile. An unknown
/// session id is refused.
#[tokio::test]
async fn a_resumed_session_sees_its_processes() {
    let d = Daemon::start(&[]).await;
    let ws = scratch();
    let ws_path = std::fs::canonicalize(ws.path()).unwrap();
    let front = Front::start(&d, &ws_path, &[]).await;
    let mut c = Rpc::connect(&front.url).await;
    let id = c.initialize(None).await["result"]["sessionId"]
        .as_str()
        .unwrap()
        .to_string();
    let cwd = url::Url::from_file_path(&ws_path).unwrap().to_string();
    let r = c
        .call(
            "process/start",
            json!({"processId": "late", "argv": ["/bin/sh", "-c", "sleep 1; echo late"],
                "cwd": cwd, "env": {}, "tty": false, "sandbox": managed_workspace_write(&ws_path)}),
        )
        .await;
    assert!(r.get("result").is_some(), "{r}");
    drop(c);
    let mut c = Rpc::connect(&front.url).await;
    let r = c.initialize(Some("no-such-session")).await;
    assert_eq!(r["error"]["code"], -32600, "{r}");
    let mut c = Rpc::connect(&front.url).await;
    let r = c.initialize(Some(&id)).await;
    assert_eq!(r["result"]["sessionId"], id.as_str(), "{r}");
    let r = c
        .call(
            "process/read",
            json!({"processId": "late", "afterSeq": 0, "waitMs": 10000}),
        )
        .await;
    assert_eq!(r["result"]["chunks"][0]["chunk"], b64(b"late\n"), "{r}");
}

/// The stdio transport (Codex's `program = …` environments): one JSON message per line.
#[tokio::test]
async fn stdio_serves_the_same_protocol() {
    let d = Daemon::start(&[]).await;
    let ws = scratch();
    let ws_path = std::fs::canonicalize(ws.path()).unwrap();
    let mut child = tokio::process::Command::new(common::CORRAL)
        .args(["--socket", &format!("unix:{}", d.socket.display())])
        .args(["exec-server", "--listen", "stdio"])
        .current_dir(&ws_path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let cwd = url::Url::from_file_path(&ws_path).unwrap().to_string();
    for msg in [
        json!({"id": 1, "method": "initialize", "params": {"clientName": "t"}}),
        json!({"method": "initialized", "params": {}}),
        json!({"id": 2, "method": "process/start", "params": {"processId": "e", "argv": ["echo", "over-stdio"],
            "cwd": cwd, "env": {}, "tty": false, "sandbox": managed_workspace_write(&ws_path)}}),
    ] {
        stdin
            .write_all(format!("{msg}\n").as_bytes())
            .await
            .unwrap();
    }
    let mut seen = Vec::new();
    while !seen.iter().any(|v: &Value| v["method"] == "process/closed") {
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("a line within 30 s")
            .unwrap()
            .expect("stdout open");
        seen.push(serde_json::from_str(&line).unwrap());
    }
    assert!(
        seen.iter()
            .any(|v| v["id"] == 1 && v["result"]["sessionId"].is_string()),
        "{seen:?}"
    );
    let out = seen
        .iter()
        .find(|v| v["method"] == "process/output")
        .unwrap();
    assert_eq!(out["params"]["chunk"], b64(b"over-stdio\n"));
    drop(stdin);
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
    assert!(
        status.is_ok_and(|s| s.is_ok_and(|s| s.success())),
        "the front ends with stdin"
    );
}

/// The front serves the user who started it: run as another local user (over stdio, as Codex's
/// `program = …` environments start it), Codex's commands run as that user and write files it
/// owns. Over WebSocket that user's front refuses this (root) test process: a front serves only
/// its own user's processes.
#[tokio::test]
async fn a_front_started_by_another_user_runs_as_that_user() {
    let user = common::TestUser::create("esu");
    let d = Daemon::start(&[]).await;
    let socket = d.open_to_local_users();
    let ws = user.dir.join("ws");
    std::fs::create_dir(&ws).unwrap();
    std::os::unix::fs::chown(&ws, Some(user.uid), Some(user.gid)).unwrap();
    let as_user = |args: &[&str]| {
        let mut cmd = tokio::process::Command::new("setpriv");
        cmd.args([
            "--reuid",
            &user.name,
            "--regid",
            &user.name,
            "--init-groups",
            "--",
        ])
        .arg(common::CORRAL)
        .args(["--socket", &socket, "exec-server"])
        .args(args)
        .current_dir(&ws)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true);
        cmd.spawn().unwrap()
    };
    let mut child = as_user(&["--listen", "stdio"]);
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let cwd = url::Url::from_file_path(&ws).unwrap().to_string();
    for msg in [
        json!({"id": 1, "method": "initialize", "params": {"clientName": "t"}}),
        json!({"method": "initialized", "params": {}}),
        json!({"id": 2, "method": "process/start", "params": {"processId": "who",
            "argv": ["/bin/sh", "-c", "id -u > mine; id -u"], "cwd": cwd, "env": {}, "tty": false,
            "sandbox": managed_workspace_write(&ws)}}),
    ] {
        stdin
            .write_all(format!("{msg}\n").as_bytes())
            .await
            .unwrap();
    }
    let out = loop {
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("a line within 30 s")
            .unwrap()
            .expect("stdout open");
        let v: Value = serde_json::from_str(&line).unwrap();
        if v["method"] == "process/output" {
            break v;
        }
    };
    assert_eq!(
        out["params"]["chunk"],
        b64(format!("{}\n", user.uid).as_bytes()),
        "{out}"
    );
    let meta = std::fs::metadata(ws.join("mine")).unwrap();
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), user.uid);
    // Over WebSocket, another user's process (this test runs as root) is refused.
    let mut ws_front = as_user(&[]);
    let mut lines = BufReader::new(ws_front.stdout.take().unwrap()).lines();
    let url = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let tcp = TcpStream::connect(url.trim_start_matches("ws://"))
        .await
        .unwrap();
    let refused = tokio_tungstenite::client_async(url.as_str(), tcp).await;
    assert!(
        matches!(&refused, Err(tokio_tungstenite::tungstenite::Error::Http(r)) if r.status() == 403),
        "{refused:?}"
    );
}
