//! The audit log: one JSON line per call with who, what, how it ended — never file contents —
//! and reopened on SIGHUP for logrotate.

mod common;

use common::{Daemon, outside, scratch};
use corral::api::{self, SandboxMode};
use std::time::Duration;

fn lines(path: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test]
async fn every_call_is_one_json_line_and_sighup_reopens_the_file() {
    let logs = outside();
    let log = logs.path().join("audit.log");
    let d = Daemon::start(&["--audit-log", log.to_str().unwrap()]).await;
    let cwd = scratch();
    std::fs::write(cwd.path().join("f.txt"), "TOP-SECRET-CONTENT\n").unwrap();
    let id = d.open(cwd.path(), SandboxMode::WorkspaceWrite).await;

    d.invoke(&id, "read_file", r#"{"file_path":"f.txt"}"#).await;
    let r = d.sh(&id, "exit 3").await;
    assert_eq!(r.exit_code, 3);
    let patch = serde_json::json!({"input": "*** Begin Patch\n*** Add File: new.txt\n+PATCH-BODY-SECRET\n*** End Patch"}).to_string();
    assert!(d.invoke(&id, "apply_patch", &patch).await.1);
    let err = d
        .tools()
        .await
        .read_file(api::ReadFileRequest {
            session_id: id.clone(),
            file_path: "missing.txt".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);

    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        !text.contains("TOP-SECRET-CONTENT") && !text.contains("PATCH-BODY-SECRET"),
        "{text}"
    );
    let l = lines(&log);
    assert_eq!(l.len(), 4, "{text}");
    let me = nix::unistd::geteuid().as_raw();
    for line in &l {
        assert_eq!(line["uid"], me);
        assert!(line["pid"].as_i64().unwrap() > 0);
        assert_eq!(line["session"], id.as_str());
        assert_eq!(line["mode"], "workspace-write");
        assert_eq!(line["escalated"], false);
        assert!(line["time"].as_str().unwrap().ends_with('Z'));
        assert!(line["duration_ms"].is_u64());
        assert!(line["bytes_in"].as_u64().unwrap() > 0);
    }
    assert_eq!(
        (l[0]["tool"].as_str(), l[0]["outcome"].as_str()),
        (Some("read_file"), Some("ok"))
    );
    assert_eq!(l[0]["targets"], serde_json::json!(["f.txt"]));
    assert!(l[0]["bytes_out"].as_u64().unwrap() > 0);
    assert_eq!(
        (l[1]["tool"].as_str(), l[1]["outcome"].as_str()),
        (Some("shell"), Some("failed"))
    );
    assert_eq!(l[1]["exit_code"], 3);
    assert_eq!(l[1]["targets"], serde_json::json!(["bash", "-c", "exit 3"]));
    assert_eq!(l[2]["tool"], "apply_patch");
    assert_eq!(l[2]["targets"], serde_json::json!(["new.txt"]));
    assert_eq!(
        (l[3]["tool"].as_str(), l[3]["outcome"].as_str()),
        (Some("read_file"), Some("NOT_FOUND"))
    );

    // logrotate: move the file away, SIGHUP, and the next line lands in a new file.
    let rotated = logs.path().join("audit.log.1");
    std::fs::rename(&log, &rotated).unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.pid() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    d.invoke(&id, "list_dir", r#"{"dir_path":"."}"#).await;
    assert_eq!(lines(&rotated).len(), 4);
    let fresh = lines(&log);
    assert_eq!(fresh.len(), 1);
    assert_eq!(fresh[0]["tool"], "list_dir");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&log).unwrap().permissions().mode() & 0o777,
        0o600
    );
}
