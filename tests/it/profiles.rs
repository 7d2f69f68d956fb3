//! Sandbox profiles as data: an operator directory adds profiles that sessions name; a broken
//! profile stops the daemon with the file, line and key.

use crate::common::{CORRAL, Daemon, outside, scratch};
use corral::api::{self, SandboxMode};

const WW: &str = include_str!("../../sandbox-profiles/workspace-write.toml");

#[tokio::test]
async fn an_operator_profile_adds_a_writable_path_and_can_forbid_the_network() {
    let profiles = outside();
    let cache = outside();
    std::fs::write(
        profiles.path().join("ci.toml"),
        WW.replace(
            "\"{tmpdir}\"]",
            &format!("\"{{tmpdir}}\", \"{}\"]", cache.path().display()),
        )
        .replace("allow = true", "allow = false"),
    )
    .unwrap();
    let dir = profiles.path().display().to_string();
    let d = Daemon::start(&["--profiles-dir", &dir]).await;
    let cwd = scratch();

    let caps = d
        .sessions()
        .await
        .get_capabilities(api::GetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(
        caps.profiles.contains(&"ci".to_string()),
        "{:?}",
        caps.profiles
    );

    let id = d
        .open_with(api::OpenSessionRequest {
            cwd: cwd.path().display().to_string(),
            profile: "ci".into(),
            ..Default::default()
        })
        .await;
    let r = d
        .sh(&id, &format!("echo x > {}/built", cache.path().display()))
        .await;
    assert_eq!(r.exit_code, 0, "{}", r.output);
    assert!(cache.path().join("built").exists());
    // The built-in workspace-write profile does not make that path writable.
    let id = d.open(cwd.path(), SandboxMode::WorkspaceWrite).await;
    let r = d
        .sh(&id, &format!("echo x > {}/other", cache.path().display()))
        .await;
    assert_ne!(r.exit_code, 0);
    assert!(!cache.path().join("other").exists());

    let err = d
        .try_open_with(api::OpenSessionRequest {
            cwd: cwd.path().display().to_string(),
            profile: "ci".into(),
            network_access: true,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
    assert!(
        err.message().contains("does not allow network access"),
        "{}",
        err.message()
    );

    let err = d
        .try_open_with(api::OpenSessionRequest {
            cwd: cwd.path().display().to_string(),
            profile: "nope".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().contains("profile `nope` does not exist"),
        "{}",
        err.message()
    );

    let err = d
        .try_open_with(api::OpenSessionRequest {
            cwd: cwd.path().display().to_string(),
            profile: "ci".into(),
            mode: SandboxMode::ReadOnly as i32,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
}

#[test]
fn a_broken_profile_stops_the_daemon_naming_file_line_and_key() {
    let profiles = outside();
    let file = profiles.path().join("bad.toml");
    std::fs::write(
        &file,
        WW.replace("\"{tmpdir}\"]", "\"{tmpdir}\", \"relative\"]"),
    )
    .unwrap();
    let out = std::process::Command::new(CORRAL)
        .args([
            "serve",
            "--listen",
            "unix:/nonexistent/corral.sock",
            "--profiles-dir",
        ])
        .arg(profiles.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&file.display().to_string()), "{err}");
    assert!(
        err.contains("line ") && err.contains("key `writable`"),
        "{err}"
    );
}
