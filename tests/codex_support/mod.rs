//! What the tests that run the pinned Codex share: finding the pinned `codex`, a scripted mock
//! of the Responses API on loopback, a CODEX_HOME pointing at it, `codex exec`, a running
//! `corral exec-server`, and the scripted turn itself (tests/exec_server.rs runs it through
//! corral, tests/exec_server_trace.rs records it against Codex's own exec-server).
#![allow(dead_code)]

use crate::common::{self, Daemon, outside};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// The pinned Codex: CORRAL_CODEX, else where `.ci/run` installs it. Its version must be the
/// pinned one.
pub fn codex() -> PathBuf {
    let version =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/codex/VERSION"))
            .unwrap()
            .trim()
            .to_string();
    let path = std::env::var_os("CORRAL_CODEX")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_default();
            PathBuf::from(home).join(format!(
                ".cache/corral-ci/codex-{version}/node_modules/.bin/codex"
            ))
        });
    let out = std::process::Command::new(&path)
        .arg("--version")
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "the pinned Codex {version} is needed ({}: {e}); `.ci/run` installs it, or \
                 `npm install --prefix ~/.cache/corral-ci/codex-{version} @openai/codex@{version}`",
                path.display()
            )
        });
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains(&version),
        "{} is {shown:?}, not the pinned {version}",
        path.display()
    );
    path
}

/// A scripted model: each request to `/v1/responses` gets the next turn's output items as an
/// SSE stream. A turn is computed from the request (so it can use what a tool answered before).
pub type Turn = Box<dyn Fn(&Value) -> Vec<Value> + Send + Sync>;

pub struct MockModel {
    pub url: String,
    requests: Arc<Mutex<Vec<Value>>>,
}

impl MockModel {
    pub async fn start(turns: Vec<Turn>) -> MockModel {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/v1", listener.local_addr().unwrap());
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
                    let _ = serve_model(stream, turns, seen).await;
                });
            }
        });
        MockModel { url, requests }
    }

    pub fn requests(&self) -> Vec<Value> {
        self.requests.lock().unwrap().clone()
    }
}

pub async fn serve_model(
    stream: TcpStream,
    turns: Arc<Vec<Turn>>,
    seen: Arc<Mutex<Vec<Value>>>,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream);
    while let Some((head, body)) = read_request(&mut reader).await? {
        let post = head
            .first()
            .is_some_and(|l| l.starts_with("POST ") && l.contains("/responses"));
        let response = if post {
            let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let n = {
                let mut seen = seen.lock().unwrap();
                seen.push(request.clone());
                seen.len()
            };
            let items = match turns.get(n - 1) {
                Some(turn) => turn(&request),
                None => vec![message("done")],
            };
            let id = format!("resp_{n}");
            let mut events = vec![json!({"type": "response.created", "response": {"id": id}})];
            events.extend(
                items
                    .into_iter()
                    .map(|item| json!({"type": "response.output_item.done", "item": item})),
            );
            events.push(
                json!({"type": "response.completed", "response": {"id": id, "usage": {
                "input_tokens": 1, "input_tokens_details": null, "output_tokens": 1,
                "output_tokens_details": null, "total_tokens": 2}}}),
            );
            let sse: String = events
                .iter()
                .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap()))
                .collect();
            format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n{sse}",
                sse.len()
            )
        } else {
            "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n".to_string()
        };
        reader.get_mut().write_all(response.as_bytes()).await?;
    }
    Ok(())
}

/// The next HTTP/1.1 request on a connection: its head's lines (request line first) and its
/// body (by content-length or chunked); `None` when the client closed the connection.
pub async fn read_request(
    reader: &mut BufReader<TcpStream>,
) -> std::io::Result<Option<(Vec<String>, Vec<u8>)>> {
    let mut head = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).await? == 0 {
            return Ok(None);
        }
        if line == "\r\n" {
            break;
        }
        head.push(line);
    }
    let header = |name: &str| {
        head.iter().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    };
    let mut body = Vec::new();
    if let Some(n) = header("content-length").and_then(|n| n.parse::<usize>().ok()) {
        body.resize(n, 0);
        reader.read_exact(&mut body).await?;
    } else if header("transfer-encoding").is_some_and(|t| t.contains("chunked")) {
        loop {
            let mut size = String::new();
            reader.read_line(&mut size).await?;
            let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            let mut chunk = vec![0; n + 2];
            reader.read_exact(&mut chunk).await?;
            if n == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..n]);
        }
    }
    Ok(Some((head, body)))
}

pub fn message(text: &str) -> Value {
    json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]})
}

pub fn function_call(name: &str, call_id: &str, arguments: Value) -> Value {
    json!({"type": "function_call", "name": name, "call_id": call_id, "arguments": arguments.to_string()})
}

/// The text Codex sent back for tool call `call_id` (a function or custom tool's output).
pub fn output_of(request: &Value, call_id: &str) -> String {
    request["input"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|i| i["call_id"] == call_id)
        .filter_map(|i| match &i["output"] {
            Value::String(s) => Some(s.clone()),
            Value::Null => None,
            other => Some(other.to_string()),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A running `corral exec-server` and the URL it serves.
pub struct Front {
    /// Killed when the test drops it.
    _child: tokio::process::Child,
    pub url: String,
}

impl Front {
    pub async fn start(d: &Daemon, cwd: &Path, extra: &[&str]) -> Front {
        let mut child = tokio::process::Command::new(common::CORRAL)
            .args([
                "--socket",
                &format!("unix:{}", d.socket.display()),
                "exec-server",
            ])
            .args(extra)
            .current_dir(cwd)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let url = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .expect("the front prints its URL")
            .unwrap()
            .expect("a URL line");
        assert!(url.starts_with("ws://127.0.0.1:"), "{url}");
        Front { _child: child, url }
    }
}

/// A CODEX_HOME whose model provider is the mock.
pub fn codex_home(model: &MockModel) -> tempfile::TempDir {
    let home = outside();
    std::fs::write(
        home.path().join("config.toml"),
        format!(
            "model = \"gpt-5.5\"\nmodel_provider = \"mock\"\n\n[model_providers.mock]\nname = \
             \"mock\"\nbase_url = \"{}\"\nwire_api = \"responses\"\n",
            model.url
        ),
    )
    .unwrap();
    home
}

pub async fn codex_exec(
    home: &Path,
    url: Option<&str>,
    cwd: &Path,
    sandbox: &str,
) -> (i32, String) {
    let mut cmd = tokio::process::Command::new(codex());
    if let Some(url) = url {
        cmd.env("CODEX_EXEC_SERVER_URL", url);
    }
    let out = cmd
        .args([
            "exec",
            "--skip-git-repo-check",
            "--sandbox",
            sandbox,
            "run the scripted turn",
        ])
        .env("CODEX_HOME", home)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), out)
        .await
        .expect("codex exec finishes")
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

/// A 1×1 PNG, base64.
pub const PIXEL: &str =
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGMwqTUDAAHQAOj9PzHUAAAAAElFTkSuQmCC";

/// Writes the 1×1 PNG the turn's view_image shows, as `pixel.png` in `ws`.
pub fn write_pixel(ws: &Path) {
    use base64::Engine;
    let png = base64::engine::general_purpose::STANDARD
        .decode(PIXEL)
        .unwrap();
    std::fs::write(ws.join("pixel.png"), png).unwrap();
}

/// The scripted turn in workspace `ws` (holding `pixel.png`): an exec_command that writes
/// inside the workspace and tries to write `leak` (outside it), an exec_command with a TTY, a
/// write_stdin to it, a freeform apply_patch adding `patched.txt`, a view_image, and a final
/// message.
pub fn scripted_turns(ws: &Path, leak: &Path) -> Vec<Turn> {
    let leak_cmd = format!(
        "echo made-by-codex > inside.txt; cat inside.txt; grep -E '^(NoNewPrivs|Seccomp):' \
         /proc/self/status; echo x > {} || echo WRITE-REFUSED",
        leak.display()
    );
    let image = ws.join("pixel.png").to_string_lossy().into_owned();
    vec![
        Box::new(move |_| {
            vec![function_call(
                "exec_command",
                "c1",
                json!({"cmd": leak_cmd, "yield_time_ms": 10000}),
            )]
        }),
        Box::new(|_| {
            vec![function_call(
                "exec_command",
                "c2",
                json!({"cmd": "cat", "tty": true, "yield_time_ms": 500}),
            )]
        }),
        Box::new(|request| {
            let text = output_of(request, "c2");
            let id: u64 = text
                .split("session ID ")
                .nth(1)
                .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("no session id in {text:?}"));
            vec![function_call(
                "write_stdin",
                "c3",
                json!({"session_id": id, "chars": "hello-tty\n", "yield_time_ms": 1000}),
            )]
        }),
        Box::new(|_| {
            vec![
                json!({"type": "custom_tool_call", "name": "apply_patch", "call_id": "c4",
                "input": "*** Begin Patch\n*** Add File: patched.txt\n+added-by-apply-patch\n*** End Patch\n"}),
            ]
        }),
        Box::new(move |_| vec![function_call("view_image", "c5", json!({"path": image}))]),
        Box::new(|_| vec![message("done")]),
    ]
}
