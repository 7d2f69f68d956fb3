//! H21: bounds that hold for root too. `RLIMIT_NPROC` does not bind uid 0, so every worker gets
//! a `pids` cgroup (`pids.max` from the policy's `max_processes`): a confined root session's
//! fork bomb stops at its limit, and the daemon and other users are served throughout. The
//! daemon runs in a pids cgroup of its own with a cap, so a failure cannot hurt the machine.

mod common;

use common::{Daemon, DaemonCgroup, TestUser, outside, scratch};
use corral::api::SandboxMode;
use std::time::Duration;

/// Forks until refused (up to 1500), each child pausing with its output closed; prints how
/// many started.
const FORK_BOMB: &str = r#"
import os, time
n = 0
while n < 1500:
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        os.close(1); os.close(2)
        time.sleep(20)
        os._exit(0)
    n += 1
print(n)
"#;

#[tokio::test]
async fn a_root_sessions_fork_bomb_stops_at_its_process_limit() {
    let Some(cap) = DaemonCgroup::create_in("pids", "h21", "pids.max", 3000) else {
        assert!(
            !nix::unistd::geteuid().is_root(),
            "root without a v1 pids controller: H21 cannot be tested here"
        );
        return;
    };
    let conf_dir = outside();
    let conf = conf_dir.path().join("corral.toml");
    std::fs::write(&conf, "[policy.default]\nmax_processes = 200\n").unwrap();
    let join = cap.join_script();
    let d = Daemon::start_wrapped(
        &["sh", "-c", &join, "sh"],
        &["--config", conf.to_str().unwrap()],
    )
    .await;
    let cwd = scratch();
    let id = d.open(cwd.path(), SandboxMode::WorkspaceWrite).await;
    // The confined root session's RLIMIT_NPROC says 200 but does not bind root.
    let r = d.sh(&id, "ulimit -u").await;
    assert_eq!(r.output.trim(), "200");

    // Another user is served while the bomb runs.
    let other = TestUser::create("h21");
    let socket = d.open_to_local_users();
    let bomb = {
        let script = FORK_BOMB.to_string();
        let d_target = d.target().to_string();
        let id = id.clone();
        tokio::task::spawn_blocking(move || {
            let out = std::process::Command::new(common::client_binary())
                .args(["--socket", &d_target, "exec", "--session", &id])
                .args(["--timeout-ms", "60000", "--", "python3", "-c", &script])
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).into_owned()
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (code, out, err) = other.corral(&socket, &["exec", "--", "echo", "served"]);
    assert_eq!((code, out.trim()), (0, "served"), "{err}");
    let (code, out, _) = other.corral(&socket, &["health"]);
    assert_eq!((code, out.trim()), (0, "SERVING"));

    let started: u64 = bomb
        .await
        .unwrap()
        .trim()
        .parse()
        .expect("the bomb's count");
    assert!(
        started < 200,
        "a confined root session forked {started} processes past max_processes = 200"
    );
    assert!(started > 50, "the limit bound far too early: {started}");
    // The session and the daemon still work afterwards.
    let r = d.sh(&id, "echo after").await;
    assert_eq!(r.output, "after\n");
    drop(d);
    drop(cap);
}
