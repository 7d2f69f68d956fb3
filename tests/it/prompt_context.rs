//! GetPromptContext (spec/tools.md §11) against a real daemon: the environment context and the
//! AGENTS.md message byte for byte as the newest Codex builds them, project docs read in the
//! session's sandbox as the caller (another user's unreadable doc is not disclosed by the root
//! daemon), every read bounded (a FIFO, /dev/zero, a huge file), the budget validated, and the
//! call audited like any other.

use crate::common::{Daemon, TestUser, connect_as, outside, scratch};
use corral::api::{
    self, SandboxMode, bridge_client::BridgeClient, sessions_client::SessionsClient,
};
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tonic::Code;

const ZONE: &str = "Asia/Tokyo";

/// A daemon whose host time zone is `ZONE` (the test's own zone is left alone).
async fn daemon_in_zone(extra: &[&str]) -> (Daemon, tempfile::TempDir) {
    let dir = outside();
    let socket = dir.path().join("corral.sock");
    let d = Daemon::start_at(&socket, extra, &[("TZ", ZONE)], Stdio::null()).await;
    (d, dir)
}

/// Today in `ZONE`, by the host's `date`.
fn today_in_zone() -> String {
    let out = std::process::Command::new("date")
        .arg("+%F")
        .env("TZ", ZONE)
        .output()
        .expect("date");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Codex's name of `uid`'s login shell (what the session's worker runs).
fn shell_of(uid: u32) -> String {
    let user = nix::unistd::User::from_uid(uid.into()).unwrap().unwrap();
    let name = user
        .shell
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    if user.shell.is_file() {
        name
    } else {
        "bash".into()
    }
}

async fn context(
    d: &Daemon,
    session: &str,
    budget: Option<u64>,
) -> Result<api::GetPromptContextResponse, tonic::Status> {
    let mut bridge = d.bridge().await;
    let call = bridge.get_prompt_context(api::GetPromptContextRequest {
        session_id: session.into(),
        project_doc_max_bytes: budget,
    });
    // Every answer must come promptly, whatever the workspace holds.
    tokio::time::timeout(Duration::from_secs(20), call)
        .await
        .expect("GetPromptContext did not answer within 20 s")
        .map(|r| r.into_inner())
}

fn env_text(cwd: &str, shell: &str, date: &str) -> String {
    format!(
        "<environment_context>\n  <cwd>{cwd}</cwd>\n  <shell>{shell}</shell>\n  \
         <current_date>{date}</current_date>\n  <timezone>{ZONE}</timezone>\n\
         </environment_context>"
    )
}

fn responses_item(text: &str) -> serde_json::Value {
    serde_json::json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
}

fn chat_item(text: &str) -> serde_json::Value {
    serde_json::json!({"role": "user", "content": text})
}

/// The answer for `cwd`, checked against the exact texts Codex would send: the AGENTS.md
/// message (when `docs` is some) first, then the environment context.
async fn check_layout(d: &Daemon, cwd: &Path, docs: Option<&str>, used: &[(PathBuf, u64)]) {
    let id = d.open(cwd, SandboxMode::ReadOnly).await;
    let before = today_in_zone();
    let r = context(d, &id, None).await.unwrap();
    let after = today_in_zone();
    assert!(
        r.current_date == before || r.current_date == after,
        "date {} is not today in {ZONE} ({before}/{after})",
        r.current_date
    );
    let cwd_text = cwd.to_str().unwrap();
    let shell = shell_of(nix::unistd::geteuid().as_raw());
    let env = env_text(cwd_text, &shell, &r.current_date);
    assert_eq!(
        (r.cwd.as_str(), r.shell.as_str()),
        (cwd_text, shell.as_str())
    );
    assert_eq!(r.timezone, ZONE);
    assert_eq!(r.environment_context, env);
    let ui = docs.map(|t| {
        format!("# AGENTS.md instructions for {cwd_text}\n\n<INSTRUCTIONS>\n{t}\n</INSTRUCTIONS>")
    });
    assert_eq!(r.user_instructions, ui.clone().unwrap_or_default());
    let texts: Vec<&str> = ui
        .iter()
        .map(String::as_str)
        .chain([env.as_str()])
        .collect();
    let responses: serde_json::Value = serde_json::from_str(&r.responses_input_json).unwrap();
    assert_eq!(
        responses,
        serde_json::Value::Array(texts.iter().map(|t| responses_item(t)).collect())
    );
    let chat: serde_json::Value = serde_json::from_str(&r.chat_messages_json).unwrap();
    assert_eq!(
        chat,
        serde_json::Value::Array(texts.iter().map(|t| chat_item(t)).collect())
    );
    let got: Vec<(PathBuf, u64, bool)> = r
        .project_docs
        .iter()
        .map(|p| (PathBuf::from(&p.path), p.bytes_used, p.truncated))
        .collect();
    let want: Vec<(PathBuf, u64, bool)> =
        used.iter().map(|(p, n)| (p.clone(), *n, false)).collect();
    assert_eq!(got, want);
}

#[tokio::test]
async fn the_three_layouts_are_byte_exact() {
    let (d, _dir) = daemon_in_zone(&[]).await;
    let top = scratch();
    let canon = std::fs::canonicalize(top.path()).unwrap();

    // No docs: no AGENTS.md message, only the environment context.
    let bare = top.path().join("bare");
    std::fs::create_dir(&bare).unwrap();
    check_layout(&d, &bare, None, &[]).await;

    // The repository root only.
    let one = top.path().join("one");
    std::fs::create_dir_all(one.join(".git")).unwrap();
    let rules = "Run `make test` before committing.\n";
    std::fs::write(one.join("AGENTS.md"), rules).unwrap();
    check_layout(
        &d,
        &one,
        Some(rules),
        &[(canon.join("one/AGENTS.md"), rules.len() as u64)],
    )
    .await;

    // The root and a nested package, root first, joined by a blank line; the directory in
    // between has none, and a doc above the root is not read.
    std::fs::write(top.path().join("AGENTS.md"), "above the repository").unwrap();
    let two = top.path().join("two");
    std::fs::create_dir_all(two.join(".git")).unwrap();
    std::fs::write(two.join("AGENTS.md"), "root rules").unwrap();
    let pkg = two.join("crates/pkg");
    std::fs::create_dir_all(&pkg).unwrap();
    std::fs::write(pkg.join("AGENTS.md"), "pkg rules: no unwrap").unwrap();
    check_layout(
        &d,
        &pkg,
        Some("root rules\n\npkg rules: no unwrap"),
        &[
            (canon.join("two/AGENTS.md"), 10),
            (canon.join("two/crates/pkg/AGENTS.md"), 20),
        ],
    )
    .await;

    // AGENTS.override.md wins over AGENTS.md in its directory.
    std::fs::write(pkg.join("AGENTS.override.md"), "local override").unwrap();
    check_layout(
        &d,
        &pkg,
        Some("root rules\n\nlocal override"),
        &[
            (canon.join("two/AGENTS.md"), 10),
            (canon.join("two/crates/pkg/AGENTS.override.md"), 14),
        ],
    )
    .await;
}

#[tokio::test]
async fn fifos_devices_and_huge_files_answer_promptly_and_bounded() {
    let d = Daemon::start(&[]).await;
    let top = scratch();
    let repo = top.path().join("repo");
    std::fs::create_dir_all(repo.join(".git")).unwrap();
    let fifo = |p: &Path| {
        nix::unistd::mkfifo(p, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    };
    // A FIFO named AGENTS.md at the root; a link to /dev/zero below it; a link to a FIFO as
    // the override below that; a 4 MiB doc at the cwd.
    fifo(&repo.join("AGENTS.md"));
    let a = repo.join("a");
    std::fs::create_dir(&a).unwrap();
    symlink("/dev/zero", a.join("AGENTS.md")).unwrap();
    let b = a.join("b");
    std::fs::create_dir(&b).unwrap();
    fifo(&b.join("pipe"));
    symlink(b.join("pipe"), b.join("AGENTS.override.md")).unwrap();
    let c = b.join("c");
    std::fs::create_dir(&c).unwrap();
    let huge = "x".repeat(4 << 20);
    std::fs::write(c.join("AGENTS.md"), &huge).unwrap();

    let id = d.open(&c, SandboxMode::WorkspaceWrite).await;
    let started = std::time::Instant::now();
    let r = context(&d, &id, None).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(10));
    // Only the huge doc, cut at Codex's default 32 KiB.
    let canon = std::fs::canonicalize(&c).unwrap();
    assert_eq!(r.project_docs.len(), 1, "{:?}", r.project_docs);
    assert_eq!(
        (
            r.project_docs[0].path.as_str(),
            r.project_docs[0].bytes_used,
            r.project_docs[0].truncated
        ),
        (canon.join("AGENTS.md").to_str().unwrap(), 32 * 1024, true)
    );
    assert_eq!(
        r.user_instructions,
        format!(
            "# AGENTS.md instructions for {}\n\n<INSTRUCTIONS>\n{}\n</INSTRUCTIONS>",
            c.display(),
            &huge[..32 * 1024]
        )
    );
    // A budget of 1 MiB (the most) still reads only that much.
    let r = context(&d, &id, Some(1 << 20)).await.unwrap();
    assert_eq!(r.project_docs[0].bytes_used, 1 << 20);
    // The worker is still serving.
    assert_eq!(d.sh(&id, "echo alive").await.output, "alive\n");
}

#[tokio::test]
async fn another_users_doc_is_not_disclosed() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root (the root daemon serves other users)"
    );
    let d = Daemon::start(&[]).await;
    d.open_to_local_users();
    let user = TestUser::create("pctx");
    // A repository the user may enter, whose root doc only root may read.
    let top = outside();
    std::fs::set_permissions(top.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let repo = top.path().join("repo");
    std::fs::create_dir_all(repo.join(".git")).unwrap();
    let secret = repo.join("AGENTS.md");
    std::fs::write(&secret, "ROOT-ONLY-SECRET rules").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let work = repo.join("work");
    std::fs::create_dir(&work).unwrap();
    std::fs::write(work.join("AGENTS.md"), "user rules").unwrap();
    for p in [&work, &work.join("AGENTS.md")] {
        std::os::unix::fs::chown(p, Some(user.uid), Some(user.gid)).unwrap();
    }

    let channel = connect_as(&d.socket, user.uid, user.gid).await.unwrap();
    let id = SessionsClient::new(channel.clone())
        .open_session(api::OpenSessionRequest {
            cwd: work.to_str().unwrap().into(),
            mode: SandboxMode::ReadOnly as i32,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .session_id;
    let ask = || {
        let mut bridge = BridgeClient::new(channel.clone());
        let id = id.clone();
        async move {
            bridge
                .get_prompt_context(api::GetPromptContextRequest {
                    session_id: id,
                    project_doc_max_bytes: None,
                })
                .await
                .unwrap()
                .into_inner()
        }
    };
    let r = ask().await;
    let wire = prost::Message::encode_to_vec(&r);
    assert!(
        !String::from_utf8_lossy(&wire).contains("ROOT-ONLY-SECRET"),
        "{r:?}"
    );
    assert_eq!(
        r.user_instructions,
        format!(
            "# AGENTS.md instructions for {}\n\n<INSTRUCTIONS>\nuser rules\n</INSTRUCTIONS>",
            work.display()
        )
    );
    assert_eq!(r.project_docs.len(), 1);
    // The worker runs as the user: their login shell (TestUser's is /bin/bash).
    assert_eq!(r.shell, "bash");

    // Control: once the user may read it, the root doc is included, first.
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
    let r = ask().await;
    assert!(
        r.user_instructions
            .contains("<INSTRUCTIONS>\nROOT-ONLY-SECRET rules\n\nuser rules\n</INSTRUCTIONS>"),
        "{}",
        r.user_instructions
    );
    drop(channel);
    drop(d);
}

#[tokio::test]
async fn budgets_are_validated_and_honoured_and_calls_audited() {
    let logs = outside();
    let log = logs.path().join("audit.log");
    let d = Daemon::start(&["--audit-log", log.to_str().unwrap()]).await;
    let repo = scratch();
    std::fs::create_dir(repo.path().join(".git")).unwrap();
    std::fs::write(repo.path().join("AGENTS.md"), "abcdefgh-DOC-BODY").unwrap();

    // OpenSession: more than 1 MiB is refused, naming the field.
    let err = d
        .try_open_with(api::OpenSessionRequest {
            cwd: repo.path().to_str().unwrap().into(),
            mode: SandboxMode::ReadOnly as i32,
            project_doc_max_bytes: Some((1 << 20) + 1),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("project_doc_max_bytes"), "{err:?}");

    // The session's budget, and a call's override of it.
    let id = d
        .open_with(api::OpenSessionRequest {
            cwd: repo.path().to_str().unwrap().into(),
            mode: SandboxMode::ReadOnly as i32,
            project_doc_max_bytes: Some(4),
            ..Default::default()
        })
        .await;
    let r = context(&d, &id, None).await.unwrap();
    assert!(
        r.user_instructions
            .contains("<INSTRUCTIONS>\nabcd\n</INSTRUCTIONS>")
    );
    assert!(r.project_docs[0].truncated);
    let r = context(&d, &id, Some(6)).await.unwrap();
    assert!(
        r.user_instructions
            .contains("<INSTRUCTIONS>\nabcdef\n</INSTRUCTIONS>")
    );
    // 0 disables docs: no AGENTS.md message at all.
    let r = context(&d, &id, Some(0)).await.unwrap();
    assert_eq!(
        (r.user_instructions.as_str(), r.project_docs.len()),
        ("", 0)
    );
    let items: serde_json::Value = serde_json::from_str(&r.responses_input_json).unwrap();
    assert_eq!(items.as_array().unwrap().len(), 1);

    let err = context(&d, &id, Some(2 << 20)).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("project_doc_max_bytes"), "{err:?}");
    let err = context(&d, &"0".repeat(32), None).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let err = context(&d, "", None).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);

    // One audit line per call that reached the pipeline, never the docs' contents.
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains("DOC-BODY"), "{text}");
    let outcomes: Vec<(String, String)> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|l| l["tool"] == "get_prompt_context")
        .map(|l| {
            (
                l["session"].as_str().unwrap().to_string(),
                l["outcome"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let ok = (id.clone(), "ok".to_string());
    assert_eq!(
        outcomes,
        vec![
            ok.clone(),
            ok.clone(),
            ok,
            ("0".repeat(32), "NOT_FOUND".to_string()),
            (String::new(), "INVALID_ARGUMENT".to_string()),
        ],
        "{text}"
    );
}
