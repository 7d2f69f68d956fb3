//! The scripted model and the pinned Codex, with nothing of corral's test daemons: shared by
//! the tests (through `codex_support`) and by the exec-server benchmark.
#![allow(dead_code)]

use serde_json::{Value, json};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// The pinned Codex: CORRAL_CODEX, else where `.ci/run` installs it. Its version must be the
/// pinned one.
pub fn codex() -> PathBuf {
    pinned_npm_bin(
        "Codex",
        "codex",
        "CORRAL_CODEX",
        "codex",
        "@openai/codex",
        "codex",
    )
}

/// A client pinned in `tests/<dir>/VERSION` and installed from npm by `.ci/run` under
/// `~/.cache/corral-ci/<prefix>-VERSION` (or named by `env`), checked to be that version.
pub fn pinned_npm_bin(
    what: &str,
    dir: &str,
    env: &str,
    prefix: &str,
    package: &str,
    bin: &str,
) -> PathBuf {
    let file = format!("{}/tests/{dir}/VERSION", env!("CARGO_MANIFEST_DIR"));
    let version = std::fs::read_to_string(&file).unwrap().trim().to_string();
    let path = std::env::var_os(env).map(PathBuf::from).unwrap_or_else(|| {
        let home = std::env::var_os("HOME").unwrap_or_default();
        PathBuf::from(home).join(format!(
            ".cache/corral-ci/{prefix}-{version}/node_modules/.bin/{bin}"
        ))
    });
    let out = std::process::Command::new(&path)
        .arg("--version")
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "the pinned {what} {version} is needed ({}: {e}); `.ci/run` installs it, or \
                 `npm install --prefix ~/.cache/corral-ci/{prefix}-{version} {package}@{version}`",
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
    times: Times,
}

/// When each request arrived and when its answer was written (for the turn benchmark: the gap
/// between an answer and the next request is the client's tool time).
type Times = Arc<Mutex<Vec<(Instant, Instant)>>>;

impl MockModel {
    pub async fn start(turns: Vec<Turn>) -> MockModel {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/v1", listener.local_addr().unwrap());
        let requests: Arc<Mutex<Vec<Value>>> = Arc::default();
        let times: Times = Arc::default();
        let turns = Arc::new(turns);
        let (seen, timed) = (requests.clone(), times.clone());
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (turns, seen, timed) = (turns.clone(), seen.clone(), timed.clone());
                tokio::spawn(async move {
                    let _ = serve_model(stream, turns, seen, timed).await;
                });
            }
        });
        MockModel {
            url,
            requests,
            times,
        }
    }

    pub fn requests(&self) -> Vec<Value> {
        self.requests.lock().unwrap().clone()
    }

    /// Per model request: when it arrived and when its answer was written.
    pub fn times(&self) -> Vec<(Instant, Instant)> {
        self.times.lock().unwrap().clone()
    }
}

pub async fn serve_model(
    stream: TcpStream,
    turns: Arc<Vec<Turn>>,
    seen: Arc<Mutex<Vec<Value>>>,
    times: Times,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream);
    while let Some((head, body)) = read_request(&mut reader).await? {
        let arrived = Instant::now();
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
        if post {
            times.lock().unwrap().push((arrived, Instant::now()));
        }
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

/// A 1×1 PNG, base64.
pub const PIXEL: &str =
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGMwqTUDAAHQAOj9PzHUAAAAAElFTkSuQmCC";
