//! Tool sets as a session option (issue 11 item 3): ListTools lists exactly the session's tools
//! with their parallel-safety, Invoke refuses the others with Codex's text, and update_plan and
//! view_image run through Invoke (spec/tools.md §1, §8), view_image inside the sandbox.

use crate::common::{self, Daemon, scratch};
use base64::Engine;
use corral::api::{
    self, ApplyPatchTool, SandboxMode, ShellTool, ToolFormat, output_content_item::Item,
};
use std::path::Path;
use tonic::Code;

fn request(cwd: &Path) -> api::OpenSessionRequest {
    api::OpenSessionRequest {
        cwd: cwd.to_string_lossy().into_owned(),
        mode: SandboxMode::ReadOnly as i32,
        env: common::session_env(cwd),
        ..Default::default()
    }
}

async fn list(d: &Daemon, session: &str, format: ToolFormat) -> api::ListToolsResponse {
    d.bridge()
        .await
        .list_tools(api::ListToolsRequest {
            format: format as i32,
            session_id: session.into(),
            exclude: vec![],
            ..Default::default()
        })
        .await
        .unwrap_or_else(|s| panic!("list_tools: {s:?}"))
        .into_inner()
}

/// The names in a `tools_json` array, in order (Chat Completions nests them under `function`).
fn json_names(tools_json: &str) -> Vec<String> {
    let parsed: Vec<serde_json::Value> = serde_json::from_str(tools_json).unwrap();
    parsed
        .iter()
        .map(|t| {
            t.get("name")
                .or_else(|| t["function"].get("name"))
                .and_then(|n| n.as_str())
                .unwrap()
                .to_string()
        })
        .collect()
}

async fn call(d: &Daemon, session: &str, name: &str, arguments: &str) -> api::InvokeResponse {
    call_kind(d, session, name, arguments, false).await
}

async fn call_kind(
    d: &Daemon,
    session: &str,
    name: &str,
    arguments: &str,
    freeform: bool,
) -> api::InvokeResponse {
    let r = d
        .bridge()
        .await
        .invoke(api::InvokeRequest {
            session_id: session.into(),
            name: name.into(),
            arguments: arguments.into(),
            call_id: "call_9".into(),
            freeform,
        })
        .await
        .unwrap_or_else(|s| panic!("invoke {name}: {s:?}\nlog:\n{}", d.log_text()))
        .into_inner();
    assert_eq!(r.call_id, "call_9");
    r
}

const FILE_TOOLS: [&str; 3] = ["read_file", "list_dir", "grep_files"];

#[tokio::test]
async fn each_tool_set_lists_exactly_its_tools_in_order() {
    let d = Daemon::start(&[]).await;
    let dir = scratch();
    let cases: [(ShellTool, &[&str]); 5] = [
        (ShellTool::Unspecified, &["exec_command", "write_stdin"]),
        (ShellTool::UnifiedExec, &["exec_command", "write_stdin"]),
        (ShellTool::ShellCommand, &["shell_command"]),
        (ShellTool::Shell, &["shell"]),
        (ShellTool::None, &[]),
    ];
    for (shell, first) in cases {
        let id = d
            .open_with(api::OpenSessionRequest {
                shell_tool: shell as i32,
                ..request(dir.path())
            })
            .await;
        let mut want: Vec<&str> = first.to_vec();
        want.extend(FILE_TOOLS);
        want.extend(["update_plan", "apply_patch", "view_image"]);
        let listed = list(&d, &id, ToolFormat::Responses).await;
        assert_eq!(listed.names, want, "{shell:?}");
        assert_eq!(json_names(&listed.tools_json), want, "{shell:?}");
        // Codex: the command tools that start a command, the file tools and view_image are
        // parallel-safe; write_stdin, update_plan and apply_patch are not.
        let safe: Vec<&str> = want
            .iter()
            .copied()
            .filter(|n| !matches!(*n, "write_stdin" | "update_plan" | "apply_patch"))
            .collect();
        assert_eq!(listed.parallel_safe, safe, "{shell:?}");
        let chat = list(&d, &id, ToolFormat::ChatCompletions).await;
        assert_eq!(chat.names, want);
        assert_eq!(json_names(&chat.tools_json), want);
    }

    // shell_command's definition is listed byte for byte.
    let id = d
        .open_with(api::OpenSessionRequest {
            shell_tool: ShellTool::ShellCommand as i32,
            ..request(dir.path())
        })
        .await;
    let listed = list(&d, &id, ToolFormat::Responses).await;
    assert!(listed.tools_json.starts_with(&format!(
        "[{}",
        include_str!("../../src/calls/definitions/shell_command.json")
    )));
    let unified = d.open_with(request(dir.path())).await;
    let listed = list(&d, &unified, ToolFormat::Responses).await;
    for def in [
        include_str!("../../src/calls/definitions/exec_command.json"),
        include_str!("../../src/calls/definitions/write_stdin.json"),
        include_str!("../../src/calls/definitions/update_plan.json"),
        include_str!("../../src/calls/definitions/view_image.json"),
    ] {
        assert!(listed.tools_json.contains(def), "{def}");
    }
}

#[tokio::test]
async fn apply_patch_form_and_optional_tools() {
    let d = Daemon::start(&[]).await;
    let dir = scratch();
    let function = d
        .open_with(api::OpenSessionRequest {
            shell_tool: ShellTool::Shell as i32,
            apply_patch_tool: ApplyPatchTool::Function as i32,
            update_plan: Some(false),
            view_image: Some(false),
            ..request(dir.path())
        })
        .await;
    let listed = list(&d, &function, ToolFormat::Responses).await;
    assert_eq!(
        listed.names,
        [
            "shell",
            "read_file",
            "list_dir",
            "grep_files",
            "apply_patch"
        ]
    );
    let parsed: Vec<serde_json::Value> = serde_json::from_str(&listed.tools_json).unwrap();
    assert_eq!(parsed[4]["type"], "function");
    assert_eq!(parsed[4]["parameters"]["required"][0], "input");

    // The freeform default is a custom tool in the Responses shape, the function form in Chat.
    let freeform = d.open_with(request(dir.path())).await;
    let listed = list(&d, &freeform, ToolFormat::Responses).await;
    let parsed: Vec<serde_json::Value> = serde_json::from_str(&listed.tools_json).unwrap();
    let patch = parsed.iter().find(|t| t["name"] == "apply_patch").unwrap();
    assert_eq!(patch["type"], "custom");
    let chat = list(&d, &freeform, ToolFormat::ChatCompletions).await;
    assert!(chat.names.contains(&"apply_patch".to_string()));

    let none = d
        .open_with(api::OpenSessionRequest {
            shell_tool: ShellTool::None as i32,
            apply_patch_tool: ApplyPatchTool::None as i32,
            update_plan: Some(false),
            view_image: Some(false),
            ..request(dir.path())
        })
        .await;
    let listed = list(&d, &none, ToolFormat::Responses).await;
    assert_eq!(listed.names, FILE_TOOLS);
    assert_eq!(listed.parallel_safe, FILE_TOOLS);

    // `exclude` still applies on top of the set.
    let excluded = d
        .bridge()
        .await
        .list_tools(api::ListToolsRequest {
            session_id: freeform.clone(),
            exclude: vec!["write_stdin".into(), "view_image".into()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        excluded.names,
        [
            "exec_command",
            "read_file",
            "list_dir",
            "grep_files",
            "update_plan",
            "apply_patch"
        ]
    );
    assert_eq!(json_names(&excluded.tools_json), excluded.names);
}

#[tokio::test]
async fn without_a_session_shell_and_the_default_tools() {
    let d = Daemon::start(&[]).await;
    let listed = list(&d, "", ToolFormat::Responses).await;
    assert_eq!(
        listed.names,
        [
            "shell",
            "read_file",
            "list_dir",
            "grep_files",
            "update_plan",
            "apply_patch",
            "view_image"
        ]
    );
    assert_eq!(json_names(&listed.tools_json), listed.names);
    assert_eq!(
        listed.parallel_safe,
        ["shell", "read_file", "list_dir", "grep_files", "view_image"]
    );
}

#[tokio::test]
async fn bad_tool_set_values_name_the_field() {
    let d = Daemon::start(&[]).await;
    let dir = scratch();
    let err = d
        .try_open_with(api::OpenSessionRequest {
            shell_tool: 42,
            ..request(dir.path())
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message()
            .contains("shell_tool 42 is not a known ShellTool"),
        "{err:?}"
    );
    let err = d
        .try_open_with(api::OpenSessionRequest {
            apply_patch_tool: 7,
            ..request(dir.path())
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("apply_patch_tool 7"), "{err:?}");
}

#[tokio::test]
async fn a_tool_outside_the_set_is_an_unsupported_call() {
    let d = Daemon::start(&[]).await;
    let dir = scratch();
    std::fs::write(dir.path().join("f.txt"), "x\n").unwrap();
    let bare = d
        .open_with(api::OpenSessionRequest {
            shell_tool: ShellTool::None as i32,
            apply_patch_tool: ApplyPatchTool::None as i32,
            update_plan: Some(false),
            view_image: Some(false),
            ..request(dir.path())
        })
        .await;
    for (name, args) in [
        ("shell", r#"{"command":["true"]}"#),
        ("container.exec", r#"{"command":["true"]}"#),
        ("shell_command", r#"{"command":"true"}"#),
        ("exec_command", r#"{"cmd":"true"}"#),
        ("write_stdin", r#"{"session_id":1}"#),
        ("update_plan", r#"{"plan":[]}"#),
        ("view_image", r#"{"path":"f.txt"}"#),
        (
            "apply_patch",
            r#"{"input":"*** Begin Patch\n*** End Patch"}"#,
        ),
        ("web_search", "{}"),
    ] {
        let r = call(&d, &bare, name, args).await;
        assert_eq!(
            (r.output.as_str(), r.success),
            (format!("unsupported call: {name}").as_str(), false)
        );
    }
    let r = call_kind(
        &d,
        &bare,
        "apply_patch",
        "*** Begin Patch\n*** End Patch\n",
        true,
    )
    .await;
    assert_eq!(r.output, "unsupported call: apply_patch");
    // The file tools are always there.
    let r = call(&d, &bare, "read_file", r#"{"file_path":"f.txt"}"#).await;
    assert_eq!((r.output.as_str(), r.success), ("L1: x", true));

    // A `shell` session offers neither unified exec tool, but Codex keeps the shell aliases.
    let shell = d
        .open_with(api::OpenSessionRequest {
            shell_tool: ShellTool::Shell as i32,
            ..request(dir.path())
        })
        .await;
    for name in ["exec_command", "write_stdin"] {
        let r = call(&d, &shell, name, "{}").await;
        assert_eq!(r.output, format!("unsupported call: {name}"));
    }
    let r = call(&d, &shell, "shell_command", r#"{"command":"echo hi"}"#).await;
    assert!(r.success && r.output.ends_with("Output:\nhi\n"), "{r:?}");
    let r = call(&d, &shell, "container.exec", r#"{"command":["echo","hi"]}"#).await;
    assert!(r.success, "{r:?}");
}

#[tokio::test]
async fn update_plan_answers_plan_updated_or_codex_parse_errors() {
    let d = Daemon::start(&[]).await;
    let dir = scratch();
    let id = d.open(dir.path(), SandboxMode::ReadOnly).await;
    let ok = r#"{"explanation":"start","plan":[{"step":"read","status":"completed"},{"step":"fix","status":"in_progress"},{"step":"test","status":"pending"}]}"#;
    assert_eq!(
        d.invoke(&id, "update_plan", ok).await,
        ("Plan updated".to_string(), true)
    );
    let cases = [
        (
            r#"{"plan":[{"step":"a","status":"done"}]}"#,
            "failed to parse function arguments: unknown variant `done`, expected one of \
             `pending`, `in_progress`, `completed` at line 1 column 36",
        ),
        (
            r#"{"explanation":"x"}"#,
            "failed to parse function arguments: missing field `plan` at line 1 column 19",
        ),
        (
            r#"{"plan":[{"status":"pending"}]}"#,
            "failed to parse function arguments: missing field `step` at line 1 column 29",
        ),
        (
            r#"{"plan":[],"note":1}"#,
            "failed to parse function arguments: unknown field `note`, expected \
             `explanation` or `plan` at line 1 column 17",
        ),
    ];
    for (args, want) in cases {
        assert_eq!(
            d.invoke(&id, "update_plan", args).await,
            (want.to_string(), false),
            "{args}"
        );
    }
    let r = call_kind(&d, &id, "update_plan", "plan", true).await;
    assert_eq!(r.output, "update_plan handler received unsupported payload");
}

fn png_bytes(w: u32, h: u32) -> Vec<u8> {
    let img = image::RgbaImage::from_pixel(w, h, image::Rgba([200, 30, 60, 255]));
    let mut out = std::io::Cursor::new(Vec::new());
    image::DynamicImage::ImageRgba8(img)
        .write_to(&mut out, image::ImageFormat::Png)
        .unwrap();
    out.into_inner()
}

fn the_image(r: &api::InvokeResponse) -> &api::InputImage {
    match &r.content_items[..] {
        [
            api::OutputContentItem {
                item: Some(Item::InputImage(image)),
            },
        ] => image,
        other => panic!("one image item expected: {other:?} ({})", r.output),
    }
}

#[tokio::test]
async fn view_image_returns_a_data_url_read_in_the_sandbox() {
    let d = Daemon::start(&[]).await;
    let dir = scratch();
    let png = png_bytes(40, 20);
    std::fs::write(dir.path().join("shot.png"), &png).unwrap();
    let id = d.open(dir.path(), SandboxMode::ReadOnly).await;

    let r = call(&d, &id, "view_image", r#"{"path":"shot.png"}"#).await;
    assert!(r.success);
    assert_eq!(r.output, "attached local image path");
    let image = the_image(&r);
    let b64 = base64::engine::general_purpose::STANDARD.encode(&png);
    assert_eq!(image.image_url, format!("data:image/png;base64,{b64}"));
    assert_eq!(image.detail, "");

    let abs = dir.path().join("shot.png");
    let r = call(
        &d,
        &id,
        "view_image",
        &format!(r#"{{"path":"{}","detail":"original"}}"#, abs.display()),
    )
    .await;
    assert_eq!(the_image(&r).detail, "original");

    // Larger than 2048 on a side: scaled to fit, still a PNG.
    std::fs::write(dir.path().join("wide.png"), png_bytes(4096, 1024)).unwrap();
    let r = call(&d, &id, "view_image", r#"{"path":"wide.png"}"#).await;
    let url = &the_image(&r).image_url;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(url.strip_prefix("data:image/png;base64,").unwrap())
        .unwrap();
    let scaled = image::load_from_memory(&raw).unwrap();
    assert_eq!((scaled.width(), scaled.height()), (2048, 512));
}

#[tokio::test]
async fn view_image_errors_are_codex_texts() {
    let d = Daemon::start(&[]).await;
    let dir = scratch();
    std::fs::create_dir(dir.path().join("pics")).unwrap();
    std::fs::write(dir.path().join("notes.txt"), "not an image\n").unwrap();
    std::fs::write(dir.path().join("ok.png"), png_bytes(2, 2)).unwrap();
    let id = d.open(dir.path(), SandboxMode::ReadOnly).await;
    let p = dir.path().display();
    let cases = [
        (
            r#"{"path":"missing.png"}"#.to_string(),
            format!(
                "unable to locate image at `{p}/missing.png`: No such file or directory (os error 2)"
            ),
        ),
        (
            r#"{"path":"pics"}"#.to_string(),
            format!("image path `{p}/pics` is not a file"),
        ),
        (
            r#"{"path":"notes.txt"}"#.to_string(),
            format!("unable to process image at `{p}/notes.txt`: unsupported image `text/plain`"),
        ),
        (
            r#"{"path":"ok.png","detail":"low"}"#.to_string(),
            "view_image.detail only supports `high` or `original`; omit `detail` for default \
             high resized behavior, got `low`"
                .to_string(),
        ),
        (
            "{}".to_string(),
            "failed to parse function arguments: missing field `path` at line 1 column 2"
                .to_string(),
        ),
    ];
    for (args, want) in cases {
        let r = call(&d, &id, "view_image", &args).await;
        assert_eq!(
            (r.output.as_str(), r.success),
            (want.as_str(), false),
            "{args}"
        );
        assert!(r.content_items.is_empty());
    }

    // A session whose model takes no image input: Codex's refusal, before anything is read.
    let blind = d
        .open_with(api::OpenSessionRequest {
            no_image_input: true,
            ..request(dir.path())
        })
        .await;
    let r = call(&d, &blind, "view_image", r#"{"path":"ok.png"}"#).await;
    assert_eq!(
        (r.output.as_str(), r.success),
        (
            "view_image is not allowed because you do not support image inputs",
            false
        )
    );
}

#[tokio::test]
async fn view_image_cannot_read_what_the_sandbox_hides() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    // The per-user corral directory is masked in every sandbox (spec/sandbox.md, H7): an image
    // there is visible on the host and absent for view_image.
    let uid = nix::unistd::geteuid().as_raw();
    let masked = std::path::PathBuf::from(format!("/run/user/{uid}/corral"));
    let created = !masked.exists();
    std::fs::create_dir_all(&masked).unwrap();
    let secret = masked.join(format!("secret-{}.png", std::process::id()));
    std::fs::write(&secret, png_bytes(2, 2)).unwrap();
    struct Cleanup(std::path::PathBuf, std::path::PathBuf, bool);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
            if self.2 {
                let _ = std::fs::remove_dir(&self.1);
            }
        }
    }
    let _cleanup = Cleanup(secret.clone(), masked.clone(), created);

    let d = Daemon::start(&[]).await;
    let dir = scratch();
    let id = d.open(dir.path(), SandboxMode::ReadOnly).await;
    let r = call(
        &d,
        &id,
        "view_image",
        &format!(r#"{{"path":"{}"}}"#, secret.display()),
    )
    .await;
    assert!(!r.success, "{r:?}");
    assert!(r.content_items.is_empty());
    assert_eq!(
        r.output,
        format!(
            "unable to locate image at `{}`: No such file or directory (os error 2)",
            secret.display()
        )
    );
    assert!(secret.exists(), "the host still has it");
}
