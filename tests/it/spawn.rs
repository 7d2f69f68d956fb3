//! How commands and workers are started, through a real daemon: a command is spawned
//! (`posix_spawn`) as the leader of its own session, with every signal at its default
//! disposition, an empty signal mask and only descriptors 0-2; and a worker started ahead of
//! time (a spare, `corral __spare_`, in a memory cgroup of its own) serves exactly one worker's
//! life for one user, then a new spare takes its place.

use crate::common::{Daemon, TestUser, eventually, scratch};
use corral::api;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn status_field(text: &str, key: &str) -> Vec<String> {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .unwrap_or_else(|| panic!("no {key} in {text}"))
        .split_whitespace()
        .map(String::from)
        .collect()
}

#[tokio::test]
async fn a_command_leads_its_own_session_with_default_signals_and_no_inherited_fds() {
    let d = Daemon::start(&[]).await;
    let dir = scratch();
    for mode in [api::SandboxMode::ReadOnly, api::SandboxMode::WorkspaceWrite] {
        let id = d.open(dir.path(), mode).await;
        let run = |argv: &[&str]| api::ShellRequest {
            session_id: id.clone(),
            command: argv.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        let r = d.shell(run(&["cat", "/proc/self/status"])).await;
        assert_eq!(r.exit_code, 0, "{}", r.output);
        // In the innermost pid namespace (last field), the command's session id is its pid.
        let pid = status_field(&r.output, "NSpid").pop().unwrap();
        let sid = status_field(&r.output, "NSsid").pop().unwrap();
        assert_eq!(sid, pid, "{mode:?}: not its own session leader");
        for key in ["SigBlk", "SigIgn"] {
            let mask = u64::from_str_radix(&status_field(&r.output, key)[0], 16).unwrap();
            assert_eq!(mask, 0, "{mode:?}: {key} {mask:#x}");
        }
        // Only stdin, stdout, stderr — and the directory `ls` itself opens.
        let r = d.shell(run(&["ls", "/proc/self/fd"])).await;
        let fds: Vec<&str> = r.output.split_whitespace().collect();
        assert_eq!(fds, ["0", "1", "2", "3"], "{mode:?}");
        let r = d.shell(run(&["readlink", "/proc/self/fd/0"])).await;
        assert_eq!(r.output, "/dev/null\n");
    }
}

/// Children of `parent` whose command line contains `arg` as a whole argument.
fn children_with_arg(parent: u32, arg: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
                return false;
            };
            let ppid = status
                .lines()
                .find_map(|l| l.strip_prefix("PPid:"))
                .map(|v| v.trim().parse::<u32>().ok());
            ppid == Some(Some(parent))
                && std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == arg.as_bytes()))
        })
        .collect()
}

/// The real uid of `pid`, if it is alive.
fn uid_of(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The uid the worker rooted at `pid` runs commands as: a sandboxed worker is two processes,
/// the outer one waiting and PID 1 of the sandbox (its only `__worker` child) serving.
fn serving_uid(pid: u32) -> Option<u32> {
    let inner = children_with_arg(pid, "__worker");
    uid_of(*inner.first()?)
}

/// The v1 memory cgroup directory of `pid` (`None` without a v1 memory controller; the CI
/// machine has one).
fn memory_cgroup(pid: u32) -> Option<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let rel = text.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then_some(path)
    })?;
    let dir = Path::new("/sys/fs/cgroup/memory").join(rel.trim_start_matches('/'));
    dir.is_dir().then_some(dir)
}

fn memory_limit(cgroup: &Path) -> Option<u64> {
    std::fs::read_to_string(cgroup.join("memory.limit_in_bytes"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The daemon keeps this many spares started ahead (pool/spare.rs `SPARE_WORKERS`).
const SPARES: usize = 2;

/// The spares, once all of them are ready.
async fn spares(d: &Daemon) -> Vec<u32> {
    let mut spares = Vec::new();
    assert!(
        eventually(Duration::from_secs(10), || {
            spares = children_with_arg(d.pid(), "__spare_");
            spares.len() == SPARES
        })
        .await,
        "expected {SPARES} spare workers, found {spares:?}"
    );
    spares
}

/// The one worker that is new since `before`.
fn new_worker(d: &Daemon, before: &[u32]) -> u32 {
    let new: Vec<u32> = children_with_arg(d.pid(), "__worker")
        .into_iter()
        .filter(|p| !before.contains(p))
        .collect();
    assert_eq!(new.len(), 1, "expected one new worker, found {new:?}");
    new[0]
}

fn open_as(user: &TestUser, socket: &str, dir: &Path) -> String {
    let (code, id, err) = user.corral(
        socket,
        &[
            "open-session",
            "--mode",
            "workspace-write",
            "--cwd",
            dir.to_str().unwrap(),
            "--env",
            "PATH=/usr/bin:/bin",
        ],
    );
    assert_eq!(code, 0, "{}: open-session: {err}", user.name);
    id
}

#[tokio::test]
async fn a_spare_worker_serves_one_user_once_and_is_replaced() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: creating users and serving them needs root (CI runs as root)");
        return;
    }
    let d = Daemon::start(&[]).await;
    let socket = d.open_to_local_users();
    let (a, b) = (TestUser::create("spa"), TestUser::create("spb"));

    // Before it is used a spare is the daemon's: no user's identity, not named a worker. It
    // already sits in a memory cgroup of its own (so no process moves between cgroups while a
    // session opens), capped until a session gives it its limit.
    let ready = spares(&d).await;
    assert!(children_with_arg(d.pid(), "__worker").is_empty());
    let mut spare_cgroups = Vec::new();
    for &spare in &ready {
        assert_eq!(uid_of(spare), Some(0));
        if let Some(cg) = memory_cgroup(spare) {
            // Moved in by the daemon right after its exec.
            let daemons = memory_cgroup(d.pid());
            assert!(
                eventually(Duration::from_secs(5), || memory_cgroup(spare) != daemons).await,
                "spare {spare} stays in the daemon's cgroup"
            );
            let cg = memory_cgroup(spare).unwrap_or(cg);
            assert!(
                !spare_cgroups.contains(&cg),
                "two spares share {}",
                cg.display()
            );
            assert_eq!(memory_limit(&cg), Some(256 << 20), "{}", cg.display());
            spare_cgroups.push(cg);
        }
    }

    let sa = open_as(&a, &socket, &a.dir);
    // A's session got a spare: it is now a worker, serving as A, in that spare's cgroup, which
    // now carries the session's limit (the policy default: half the host's memory).
    let first = new_worker(&d, &[]);
    assert!(ready.contains(&first), "{first} was not a spare");
    assert!(
        children_with_arg(d.pid(), "__spare_")
            .iter()
            .all(|p| *p != first)
    );
    assert_eq!(serving_uid(first), Some(a.uid));
    if let Some(cg) = memory_cgroup(first) {
        // The spare's cgroup, moved under A's group (H21: a user's workers share a ceiling).
        assert!(
            spare_cgroups
                .iter()
                .any(|s| s.file_name() == cg.file_name()),
            "{} is not a spare's",
            cg.display()
        );
        assert_eq!(
            cg.parent().and_then(|p| p.file_name()),
            Some(std::ffi::OsStr::new(&format!("user-{}", a.uid))),
            "{}",
            cg.display()
        );
        let sandboxed = children_with_arg(first, "__worker");
        assert_eq!(memory_cgroup(sandboxed[0]).as_ref(), Some(&cg));
        // The kernel rounds a limit down to whole pages.
        let want = corral::default_limit_bytes();
        let got = memory_limit(&cg).unwrap_or(0);
        assert!(
            got <= want && want - got < 64 << 10,
            "{}: limit {got}, want {want}",
            cg.display()
        );
    }

    // A new spare replaces it; B's session gets a spare too, never A's worker.
    let refilled = spares(&d).await;
    assert!(!refilled.contains(&first));
    let sb = open_as(&b, &socket, &b.dir);
    let second = new_worker(&d, &[first]);
    assert!(refilled.contains(&second), "{second} was not a spare");
    assert_eq!(serving_uid(second), Some(b.uid));
    assert_eq!(serving_uid(first), Some(a.uid), "A's worker still A's only");
    for (user, session) in [(&a, &sa), (&b, &sb)] {
        let (code, out, err) = user.corral(
            &socket,
            &[
                "invoke",
                "shell",
                r#"{"command":["id","-u"]}"#,
                "--session",
                session,
                "--json",
            ],
        );
        assert_eq!(code, 0, "{err}");
        let reply: serde_json::Value = serde_json::from_str(&out).unwrap();
        let text: serde_json::Value =
            serde_json::from_str(reply["output"].as_str().unwrap()).unwrap();
        assert_eq!(text["output"], format!("{}\n", user.uid), "{out}");
    }

    // Closing A's session ends its worker; the spare that became it is not reused.
    let (code, _, err) = a.corral(&socket, &["close-session", &sa]);
    assert_eq!(code, 0, "{err}");
    assert!(
        eventually(Duration::from_secs(10), || uid_of(first).is_none()).await,
        "A's worker outlived its session"
    );
    let after = spares(&d).await;
    assert!(!after.contains(&first) && !after.contains(&second));
}

#[tokio::test]
async fn a_spare_path_resolver_answers_one_open_as_its_caller() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: creating users and serving them needs root (CI runs as root)");
        return;
    }
    let d = Daemon::start(&[]).await;
    let socket = d.open_to_local_users();
    let (a, b) = (TestUser::create("rsa"), TestUser::create("rsb"));
    std::fs::set_permissions(&a.dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let resolvers = |d: &Daemon| children_with_arg(d.pid(), "__resolve");
    let mut ready = Vec::new();
    assert!(
        eventually(Duration::from_secs(10), || {
            ready = resolvers(&d);
            ready.len() == SPARES
        })
        .await,
        "expected {SPARES} spare resolvers, found {ready:?}"
    );
    // Waiting, a spare is the daemon's.
    for &pid in &ready {
        assert_eq!(uid_of(pid), Some(0));
    }

    // B's open is resolved as B, not as the root that started the helper: A's private
    // directory is refused.
    let (code, _, err) = b.corral(
        &socket,
        &[
            "open-session",
            "--mode",
            "read-only",
            "--cwd",
            a.dir.to_str().unwrap(),
        ],
    );
    assert_ne!(code, 0, "B opened a session in A's private directory");
    assert!(
        err.contains("PermissionDenied") || err.contains("permission"),
        "{err}"
    );
    // A's own open of it works.
    open_as(&a, &socket, &a.dir);
    // Each helper answered once and is gone (the oldest are taken first); new ones wait in
    // their place.
    let mut now = Vec::new();
    assert!(
        eventually(Duration::from_secs(10), || {
            now = resolvers(&d);
            now.len() == SPARES && ready.iter().all(|p| uid_of(*p).is_none())
        })
        .await,
        "spares before {ready:?}, now {now:?}"
    );
}
