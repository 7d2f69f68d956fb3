//! What the tests that run the pinned Codex share: finding the pinned `codex`, a scripted mock
//! of the Responses API on loopback, a CODEX_HOME pointing at it, `codex exec`, a running
//! `corral exec-server`, and the scripted turn itself (tests/it/exec_server.rs runs it through
//! corral, tests/it/exec_server_trace.rs records it against Codex's own exec-server).

use crate::common::{self, Daemon, outside};
use serde_json::json;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};

mod model;
pub use model::*;

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
    let leak_cmd = sandboxed_writes_command(leak, "made-by-codex");
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

/// The command [`assert_sandboxed_writes`] judges: writes `marker` to `inside.txt` in its cwd,
/// prints its NoNewPrivs/Seccomp lines, and tries to write `leak`.
pub fn sandboxed_writes_command(leak: &Path, marker: &str) -> String {
    format!(
        "echo {marker} > inside.txt; cat inside.txt; grep -E '^(NoNewPrivs|Seccomp):' \
         /proc/self/status; echo x > {} || echo WRITE-REFUSED",
        leak.display()
    )
}

/// What the host sees after a command ran in corral's sandbox (it wrote `MARKER` to
/// `inside.txt`, printed its NoNewPrivs/Seccomp lines, tried to write `leak`): the write inside
/// is there, the one outside was refused and is not.
pub fn assert_sandboxed_writes(ws: &Path, leak: &Path, output: &str, marker: &str) {
    assert!(output.contains(marker), "{output}");
    assert!(
        output.contains("NoNewPrivs:\t1") && output.contains("Seccomp:\t2"),
        "{output}"
    );
    assert!(
        output.contains("WRITE-REFUSED") && output.contains("Read-only file system"),
        "{output}"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("inside.txt")).unwrap(),
        format!("{marker}\n")
    );
    assert!(!leak.exists(), "the sandbox wrote outside the workspace");
}
