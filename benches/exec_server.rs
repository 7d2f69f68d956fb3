//! Codex's exec-server protocol, corral's front against Codex's own server: a sandboxed `true`
//! via `process/start` until its `process/closed` notification, through `corral exec-server`
//! (daemon + front) and through the pinned release's `codex exec-server` with its own sandbox,
//! with the same client, the same request (Codex 0.171's workspace-write sandbox entries) and
//! interleaved round-robin in the same run. Goal (issue 21): corral ÷ Codex ≤ 0.6 at p50.
//!
//!
//! Then whole turns: an unmodified `codex exec` (the pinned release) runs a scripted turn —
//! three exec_commands, two freeform apply_patch calls, a view_image — with its tools on corral's
//! front or on Codex's own server (`CODEX_EXEC_SERVER_URL`), turns alternating. The scripted
//! model answers at once; the turn's tool time is the sum, over its tool calls, of the gap
//! between the model's answer and Codex's next request (everything Codex does to run the tool
//! and report it, the server included).
//!
//! `cargo bench --bench exec_server` (harness = false). Needs the pinned Codex: CORRAL_CODEX,
//! else `~/.cache/corral-ci/codex-<tests/codex/VERSION>` (what `.ci/run` installs).
//! Environment: `CORRAL_BENCH_N` (measured iterations per server, default 200),
//! `CORRAL_BENCH_WARMUP` (default 20), `CORRAL_BENCH_TURNS` (whole turns per server, default
//! 10), `CORRAL_BIN`.

#[path = "../tests/codex_support/model.rs"]
mod model;
mod support;

use futures_util::{SinkExt, StreamExt};
use model::{PIXEL, codex};
use serde_json::{Value, json};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};
use support::{Daemon, env_usize, fail, load_average, pct, us};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;

/// A connection speaking the protocol, as Codex does.
struct Client {
    ws: WebSocketStream<TcpStream>,
    next: u64,
}

impl Client {
    async fn connect(url: &str) -> Client {
        let tcp = TcpStream::connect(url.trim_start_matches("ws://"))
            .await
            .unwrap_or_else(|e| fail(&format!("{url}: {e}")));
        let (ws, _) = tokio_tungstenite::client_async(url, tcp)
            .await
            .unwrap_or_else(|e| fail(&format!("{url}: {e}")));
        let mut c = Client { ws, next: 1 };
        let r = c.call("initialize", json!({"clientName": "bench"})).await;
        if r.get("result").is_none() {
            fail(&format!("initialize: {r}"));
        }
        c.send(json!({"method": "initialized", "params": {}})).await;
        c
    }

    async fn send(&mut self, v: Value) {
        self.ws.send(Message::text(v.to_string())).await.unwrap();
    }

    async fn recv(&mut self) -> Value {
        loop {
            match tokio::time::timeout(Duration::from_secs(30), self.ws.next()).await {
                Ok(Some(Ok(Message::Text(t)))) => return serde_json::from_str(&t).unwrap(),
                Ok(Some(Ok(_))) => continue,
                other => fail(&format!("the connection ended: {other:?}")),
            }
        }
    }

    async fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next;
        self.next += 1;
        self.send(json!({"id": id, "method": method, "params": params}))
            .await;
        loop {
            let v = self.recv().await;
            if v["id"] == json!(id) {
                return v;
            }
        }
    }

    /// `process/start` of `true`, until its `process/closed`; the elapsed time.
    async fn run_true(&mut self, n: usize, ws: &Path) -> Duration {
        let pid = format!("bench-{n}");
        let cwd = url::Url::from_file_path(ws).unwrap().to_string();
        let t = Instant::now();
        let id = self.next;
        self.next += 1;
        self.send(json!({"id": id, "method": "process/start", "params": {
            "processId": pid, "argv": ["true"], "cwd": cwd, "env": {}, "tty": false,
            "pipeStdin": false, "arg0": null, "sandbox": sandbox(ws),
            "enforceManagedNetwork": false, "managedNetwork": null}}))
            .await;
        loop {
            let v = self.recv().await;
            if v["id"] == json!(id) && v.get("error").is_some() {
                fail(&format!("process/start: {v}"));
            }
            if v["method"] == "process/closed" && v["params"]["processId"] == pid {
                break;
            }
        }
        let elapsed = t.elapsed();
        self.call("process/terminate", json!({"processId": pid}))
            .await;
        elapsed
    }
}

/// Codex 0.171's `--sandbox workspace-write` request (as recorded from a real turn), /tmp left
/// out so that both servers confine to the workspace alone.
fn sandbox(ws: &Path) -> Value {
    let root = url::Url::from_file_path(ws).unwrap().to_string();
    let special = |kind: &str, sub: Option<&str>| {
        let mut v = json!({"type": "special", "value": {"kind": kind}});
        if let Some(s) = sub {
            v["value"]["subpath"] = json!(s);
        }
        v
    };
    let ro = |sub: &str| {
        json!({"path": special("project_roots", Some(sub)), "access": "read",
            "missing_path_behavior": "skip"})
    };
    json!({
        "permissions": {"type": "managed", "network": "restricted", "file_system": {
            "type": "restricted", "entries": [
                {"path": special("root", None), "access": "read"},
                {"path": special("project_roots", None), "access": "write"},
                ro(".git"), ro(".agents"), ro(".codex"), ro(".aws"),
            ]}},
        "cwd": root, "workspaceRoots": [root], "windowsSandboxLevel": "disabled",
        "windowsSandboxProxySettingsMode": "reconcile", "useLegacyLandlock": false,
    })
}

/// Starts `program args…`, returns it and the `ws://` URL it prints (corral's front) or the one
/// it was told to listen on (Codex's server).
async fn start(
    program: &Path,
    args: &[&str],
    cwd: &Path,
    env: &[(&str, &Path)],
    known_url: Option<String>,
) -> (tokio::process::Child, String) {
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, *v)))
        .current_dir(cwd)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| fail(&format!("{}: {e}", program.display())));
    let url = match known_url {
        Some(u) => {
            // Ready when /readyz answers.
            let addr = u.trim_start_matches("ws://").to_string();
            for _ in 0..200 {
                if TcpStream::connect(&addr).await.is_ok() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            u
        }
        None => {
            let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
            lines
                .next_line()
                .await
                .ok()
                .flatten()
                .unwrap_or_else(|| fail("no URL from the front"))
        }
    };
    (child, url)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The scripted turn: every tool call ends as soon as its work does (no fixed waits).
fn turn_script(ws: &Path) -> Vec<model::Turn> {
    let image = ws.join("pixel.png").to_string_lossy().into_owned();
    let patch = |body: &'static str| {
        move |_: &Value| {
            vec![
                json!({"type": "custom_tool_call", "name": "apply_patch", "call_id": "p",
                "input": body}),
            ]
        }
    };
    let exec = |id: &'static str, cmd: &'static str| {
        move |_: &Value| {
            vec![model::function_call(
                "exec_command",
                id,
                json!({"cmd": cmd, "yield_time_ms": 10000}),
            )]
        }
    };
    vec![
        Box::new(exec("e1", "echo made > a.txt && cat a.txt")),
        Box::new(exec("e2", "ls -la && wc -c a.txt")),
        Box::new(patch(
            "*** Begin Patch\n*** Add File: b.txt\n+one\n*** End Patch\n",
        )),
        Box::new(patch(
            "*** Begin Patch\n*** Update File: b.txt\n@@\n-one\n+two\n*** End Patch\n",
        )),
        Box::new(move |_| {
            vec![model::function_call(
                "view_image",
                "v",
                json!({"path": image}),
            )]
        }),
        Box::new(exec("e3", "cat b.txt")),
        Box::new(|_| vec![model::message("done")]),
    ]
}

/// One `codex exec` turn with its tools on the exec-server at `url`, in a fresh directory under
/// `ws`; the turn's tool time.
async fn one_turn(ws: &Path, url: &str, n: usize) -> Duration {
    let dir = ws.join(format!("turn-{n}"));
    std::fs::create_dir(&dir).unwrap();
    std::fs::copy(ws.join("pixel.png"), dir.join("pixel.png")).unwrap();
    let mock = model::MockModel::start(turn_script(&dir)).await;
    let home = tempfile::tempdir_in("/var/tmp").unwrap();
    std::fs::write(
        home.path().join("config.toml"),
        format!(
            "model = \"gpt-5.5\"\nmodel_provider = \"mock\"\n[model_providers.mock]\nname = \
             \"mock\"\nbase_url = \"{}\"\nwire_api = \"responses\"\n",
            mock.url
        ),
    )
    .unwrap();
    let out = tokio::process::Command::new(codex())
        .args([
            "exec",
            "--skip-git-repo-check",
            "--sandbox",
            "workspace-write",
            "run the scripted turn",
        ])
        .env("CODEX_HOME", home.path())
        .env("CODEX_EXEC_SERVER_URL", url)
        .current_dir(&dir)
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    let times = mock.times();
    let requests = mock.requests();
    // Every tool answered, and the last patch landed: the turn really ran on that server.
    let patched = std::fs::read_to_string(dir.join("b.txt")).unwrap_or_default();
    if !out.status.success() || times.len() != 7 || patched != "two\n" {
        fail(&format!(
            "the turn on {url} did not run through: status {:?}, {} model requests, b.txt {patched:?}\n{}{}",
            out.status,
            times.len(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    if !model::output_of(&requests[1], "e1").contains("made") {
        fail(&format!(
            "exec_command's output did not reach the model: {}",
            requests[1]
        ));
    }
    times
        .windows(2)
        .map(|w| w[1].0.duration_since(w[0].1))
        .sum()
}

async fn whole_turns(ws: &Path, corral_url: &str, codex_url: &str) {
    let turns = env_usize("CORRAL_BENCH_TURNS", 10);
    let png = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, PIXEL).unwrap();
    std::fs::write(ws.join("pixel.png"), png).unwrap();
    // One turn each to warm up (Codex's first start reads its bundled model metadata).
    one_turn(ws, corral_url, 0).await;
    one_turn(ws, codex_url, 1).await;
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for i in 0..turns {
        let n = 2 + 2 * i;
        if i.is_multiple_of(2) {
            a.push(one_turn(ws, corral_url, n).await);
            b.push(one_turn(ws, codex_url, n + 1).await);
        } else {
            b.push(one_turn(ws, codex_url, n + 1).await);
            a.push(one_turn(ws, corral_url, n).await);
        }
    }
    a.sort();
    b.sort();
    println!(
        "whole turn: codex exec, 6 tool calls (3 exec_command, 2 apply_patch, view_image), \
         tool time per turn, {turns} each, alternating"
    );
    println!("load before: {}", load_average());
    for (name, v) in [
        ("on corral's front", &a),
        ("on codex exec-server 0.171.0", &b),
    ] {
        println!(
            "{name:38} p50 {:>8.1} ms  min {:>8.1} ms  max {:>8.1} ms",
            us(pct(v, 0.5)) / 1000.0,
            us(v[0]) / 1000.0,
            us(v[v.len() - 1]) / 1000.0
        );
    }
    println!(
        "ratio corral / codex (turn tool time): p50 {:.2}×",
        us(pct(&a, 0.5)) / us(pct(&b, 0.5))
    );
}

fn main() {
    support::block_on(async {
        let n = env_usize("CORRAL_BENCH_N", 200);
        let warmup = env_usize("CORRAL_BENCH_WARMUP", 20);
        // Panics, naming the install command, unless the pinned release is there.
        let codex = codex();
        let ws_dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let ws = std::fs::canonicalize(ws_dir.path()).unwrap();
        let daemon = Daemon::start().await.unwrap_or_else(|e| fail(&e));
        let socket = format!("unix:{}", daemon.socket_path().display());
        let (_front, corral_url) = start(
            &support::corral_bin(),
            &[
                "--socket",
                &socket,
                "exec-server",
                "--listen",
                "ws://127.0.0.1:0",
            ],
            &ws,
            &[],
            None,
        )
        .await;
        let codex_home = tempfile::tempdir_in("/var/tmp").unwrap();
        let port = free_port();
        let codex_url = format!("ws://127.0.0.1:{port}");
        let listen = codex_url.clone();
        let codex_args = ["exec-server", "--listen", listen.as_str()];
        // CODEX_HOME keeps the user's own Codex config out of the measurement.
        let (mut codex_server, codex_url) = start(
            &codex,
            &codex_args,
            &ws,
            &[("CODEX_HOME", codex_home.path())],
            Some(codex_url),
        )
        .await;
        let mut corral = Client::connect(&corral_url).await;
        let mut theirs = Client::connect(&codex_url).await;
        for i in 0..warmup {
            corral.run_true(i, &ws).await;
            theirs.run_true(i, &ws).await;
        }
        let (mut a, mut b) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for i in 0..n {
            let i = warmup + i;
            if i.is_multiple_of(2) {
                a.push(corral.run_true(i, &ws).await);
                b.push(theirs.run_true(i, &ws).await);
            } else {
                b.push(theirs.run_true(i, &ws).await);
                a.push(corral.run_true(i, &ws).await);
            }
        }
        a.sort();
        b.sort();
        println!(
            "exec-server: sandboxed `true`, process/start → process/closed, {n} each, interleaved"
        );
        println!("load before: {}", load_average());
        for (name, v) in [
            ("corral exec-server (daemon + front)", &a),
            ("codex exec-server 0.171.0", &b),
        ] {
            println!(
                "{name:38} p50 {:>8.0} µs  p90 {:>8.0} µs  p99 {:>8.0} µs",
                us(pct(v, 0.50)),
                us(pct(v, 0.90)),
                us(pct(v, 0.99))
            );
        }
        println!(
            "ratio corral / codex: p50 {:.2}×  p90 {:.2}× (goal ≤ 0.6× at p50)",
            us(pct(&a, 0.5)) / us(pct(&b, 0.5)),
            us(pct(&a, 0.9)) / us(pct(&b, 0.9))
        );
        whole_turns(&ws, &corral_url, &codex_url).await;
        // Codex's server must not outlive the bench (its sandbox makes mount points on the host
        // while commands run).
        let _ = codex_server.kill().await;
    });
}
