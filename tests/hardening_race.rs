//! H18 on its own (spec/sandbox.md §8.7): the race it measures needs the guard's thread to get
//! the CPU, so it runs in a test binary of its own rather than beside the other hardening tests
//! on a 2-core machine. A real daemon; the host polls as a victim would.

// The harness is shared with tests/it, which uses all of it; this binary uses a part.
#[allow(dead_code, unused_imports, unused_macros)]
mod common;

use common::{Daemon, count_lines, gitdir_script, host_sh, outside};
use corral::api::{self, SandboxMode};
use std::path::Path;
use std::time::{Duration, Instant};

fn exists(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok()
}

async fn ww(d: &Daemon, cwd: &Path) -> String {
    d.try_open_with(api::OpenSessionRequest {
        cwd: cwd.to_string_lossy().into_owned(),
        mode: SandboxMode::WorkspaceWrite as i32,
        exclude_slash_tmp: true,
        env: common::session_env(cwd),
        ..Default::default()
    })
    .await
    .unwrap()
}

/// The victim's side of H18: a host `git status` in `dir` every 10 ms (an editor, a git-aware
/// prompt), and a tight existence check of `dir/.git` that adds up how long it was visible.
struct HostPoller {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<Duration>>,
}

impl HostPoller {
    fn start(dir: &Path) -> Self {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let git = {
            let (stop, dir) = (stop.clone(), dir.to_path_buf());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let _ = std::process::Command::new("git")
                        .args(["status", "--porcelain"])
                        .current_dir(&dir)
                        .env("GIT_CEILING_DIRECTORIES", dir.parent().unwrap())
                        .stdout(std::process::Stdio::null())
                        .stderr(std::process::Stdio::null())
                        .status();
                    std::thread::sleep(Duration::from_millis(10));
                }
                Duration::ZERO
            })
        };
        let visible = {
            let (stop, dot_git) = (stop.clone(), dir.join(".git"));
            std::thread::spawn(move || {
                let mut total = Duration::ZERO;
                let mut since: Option<Instant> = None;
                while !stop.load(Ordering::Relaxed) {
                    match (exists(&dot_git), since) {
                        (true, None) => since = Some(Instant::now()),
                        (false, Some(t)) => {
                            total += t.elapsed();
                            since = None;
                        }
                        _ => {}
                    }
                    std::thread::sleep(Duration::from_micros(100));
                }
                total + since.map(|t| t.elapsed()).unwrap_or_default()
            })
        };
        Self {
            stop,
            threads: vec![git, visible],
        }
    }

    /// Stops polling; returns how long `.git` was visible on the host.
    fn finish(self) -> Duration {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.threads.into_iter().map(|t| t.join().unwrap()).sum()
    }
}

/// H18 (red team finding 1): a command that renames prepared gitdirs onto `.git` as fast as it
/// can for 10 s, against a host `git status` every 10 ms for the whole call. Detect-and-undo
/// lost that race (the hook ran 330 times); now the first creation stops every process of the
/// sandbox before the name is taken away, and the session refuses what follows. Across 10
/// sessions the planted hook runs at most once per session. Baseline first, on the host.
#[tokio::test]
async fn h18_a_recreate_loop_is_stopped_at_its_first_creation() {
    let base = outside();
    let proj = base.path().join("proj");
    std::fs::create_dir(&proj).unwrap();
    let counter = base.path().join("hook-runs");
    let race = format!(
        "{} && for i in $(seq 100); do cp -r t t$i; done && end=$((SECONDS+10)); i=0; \
         while [ $SECONDS -lt $end ]; do i=$((i+1)); mv t$((i % 100 + 1)) .git 2>/dev/null; \
         mv .git t$((i % 100 + 1)) 2>/dev/null; done",
        gitdir_script("t", &counter)
    );
    // Baseline: on the host the same loop keeps `.git` there often enough that the poller runs
    // the planted hook again and again (here for 1 s, not 10).
    let poller = HostPoller::start(&proj);
    host_sh(&format!(
        "cd '{}' && {}",
        proj.display(),
        race.replace("SECONDS+10", "SECONDS+1")
    ));
    poller.finish();
    let baseline = count_lines(&counter);
    assert!(baseline >= 2, "baseline: the hook ran {baseline} times");
    host_sh(&format!(
        "rm -rf '{}' && mkdir '{}'",
        proj.display(),
        proj.display()
    ));
    let _ = std::fs::remove_file(&counter);

    let d = Daemon::start(&[]).await;
    let mut worst = Duration::ZERO;
    for run in 0..10 {
        let id = ww(&d, &proj).await;
        let poller = HostPoller::start(&proj);
        let started = Instant::now();
        let r = d.sh(&id, &race).await;
        let took = started.elapsed();
        // The poller watches on for a moment after the call, as a host would.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let visible = poller.finish();
        worst = worst.max(visible);
        let runs = count_lines(&counter);
        assert!(
            runs <= 1,
            "run {run}: {runs} host git processes ran the planted hook"
        );
        assert!(
            r.output
                .contains("sandbox stopped every process of this session"),
            "run {run}: {}",
            r.output
        );
        assert_ne!(r.exit_code, 0, "run {run}");
        assert!(
            took < Duration::from_secs(5),
            "run {run}: the loop was not stopped ({took:?})"
        );
        assert!(!exists(&proj.join(".git")), "run {run}: .git survived");
        let refused = d.try_sh(&id, "mv t1 .git").await.unwrap_err();
        assert_eq!(
            refused.code(),
            tonic::Code::FailedPrecondition,
            "{refused:?}"
        );
        let _ = std::fs::remove_file(&counter);
        host_sh(&format!("rm -rf '{0}' && mkdir '{0}'", proj.display()));
    }
    eprintln!("H18: .git was visible on the host for at most {worst:?} per session");
    // The allowed path: a new session works in the same workspace.
    let id = ww(&d, &proj).await;
    let r = d.sh(&id, "echo ok > fine && cat fine").await;
    assert_eq!((r.exit_code, r.output.as_str()), (0, "ok\n"));
}
