//! Results larger than gRPC's default 4 MiB message: corral's clients accept up to 64 MiB and
//! the daemon answers up to 32 MiB; beyond that a typed call fails with RESOURCE_EXHAUSTED and
//! an Invoke answers model text (`success: false`); both say how to ask for less, instead of a
//! transport error or a hang.

use crate::common::{Daemon, scratch};
use corral::api::{self, SandboxMode};
use tonic::Code;

#[tokio::test]
async fn a_twenty_megabyte_read_is_answered_and_a_larger_one_refused_clearly() {
    let d = Daemon::start(&[]).await;
    let cwd = scratch();
    // 200 000 lines of 100 bytes: 20 MB.
    let line = format!("{}\n", "x".repeat(99));
    std::fs::write(cwd.path().join("big.txt"), line.repeat(200_000)).unwrap();
    let s = d.open(cwd.path(), SandboxMode::ReadOnly).await;

    // Half of it, typed: about 21 MB (text and numbered lines), far over 4 MiB.
    let r = d
        .tools()
        .await
        .read_file(api::ReadFileRequest {
            session_id: s.clone(),
            file_path: "big.txt".into(),
            limit: Some(100_000),
            ..Default::default()
        })
        .await
        .expect("a 21 MB answer")
        .into_inner();
    assert_eq!(r.lines.len(), 100_000);
    assert!(r.text.len() > 10_000_000);

    // All of it through Invoke: about 21 MB of model text.
    let (out, ok) = d
        .invoke(
            &s,
            "read_file",
            &serde_json::json!({"file_path": "big.txt", "limit": 200_000}).to_string(),
        )
        .await;
    assert!(ok);
    assert!(out.ends_with(&format!("L200000: {}", "x".repeat(99))));

    // All of it typed: about 42 MB, more than one answer may be.
    let e = d
        .tools()
        .await
        .read_file(api::ReadFileRequest {
            session_id: s.clone(),
            file_path: "big.txt".into(),
            limit: Some(200_000),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{}", e.message());
    assert!(
        e.message()
            .contains("more than the 32 MiB one response may carry")
            && e.message().contains("offset and limit"),
        "{}",
        e.message()
    );
    // The same through Invoke, where the model chose the limit: model text with success
    // false that says how to ask for less, never an error status that would throw in the
    // host's agent loop (41 MB of model text).
    std::fs::write(cwd.path().join("bigger.txt"), line.repeat(400_000)).unwrap();
    let (out, ok) = d
        .invoke(
            &s,
            "read_file",
            &serde_json::json!({"file_path": "bigger.txt", "limit": 1_000_000_000u64}).to_string(),
        )
        .await;
    assert!(!ok, "{}", &out[..out.len().min(200)]);
    assert!(
        out.contains("more than the 32 MiB one response may carry") && out.contains("ask for less"),
        "{out}"
    );
    // The session still works.
    let r = d.sh(&s, "echo fine").await;
    assert_eq!(r.output, "fine\n");
}
