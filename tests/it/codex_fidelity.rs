//! Model texts that must match the newest Codex byte for byte, through a real daemon: apply_patch's
//! exec-format answer for every form, the empty patch, line endings, the structured shell JSON's
//! truncation header, and apply_patch typed into `shell` / `shell_command` (spec/tools.md §5.5,
//! §5.8, §5.9, §6.5).

use crate::common::{Daemon, outside, scratch};
use corral::api::SandboxMode;

/// Replaces the exec format's wall time with `_` (it varies with load).
fn wall(text: &str) -> String {
    let (head, rest) = text.split_once("\nWall time: ").expect("wall time");
    let end = rest.find(" seconds\n").expect("seconds");
    format!("{head}\nWall time: _{}", &rest[end..])
}

fn success(lines: &str) -> String {
    format!(
        "Exit code: 0\nWall time: _ seconds\nOutput:\nSuccess. Updated the following files:\n{lines}"
    )
}

#[tokio::test]
async fn json_apply_patch_answers_in_the_exec_format() {
    let d = Daemon::start(&[]).await;
    let cwd = scratch();
    let id = d.open(cwd.path(), SandboxMode::WorkspaceWrite).await;
    let args = serde_json::json!({"input": "*** Begin Patch\n*** Add File: f.txt\n+via json\n*** End Patch\n"})
        .to_string();
    let (text, ok) = d.invoke(&id, "apply_patch", &args).await;
    assert!(ok, "{text}");
    assert_eq!(wall(&text), success("A f.txt\n"));
    assert_eq!(
        std::fs::read_to_string(cwd.path().join("f.txt")).unwrap(),
        "via json\n"
    );
}

#[tokio::test]
async fn empty_patch_is_rejected_even_when_read_only() {
    let d = Daemon::start(&[]).await;
    let cwd = scratch();
    let args = r#"{"input":"*** Begin Patch\n*** End Patch"}"#;
    for mode in [SandboxMode::WorkspaceWrite, SandboxMode::ReadOnly] {
        let id = d.open(cwd.path(), mode).await;
        assert_eq!(
            d.invoke(&id, "apply_patch", args).await,
            ("patch rejected: empty patch".to_string(), false)
        );
    }
}

#[tokio::test]
async fn surviving_lines_keep_their_own_line_endings() {
    let d = Daemon::start(&[]).await;
    let cwd = scratch();
    std::fs::write(cwd.path().join("mixed.txt"), b"k\r\nl\nm\r\nn\n").unwrap();
    std::fs::write(cwd.path().join("rep.txt"), b"r\r\nr\n").unwrap();
    let id = d.open(cwd.path(), SandboxMode::WorkspaceWrite).await;
    let patch = "*** Begin Patch\n*** Update File: mixed.txt\n@@\n k\n l\n-m\n+M\n n\n\
                 *** Update File: rep.txt\n@@\n-r\n r\n*** End Patch";
    let args = serde_json::json!({ "input": patch }).to_string();
    let (text, ok) = d.invoke(&id, "apply_patch", &args).await;
    assert!(ok, "{text}");
    assert_eq!(wall(&text), success("M mixed.txt\nM rep.txt\n"));
    assert_eq!(
        std::fs::read(cwd.path().join("mixed.txt")).unwrap(),
        b"k\r\nl\nM\r\nn\n"
    );
    // The context line is the LF one; the CRLF line before it was removed.
    assert_eq!(std::fs::read(cwd.path().join("rep.txt")).unwrap(), b"r\n");
}

#[tokio::test]
async fn structured_shell_json_truncation_has_no_warning_line() {
    let d = Daemon::start(&[]).await;
    let cwd = scratch();
    let id = d.open(cwd.path(), SandboxMode::WorkspaceWrite).await;
    let (out, ok) = d
        .invoke(&id, "shell", r#"{"command":["seq","1","3000"]}"#)
        .await;
    assert!(ok, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let text = v["output"].as_str().unwrap();
    assert!(
        text.starts_with("Total output lines: 3000\n\n1\n2\n"),
        "{}",
        &text[..80]
    );
    assert!(!text.contains("Warning"));
}

fn heredoc(dir_prefix: &str, body: &str) -> String {
    format!("{dir_prefix}apply_patch <<'EOF'\n*** Begin Patch\n{body}\n*** End Patch\nEOF\n")
}

#[tokio::test]
async fn heredoc_patch_through_shell_and_shell_command_is_applied() {
    let d = Daemon::start(&[]).await;
    let cwd = scratch();
    std::fs::create_dir(cwd.path().join("pkg")).unwrap();
    std::fs::write(cwd.path().join("pkg/lib.txt"), "old\n").unwrap();
    let id = d.open(cwd.path(), SandboxMode::WorkspaceWrite).await;

    // `shell`: a bash -lc wrapper around the heredoc.
    let script = heredoc("", "*** Add File: via_shell.txt\n+from shell");
    let args = serde_json::json!({ "command": ["bash", "-lc", script] }).to_string();
    let (text, ok) = d.invoke(&id, "shell", &args).await;
    assert!(ok, "{text}");
    assert_eq!(wall(&text), success("A via_shell.txt\n"));
    assert_eq!(
        std::fs::read_to_string(cwd.path().join("via_shell.txt")).unwrap(),
        "from shell\n"
    );

    // `shell_command`: the script itself, with `cd <dir> &&`.
    let script = heredoc("cd pkg && ", "*** Update File: lib.txt\n@@\n-old\n+new");
    let args = serde_json::json!({ "command": script }).to_string();
    let (text, ok) = d.invoke(&id, "shell_command", &args).await;
    assert!(ok, "{text}");
    assert_eq!(wall(&text), success("M lib.txt\n"));
    assert_eq!(
        std::fs::read_to_string(cwd.path().join("pkg/lib.txt")).unwrap(),
        "new\n"
    );

    // `applypatch` as a direct argv.
    let args = serde_json::json!({
        "command": ["applypatch", "*** Begin Patch\n*** Delete File: via_shell.txt\n*** End Patch"]
    })
    .to_string();
    let (text, ok) = d.invoke(&id, "shell", &args).await;
    assert!(ok, "{text}");
    assert_eq!(wall(&text), success("D via_shell.txt\n"));
    assert!(!cwd.path().join("via_shell.txt").exists());

    // `exec_command` (unified exec): the same interception.
    let script = heredoc("", "*** Add File: via_exec.txt\n+from exec_command");
    let args = serde_json::json!({ "cmd": script }).to_string();
    let (text, ok) = d.invoke(&id, "exec_command", &args).await;
    assert!(ok, "{text}");
    assert_eq!(wall(&text), success("A via_exec.txt\n"));
    assert_eq!(
        std::fs::read_to_string(cwd.path().join("via_exec.txt")).unwrap(),
        "from exec_command\n"
    );

    // An ordinary heredoc command is still run.
    let args = serde_json::json!({ "command": "cat <<'EOF'\nplain\nEOF\n" }).to_string();
    let (text, ok) = d.invoke(&id, "shell_command", &args).await;
    assert!(ok, "{text}");
    assert!(text.ends_with("Output:\nplain\n"), "{text}");
}

#[tokio::test]
async fn shell_route_is_refused_outside_the_roots_and_on_protected_paths() {
    let d = Daemon::start(&[]).await;
    let cwd = scratch();
    let out = outside();
    std::fs::create_dir(cwd.path().join(".git")).unwrap();
    let id = d.open(cwd.path(), SandboxMode::WorkspaceWrite).await;

    let script = heredoc(
        "",
        &format!("*** Add File: {}/x.txt\n+x", out.path().display()),
    );
    let args = serde_json::json!({ "command": script }).to_string();
    assert_eq!(
        d.invoke(&id, "shell_command", &args).await,
        (
            "patch rejected: writing outside of the project; rejected by user approval settings"
                .to_string(),
            false
        )
    );
    assert!(!out.path().join("x.txt").exists());

    let script = heredoc("", "*** Add File: .git/hooks/post-checkout\n+evil");
    let args = serde_json::json!({ "command": ["bash", "-lc", script] }).to_string();
    let (text, ok) = d.invoke(&id, "shell", &args).await;
    assert!(!ok);
    assert!(
        text.starts_with("patch rejected: writing to protected workspace metadata path "),
        "{text}"
    );
    assert!(!cwd.path().join(".git/hooks").exists());

    // Asking for escalation does not take the patch outside the sandbox.
    let script = heredoc(
        "",
        &format!("*** Add File: {}/y.txt\n+y", out.path().display()),
    );
    let args = serde_json::json!({ "command": script, "sandbox_permissions": "require_escalated" })
        .to_string();
    let (text, ok) = d.invoke(&id, "shell_command", &args).await;
    assert!(!ok);
    assert_eq!(
        text,
        "patch rejected: writing outside of the project; rejected by user approval settings"
    );
    assert!(!out.path().join("y.txt").exists());

    // A read-only session refuses the shell route like the tool.
    let ro = d.open(cwd.path(), SandboxMode::ReadOnly).await;
    let script = heredoc("", "*** Add File: ro.txt\n+x");
    let args = serde_json::json!({ "command": script }).to_string();
    assert_eq!(
        d.invoke(&ro, "shell_command", &args).await,
        (
            "patch rejected: writing is blocked by read-only sandbox; rejected by user approval settings"
                .to_string(),
            false
        )
    );
    assert!(!cwd.path().join("ro.txt").exists());
}

/// The pinned Codex release's own tool definitions, as `codex exec` sent them to a mock model
/// (`tests/codex/tools-VERSION.json`, captured as `tests/codex/tools-VERSION.md` says).
fn pinned_codex_tools() -> Vec<serde_json::Value> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/codex");
    let version = std::fs::read_to_string(dir.join("VERSION")).unwrap();
    let path = dir.join(format!("tools-{}.json", version.trim()));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (capture it for the pinned release)",
            path.display()
        )
    });
    serde_json::from_str(&text).unwrap()
}

fn named<'a>(tools: &'a [serde_json::Value], name: &str) -> &'a serde_json::Value {
    tools
        .iter()
        .find(|t| t["name"] == name || t["function"]["name"] == name)
        .unwrap_or_else(|| panic!("{name} not listed"))
}

/// Codex 0.171 lists view_image's `detail` only when the model can ask for original detail and
/// the unified image budget (a stable feature, on by default) is off: by default it lists `path`
/// alone, and its handler still takes `detail: "original"` when a model sends it.
#[tokio::test]
async fn view_image_lists_detail_as_the_pinned_codex_does() {
    let codex = pinned_codex_tools();
    let codex_params = &named(&codex, "view_image")["parameters"];
    assert!(codex_params["properties"].get("detail").is_none());

    let d = Daemon::start(&[]).await;
    let cwd = scratch();
    let id = d.open(cwd.path(), SandboxMode::ReadOnly).await;
    for (format, session) in [
        (corral::api::ToolFormat::Responses, id.as_str()),
        (corral::api::ToolFormat::ChatCompletions, id.as_str()),
        (corral::api::ToolFormat::Responses, ""),
    ] {
        let listed = d
            .bridge()
            .await
            .list_tools(corral::api::ListToolsRequest {
                format: format as i32,
                session_id: session.into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let tools: Vec<serde_json::Value> = serde_json::from_str(&listed.tools_json).unwrap();
        let tool = named(&tools, "view_image");
        let params = tool
            .get("parameters")
            .unwrap_or(&tool["function"]["parameters"]);
        let keys = |p: &serde_json::Value| -> Vec<String> {
            p["properties"]
                .as_object()
                .unwrap()
                .keys()
                .cloned()
                .collect()
        };
        assert_eq!(keys(params), keys(codex_params), "{format:?} {session:?}");
        assert_eq!(keys(params), ["path"]);
        for field in ["type", "required", "additionalProperties"] {
            assert_eq!(params[field], codex_params[field], "{field}");
        }
        assert!(!listed.tools_json.contains("detail"), "{format:?}");
    }

    // Unlisted, `detail: "original"` is still honoured, as Codex's handler honours it.
    std::fs::write(cwd.path().join("dot.png"), base64_png_1x1()).unwrap();
    let r = d
        .bridge()
        .await
        .invoke(corral::api::InvokeRequest {
            session_id: id.clone(),
            name: "view_image".into(),
            arguments: r#"{"path":"dot.png","detail":"original"}"#.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.success, "{}", r.output);
    let details: Vec<&str> = r
        .content_items
        .iter()
        .filter_map(|c| match &c.item {
            Some(corral::api::output_content_item::Item::InputImage(i)) => Some(i.detail.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(details, ["original"]);
}

/// A 1×1 PNG.
fn base64_png_1x1() -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")
        .unwrap()
}

/// The tools the pinned Codex still lists are offered with its definitions byte for byte (as
/// JSON values: the fixture is one request body's `tools`), with and without a session: the
/// model reads the same descriptions through corral as through Codex.
#[tokio::test]
async fn definitions_are_the_pinned_codex_ones() {
    let codex = pinned_codex_tools();
    let d = Daemon::start(&[]).await;
    let cwd = scratch();
    let id = d.open(cwd.path(), SandboxMode::ReadOnly).await;
    for session in [id.as_str(), ""] {
        let listed = d
            .bridge()
            .await
            .list_tools(corral::api::ListToolsRequest {
                format: corral::api::ToolFormat::Responses as i32,
                session_id: session.into(),
                // Without a session, what a new session gets by default (as `corral tools`).
                shell_tool: corral::api::ShellTool::UnifiedExec as i32,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let tools: Vec<serde_json::Value> = serde_json::from_str(&listed.tools_json).unwrap();
        for name in ["exec_command", "write_stdin", "view_image", "apply_patch"] {
            assert_eq!(
                named(&tools, name),
                named(&codex, name),
                "{name} (session {session:?})"
            );
        }
    }
}
