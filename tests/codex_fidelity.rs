//! Model texts that must match the newest Codex byte for byte, through a real daemon: apply_patch's
//! exec-format answer for every form, the empty patch, line endings, the structured shell JSON's
//! truncation header, and apply_patch typed into `shell` / `shell_command` (spec/tools.md §5.5,
//! §5.8, §5.9, §6.5).

mod common;

use common::{Daemon, outside, scratch};
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
