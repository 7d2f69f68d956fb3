//! The pinned Codex's own exec-server is the ground truth for `corral exec-server` (issue 21
//! item 2). `record_codex_exec_server_trace` (ignored; run by hand with `cargo test --test
//! exec_server_trace -- --ignored record`) runs the scripted `codex exec` turn of
//! tests/it/exec_server.rs against the pinned `codex exec-server` through a WebSocket relay that
//! logs every text frame, normalizes the log and writes `tests/codex/trace-$(VERSION).jsonl`
//! (how: tests/codex/trace-$(VERSION).md). The replay test (not ignored) sends the recorded
//! client→server messages to corral's front in order and checks each answer against the one
//! Codex's server gave.

use crate::codex_support::{
    self, MockModel, codex, codex_exec, codex_home, output_of, scripted_turns,
};
use crate::common::{self, outside};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::Message;

fn version() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/codex/VERSION"))
        .unwrap()
        .trim()
        .to_string()
}

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/codex/trace-{}.jsonl", version()))
}

/// What the relay saw: one entry per text frame, in the order the relay received them.
type Log = Arc<Mutex<Vec<Value>>>;

/// A WebSocket relay on loopback to `upstream`: every frame is passed on unchanged, every text
/// frame is logged (`dir` c2s or s2c, `conn` the connection's number from 1, `msg`).
async fn relay(upstream: String) -> (String, Log) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    let log: Log = Arc::default();
    let logged = log.clone();
    tokio::spawn(async move {
        let mut conn = 0u64;
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            conn += 1;
            let (log, upstream) = (logged.clone(), upstream.clone());
            tokio::spawn(async move {
                let Ok(down) = tokio_tungstenite::accept_async(tcp).await else {
                    return;
                };
                let up_tcp = TcpStream::connect(upstream.trim_start_matches("ws://"))
                    .await
                    .unwrap();
                let (up, _) = tokio_tungstenite::client_async(&upstream, up_tcp)
                    .await
                    .unwrap();
                let (mut up_tx, mut up_rx) = up.split();
                let (mut down_tx, mut down_rx) = down.split();
                let note = |dir: &str, m: &Message| {
                    if let Message::Text(t) = m {
                        let msg: Value = serde_json::from_str(t).unwrap_or(json!(t.as_str()));
                        log.lock()
                            .unwrap()
                            .push(json!({"dir": dir, "conn": conn, "msg": msg}));
                    }
                };
                let c2s = async {
                    while let Some(Ok(m)) = down_rx.next().await {
                        note("c2s", &m);
                        if up_tx.send(m).await.is_err() {
                            break;
                        }
                    }
                    let _ = up_tx.close().await;
                };
                let s2c = async {
                    while let Some(Ok(m)) = up_rx.next().await {
                        note("s2c", &m);
                        if down_tx.send(m).await.is_err() {
                            break;
                        }
                    }
                    let _ = down_tx.close().await;
                };
                tokio::join!(c2s, s2c);
            });
        }
    });
    (url, log)
}

/// A process group this test started, killed on drop (also when the test fails).
struct ProcessGroup(i32);

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        // SAFETY: kill(2) of the group this test started; no memory is involved.
        unsafe { libc::killpg(self.0, libc::SIGKILL) };
    }
}

/// Directories that did not exist before the recording: removed on drop when empty.
struct Leftovers(Vec<PathBuf>);

impl Drop for Leftovers {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_dir(p);
        }
    }
}

/// Records the scripted turn against the pinned `codex exec-server` and writes the fixture.
#[tokio::test]
#[ignore = "run by hand to re-record tests/codex/trace-VERSION.jsonl"]
async fn record_codex_exec_server_trace() {
    let codex = codex();
    // The npm install: what precedes `/node_modules/` in the resolved binary.
    let resolved = std::fs::canonicalize(&codex).unwrap();
    let install = resolved.to_string_lossy();
    let install = install[..install.find("/node_modules/").unwrap()].to_string();
    // Outside /tmp, as corral's replay runs it: the ancestors probed for `.git` are the same.
    let ws = outside();
    let ws_path = std::fs::canonicalize(ws.path()).unwrap();
    let forbidden = outside();
    let forbidden_path = std::fs::canonicalize(forbidden.path()).unwrap();
    let leak = forbidden_path.join("leak");
    codex_support::write_pixel(&ws_path);
    let server_home = outside();
    // Codex's sandbox makes mount points for its read-only masks at the top of each writable
    // root, /tmp among them, and may leave them: the ones this recording made go at the end.
    let _leftovers = Leftovers(
        [".git", ".agents", ".codex", ".aws"]
            .iter()
            .map(|n| Path::new("/tmp").join(n))
            .filter(|p| !p.exists())
            .collect(),
    );
    let mut server = tokio::process::Command::new(&codex)
        .args(["exec-server", "--listen", "ws://127.0.0.1:0"])
        .env("CODEX_HOME", server_home.path())
        .current_dir(&ws_path)
        .stdout(Stdio::piped())
        // npm's `codex` is a node wrapper around the native binary: its own process group, so
        // the whole group is ended at the end.
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let _group = ProcessGroup(server.id().unwrap() as i32);
    let mut lines = BufReader::new(server.stdout.take().unwrap()).lines();
    let upstream = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("codex exec-server prints its URL")
        .unwrap()
        .expect("a URL line");
    assert!(upstream.starts_with("ws://127.0.0.1:"), "{upstream}");
    let (url, log) = relay(upstream).await;
    let model = MockModel::start(scripted_turns(&ws_path, &leak)).await;
    let home = codex_home(&model);
    let (code, out) = codex_exec(home.path(), Some(&url), &ws_path, "workspace-write").await;
    assert_eq!(code, 0, "{out}");
    let requests = model.requests();
    assert_eq!(requests.len(), 6, "{out}");
    let c1 = output_of(&requests[1], "c1");
    assert!(c1.contains("made-by-codex"), "{c1}");
    // The refused write's message came on stderr and is in the tool output with the rest.
    assert!(c1.contains("Read-only file system"), "{c1}");
    assert!(output_of(&requests[3], "c3").contains("hello-tty"), "{out}");
    assert!(ws_path.join("patched.txt").exists(), "{out}");
    // Let the last notifications arrive.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let entries = log.lock().unwrap().clone();
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_string();
    let home_dir = std::env::var("HOME").unwrap();
    let mut paths = vec![
        (ws_path.to_string_lossy().into_owned(), "<ws>"),
        (forbidden_path.to_string_lossy().into_owned(), "<outside>"),
        (
            std::fs::canonicalize(server_home.path())
                .unwrap()
                .to_string_lossy()
                .into_owned(),
            "<server-home>",
        ),
        (
            std::fs::canonicalize(home.path())
                .unwrap()
                .to_string_lossy()
                .into_owned(),
            "<codex-home>",
        ),
        (install, "<codex>"),
        (home_dir, "<home>"),
    ];
    // Longest first, so a path inside another is replaced as itself.
    paths.sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
    let mut n = Normalizer {
        paths,
        hostname,
        ids: Vec::new(),
    };
    let single = entries.iter().all(|e| e["conn"] == 1);
    let text: String = entries
        .into_iter()
        .map(|mut e| {
            if single {
                e.as_object_mut().unwrap().remove("conn");
            }
            let msg = e["msg"].take();
            e["msg"] = n.value(None, msg);
            format!("{e}\n")
        })
        .collect();
    std::fs::write(fixture(), text).unwrap();
    eprintln!("wrote {}", fixture().display());
}

/// Replaces what differs from run to run with placeholders: the paths, the hostname, process
/// ids (`<process-N>`), the session id, other UUIDs (`<uuid-N>`), `*AtMs` times (`"<ms>"`),
/// the provider id. Output and stdin chunks (base64) are decoded, normalized and encoded again.
struct Normalizer {
    paths: Vec<(String, &'static str)>,
    hostname: String,
    /// Each distinct id seen, and its placeholder.
    ids: Vec<(String, String)>,
}

impl Normalizer {
    fn id(&mut self, id: &str, kind: &str) -> String {
        if let Some((_, p)) = self.ids.iter().find(|(i, _)| i == id) {
            return p.clone();
        }
        let n = self.ids.iter().filter(|(_, p)| p.starts_with(kind)).count() + 1;
        let p = format!("{kind}{n}>");
        self.ids.push((id.to_string(), p.clone()));
        p
    }

    fn text(&mut self, s: &str) -> String {
        if let Some((_, p)) = self.ids.iter().find(|(i, _)| i == s) {
            return p.clone();
        }
        let mut s = s.to_string();
        for (path, placeholder) in &self.paths {
            s = s.replace(path.as_str(), placeholder);
        }
        if !self.hostname.is_empty() && s == self.hostname {
            return "<host>".into();
        }
        let uuid =
            regex::Regex::new("[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
                .unwrap();
        let found: Vec<String> = uuid.find_iter(&s).map(|m| m.as_str().to_string()).collect();
        for u in found {
            let p = self.id(&u, "<uuid-");
            s = s.replace(&u, &p);
        }
        s
    }

    fn value(&mut self, key: Option<&str>, v: Value) -> Value {
        match (key, v) {
            (Some("processId"), Value::String(s)) => json!(self.id(&s, "<process-")),
            (Some("sessionId" | "resumeSessionId"), Value::String(s)) => {
                json!(self.id(&s, "<session-"))
            }
            (Some("providerId"), Value::String(_)) => json!("<provider-id>"),
            (Some(k), Value::Number(_)) if k.ends_with("AtMs") => json!("<ms>"),
            (Some("chunk"), Value::String(s)) => {
                use base64::Engine;
                let b64 = base64::engine::general_purpose::STANDARD;
                match b64.decode(&s).ok().and_then(|b| String::from_utf8(b).ok()) {
                    Some(text) => json!(b64.encode(self.text(&text))),
                    None => json!(s),
                }
            }
            (_, Value::String(s)) => json!(self.text(&s)),
            (_, Value::Array(a)) => {
                Value::Array(a.into_iter().map(|v| self.value(None, v)).collect())
            }
            (_, Value::Object(m)) => Value::Object(
                m.into_iter()
                    .map(|(k, v)| {
                        let v = self.value(Some(&k), v);
                        (k, v)
                    })
                    .collect(),
            ),
            (_, v) => v,
        }
    }
}

/// Methods Codex's server served in the recorded turn that corral deliberately does not: their
/// capability flags (`environmentConfigRead`, `fsWatchMissing`) are false in corral's
/// `environmentInfo`, so a `codex exec` talking to corral never sends them. The replay sends
/// each once and expects -32601 (method not found); their recorded answers are not compared.
const UNSERVED: &[&str] = &["environmentConfig/read", "fs/watchMissing"];

/// Notifications of Codex's server that are not about a process and that corral never sends:
/// `fs/missingChanged` answers `fs/watchMissing` (Codex's own sandbox created the `.git`,
/// `.agents` mount points it watched).
const UNSERVED_NOTIFICATIONS: &[&str] = &["fs/missingChanged"];

/// The fixture with its placeholders filled for this run.
struct Fill {
    fixed: Vec<(&'static str, String)>,
}

impl Fill {
    fn text(&self, s: &str) -> String {
        let mut s = s.to_string();
        for (placeholder, value) in &self.fixed {
            s = s.replace(placeholder, value);
        }
        regex::Regex::new("<(process|session|uuid)-([0-9]+)>")
            .unwrap()
            .replace_all(&s, |c: &regex::Captures| {
                let n: u64 = c[2].parse().unwrap();
                match &c[1] {
                    "process" => format!("replay-process-{n}"),
                    "session" => format!("00000000-0000-4000-8000-5e5510{n:06}"),
                    _ => format!("00000000-0000-4000-8000-{n:012}"),
                }
            })
            .into_owned()
    }

    fn value(&self, key: Option<&str>, v: Value) -> Value {
        match (key, v) {
            (Some("chunk"), Value::String(s)) => {
                use base64::Engine;
                let b64 = base64::engine::general_purpose::STANDARD;
                match b64.decode(&s).ok().and_then(|b| String::from_utf8(b).ok()) {
                    Some(text) => json!(b64.encode(self.text(&text))),
                    None => json!(s),
                }
            }
            (_, Value::String(s)) => json!(self.text(&s)),
            (_, Value::Array(a)) => {
                Value::Array(a.into_iter().map(|v| self.value(None, v)).collect())
            }
            (_, Value::Object(m)) => Value::Object(
                m.into_iter()
                    .map(|(k, v)| {
                        let v = self.value(Some(&k), v);
                        (k, v)
                    })
                    .collect(),
            ),
            (_, v) => v,
        }
    }
}

/// A connection to corral's front that keeps everything it received, in order.
struct Conn {
    ws: tokio_tungstenite::WebSocketStream<TcpStream>,
    inbox: Vec<Value>,
}

impl Conn {
    async fn connect(url: &str) -> Conn {
        let tcp = TcpStream::connect(url.trim_start_matches("ws://"))
            .await
            .unwrap();
        let (ws, _) = tokio_tungstenite::client_async(url, tcp).await.unwrap();
        Conn {
            ws,
            inbox: Vec::new(),
        }
    }

    async fn send(&mut self, msg: &Value) {
        self.ws.send(Message::text(msg.to_string())).await.unwrap();
    }

    /// Receives one message within `wait`; false when none came.
    async fn receive(&mut self, wait: Duration) -> bool {
        loop {
            match tokio::time::timeout(wait, self.ws.next()).await {
                Err(_) => return false,
                Ok(m) => {
                    if let Message::Text(t) = m.expect("the front keeps the connection").unwrap() {
                        self.inbox.push(serde_json::from_str(&t).unwrap());
                        return true;
                    }
                }
            }
        }
    }

    async fn answer(&mut self, id: &Value) -> Value {
        loop {
            if let Some(a) = self
                .inbox
                .iter()
                .find(|m| m.get("id") == Some(id) && m.get("method").is_none())
            {
                return a.clone();
            }
            assert!(
                self.receive(Duration::from_secs(30)).await,
                "no answer to request {id} within 30 s"
            );
        }
    }

    /// Waits until `done` holds for what was received (at most 30 s), or, when `settle`, until
    /// 1.5 s pass with nothing new.
    async fn wait_for(&mut self, settle: bool, done: impl Fn(&[Value]) -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !done(&self.inbox) {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            assert!(
                !left.is_zero(),
                "the front did not send what Codex's did within 30 s"
            );
            let wait = if settle {
                left.min(Duration::from_millis(1500))
            } else {
                left
            };
            if !self.receive(wait).await && settle {
                return;
            }
        }
    }
}

/// The notifications about process `pid` in `msgs`, in order.
fn notes_of<'a>(msgs: &'a [Value], pid: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    msgs.iter().filter(move |m| {
        m["method"]
            .as_str()
            .is_some_and(|s| s.starts_with("process/"))
            && m["params"]["processId"] == pid
    })
}

fn output_bytes<'a>(notes: impl Iterator<Item = &'a Value>) -> usize {
    use base64::Engine;
    notes
        .filter(|n| n["method"] == "process/output")
        .map(|n| {
            base64::engine::general_purpose::STANDARD
                .decode(n["params"]["chunk"].as_str().unwrap())
                .unwrap()
                .len()
        })
        .sum()
}

/// A process's notification methods with each run of `process/output` as one.
fn collapsed<'a>(notes: impl Iterator<Item = &'a Value>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for n in notes {
        let m = n["method"].as_str().unwrap().to_string();
        if m == "process/output" && out.last().is_some_and(|l| *l == m) {
            continue;
        }
        out.push(m);
    }
    out
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        // A normalized time is a number.
        Value::String(s) if s == "<ms>" => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// The same keys, recursively, with values of the same JSON types.
fn same_shape(path: &str, recorded: &Value, got: &Value) -> Result<(), String> {
    if kind(recorded) != kind(got) {
        return Err(format!(
            "{path}: Codex's server gave a {} ({recorded}), corral a {} ({got})",
            kind(recorded),
            kind(got)
        ));
    }
    if let (Value::Object(r), Value::Object(g)) = (recorded, got) {
        let rk: Vec<&String> = r.keys().collect();
        let gk: Vec<&String> = g.keys().collect();
        let (mut rs, mut gs) = (rk.clone(), gk.clone());
        rs.sort();
        gs.sort();
        if rs != gs {
            return Err(format!(
                "{path}: keys {rs:?} (Codex's server) vs {gs:?} (corral)"
            ));
        }
        for (k, v) in r {
            same_shape(&format!("{path}.{k}"), v, &g[k])?;
        }
    }
    Ok(())
}

/// What `codex exec` reads of `environmentInfo`, compared: corral's answer differs on purpose
/// elsewhere.
fn same_environment_info(recorded: &Value, got: &Value) -> Result<(), String> {
    let r = recorded.as_object().unwrap();
    let g = got.as_object().ok_or("environmentInfo is no object")?;
    for (k, v) in g {
        let rv = r
            .get(k)
            .ok_or_else(|| format!("environmentInfo.{k}: Codex's server has no such member"))?;
        if k != "capabilities" {
            same_shape(&format!("environmentInfo.{k}"), rv, v)?;
        }
    }
    for k in r.keys().filter(|k| !g.contains_key(*k)) {
        // `providerId` names Codex's environment provider and `prependPathDirs` lists helper
        // directories of Codex's own npm install (`codex-path`), which a corral sandbox does
        // not hold; both are optional to `codex exec` (it runs the same turn through corral
        // without them: tests/it/exec_server.rs).
        if !["providerId", "prependPathDirs"].contains(&k.as_str()) {
            return Err(format!("environmentInfo.{k}: corral does not answer it"));
        }
    }
    // What Codex runs commands with and where: the shell, the platform, the cwd it was given.
    for k in ["platformOs", "cwd", "tempDir"] {
        if r[k] != g[k] {
            return Err(format!("environmentInfo.{k}: {} vs {}", r[k], g[k]));
        }
    }
    // The same capability flags, all booleans; corral's are false (it serves none of the
    // methods they gate), Codex's server's mostly true.
    let (rc, gc) = (
        r["capabilities"].as_object().unwrap(),
        g["capabilities"].as_object().ok_or("no capabilities")?,
    );
    let mut rk: Vec<&String> = rc.keys().collect();
    let mut gk: Vec<&String> = gc.keys().collect();
    rk.sort();
    gk.sort();
    if rk != gk {
        return Err(format!("capabilities {rk:?} vs {gk:?}"));
    }
    if !gc.values().all(|v| *v == json!(false)) {
        return Err(format!("corral's capabilities are not all false: {gc:?}"));
    }
    Ok(())
}

/// Compares corral's answer to a request with Codex's server's: the same outcome, the same
/// error code, the same result shape, and the values `codex exec` acts on.
fn same_answer(
    method: &str,
    recorded: &Value,
    got: &Value,
    first_terminate: bool,
) -> Result<(), String> {
    match (recorded.get("error"), got.get("error")) {
        (Some(r), Some(g)) => {
            return if r["code"] == g["code"] {
                Ok(())
            } else {
                Err(format!(
                    "error code {} (Codex's server) vs {}",
                    r["code"], g["code"]
                ))
            };
        }
        (None, None) => {}
        _ => return Err("one answered a result, the other an error".into()),
    }
    let (r, g) = (&recorded["result"], &got["result"]);
    if method == "initialize" {
        if !g["sessionId"].is_string() {
            return Err("no sessionId".into());
        }
        return same_environment_info(&r["environmentInfo"], &g["environmentInfo"]);
    }
    same_shape("result", r, g)?;
    let equal: &[&str] = match method {
        // The bytes of the file (the PNG view_image sends the model).
        "fs/readFile" => &["dataBase64"],
        "fs/getMetadata" => &["isDirectory", "isFile", "isSymlink", "size"],
        "process/start" => &["processId", "sandboxType"],
        "process/write" => &["status"],
        // Codex terminates its TTY process twice, back to back: its own server still holds
        // the dying process (`running: true` again), corral forgot it at the first terminate
        // (`running: false`, as Codex's server answers for a process it does not hold). Only
        // the first terminate of a process is compared by value.
        "process/terminate" if first_terminate => &["running"],
        _ => &[],
    };
    for k in equal {
        if r[k] != g[k] {
            return Err(format!(
                "result.{k}: {} (Codex's server) vs {} (corral)",
                r[k], g[k]
            ));
        }
    }
    Ok(())
}

/// corral's front answers the requests `codex exec` sent Codex's own exec-server in the
/// recorded turn (tests/codex/trace-VERSION.jsonl) the way Codex's server did: each request
/// is replayed in order (the placeholders filled for this run: a workspace with `pixel.png`, a
/// directory outside it), after waiting for the process notifications the recording had
/// before it; each answer has the recorded outcome, error code, result keys and value types,
/// and the values `codex exec` acts on; each process gets the recorded notification methods
/// in the recorded order (runs of `process/output` as one) with increasing seqs.
///
/// Not compared: `environmentConfig/read` and `fs/watchMissing` (corral's capability flags
/// for them are false, so `codex exec` does not send them to corral; corral answers -32601,
/// asserted) and the `fs/missingChanged` notification. Values that differ by nature (ids,
/// times, sizes of what the sandboxes print, environmentInfo's executor fields) are compared
/// by type only.
#[tokio::test]
async fn corral_answers_the_recorded_turn_like_codex() {
    let trace: Vec<Value> = std::fs::read_to_string(fixture())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        trace.iter().all(|e| e.get("conn").is_none()),
        "the recording holds one connection"
    );
    let d = common::Daemon::start(&[]).await;
    // Outside /tmp, as recorded: the ancestors Codex probes for `.git` are the same paths.
    let ws = outside();
    let ws_path = std::fs::canonicalize(ws.path()).unwrap();
    let forbidden = outside();
    let forbidden_path = std::fs::canonicalize(forbidden.path()).unwrap();
    let homes = outside();
    codex_support::write_pixel(&ws_path);
    let at = |p: &Path| p.to_string_lossy().into_owned();
    let fill = Fill {
        fixed: vec![
            ("<ws>", at(&ws_path)),
            ("<outside>", at(&forbidden_path)),
            ("<codex-home>", at(&homes.path().join("codex-home"))),
            ("<server-home>", at(&homes.path().join("server-home"))),
            ("<codex>", "/nonexistent/codex".into()),
            ("<home>", std::env::var("HOME").unwrap()),
        ],
    };
    let trace: Vec<(bool, Value)> = trace
        .into_iter()
        .map(|mut e| (e["dir"] == "c2s", fill.value(None, e["msg"].take())))
        .collect();
    let front = codex_support::Front::start(&d, &ws_path, &[]).await;
    let mut c = Conn::connect(&front.url).await;
    let recorded_notes = |upto: usize| -> Vec<Value> {
        trace[..upto]
            .iter()
            .filter(|(c2s, m)| !c2s && m.get("id").is_none())
            .map(|(_, m)| m.clone())
            .collect()
    };
    let pids: Vec<String> = {
        let mut p: Vec<String> = Vec::new();
        for (_, m) in &trace {
            if m["method"] == "process/start" {
                p.push(m["params"]["processId"].as_str().unwrap().to_string());
            }
        }
        p
    };
    let mut terminated: Vec<String> = Vec::new();
    let mut differences: Vec<String> = Vec::new();
    let mut compared = 0;
    for (i, (c2s, msg)) in trace.iter().enumerate() {
        if !c2s {
            continue;
        }
        // What the process notifications had said before Codex sent this: its exits and
        // closes for sure, its output as far as corral's sandbox prints as much.
        let before = recorded_notes(i);
        for pid in &pids {
            let want = collapsed(notes_of(&before, pid));
            let ends: Vec<String> = want.into_iter().filter(|m| m != "process/output").collect();
            c.wait_for(false, |got| {
                let have = collapsed(notes_of(got, pid));
                ends.iter().all(|m| have.contains(m))
            })
            .await;
            let bytes = output_bytes(notes_of(&before, pid));
            c.wait_for(true, |got| {
                output_bytes(notes_of(got, pid)) >= bytes
                    || notes_of(got, pid).any(|n| n["method"] == "process/exited")
            })
            .await;
        }
        c.send(msg).await;
        let Some(id) = msg.get("id") else {
            continue;
        };
        let method = msg["method"].as_str().unwrap();
        let got = c.answer(id).await;
        if UNSERVED.contains(&method) {
            assert_eq!(got["error"]["code"], -32601, "{method}: {got}");
            continue;
        }
        let recorded = trace
            .iter()
            .find(|(c2s, m)| !c2s && m.get("id") == Some(id) && m.get("method").is_none())
            .map(|(_, m)| m)
            .unwrap_or_else(|| panic!("no recorded answer to {msg}"));
        let first_terminate = method == "process/terminate" && {
            let pid = msg["params"]["processId"].as_str().unwrap().to_string();
            let first = !terminated.contains(&pid);
            terminated.push(pid);
            first
        };
        compared += 1;
        if let Err(e) = same_answer(method, recorded, &got, first_terminate) {
            differences.push(format!(
                "request {id} {method}: {e}\n  sent {msg}\n  Codex's server: {recorded}\n  corral: {got}"
            ));
        }
    }
    // The notifications: per process, the recorded methods in order (corral may add what came
    // after the recording ended: Codex exits right after its last terminate).
    let all = recorded_notes(trace.len());
    for pid in &pids {
        let want = collapsed(notes_of(&all, pid));
        let ends: Vec<String> = want
            .iter()
            .filter(|m| *m != "process/output")
            .cloned()
            .collect();
        c.wait_for(false, |got| {
            let have = collapsed(notes_of(got, pid));
            ends.iter().all(|m| have.contains(m))
        })
        .await;
        c.wait_for(true, |_| false).await;
        let have = collapsed(notes_of(&c.inbox, pid));
        let closed = want.last().is_some_and(|m| m == "process/closed");
        if (closed && have != want) || !have.starts_with(&want) {
            differences.push(format!(
                "process {pid}: notifications {want:?} (Codex's server) vs {have:?} (corral)"
            ));
        }
        let seqs: Vec<u64> = notes_of(&c.inbox, pid)
            .map(|n| n["params"]["seq"].as_u64().unwrap())
            .collect();
        if !seqs.windows(2).all(|w| w[0] < w[1]) {
            differences.push(format!("process {pid}: seqs {seqs:?} do not increase"));
        }
        // Each notification's params have the recorded shape.
        for n in notes_of(&c.inbox, pid) {
            let Some(r) = notes_of(&all, pid).find(|r| r["method"] == n["method"]) else {
                continue;
            };
            if let Err(e) = same_shape("params", &r["params"], &n["params"]) {
                differences.push(format!("process {pid} {}: {e}", n["method"]));
            }
        }
        let rec: Vec<&Value> = notes_of(&all, pid).collect();
        let got: Vec<&Value> = notes_of(&c.inbox, pid).collect();
        // The streams output came on: `pty` for a TTY. corral's Processes service hands a pipe
        // process's stdout and stderr over interleaved as one stream (corral.proto,
        // StartProcessRequest.tty), so the front reports both as `stdout`; `codex exec` puts
        // both streams into the one tool output the model reads (the recorder asserts that
        // the stderr line Codex's server sent is in it), so `stderr` counts as `stdout` here.
        let streams = |notes: &[&Value]| {
            let mut s: Vec<String> = notes
                .iter()
                .filter(|n| n["method"] == "process/output")
                .map(|n| match n["params"]["stream"].as_str().unwrap() {
                    "stderr" => "stdout".to_string(),
                    other => other.to_string(),
                })
                .collect();
            s.sort();
            s.dedup();
            s
        };
        if streams(&rec) != streams(&got) {
            differences.push(format!(
                "process {pid}: output streams {:?} vs {:?}",
                streams(&rec),
                streams(&got)
            ));
        }
        // A process that exited on its own (before Codex terminated it): the same exit code
        // and sandboxDenied.
        let exit = |notes: &[&Value]| {
            notes
                .iter()
                .find(|n| n["method"] == "process/exited")
                .map(|n| {
                    (
                        n["params"]["exitCode"].clone(),
                        n["params"]["sandboxDenied"].clone(),
                    )
                })
        };
        let at = |pred: &dyn Fn(&(bool, Value)) -> bool| trace.iter().position(pred);
        let exited_at = at(&|(c2s, m)| {
            !c2s && m["method"] == "process/exited" && m["params"]["processId"] == pid.as_str()
        });
        let terminated_at = at(&|(c2s, m)| {
            *c2s && m["method"] == "process/terminate" && m["params"]["processId"] == pid.as_str()
        });
        if exited_at.is_some_and(|e| terminated_at.is_none_or(|t| e < t))
            && exit(&rec) != exit(&got)
        {
            differences.push(format!(
                "process {pid}: exited {:?} vs {:?}",
                exit(&rec),
                exit(&got)
            ));
        }
    }
    for n in &c.inbox {
        if let Some(m) = n["method"].as_str() {
            assert!(
                m.starts_with("process/") && !UNSERVED_NOTIFICATIONS.contains(&m),
                "corral sent {n}"
            );
        }
    }
    assert!(
        differences.is_empty(),
        "corral answered {} of {compared} requests unlike Codex's server:\n{}",
        differences.len(),
        differences.join("\n")
    );
    assert!(compared >= 20, "only {compared} answers compared");
    // What the turn wrote: the bytes Codex's server was asked to write, and the command's file.
    use base64::Engine;
    let written = trace
        .iter()
        .find(|(c2s, m)| *c2s && m["method"] == "fs/writeFile")
        .map(|(_, m)| m["params"]["dataBase64"].as_str().unwrap())
        .unwrap();
    assert_eq!(
        std::fs::read(ws_path.join("patched.txt")).unwrap(),
        base64::engine::general_purpose::STANDARD
            .decode(written)
            .unwrap()
    );
    assert_eq!(
        std::fs::read_to_string(ws_path.join("inside.txt")).unwrap(),
        "made-by-codex\n"
    );
    assert!(!forbidden_path.join("leak").exists());
}
