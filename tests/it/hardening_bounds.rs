//! H21: bounds that hold for root too. `RLIMIT_NPROC` does not bind uid 0, so every worker gets
//! a `pids` cgroup (`pids.max` from the policy's `max_processes`): a confined root session's
//! fork bomb stops at its limit, and the daemon and other users are served throughout. The
//! daemon runs in a pids cgroup of its own with a cap, so a failure cannot hurt the machine.

use crate::common::{self, Daemon, DaemonCgroup, TestUser, outside, scratch};
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

/// Holds `MiB` of touched memory and reports it, then waits.
fn hold(mib: u64) -> String {
    format!(
        "python3 -c 'import time; b = bytearray({mib} << 20); print(\"holding\", flush=True); \
         time.sleep(60)'"
    )
}

/// H21, the memory half: all of one user's workers together stay under the user's ceiling
/// (`max_user_memory_bytes`), though each is under its own limit (`max_memory_bytes`); another
/// user is served meanwhile. Judged on the host: the user's cgroup's peak.
#[tokio::test]
async fn a_users_workers_together_stay_under_its_memory_ceiling() {
    let Some(cap) = DaemonCgroup::create("h21m", 2 << 30) else {
        assert!(
            !nix::unistd::geteuid().is_root(),
            "root without a v1 memory controller"
        );
        return;
    };
    let conf_dir = outside();
    let conf = conf_dir.path().join("corral.toml");
    std::fs::write(
        &conf,
        "[policy.default]\nmax_memory_bytes = 209715200\nmax_user_memory_bytes = 268435456\n",
    )
    .unwrap();
    let join = cap.join_script();
    let d = Daemon::start_wrapped(
        &["sh", "-c", &join, "sh"],
        &["--config", conf.to_str().unwrap()],
    )
    .await;
    // Two sessions on different cwds: two workers of the same user (root here).
    let (one, two) = (scratch(), scratch());
    let a = d.open(one.path(), SandboxMode::WorkspaceWrite).await;
    let b = d.open(two.path(), SandboxMode::WorkspaceWrite).await;
    // Baseline: 150 MiB fits one worker's own limit (200 MiB).
    let r = d
        .sh(&b, "python3 -c 'b = bytearray(150 << 20); print(\"fits\")'")
        .await;
    assert_eq!((r.exit_code, r.output.as_str()), (0, "fits\n"), "baseline");
    // A holds 150 MiB in a process that keeps running...
    let args = serde_json::json!({ "cmd": hold(150), "yield_time_ms": 3000 }).to_string();
    let (out, _) = d.invoke(&a, "exec_command", &args).await;
    assert!(out.contains("holding"), "{out}");
    // ... so B's 150 MiB would take the user past 256 MiB: the OOM killer acts in the user's
    // group (on one of the two).
    let r = d
        .sh(&b, "python3 -c 'b = bytearray(150 << 20); print(\"fits\")'")
        .await;
    let a_alive = d
        .sh(&a, "pgrep -f 'bytearray\\(150' >/dev/null && echo alive")
        .await;
    assert!(
        r.exit_code != 0 || !a_alive.output.contains("alive"),
        "both workers held 150 MiB under a 256 MiB user ceiling: {r:?} {a_alive:?}"
    );
    // The user's group, seen on the host: every worker under it, its peak under the ceiling.
    let workers = cap
        .0
        .join("corral-workers")
        .join(format!("daemon-{}", d.pid()));
    let group = workers.join("user-0");
    let peak: u64 = std::fs::read_to_string(group.join("memory.max_usage_in_bytes"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        peak <= 256 << 20,
        "the user's workers peaked at {peak} bytes"
    );
    assert!(
        peak > 150 << 20,
        "the measurement saw the allocations: {peak}"
    );
    let limit = std::fs::read_to_string(group.join("memory.limit_in_bytes")).unwrap();
    assert_eq!(limit.trim(), (256u64 << 20).to_string());
    // Another user is served, under a group of its own.
    let other = TestUser::create("h21m");
    let socket = d.open_to_local_users();
    let (code, out, err) = other.corral(&socket, &["exec", "--", "echo", "served"]);
    assert_eq!((code, out.trim()), (0, "served"), "{err}");
    // Both sessions still work after the kill.
    assert_eq!(d.sh(&a, "echo a").await.output, "a\n");
    assert_eq!(d.sh(&b, "echo b").await.output, "b\n");
    drop(d);
    drop(cap);
}
