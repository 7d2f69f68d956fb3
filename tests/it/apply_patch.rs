//! apply_patch through the real daemon: the typed RPC, both bridge forms, and every refusal the
//! sandbox implies (read-only session, outside the roots, protected paths).

use crate::common::{Daemon, outside, scratch};
use corral::api::{self, SandboxMode};

/// Replaces the wall time of the exec format with `_` (it varies with load).
fn strip_duration(text: &str) -> String {
    let (head, rest) = text.split_once("\nWall time: ").expect("wall time");
    let end = rest.find(" seconds\n").expect("seconds");
    format!("{head}\nWall time: _{}", &rest[end..])
}

#[tokio::test]
async fn patches_apply_through_both_bridge_forms_and_the_typed_rpc() {
    let d = Daemon::start(&[]).await;
    let cwd = scratch();
    std::fs::write(cwd.path().join("app.txt"), "one\ntwo\nthree\n").unwrap();
    let id = d.open(cwd.path(), SandboxMode::WorkspaceWrite).await;

    // Freeform (custom tool) form.
    let patch = "*** Begin Patch\n*** Add File: hello.txt\n+hi\n*** Update File: app.txt\n@@\n one\n-two\n+TWO\n*** End Patch";
    let out = d
        .bridge()
        .await
        .invoke(api::InvokeRequest {
            session_id: id.clone(),
            name: "apply_patch".into(),
            arguments: patch.into(),
            call_id: "c1".into(),
            freeform: true,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(out.success, "{}", out.output);
    assert_eq!(
        strip_duration(&out.output),
        "Exit code: 0\nWall time: _ seconds\nOutput:\nSuccess. Updated the following files:\nA hello.txt\nM app.txt\n"
    );
    assert_eq!(
        std::fs::read_to_string(cwd.path().join("hello.txt")).unwrap(),
        "hi\n"
    );
    assert_eq!(
        std::fs::read_to_string(cwd.path().join("app.txt")).unwrap(),
        "one\nTWO\nthree\n"
    );

    // JSON function form.
    let args =
        serde_json::json!({"input": "*** Begin Patch\n*** Delete File: hello.txt\n*** End Patch"})
            .to_string();
    let (text, ok) = d.invoke(&id, "apply_patch", &args).await;
    assert!(ok, "{text}");
    assert!(!cwd.path().join("hello.txt").exists());

    // Typed, with structured changes.
    let resp = d
        .tools()
        .await
        .apply_patch(api::ApplyPatchRequest {
            session_id: id.clone(),
            patch: "*** Begin Patch\n*** Update File: app.txt\n*** Move to: moved.txt\n@@\n-one\n+ONE\n*** End Patch".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.changes.len(), 1);
    assert_eq!(resp.changes[0].kind, api::FileChangeKind::Moved as i32);
    assert!(
        resp.changes[0].unified_diff.contains("-one\n+ONE"),
        "{}",
        resp.changes[0].unified_diff
    );
    assert_eq!(
        std::fs::read_to_string(cwd.path().join("moved.txt")).unwrap(),
        "ONE\nTWO\nthree\n"
    );

    // A verification failure changes nothing, and is INVALID_ARGUMENT on the typed RPC.
    let err = d
        .tools()
        .await
        .apply_patch(api::ApplyPatchRequest {
            session_id: id.clone(),
            patch: "*** Begin Patch\n*** Add File: new.txt\n+x\n*** Update File: moved.txt\n@@\n-not there\n+y\n*** End Patch".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message()
            .starts_with("apply_patch verification failed: Failed to find expected lines in "),
        "{}",
        err.message()
    );
    assert!(
        !cwd.path().join("new.txt").exists(),
        "nothing written when any hunk fails"
    );
}

#[tokio::test]
async fn patches_obey_the_sandbox() {
    let d = Daemon::start(&[]).await;
    let cwd = scratch();
    let out = outside();
    std::fs::create_dir(cwd.path().join(".git")).unwrap();
    std::fs::write(cwd.path().join(".git/config"), "[core]\n").unwrap();

    let ro = d.open(cwd.path(), SandboxMode::ReadOnly).await;
    assert_eq!(
        d.invoke(&ro, "apply_patch", r#"{"input":"*** Begin Patch\n*** Add File: a.txt\n+x\n*** End Patch"}"#).await,
        ("patch rejected: writing is blocked by read-only sandbox; rejected by user approval settings".to_string(), false)
    );

    let ww = d.open(cwd.path(), SandboxMode::WorkspaceWrite).await;
    let outside_patch = serde_json::json!({"input": format!("*** Begin Patch\n*** Add File: {}/x.txt\n+x\n*** End Patch", out.path().display())}).to_string();
    assert_eq!(
        d.invoke(&ww, "apply_patch", &outside_patch).await,
        (
            "patch rejected: writing outside of the project; rejected by user approval settings"
                .to_string(),
            false
        )
    );
    assert!(!out.path().join("x.txt").exists());

    let (text, ok) = d
        .invoke(&ww, "apply_patch", r#"{"input":"*** Begin Patch\n*** Add File: .git/hooks/pre-commit\n+evil\n*** End Patch"}"#)
        .await;
    assert!(!ok);
    assert!(
        text.starts_with("patch rejected: writing to protected workspace metadata path "),
        "{text}"
    );
    assert!(!cwd.path().join(".git/hooks").exists());

    let err = d
        .tools()
        .await
        .apply_patch(api::ApplyPatchRequest {
            session_id: ro,
            patch: "*** Begin Patch\n*** Add File: a.txt\n+x\n*** End Patch".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
}

/// Codex drift (0.171): a patch may open with `*** Environment ID: <id>` (its grammar allows it
/// when a turn has several environments). A session is one environment: the patch applies; an
/// empty id is refused and nothing is written.
#[tokio::test]
async fn an_environment_id_preamble_is_accepted() {
    let d = Daemon::start(&[]).await;
    let cwd = scratch();
    let id = d.open(cwd.path(), SandboxMode::WorkspaceWrite).await;
    let (out, ok) = d
        .invoke(
            &id,
            "apply_patch",
            r#"{"input":"*** Begin Patch\n*** Environment ID: remote\n*** Add File: env.txt\n+x\n*** End Patch"}"#,
        )
        .await;
    assert!(ok, "{out}");
    assert_eq!(
        std::fs::read_to_string(cwd.path().join("env.txt")).unwrap(),
        "x\n"
    );
    let (out, ok) = d
        .invoke(
            &id,
            "apply_patch",
            r#"{"input":"*** Begin Patch\n*** Environment ID:\n*** Add File: empty.txt\n+x\n*** End Patch"}"#,
        )
        .await;
    assert!(!ok && out.contains("Environment ID"), "{out}");
    assert!(!cwd.path().join("empty.txt").exists());
}
