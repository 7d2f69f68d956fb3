//! Fail closed (spec/sandbox.md §6, §8.2 case 40): on a host where a layer cannot be applied,
//! sandboxed sessions fail with FAILED_PRECONDITION naming the layer, health says NOT_SERVING,
//! danger-full-access still works, and an explicit degraded mode runs without the layer and
//! says so everywhere.

use crate::common::{self, Daemon, outside, scratch};
use corral::api::{self, SandboxMode};
use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus};

const NO_LANDLOCK: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/support/deny_landlock.py"
);

async fn health(d: &Daemon, service: &str) -> i32 {
    tonic_health::pb::health_client::HealthClient::new(d.channel().await)
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .status
}

#[tokio::test]
async fn without_landlock_sandboxed_sessions_fail_closed() {
    let d = Daemon::start_wrapped(&["python3", NO_LANDLOCK], &["--root-callers", "trusted"]).await;
    let cwd = scratch();
    let marker = outside();
    let err = d
        .try_open(cwd.path(), SandboxMode::WorkspaceWrite)
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        tonic::Code::FailedPrecondition,
        "{}",
        err.message()
    );
    assert!(
        err.message()
            .starts_with("sandbox unavailable: landlock could not be applied: "),
        "{}",
        err.message()
    );
    assert!(!err.message().contains("panicked"));
    assert_eq!(
        health(&d, "corral.v1.Tools").await,
        ServingStatus::NotServing as i32
    );
    assert_eq!(health(&d, "").await, ServingStatus::NotServing as i32);
    let caps = d
        .sessions()
        .await
        .get_capabilities(api::GetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(caps.landlock_abi, 0);
    assert!(
        caps.layers
            .iter()
            .any(|l| l.status == api::LayerStatus::Unavailable as i32)
    );

    // danger-full-access needs no sandbox layer and keeps working.
    let id = d.open(cwd.path(), SandboxMode::DangerFullAccess).await;
    let r = d
        .sh(&id, &format!("touch {}/ran", marker.path().display()))
        .await;
    assert_eq!(r.exit_code, 0, "{}", r.output);
    assert!(marker.path().join("ran").exists());
}

#[tokio::test]
async fn degraded_mode_runs_without_the_layer_and_says_so() {
    let d =
        Daemon::start_wrapped(&["python3", NO_LANDLOCK], &["--allow-degraded", "landlock"]).await;
    assert_eq!(
        health(&d, "corral.v1.Tools").await,
        ServingStatus::Serving as i32
    );
    let caps = d
        .sessions()
        .await
        .get_capabilities(api::GetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    let landlock = caps.layers.iter().find(|l| l.name == "landlock").unwrap();
    assert_eq!(
        landlock.status,
        api::LayerStatus::Degraded as i32,
        "{landlock:?}"
    );
    assert!(
        landlock.detail.contains("without it"),
        "{}",
        landlock.detail
    );
    // The remaining layers still confine: the read-only mounts stop writes outside the roots.
    let cwd = scratch();
    let out = outside();
    let id = d.open(cwd.path(), SandboxMode::WorkspaceWrite).await;
    let r = d
        .sh(
            &id,
            &format!("echo x > inside; echo x > {}/outside", out.path().display()),
        )
        .await;
    assert!(cwd.path().join("inside").exists());
    assert!(!out.path().join("outside").exists(), "{}", r.output);
    assert!(r.output.contains("Read-only file system"), "{}", r.output);
}

#[tokio::test]
async fn no_new_privs_and_capabilities_cannot_be_degraded() {
    let out = std::process::Command::new(common::CORRAL)
        .args([
            "serve",
            "--allow-degraded",
            "capabilities",
            "--listen",
            "unix:/nonexistent/x.sock",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a layer that may be degraded"));
}
