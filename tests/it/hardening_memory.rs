//! H11: no tool call can take the host's memory. Each worker (with all its commands) has a
//! memory limit — a cgroup where the daemon can make one (v1 `memory.limit_in_bytes` here and in
//! CI, v2 `memory.max` elsewhere) — set by policy (`max_memory_bytes`) with a default of half
//! the host's RAM. The daemon under test runs in its own capped cgroup, so a failure cannot hurt
//! the host (red-team finding 11: R01, R10).

use crate::common::{self, Daemon, DaemonCgroup, outside};
use corral::api::{self, SandboxMode};

#[tokio::test]
async fn a_command_cannot_take_more_memory_than_its_worker_limit() {
    let Some(cg) = DaemonCgroup::create("h11", 1536 << 20) else {
        eprintln!("skipped: needs root and a v1 memory controller (CI has both)");
        return;
    };
    let join = cg.join_script();
    let conf_dir = outside();
    let conf = conf_dir.path().join("corral.toml");
    // 192 MiB per worker.
    std::fs::write(&conf, "[policy.default]\nmax_memory_bytes = 201326592\n").unwrap();
    let d = Daemon::start_wrapped(
        &["sh", "-c", &join, "sh"],
        &["--config", conf.to_str().unwrap()],
    )
    .await;
    let cwd = outside();
    let id = d.open(cwd.path(), SandboxMode::ReadOnly).await;
    let grab = |mib: u32| {
        format!(
            "python3 -c \"b = bytearray({mib} * 1024 * 1024); b[::4096] = b'x' * len(b[::4096]); print('allocated {mib}')\""
        )
    };
    // Baseline: well under the limit works.
    let r = d.sh(&id, &grab(32)).await;
    assert_eq!(r.exit_code, 0, "{}", r.output);
    assert!(r.output.contains("allocated 32"));
    // Over it: the command is killed, not the host (nor the daemon's cap).
    let r = d.sh(&id, &grab(768)).await;
    assert_ne!(r.exit_code, 0, "{}", r.output);
    assert!(!r.output.contains("allocated 768"), "{}", r.output);
    // The worker's cgroup exists under the daemon's, in its user's group (H21), with the
    // policy's limit.
    let (_, limits) = common::host_sh(&format!(
        "cat {0}/corral-workers/*/user-*/worker-*/memory.limit_in_bytes",
        cg.0.display()
    ));
    assert!(limits.lines().any(|l| l.trim() == "201326592"), "{limits}");
    // The daemon and the session still serve.
    let r = d.sh(&id, "echo still-here").await;
    assert_eq!((r.exit_code, r.output.as_str()), (0, "still-here\n"));
    // read_file of an endless device is refused rather than read (the red-team's kill switch).
    let err = d
        .tools()
        .await
        .read_file(api::ReadFileRequest {
            session_id: id.clone(),
            file_path: "/dev/zero".into(),
            ..Default::default()
        })
        .await;
    match err {
        Err(s) => assert!(s.message().contains("not a regular file"), "{s:?}"),
        Ok(r) => panic!("read /dev/zero: {:?}", r.into_inner().text),
    }
    drop(d);
}
