//! grep_files through the real daemon: the typed RPC and Codex's text via Invoke.

use crate::common::{Daemon, scratch};
use corral::api::{self, SandboxMode};
use std::time::{Duration, SystemTime};

#[tokio::test]
async fn grep_files_typed_and_through_the_bridge() {
    let d = Daemon::start(&[]).await;
    let dir = scratch();
    let p = dir.path();
    std::fs::write(p.join("old.txt"), "alpha beta\n").unwrap();
    std::fs::write(p.join("new.rs"), "alpha delta\n").unwrap();
    std::fs::write(p.join("other.txt"), "omega\n").unwrap();
    std::fs::write(p.join(".hidden.txt"), "alpha\n").unwrap();
    let t0 = SystemTime::now() - Duration::from_secs(100);
    std::fs::File::options()
        .write(true)
        .open(p.join("old.txt"))
        .unwrap()
        .set_modified(t0)
        .unwrap();
    let id = d.open(p, SandboxMode::ReadOnly).await;

    let resp = d
        .tools()
        .await
        .grep_files(api::GrepFilesRequest {
            session_id: id.clone(),
            pattern: "alpha".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let paths: Vec<String> = resp.matches.iter().map(|m| m.path.clone()).collect();
    let want = vec![
        p.join("new.rs").display().to_string(),
        p.join("old.txt").display().to_string(),
    ];
    assert_eq!(paths, want, "newest first, hidden file skipped");
    assert_eq!(resp.text, want.join("\n"));
    assert!(resp.matches[0].modified_unix_seconds > resp.matches[1].modified_unix_seconds);
    assert!(!resp.truncated);

    assert_eq!(
        d.invoke(&id, "grep_files", r#"{"pattern":"alpha","include":"*.rs"}"#)
            .await,
        (p.join("new.rs").display().to_string(), true)
    );
    assert_eq!(
        d.invoke(&id, "grep_files", r#"{"pattern":"zzz-nothing"}"#)
            .await,
        ("No matches found.".to_string(), false)
    );
    assert_eq!(
        d.invoke(&id, "grep_files", r#"{"pattern":"   "}"#).await,
        ("pattern must not be empty".to_string(), false)
    );
    assert_eq!(
        d.invoke(&id, "grep_files", r#"{"pattern":"alpha","path":"nope"}"#)
            .await,
        (
            format!(
                "unable to access `{}/nope`: No such file or directory (os error 2)",
                p.display()
            ),
            false
        )
    );
    let (out, ok) = d.invoke(&id, "grep_files", r#"{"pattern":"("}"#).await;
    assert!(
        !ok && out.starts_with("rg failed: regex parse error"),
        "{out}"
    );

    let err = d
        .tools()
        .await
        .grep_files(api::GrepFilesRequest {
            session_id: id,
            pattern: "(".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
}
