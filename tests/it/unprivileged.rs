//! A daemon run by an ordinary user (DESIGN.md §1: "without root, the same design runs as a
//! single-user daemon"): its workers keep the user's uid and build the sandbox in an unprivileged
//! user namespace, so read-only and workspace-write calls really confine — not only
//! danger-full-access works. Each test creates a user (removed after), starts `corral serve` as
//! that user on a socket in a directory it owns, calls it as that user, proves the baseline as
//! that user on the host, attempts the escape, checks the host, and checks the allowed path.
//!
//! Where the host forbids unprivileged user namespaces (simulated without touching the host: the
//! daemon runs inside a user namespace whose `user.max_user_namespaces` is 0), sandboxed calls
//! fail closed naming the setting and its fix, health says NOT_SERVING, and degraded mode runs
//! with Landlock and seccomp and says so.
//!
//! Needs root to create users (CI runs as root); skipped with a note otherwise. The escape suite
//! (tests/it/sandbox_escape.rs) also runs most of its cases against such a daemon.

use crate::common::{self, Daemon, Listener, RunAs, TestUser};
use corral::api::{self, SandboxMode};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;
use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus};

const RO: SandboxMode = SandboxMode::ReadOnly;
const WW: SandboxMode = SandboxMode::WorkspaceWrite;

const NO_USER_NAMESPACES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/support/no_user_namespaces.py"
);

/// A new ordinary user and its running daemon; `None` (with a note) when not root.
async fn user_daemon(tag: &str, extra: &[&str]) -> Option<(RunAs, Daemon)> {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: creating a user needs root (CI runs as root)");
        return None;
    }
    let who = RunAs::ordinary_user(tag);
    let d = who.start(extra).await;
    Some((who, d))
}

fn user_of(who: &RunAs) -> &TestUser {
    match who {
        RunAs::User(user) => user,
        RunAs::Root => unreachable!("these tests run the daemon as an ordinary user"),
    }
}

/// A workspace-write session in `cwd` with HOME set to `home` and /tmp not writable, so both
/// stand for places outside the roots that the user may write on the host.
async fn ww_session(d: &Daemon, cwd: &Path, home: &Path) -> String {
    let mut env = common::session_env(home);
    env.insert("HOME".into(), home.display().to_string());
    d.open_with(api::OpenSessionRequest {
        cwd: cwd.display().to_string(),
        mode: WW as i32,
        exclude_slash_tmp: true,
        env,
        ..Default::default()
    })
    .await
}

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

async fn layers(d: &Daemon) -> Vec<api::Layer> {
    d.sessions()
        .await
        .get_capabilities(api::GetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .layers
}

fn layer<'a>(layers: &'a [api::Layer], name: &str) -> &'a api::Layer {
    layers
        .iter()
        .find(|l| l.name == name)
        .unwrap_or_else(|| panic!("no {name} layer in {layers:?}"))
}

/// Each layer is reported as it is: the user namespace inside the namespaces layer, identity
/// not applicable (the daemon serves only its uid), every capability dropped, and the memory
/// limit's fallback when the user may not make a memory cgroup. Commands run as the user.
#[tokio::test]
async fn layers_are_in_force_and_reported_honestly() {
    let Some((who, d)) = user_daemon("lay", &[]).await else {
        return;
    };
    let user = user_of(&who);
    assert_eq!(health(&d, "").await, ServingStatus::Serving as i32);
    assert_eq!(
        health(&d, "corral.v1.Tools").await,
        ServingStatus::Serving as i32
    );
    let layers = layers(&d).await;
    let ns = layer(&layers, "namespaces");
    assert_eq!(ns.status, api::LayerStatus::Enforced as i32, "{ns:?}");
    assert!(
        ns.detail.contains(&format!(
            "user (uid {0} and gid {1} mapped to themselves, setgroups denied)",
            user.uid, user.gid
        )),
        "{}",
        ns.detail
    );
    let identity = layer(&layers, "identity");
    assert_eq!(
        identity.status,
        api::LayerStatus::NotApplicable as i32,
        "{identity:?}"
    );
    assert!(
        identity.detail.starts_with(&format!(
            "not applicable: the daemon runs as uid {0}, not root, and serves only that uid",
            user.uid
        )),
        "{}",
        identity.detail
    );
    for name in [
        "capabilities",
        "no_new_privs",
        "landlock",
        "seccomp",
        "limits",
    ] {
        let l = layer(&layers, name);
        assert_eq!(l.status, api::LayerStatus::Enforced as i32, "{l:?}");
    }
    assert!(
        layer(&layers, "capabilities")
            .detail
            .starts_with("all five capability sets empty")
    );
    // The memory cgroup: whatever the host allows this user, the log and the report agree.
    let limits = &layer(&layers, "limits").detail;
    if d.log_text()
        .contains("no memory cgroup for sandbox workers")
    {
        assert!(
            limits.contains("memory: no memory cgroup for workers")
                && limits.contains("RLIMIT_DATA instead"),
            "{limits}"
        );
        assert!(
            !limits.contains(&format!("RLIMIT_DATA={}", u64::MAX)),
            "{limits}"
        );
    } else {
        assert!(!limits.contains("no memory cgroup"), "{limits}");
    }
    // The start-up line says whom the daemon serves and how it sandboxes.
    assert!(
        d.log_text().contains(&format!(
            "corral: running as uid {0}, not root: serving only uid {0}",
            user.uid
        )),
        "{}",
        d.log_text()
    );

    // Inside: the user's uid, no capability at all, no_new_privs, a seccomp filter.
    let cwd = who.scratch();
    let id = d.open(cwd.path(), RO).await;
    let r = d
        .sh(
            &id,
            "id -u; grep -E '^(NoNewPrivs|Seccomp|Cap(Inh|Prm|Eff|Bnd|Amb)):' /proc/self/status",
        )
        .await;
    assert_eq!(r.exit_code, 0, "{}", r.output);
    assert!(
        r.output.starts_with(&format!("{}\n", user.uid)),
        "{}",
        r.output
    );
    for want in ["NoNewPrivs:\t1", "Seccomp:\t2"] {
        assert!(r.output.contains(want), "{want}: {}", r.output);
    }
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert!(
            r.output.contains(&format!("{set}:\t0000000000000000")),
            "{set}: {}",
            r.output
        );
    }
}

/// (a) A write inside the workspace works and lands on the host, owned by the user; (b) writes
/// to the user's own directories outside the roots (its home, /tmp) fail and leave nothing.
#[tokio::test]
async fn workspace_write_writes_the_workspace_and_nothing_else() {
    let Some((who, d)) = user_daemon("ww", &[]).await else {
        return;
    };
    let user = user_of(&who);
    let cwd = who.scratch();
    let home = who.outside();
    let in_tmp = format!("/tmp/corral-unpriv-{}", std::process::id());
    let escaped = home.path().join("escaped");
    // Baseline: on the host the user may write both places.
    let (code, out) = who.host_sh(&format!(
        "echo x > {0} && echo x > {1} && rm {0} {1}",
        escaped.display(),
        in_tmp
    ));
    assert_eq!(code, 0, "{out}");

    let id = ww_session(&d, cwd.path(), home.path()).await;
    let r = d
        .sh(&id, "echo hello > made-inside && cat made-inside")
        .await;
    assert_eq!((r.exit_code, r.output.as_str()), (0, "hello\n"));
    let made = cwd.path().join("made-inside");
    assert_eq!(std::fs::read_to_string(&made).unwrap(), "hello\n");
    assert_eq!(std::fs::metadata(&made).unwrap().uid(), user.uid);

    let r = d.sh(&id, "echo x > \"$HOME/escaped\"").await;
    assert_ne!(r.exit_code, 0, "{}", r.output);
    assert!(r.output.contains("Read-only file system"), "{}", r.output);
    assert!(!escaped.exists(), "a write reached the user's home");
    let r = d.sh(&id, &format!("echo x > {in_tmp}")).await;
    assert_ne!(r.exit_code, 0, "{}", r.output);
    assert!(!Path::new(&in_tmp).exists(), "a write reached /tmp");
    // The allowed path still works after the refusals.
    let r = d.sh(&id, "echo again >> made-inside").await;
    assert_eq!(r.exit_code, 0, "{}", r.output);
    assert_eq!(std::fs::read_to_string(&made).unwrap(), "hello\nagain\n");
}

/// (c) With the network off (the default of both sandboxed modes) a TCP listener of the host's
/// loopback is unreachable; the baseline as the same user reaches it.
#[tokio::test]
async fn the_network_is_off_in_both_sandboxed_modes() {
    let Some((who, d)) = user_daemon("net", &[]).await else {
        return;
    };
    let listener = Listener::start();
    let connect = format!("echo hi >/dev/tcp/127.0.0.1/{}", listener.port);
    let (code, out) = who.host_sh(&connect);
    assert_eq!(code, 0, "{out}");
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(listener.accepted(), 1, "baseline connection");

    let cwd = who.scratch();
    for mode in [RO, WW] {
        let id = d.open(cwd.path(), mode).await;
        let r = d.sh(&id, &connect).await;
        assert_ne!(r.exit_code, 0, "{mode:?}: {}", r.output);
        assert!(
            r.output.contains("Operation not permitted"),
            "{mode:?}: {}",
            r.output
        );
        // Only the loopback of the sandbox's own network namespace exists.
        let r = d
            .sh(&id, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
            .await;
        assert_eq!(r.output, "lo\n", "{mode:?}");
        // The allowed path: local IPC still works.
        let r = d
            .sh(
                &id,
                "python3 -c 'import socket;a,b=socket.socketpair();a.send(b\"x\");print(b.recv(1))'",
            )
            .await;
        assert_eq!(r.output, "b'x'\n", "{mode:?}");
    }
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(listener.accepted(), 1, "the sandbox reached the listener");
}

/// (d) The protected names stay protected: `.git` cannot be created at a root's top, an
/// existing `.codex` cannot be written; ordinary files next to them can.
#[tokio::test]
async fn protected_names_stay_blocked() {
    let Some((who, d)) = user_daemon("git", &[]).await else {
        return;
    };
    let cwd = who.scratch();
    std::fs::create_dir(cwd.path().join(".codex")).unwrap();
    who.write(&cwd.path().join(".codex/config.toml"), "safe\n");
    who.own(&cwd.path().join(".codex"));
    // Baseline: the user could do both on the host.
    let (code, out) = who.host_sh(&format!(
        "cd {} && mkdir .git && rmdir .git && echo safe > .codex/config.toml",
        cwd.path().display()
    ));
    assert_eq!(code, 0, "{out}");

    let id = ww_session(&d, cwd.path(), cwd.path()).await;
    for script in ["mkdir .git", "git init -q .", "mkdir t && mv t .git"] {
        let r = d.sh(&id, script).await;
        assert_ne!(r.exit_code, 0, "{script}: {}", r.output);
        assert!(
            r.output
                .contains("sandbox blocked creation of protected workspace metadata path"),
            "{script}: {}",
            r.output
        );
        assert!(!cwd.path().join(".git").exists(), "{script} created .git");
    }
    let r = d.sh(&id, "echo evil > .codex/config.toml").await;
    assert_ne!(r.exit_code, 0, "{}", r.output);
    assert_eq!(
        std::fs::read_to_string(cwd.path().join(".codex/config.toml")).unwrap(),
        "safe\n"
    );
    let r = d.sh(&id, "echo ok > notes.txt").await;
    assert_eq!(r.exit_code, 0, "{}", r.output);
    assert!(cwd.path().join("notes.txt").exists());
}

/// (e) No set-user-ID or set-group-ID bit can be set, by chmod or at creation; ordinary mode
/// changes of the user's own files still work.
#[tokio::test]
async fn setuid_bits_cannot_be_set() {
    let Some((who, d)) = user_daemon("suid", &[]).await else {
        return;
    };
    let cwd = who.scratch();
    let sh = cwd.path().join("sh");
    std::fs::copy("/bin/sh", &sh).unwrap();
    who.own(&sh);
    // Baseline: the user may set the bit on its own file on the host (then clears it).
    let (code, out) = who.host_sh(&format!(
        "chmod u+s {0} && test -u {0} && chmod u-s {0}",
        sh.display()
    ));
    assert_eq!(code, 0, "{out}");

    let id = ww_session(&d, cwd.path(), cwd.path()).await;
    let r = d
        .sh(
            &id,
            "chmod u+s sh; chmod g+s sh; chmod 4755 sh; \
             python3 -c 'import os; os.close(os.open(\"made\", os.O_CREAT|os.O_WRONLY, 0o4755))'; \
             chmod 700 sh && echo plain-chmod-ok",
        )
        .await;
    assert!(r.output.contains("plain-chmod-ok"), "{}", r.output);
    assert_eq!(
        r.output.matches("Operation not permitted").count(),
        4,
        "{}",
        r.output
    );
    let mode = std::fs::metadata(&sh).unwrap().permissions().mode();
    assert_eq!(mode & 0o7777, 0o700, "host mode {mode:o}");
    assert!(!cwd.path().join("made").exists());
}

/// (f) The pid namespace: the sandbox sees only its own processes, not the daemon or the test,
/// though on the host the same user may signal its daemon.
#[tokio::test]
async fn host_processes_are_invisible() {
    let Some((who, d)) = user_daemon("pid", &[]).await else {
        return;
    };
    let daemon = d.pid();
    let (code, out) = who.host_sh(&format!("kill -0 {daemon} && echo visible"));
    assert_eq!((code, out.as_str()), (0, "visible\n"), "baseline");

    let cwd = who.scratch();
    let id = d.open(cwd.path(), RO).await;
    // One line each, labelled (stdout and stderr arrive interleaved).
    let r = d
        .sh(
            &id,
            &format!(
                "kill -0 {daemon} 2>&1; test -d /proc/{daemon} && echo daemon-in-proc; \
                 test -d /proc/{test} && echo test-in-proc; \
                 echo \"pids: $(ls /proc | grep -E '^[0-9]+$' | tr '\\n' ' ')\"; \
                 echo \"ps: $(ps -e -o pid= | wc -l)\"",
                test = std::process::id()
            ),
        )
        .await;
    assert!(r.output.contains("No such process"), "{}", r.output);
    assert!(!r.output.contains("in-proc"), "{}", r.output);
    let field = |label: &str| {
        r.output
            .lines()
            .find_map(|l| l.strip_prefix(label))
            .unwrap_or_else(|| panic!("no {label} line in {}", r.output))
            .trim()
            .to_string()
    };
    let pids: Vec<u32> = field("pids:")
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert!(pids.contains(&1), "the worker is PID 1: {pids:?}");
    assert!(
        pids.len() < 10,
        "{} processes visible: {pids:?}",
        pids.len()
    );
    let ps: usize = field("ps:").parse().unwrap();
    assert!((1..10).contains(&ps), "ps lists {ps} processes");
    // The daemon is alive and serving.
    let r = d.sh(&id, "echo alive").await;
    assert_eq!(r.output, "alive\n");
}

/// (g) Read-only mode writes nothing, not even in its own cwd, which the user owns; reading
/// works.
#[tokio::test]
async fn read_only_cannot_write_the_cwd() {
    let Some((who, d)) = user_daemon("ro", &[]).await else {
        return;
    };
    let cwd = who.scratch();
    who.write(&cwd.path().join("existing"), "before\n");
    let (code, out) = who.host_sh(&format!(
        "cd {} && echo x > probe && rm probe",
        cwd.path().display()
    ));
    assert_eq!(code, 0, "{out}");

    let id = d.open(cwd.path(), RO).await;
    let r = d
        .sh(
            &id,
            "echo x > new; echo x >> existing; touch -d 2000-01-01 existing",
        )
        .await;
    assert_eq!(
        r.output.matches("Read-only file system").count(),
        3,
        "{}",
        r.output
    );
    assert!(!cwd.path().join("new").exists());
    assert_eq!(
        std::fs::read_to_string(cwd.path().join("existing")).unwrap(),
        "before\n"
    );
    let r = d.sh(&id, "cat existing").await;
    assert_eq!((r.exit_code, r.output.as_str()), (0, "before\n"));
}

/// A daemon that is not root serves only its own uid: root and another user are refused with
/// PERMISSION_DENIED (their clients would refuse the socket's directory anyway; these connect
/// past that check to test the daemon itself), and the owner still works.
#[tokio::test]
async fn other_callers_are_refused() {
    let Some((who, d)) = user_daemon("own", &[]).await else {
        return;
    };
    let owner = user_of(&who);
    let other = TestUser::create("oth");
    // Let the other user reach the socket at all.
    std::fs::set_permissions(
        d.socket.parent().unwrap(),
        std::fs::Permissions::from_mode(0o711),
    )
    .unwrap();
    std::fs::set_permissions(&d.socket, std::fs::Permissions::from_mode(0o777)).unwrap();
    let cwd = who.scratch();
    std::fs::set_permissions(cwd.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    for (uid, gid) in [(0, 0), (other.uid, other.gid)] {
        let channel = common::connect_as_unchecked(&d.socket, uid, gid)
            .await
            .unwrap();
        let err = api::sessions_client::SessionsClient::new(channel)
            .open_session(api::OpenSessionRequest {
                cwd: cwd.path().display().to_string(),
                mode: RO as i32,
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied, "uid {uid}");
        assert!(
            err.message().contains(&format!(
                "runs as uid {0}, not root, and serves only uid {0} (caller is uid {uid})",
                owner.uid
            )),
            "{}",
            err.message()
        );
    }
    let id = d.open(cwd.path(), RO).await;
    assert_eq!(d.sh(&id, "echo owner-ok").await.output, "owner-ok\n");
}

/// Starts the daemon as `user` on a host (simulated) that allows no user namespace.
async fn daemon_without_user_namespaces(user: &TestUser, extra: &[&str]) -> Daemon {
    let dir = common::outside();
    std::os::unix::fs::chown(dir.path(), Some(user.uid), Some(user.gid)).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let socket = dir.path().join("corral.sock");
    let log = dir.path().join("daemon.log");
    let child = std::process::Command::new("python3")
        .arg(NO_USER_NAMESPACES)
        .arg(user.uid.to_string())
        .arg(user.gid.to_string())
        .arg(common::client_binary())
        .arg("serve")
        .arg("--listen")
        .arg(format!("unix:{}", socket.display()))
        .args(extra)
        .current_dir(dir.path())
        .env("HOME", dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let d = Daemon {
        child: Some(child),
        _dir: dir,
        socket,
        log,
        caller: Some((user.uid, user.gid)),
    };
    d.wait_ready().await;
    d
}

/// Where the host forbids unprivileged user namespaces: the start-up line, `corral health` and
/// every sandboxed call name the setting and the command that enables it; nothing runs
/// sandboxed; danger-full-access still works.
#[tokio::test]
async fn forbidden_user_namespaces_fail_closed_and_say_how_to_enable_them() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: creating a user needs root (CI runs as root)");
        return;
    }
    let user = TestUser::create("nons");
    let d = daemon_without_user_namespaces(&user, &[]).await;
    const CAUSE: &str = "sandbox unavailable: namespaces could not be applied: \
        unshare(CLONE_NEWUSER) failed: No space left on device (ENOSPC)";
    const SETTING: &str = "user.max_user_namespaces is 0";
    const ENABLE: &str = "sysctl -w user.max_user_namespaces=15000";
    let log = d.log_text();
    assert!(
        log.contains("corral: sandboxed sessions are unavailable on this host")
            && log.contains(CAUSE)
            && log.contains(SETTING)
            && log.contains(ENABLE),
        "{log}"
    );
    assert_eq!(health(&d, "").await, ServingStatus::NotServing as i32);
    assert_eq!(
        health(&d, "corral.v1.Tools").await,
        ServingStatus::NotServing as i32
    );
    let layers = layers(&d).await;
    let ns = layer(&layers, "namespaces");
    assert_eq!(ns.status, api::LayerStatus::Unavailable as i32);
    assert!(
        ns.detail.starts_with(CAUSE) && ns.detail.contains(ENABLE),
        "{}",
        ns.detail
    );

    // `corral health`, as the user: NOT_SERVING, and why.
    let (code, out, err) = user.corral(d.target(), &["health"]);
    assert_eq!((code, out.as_str()), (1, "NOT_SERVING"), "{err}");
    assert!(
        err.starts_with(&format!("namespaces (unavailable): {CAUSE}"))
            && err.contains(SETTING)
            && err.contains(ENABLE)
            && err.contains("Otherwise run the corral daemon as root"),
        "{err}"
    );

    // Sandboxed calls fail closed with that text, and run nothing.
    let cwd = common::scratch();
    std::os::unix::fs::chown(cwd.path(), Some(user.uid), Some(user.gid)).unwrap();
    for mode in [RO, WW] {
        let err = d.try_open(cwd.path(), mode).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{mode:?}");
        assert!(
            err.message().starts_with(CAUSE) && err.message().contains(ENABLE),
            "{}",
            err.message()
        );
    }

    // danger-full-access needs no sandbox layer and keeps working.
    let marker = cwd.path().join("ran");
    let dir = cwd.path().display().to_string();
    let (code, id, err) = corral_beside(
        &d,
        &user,
        &[
            "open-session",
            "--mode",
            "danger-full-access",
            "--cwd",
            &dir,
        ],
    );
    assert_eq!(code, 0, "{err}");
    let args = format!(r#"{{"command":["touch","{}"]}}"#, marker.display());
    let (code, out, err) = corral_beside(&d, &user, &["invoke", "shell", &args, "--session", &id]);
    assert_eq!(code, 0, "{out} {err}");
    assert!(marker.exists(), "{out}");
}

/// Runs the CLI as `user` in the user namespace of the daemon `d` started by
/// [`daemon_without_user_namespaces`] — where a real process of a host without user namespaces
/// would be. (From another user namespace the daemon could not inspect the caller's process, and
/// its check of sandboxed callers, failing closed, would refuse danger-full-access.)
fn corral_beside(d: &Daemon, user: &TestUser, args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new("nsenter")
        .args(["--user", "--target", &d.pid().to_string()])
        .args([
            "--setuid",
            &user.uid.to_string(),
            "--setgid",
            &user.gid.to_string(),
        ])
        .arg("--")
        .arg(common::client_binary())
        .args(args)
        .args(["--socket", d.target()])
        .current_dir("/")
        .output()
        .expect("nsenter");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).trim_end().to_string(),
        String::from_utf8_lossy(&out.stderr).trim_end().to_string(),
    )
}

/// With the namespaces layer allowed to be missing, a daemon that may not make user namespaces
/// still confines writes (Landlock), syscalls (seccomp) and privileges (no_new_privs, no
/// capability held), and every report says what is missing.
#[tokio::test]
async fn degraded_namespaces_still_confine_and_say_so() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: creating a user needs root (CI runs as root)");
        return;
    }
    let user = std::sync::Arc::new(TestUser::create("deg"));
    let who = RunAs::User(user.clone());
    let d = daemon_without_user_namespaces(&user, &["--allow-degraded", "namespaces"]).await;
    assert_eq!(
        health(&d, "corral.v1.Tools").await,
        ServingStatus::Serving as i32
    );
    assert!(
        d.log_text()
            .contains("corral: degraded mode: sandboxed sessions run without namespaces"),
        "{}",
        d.log_text()
    );
    let layers = layers(&d).await;
    let ns = layer(&layers, "namespaces");
    assert_eq!(ns.status, api::LayerStatus::Degraded as i32, "{ns:?}");
    assert!(
        ns.detail.contains("user.max_user_namespaces is 0") && ns.detail.contains("without it"),
        "{}",
        ns.detail
    );
    let caps = layer(&layers, "capabilities");
    assert_eq!(caps.status, api::LayerStatus::Enforced as i32, "{caps:?}");
    assert!(
        caps.detail.contains("no capability held") && caps.detail.contains("missing: bounding set"),
        "{}",
        caps.detail
    );
    let (code, _, err) = user.corral(d.target(), &["health"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.starts_with("namespaces (degraded): "), "{err}");

    let cwd = who.scratch();
    let out = who.outside();
    let (code, text) = who.host_sh(&format!(
        "echo x > {0}/probe && rm {0}/probe",
        out.path().display()
    ));
    assert_eq!(code, 0, "baseline: {text}");
    let id = ww_session(&d, cwd.path(), cwd.path()).await;
    let r = d
        .sh(
            &id,
            &format!(
                "echo in > inside && echo x > {}/outside; \
                 grep -E '^(NoNewPrivs|Seccomp|CapEff):' /proc/self/status; \
                 echo hi >/dev/tcp/127.0.0.1/9",
                out.path().display()
            ),
        )
        .await;
    assert!(r.output.contains("Permission denied"), "{}", r.output);
    assert!(
        !out.path().join("outside").exists(),
        "Landlock let a write out"
    );
    assert_eq!(
        std::fs::read_to_string(cwd.path().join("inside")).unwrap(),
        "in\n"
    );
    for want in ["NoNewPrivs:\t1", "Seccomp:\t2", "CapEff:\t0000000000000000"] {
        assert!(r.output.contains(want), "{want}: {}", r.output);
    }
    assert!(r.output.contains("Operation not permitted"), "{}", r.output);
}

/// A proxied session needs a root daemon (the proxy's listener is placed in the sandbox's
/// network namespace with setns). Without root the session does not open — saying why — and
/// never opens with the network on instead.
#[tokio::test]
async fn a_proxied_session_fails_closed_without_root() {
    let Some((who, d)) = user_daemon("egr", &[]).await else {
        return;
    };
    let cwd = who.scratch();
    let err = d
        .try_open_with(api::OpenSessionRequest {
            cwd: cwd.path().display().to_string(),
            mode: RO as i32,
            network_mode: api::NetworkMode::Proxy as i32,
            allow_domains: vec!["example.com".into()],
            env: common::session_env(cwd.path()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("egress proxy") && err.message().contains("root"),
        "{}",
        err.message()
    );
    // A plain session still opens.
    d.open_with(api::OpenSessionRequest {
        cwd: cwd.path().display().to_string(),
        mode: RO as i32,
        env: common::session_env(cwd.path()),
        ..Default::default()
    })
    .await;
}
