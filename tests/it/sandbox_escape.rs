//! The escape suite (spec/sandbox.md §8): every case runs through a real daemon over gRPC, proves
//! the baseline outside the sandbox first, attempts the escape, checks the host afterwards, and
//! checks that the allowed path still works. CI runs it as root; nothing is skipped there.
//!
//! Most cases run twice (see `on_both_daemons!`): against a root daemon, and against the
//! single-user daemon of an ordinary user, which has no root to build the sandbox with and uses
//! an unprivileged user namespace instead (DESIGN.md §1). The cases left out need root's
//! powers to mean anything (danger-full-access and root callers).

use crate::common::{self, Daemon, Listener, RunAs, outside, scratch};
use corral::api::{self, SandboxMode};
use std::os::unix::fs::MetadataExt;
use std::time::Duration;

const RO: SandboxMode = SandboxMode::ReadOnly;
const WW: SandboxMode = SandboxMode::WorkspaceWrite;
const DFA: SandboxMode = SandboxMode::DangerFullAccess;

fn denied(out: &str) -> bool {
    let o = out.to_lowercase();
    o.contains("permission denied")
        || o.contains("read-only file system")
        || o.contains("operation not permitted")
}

async fn ww_session(d: &Daemon, cwd: &std::path::Path, roots: &[&std::path::Path]) -> String {
    d.open_with(api::OpenSessionRequest {
        cwd: cwd.display().to_string(),
        mode: WW as i32,
        writable_roots: roots.iter().map(|p| p.display().to_string()).collect(),
        ..Default::default()
    })
    .await
}

common::on_both_daemons! {
    "esc";
    read_only_reads_everything_and_writes_nothing,
    network_off_reaches_nothing,
    workspace_write_writes_only_inside_its_roots,
    protected_paths_are_read_only,
    symlinked_protected_path_refuses_the_session,
    no_moves_out_no_devices_no_metadata_changes,
    hostname_and_processes_are_out_of_reach,
    timeout_kills_and_is_not_a_denial,
    network_on_reaches_the_host_but_not_vsock_io_uring_or_ptrace,
    descriptors_proc_tricks_and_corral_state,
    network_on_cannot_reach_host_abstract_sockets,
    hard_links_across_roots_are_cross_device,
    a_worktree_gitdir_in_another_root_stays_read_only,
    #[cfg(target_arch = "x86_64")]
    foreign_architecture_syscalls_are_killed,
    racing_to_swap_the_git_dir_fails,
    commands_have_no_controlling_terminal,
}

// Cases 1–8: reads work, writes do not, the layers are visibly in force.
async fn read_only_reads_everything_and_writes_nothing(who: &RunAs) {
    let d = who.start(&[]).await;
    let cwd = who.scratch();
    let id = d.open(cwd.path(), RO).await;

    // 1: reading works.
    let r = d
        .sh(&id, "ls -l /bin >/dev/null && cat /etc/os-release")
        .await;
    assert_eq!(r.exit_code, 0, "{}", r.output);
    assert!(r.output.contains("ID="));

    // 2: no write in the cwd, even as root. Baseline: the host can.
    let f = cwd.path().join("f");
    assert_eq!(
        who.host_sh(&format!("echo x > {0} && rm {0}", f.display()))
            .0,
        0
    );
    let r = d.sh(&id, &format!("echo x > {}", f.display())).await;
    assert_ne!(r.exit_code, 0);
    assert!(denied(&r.output), "{}", r.output);
    assert!(!f.exists());

    // 3: nor in /tmp.
    let t = std::path::PathBuf::from(format!("/tmp/corral-ro-{}", std::process::id()));
    let r = d.sh(&id, &format!("echo x > {}", t.display())).await;
    assert_ne!(r.exit_code, 0);
    assert!(!t.exists());

    // 4: the harmless devices work.
    let r = d
        .sh(
            &id,
            "echo x > /dev/null; head -c1 /dev/urandom >/dev/null; echo hi > /dev/stdout",
        )
        .await;
    assert_eq!((r.exit_code, r.output.as_str()), (0, "hi\n"));

    // 5: a minimal /dev.
    let r = d
        .sh(&id, "for n in null zero full random urandom tty; do test -c /dev/$n || exit 1; done; ls /dev")
        .await;
    assert_eq!(r.exit_code, 0, "{}", r.output);
    for absent in ["sda", "vda", "mem", "kmsg", "loop0"] {
        assert!(
            !r.output.lines().any(|l| l == absent),
            "/dev/{absent} visible: {}",
            r.output
        );
    }

    // 6, 7, 8: no_new_privs, no capabilities, seccomp filter mode.
    let r = d
        .sh(
            &id,
            "grep -E '^(NoNewPrivs|Seccomp|Cap(Inh|Prm|Eff|Bnd|Amb)):' /proc/self/status",
        )
        .await;
    assert!(r.output.contains("NoNewPrivs:\t1"), "{}", r.output);
    assert!(r.output.contains("Seccomp:\t2"), "{}", r.output);
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert!(
            r.output.contains(&format!("{set}:\t0000000000000000")),
            "{set}: {}",
            r.output
        );
    }
    // Baseline: the test process itself (root in CI) holds capabilities.
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    if nix::unistd::geteuid().is_root() {
        assert!(!status.contains("CapEff:\t0000000000000000"));
    }
}

// Cases 9–16: the network is off.
async fn network_off_reaches_nothing(who: &RunAs) {
    let d = who.start(&[]).await;
    let cwd = who.scratch();
    let id = d.open(cwd.path(), RO).await;
    let listener = Listener::start();
    // Baseline: the host reaches the listener.
    let (code, _) = who.host_sh(&format!("echo hi >/dev/tcp/127.0.0.1/{}", listener.port));
    assert_eq!(code, 0);
    std::thread::sleep(Duration::from_millis(100));
    let before = listener.accepted();
    assert_eq!(before, 1);

    // 10: bash's /dev/tcp: refused by seccomp (EPERM), not by a closed port.
    let r = d
        .sh(
            &id,
            &format!("echo hi >/dev/tcp/127.0.0.1/{}", listener.port),
        )
        .await;
    assert_ne!(r.exit_code, 0);
    assert!(r.output.contains("Operation not permitted"), "{}", r.output);

    // 11, 12: IP, raw, netlink, packet and vsock sockets are refused with EPERM.
    let py = r#"
import socket, errno
fams = [("inet", socket.AF_INET, socket.SOCK_STREAM, 0), ("inet6", socket.AF_INET6, socket.SOCK_DGRAM, 0),
        ("netlink", socket.AF_NETLINK, socket.SOCK_RAW, 0), ("packet", socket.AF_PACKET, socket.SOCK_RAW, 0),
        ("vsock", socket.AF_VSOCK, socket.SOCK_STREAM, 0), ("mptcp", socket.AF_INET, socket.SOCK_STREAM, 262)]
for name, fam, typ, proto in fams:
    try:
        socket.socket(fam, typ, proto); print(name, "CREATED")
    except OSError as e:
        print(name, e.errno)
a, b = socket.socketpair(); a.send(b"x"); print("pair", b.recv(1))
"#;
    let r = d
        .shell(api::ShellRequest {
            session_id: id.clone(),
            command: vec!["python3".into(), "-c".into(), py.into()],
            ..Default::default()
        })
        .await;
    for name in ["inet", "inet6", "netlink", "packet", "vsock", "mptcp"] {
        assert!(
            r.output.contains(&format!("{name} 1\n")),
            "{name}: {}",
            r.output
        );
    }
    // 13: socketpair still works.
    assert!(r.output.contains("pair b'x'"), "{}", r.output);
    assert_eq!(listener.accepted(), before, "the listener was reached");

    // 14: a host UNIX socket outside the sandbox: baseline connects, the sandbox cannot.
    let out = who.outside();
    let sock = out.path().join("host.sock");
    let ul = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    // Connecting needs write permission on the socket: the baseline runs as the sandbox's uid.
    who.own(&sock);
    ul.set_nonblocking(true).unwrap();
    let connect = format!(
        "python3 -c \"import socket;s=socket.socket(socket.AF_UNIX);s.connect('{}');print('connected')\"",
        sock.display()
    );
    let (code, _) = who.host_sh(&connect);
    assert_eq!(code, 0);
    assert!(ul.accept().is_ok(), "baseline connection accepted");
    let r = d.sh(&id, &format!("{connect} 2>&1 | tail -1")).await;
    assert!(r.output.contains("Errno 1"), "{}", r.output);
    assert!(ul.accept().is_err(), "the sandbox reached the host socket");

    // 15, 18, 19: io_uring_setup, process_vm_readv and x32 syscalls are refused with EPERM.
    let py = r#"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
def call(nr, *args):
    r = libc.syscall(nr, *args); return r, ctypes.get_errno()
print("io_uring", call(425, 8, ctypes.create_string_buffer(120)))
print("vm_readv", call(310, os.getpid(), 0, 0, 0, 0, 0))
print("x32_getpid", call(0x40000000 | 39))
print("x32_socket", call(0x40000000 | 41, 2, 1, 0))
"#;
    let r = d
        .shell(api::ShellRequest {
            session_id: id.clone(),
            command: vec!["python3".into(), "-c".into(), py.into()],
            ..Default::default()
        })
        .await;
    for name in ["io_uring", "vm_readv", "x32_getpid", "x32_socket"] {
        assert!(
            r.output.contains(&format!("{name} (-1, 1)")),
            "{name}: {}",
            r.output
        );
    }
    // Baseline: on the host io_uring_setup returns a ring and x32 is ENOSYS (38) or works.
    let (_, host) = who.host_sh(&format!("python3 -c '{}'", py.replace('\'', "\"")));
    assert!(!host.contains("x32_getpid (-1, 1)"), "{host}");

    // 17: ptrace is denied (strace cannot attach), when strace is installed.
    if who.host_sh("command -v strace").0 == 0 {
        let r = d.sh(&id, "strace -f true").await;
        assert_ne!(r.exit_code, 0);
        assert!(r.output.contains("Operation not permitted"), "{}", r.output);
    }
    // 17 (env): the sandbox tells tools the network is off.
    let r = d.sh(&id, "echo $CODEX_SANDBOX_NETWORK_DISABLED").await;
    assert_eq!(r.output, "1\n");
}

// Cases 21–25: workspace-write writes only inside its roots.
async fn workspace_write_writes_only_inside_its_roots(who: &RunAs) {
    let d = who.start(&[]).await;
    let cwd = who.scratch();
    let r2 = who.scratch();
    let out = who.outside();
    let existing = out.path().join("existing");
    who.write(&existing, "keep\n");
    let id = ww_session(&d, cwd.path(), &[r2.path()]).await;

    // 21, 22: the cwd and an extra root are writable.
    let r = d.sh(&id, "echo x > f && cat f").await;
    assert_eq!((r.exit_code, r.output.as_str()), (0, "x\n"));
    assert_eq!(
        std::fs::read_to_string(cwd.path().join("f")).unwrap(),
        "x\n"
    );
    let r = d
        .sh(&id, &format!("echo x > {}/f", r2.path().display()))
        .await;
    assert_eq!(r.exit_code, 0, "{}", r.output);
    assert_eq!(std::fs::read_to_string(r2.path().join("f")).unwrap(), "x\n");

    // 23: outside the roots nothing is created or changed (baseline: the host can).
    assert_eq!(
        who.host_sh(&format!(
            "echo x > {0}/probe && rm {0}/probe",
            out.path().display()
        ))
        .0,
        0
    );
    let r = d
        .sh(
            &id,
            &format!(
                "echo x > {0}/outside; echo x >> {0}/existing",
                out.path().display()
            ),
        )
        .await;
    assert!(denied(&r.output), "{}", r.output);
    assert!(!out.path().join("outside").exists());
    assert_eq!(std::fs::read_to_string(&existing).unwrap(), "keep\n");

    // 24: /tmp is writable by default, not with exclude_slash_tmp.
    let t1 = format!("/tmp/corral-ww-{}-a", std::process::id());
    let r = d.sh(&id, &format!("echo x > {t1}")).await;
    assert_eq!(r.exit_code, 0, "{}", r.output);
    assert!(std::path::Path::new(&t1).exists());
    std::fs::remove_file(&t1).unwrap();
    let id2 = d
        .open_with(api::OpenSessionRequest {
            cwd: cwd.path().display().to_string(),
            mode: WW as i32,
            exclude_slash_tmp: true,
            ..Default::default()
        })
        .await;
    let t2 = format!("/tmp/corral-ww-{}-b", std::process::id());
    let r = d.sh(&id2, &format!("echo x > {t2}")).await;
    assert_ne!(r.exit_code, 0);
    assert!(!std::path::Path::new(&t2).exists());

    // 25: $TMPDIR from the session environment is a root unless excluded.
    let tmpdir = tempfile::tempdir_in("/var/tmp").unwrap();
    who.own(tmpdir.path());
    for (exclude, allowed) in [(false, true), (true, false)] {
        let id = d
            .open_with(api::OpenSessionRequest {
                cwd: cwd.path().display().to_string(),
                mode: WW as i32,
                exclude_slash_tmp: true,
                exclude_tmpdir_env_var: exclude,
                env: [("TMPDIR".to_string(), tmpdir.path().display().to_string())].into(),
                ..Default::default()
            })
            .await;
        let r = d.sh(&id, "echo x > \"$TMPDIR/f\"").await;
        assert_eq!(r.exit_code == 0, allowed, "exclude={exclude}: {}", r.output);
        assert_eq!(tmpdir.path().join("f").exists(), allowed);
        let _ = std::fs::remove_file(tmpdir.path().join("f"));
    }
}

fn git_repo(who: &RunAs, dir: &std::path::Path) {
    let (code, out) = who.host_sh(&format!(
        "cd {} && git init -q && mkdir -p .codex .agents && echo c > .codex/config.toml",
        dir.display()
    ));
    assert_eq!(code, 0, "{out}");
}

fn tree_hash(who: &RunAs, dir: &std::path::Path) -> String {
    who.host_sh(&format!(
        "cd {} && find . -type f -exec sha256sum {{}} + | sort",
        dir.display()
    ))
    .1
}

// Cases 26, 27, 31: protected paths stay read-only.
async fn protected_paths_are_read_only(who: &RunAs) {
    let d = who.start(&[]).await;
    let cwd = who.scratch();
    git_repo(who, cwd.path());
    let git_before = tree_hash(who, &cwd.path().join(".git"));
    let codex_before = tree_hash(who, &cwd.path().join(".codex"));
    let id = ww_session(&d, cwd.path(), &[]).await;

    for script in [
        "echo x > .git/config",
        "echo x > .git/hooks/pre-commit",
        "echo x > .codex/config.toml",
        "mkdir -p .agents/skills && echo x > .agents/skills/x",
        "rm -rf .git && mkdir .git && echo x > .git/config",
        "mv .git moved",
    ] {
        let r = d.sh(&id, script).await;
        assert_ne!(r.exit_code, 0, "{script}: {}", r.output);
    }
    assert_eq!(tree_hash(who, &cwd.path().join(".git")), git_before);
    assert_eq!(tree_hash(who, &cwd.path().join(".codex")), codex_before);
    assert!(!cwd.path().join(".agents/skills").exists());
    assert!(!cwd.path().join("moved").exists());
    // The rest of the workspace stays writable, and git can still read the repository.
    let r = d
        .sh(&id, "echo ok > notes.txt && git status --porcelain")
        .await;
    assert_eq!(r.exit_code, 0, "{}", r.output);
    assert!(r.output.contains("notes.txt"));
}

// Case 30: a protected name that is a symlink into a writable root refuses the session.
async fn symlinked_protected_path_refuses_the_session(who: &RunAs) {
    let d = who.start(&[]).await;
    let cwd = who.scratch();
    std::fs::create_dir(cwd.path().join("decoy")).unwrap();
    std::os::unix::fs::symlink(cwd.path().join("decoy"), cwd.path().join(".codex")).unwrap();
    let err = d.try_open(cwd.path(), WW).await.unwrap_err();
    let real = std::fs::canonicalize(cwd.path()).unwrap();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert_eq!(
        err.message(),
        format!(
            "cannot enforce sandbox read-only path {0}/.codex because it crosses writable symlink {0}/.codex",
            real.display()
        )
    );
    assert!(!err.message().contains("panicked"));
}

// Cases 32–34: no moves out, no device nodes, no metadata changes outside the roots.
async fn no_moves_out_no_devices_no_metadata_changes(who: &RunAs) {
    let d = who.start(&[]).await;
    let cwd = who.scratch();
    let out = who.outside();
    who.write(&cwd.path().join("file"), "data");
    let target = out.path().join("target");
    who.write(&target, "target");
    let id = ww_session(&d, cwd.path(), &[]).await;

    // 32a: moving a file out of the root.
    let r = d
        .sh(&id, &format!("mv file {}/", out.path().display()))
        .await;
    assert_ne!(r.exit_code, 0);
    assert!(cwd.path().join("file").exists());
    assert!(!out.path().join("file").exists());
    // 32b: a hard link to an outside file, then writing through it.
    let r = d
        .sh(
            &id,
            &format!("ln {} hard && echo x >> hard", target.display()),
        )
        .await;
    assert_ne!(r.exit_code, 0);
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "target");

    // 33: device nodes cannot be created, even as root (baseline: the host can, when root).
    if who.is_root() {
        let node = out.path().join("node");
        assert_eq!(
            who.host_sh(&format!("mknod {0} c 1 3 && rm {0}", node.display()))
                .0,
            0
        );
    }
    let r = d.sh(&id, "mknod c c 1 3; mknod b b 8 0; ls").await;
    assert!(
        !r.output.lines().any(|l| l == "c" || l == "b"),
        "{}",
        r.output
    );
    assert!(!cwd.path().join("c").exists() && !cwd.path().join("b").exists());

    // 34: chmod, chown, touch and xattrs outside the roots (baseline first, then restore).
    let meta = std::fs::metadata(&target).unwrap();
    assert_eq!(
        who.host_sh(&format!(
            "chmod 777 {0} && chmod {1:o} {0}",
            target.display(),
            meta.mode() & 0o7777
        ))
        .0,
        0
    );
    let r = d
        .sh(
            &id,
            &format!(
                "chmod 777 {0}; chown 1:1 {0}; touch -d 2000-01-01 {0}",
                target.display()
            ),
        )
        .await;
    assert!(denied(&r.output), "{}", r.output);
    let after = std::fs::metadata(&target).unwrap();
    assert_eq!(
        (after.mode(), after.uid(), after.gid(), after.mtime()),
        (meta.mode(), meta.uid(), meta.gid(), meta.mtime())
    );
}

// Cases 35, 36: host-global state and other processes are out of reach.
async fn hostname_and_processes_are_out_of_reach(who: &RunAs) {
    let d = who.start(&[]).await;
    let cwd = who.scratch();
    let id = ww_session(&d, cwd.path(), &[]).await;
    let host_name = nix::unistd::gethostname().unwrap();
    let r = d
        .sh(
            &id,
            "hostname corral-pwned; unshare -U true; mount -t tmpfs none /mnt; echo done",
        )
        .await;
    assert!(r.output.contains("done"));
    assert_eq!(
        nix::unistd::gethostname().unwrap(),
        host_name,
        "host hostname changed"
    );
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(" /mnt "), "a mount leaked to the host");

    // 36: the daemon is invisible and cannot be signalled; /proc shows only the sandbox.
    let r = d
        .sh(
            &id,
            &format!(
                // One pipe for both: stdout and stderr are separate pipes, and when both have
                // data at one wake-up the combined output may put kill's message last.
                "kill -0 {} 2>&1; ls /proc | grep -E '^[0-9]+$' | wc -l",
                d.pid()
            ),
        )
        .await;
    assert!(r.output.contains("No such process"), "{}", r.output);
    let count: usize = r
        .output
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("no count last: {}", r.output));
    assert!(count < 10, "{count} processes visible");
    // The daemon is alive and serving.
    let r = d.sh(&id, "echo alive").await;
    assert_eq!(r.output, "alive\n");
}

// Case 37: a timeout is a timeout, not a denial, and leaves nothing behind.
async fn timeout_kills_and_is_not_a_denial(who: &RunAs) {
    let d = who.start(&[]).await;
    let cwd = who.scratch();
    let id = ww_session(&d, cwd.path(), &[]).await;
    let r = d
        .shell(api::ShellRequest {
            session_id: id,
            command: vec!["bash".into(), "-c".into(), "sleep 2.5".into()],
            timeout_ms: Some(50),
            ..Default::default()
        })
        .await;
    assert_eq!(r.exit_code, 124);
    assert!(r.response.timed_out);
    assert!(!r.response.sandbox_denied);
    assert!(
        r.response
            .text
            .starts_with(r#"{"output":"command timed out after "#),
        "{}",
        r.response.text
    );
    let (_, ps) = who.host_sh("ps -eo args");
    assert!(!ps.lines().any(|l| l == "sleep 2.5"), "sleep survived");
}

// Case 38: network on: the host network is reachable, the dangerous calls still are not.
async fn network_on_reaches_the_host_but_not_vsock_io_uring_or_ptrace(who: &RunAs) {
    let d = who.start(&[]).await;
    let cwd = who.scratch();
    let listener = Listener::start();
    let id = d
        .open_with(api::OpenSessionRequest {
            cwd: cwd.path().display().to_string(),
            mode: WW as i32,
            network_access: true,
            ..Default::default()
        })
        .await;
    let r = d
        .sh(
            &id,
            &format!("echo hi >/dev/tcp/127.0.0.1/{}", listener.port),
        )
        .await;
    assert_eq!(r.exit_code, 0, "{}", r.output);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(listener.accepted(), 1);
    let py = r#"
import ctypes, socket
libc = ctypes.CDLL(None, use_errno=True)
try:
    socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM); print("vsock CREATED")
except OSError as e:
    print("vsock", e.errno)
r = libc.syscall(425, 8, ctypes.create_string_buffer(120)); print("io_uring", r, ctypes.get_errno())
"#;
    let r = d
        .shell(api::ShellRequest {
            session_id: id.clone(),
            command: vec!["python3".into(), "-c".into(), py.into()],
            ..Default::default()
        })
        .await;
    assert!(r.output.contains("vsock 1\n"), "{}", r.output);
    assert!(r.output.contains("io_uring -1 1\n"), "{}", r.output);
    let r = d
        .sh(&id, "echo ${CODEX_SANDBOX_NETWORK_DISABLED:-unset}")
        .await;
    assert_eq!(r.output, "unset\n");
}

// Case 39: danger-full-access adds no sandbox.
#[tokio::test]
async fn danger_full_access_is_unconfined() {
    let d = Daemon::start(&["--root-callers", "trusted"]).await;
    let cwd = scratch();
    let out = outside();
    let id = d.open(cwd.path(), DFA).await;
    let r = d
        .sh(
            &id,
            &format!(
                "echo x > {}/f && grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status",
                out.path().display()
            ),
        )
        .await;
    assert_eq!(r.exit_code, 0, "{}", r.output);
    assert!(out.path().join("f").exists());
    let own = std::fs::read_to_string("/proc/self/status").unwrap();
    let own_seccomp = own.lines().find(|l| l.starts_with("Seccomp:")).unwrap();
    assert!(r.output.contains(own_seccomp), "{}", r.output);
    assert!(r.output.contains("NoNewPrivs:\t0"), "{}", r.output);
}

// E4, E5, E7, E8: descriptors, /proc tricks, corral's own state, the worker's memory.
async fn descriptors_proc_tricks_and_corral_state(who: &RunAs) {
    let d = who.start(&[]).await;
    let cwd = who.scratch();
    let out = who.outside();
    let ro = out.path().join("ro.txt");
    who.write(&ro, "original");
    let id = d.open(cwd.path(), RO).await;

    // E4: only 0, 1, 2 (and ls's own directory descriptor).
    let r = d.sh(&id, "ls /proc/self/fd").await;
    let fds: Vec<&str> = r.output.lines().collect();
    assert!(
        fds.len() <= 4 && fds.starts_with(&["0", "1", "2"]),
        "{fds:?}"
    );

    // E5: writing through /proc/self/fd and /proc/self/root.
    let r = d
        .sh(
            &id,
            &format!(
                "exec 3<{0}; echo x > /proc/self/fd/3; echo x > /proc/self/root{0}",
                ro.display()
            ),
        )
        .await;
    assert_ne!(r.exit_code, 0);
    assert_eq!(std::fs::read_to_string(&ro).unwrap(), "original");

    // E7: the daemon's socket directory is masked.
    let sock_dir = d.socket.parent().unwrap();
    let r = d
        .sh(
            &id,
            &format!(
                "ls -A {0}; test -S {1} && echo SOCKET",
                sock_dir.display(),
                d.socket.display()
            ),
        )
        .await;
    assert!(
        !r.output.contains("SOCKET") && !r.output.contains("corral.sock"),
        "{}",
        r.output
    );
    assert!(
        d.socket.exists(),
        "baseline: the socket is there on the host"
    );

    // E8: the worker's memory.
    let r = d
        .sh(&id, "head -c 16 /proc/1/mem >/dev/null && echo READ")
        .await;
    assert!(!r.output.contains("READ"), "{}", r.output);
}

// Root callers are confined by default: no danger-full-access, no escalation.
#[tokio::test]
async fn root_callers_are_confined_by_default() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs a root caller");
        return;
    }
    let d = Daemon::start(&["--allow-escalation"]).await;
    let cwd = scratch();
    let err = d.try_open(cwd.path(), DFA).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
    assert!(err.message().contains("root_callers"), "{}", err.message());
    let id = d.open(cwd.path(), RO).await;
    let (out, ok) = d
        .invoke(
            &id,
            "shell",
            r#"{"command":["touch","x"],"sandbox_permissions":"require_escalated"}"#,
        )
        .await;
    assert!(!ok);
    assert!(out.starts_with("approval policy is Never"), "{out}");
    assert!(!cwd.path().join("x").exists());
}

// E1: with the network on, abstract UNIX sockets of the host are still out of reach (Landlock's
// abstract-socket scope), while the host's TCP loopback is reachable.
async fn network_on_cannot_reach_host_abstract_sockets(who: &RunAs) {
    use std::os::linux::net::SocketAddrExt;
    let name = format!("corral-e1-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let listener = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
    listener.set_nonblocking(true).unwrap();
    let connect = format!(
        "python3 -c \"import socket;s=socket.socket(socket.AF_UNIX);s.connect('\\0{name}');print('connected')\""
    );
    // Baseline: the host connects.
    let (code, out) = who.host_sh(&connect);
    assert_eq!(code, 0, "{out}");
    assert!(listener.accept().is_ok());

    let d = who.start(&[]).await;
    let cwd = who.scratch();
    let id = d
        .open_with(api::OpenSessionRequest {
            cwd: cwd.path().display().to_string(),
            mode: WW as i32,
            network_access: true,
            ..Default::default()
        })
        .await;
    let r = d.sh(&id, &format!("{connect} 2>&1 | tail -1")).await;
    assert!(
        r.output.contains("Errno 1") || r.output.contains("Operation not permitted"),
        "{}",
        r.output
    );
    assert!(
        listener.accept().is_err(),
        "the sandbox reached the host's abstract socket"
    );
}

// §8.2 case 32(c): each writable root is its own mount, so a hard link across roots fails with
// EXDEV (asserted so that a change of the mount layout is noticed).
async fn hard_links_across_roots_are_cross_device(who: &RunAs) {
    let d = who.start(&[]).await;
    let cwd = who.scratch();
    // Owned by the sandbox's uid: the kernel's protected_hardlinks refuses linking another
    // user's file with EPERM before the mount layout is reached.
    who.write(&cwd.path().join("file"), "data");
    let id = ww_session(&d, cwd.path(), &[]).await;
    let target = format!("/tmp/corral-hard-{}", std::process::id());
    let r = d.sh(&id, &format!("ln file {target}")).await;
    assert_ne!(r.exit_code, 0);
    assert!(
        r.output.contains("Invalid cross-device link"),
        "{}",
        r.output
    );
    assert!(!std::path::Path::new(&target).exists());
}

// §8.2 case 29: a worktree's `.git` file points at a gitdir in another writable root; that
// gitdir stays read-only.
async fn a_worktree_gitdir_in_another_root_stays_read_only(who: &RunAs) {
    let d = who.start(&[]).await;
    let cwd = who.scratch();
    let r2 = who.scratch();
    let wt = r2.path().join("wt");
    std::fs::create_dir(&wt).unwrap();
    who.write(&wt.join("HEAD"), "ref: refs/heads/main\n");
    who.own(&wt);
    std::fs::write(
        cwd.path().join(".git"),
        format!("gitdir: {}\n", wt.display()),
    )
    .unwrap();
    let id = ww_session(&d, cwd.path(), &[r2.path()]).await;
    let r = d
        .sh(
            &id,
            &format!(
                "touch {0}/x; echo x >> {0}/HEAD; echo ok > {1}/other",
                wt.display(),
                r2.path().display()
            ),
        )
        .await;
    assert!(denied(&r.output), "{}", r.output);
    assert!(!wt.join("x").exists());
    assert_eq!(
        std::fs::read_to_string(wt.join("HEAD")).unwrap(),
        "ref: refs/heads/main\n"
    );
    // The rest of that root is writable.
    assert!(r2.path().join("other").exists());
}

// §8.2 case 20: the i386 syscall entry (int 0x80) kills the process (SIGSYS, exit 159) instead of
// bypassing the x86_64 rules.
#[cfg(target_arch = "x86_64")]
async fn foreign_architecture_syscalls_are_killed(who: &RunAs) {
    if who.host_sh("command -v cc").0 != 0 {
        panic!("a C compiler is required for this test (CI machines have gcc)");
    }
    let dir = who.outside();
    let src = dir.path().join("i386.c");
    std::fs::write(
        &src,
        "int main(void) { long r; __asm__ volatile (\"int $0x80\" : \"=a\"(r) : \"a\"(359), \"b\"(2), \"c\"(1), \"d\"(0) : \"memory\"); return r >= 0 ? 0 : 3; }\n",
    )
    .unwrap();
    let bin = dir.path().join("i386");
    let (code, out) = who.host_sh(&format!("cc -O0 -o {} {}", bin.display(), src.display()));
    assert_eq!(code, 0, "{out}");
    // Baseline: outside the sandbox the i386 socket call returns a socket (IA32 emulation on) or
    // fails normally (off) — either way the process lives.
    let (host_code, _) = who.host_sh(&bin.display().to_string());
    if host_code >= 128 {
        // The kernel has no IA32 emulation (int 0x80 faults everywhere): nothing to bypass.
        eprintln!("skipped: this kernel has no IA32 syscall entry (int 0x80 -> {host_code})");
        return;
    }
    assert!(host_code == 0 || host_code == 3, "host: {host_code}");
    let d = who.start(&[]).await;
    let cwd = who.scratch();
    let id = d.open(cwd.path(), RO).await;
    let r = d
        .shell(api::ShellRequest {
            session_id: id,
            command: vec![bin.display().to_string()],
            ..Default::default()
        })
        .await;
    assert_eq!(r.exit_code, 159, "{}", r.output);
    assert!(r.response.sandbox_denied);
}

// E6: racing to swap `.git` for a decoy (mv, ln -sfn) while writing `.git/config` gets nowhere:
// the read-only bind mount cannot be moved or replaced.
async fn racing_to_swap_the_git_dir_fails(who: &RunAs) {
    let d = who.start(&[]).await;
    let cwd = who.scratch();
    git_repo(who, cwd.path());
    let before = tree_hash(who, &cwd.path().join(".git"));
    let id = ww_session(&d, cwd.path(), &[]).await;
    let script = "mkdir -p decoy; echo evil > decoy/config; \
        ( for i in $(seq 1000); do mv .git g 2>/dev/null && mv decoy .git 2>/dev/null; \
          ln -sfn decoy .git 2>/dev/null; done ) & \
        for i in $(seq 1000); do echo x >> .git/config 2>/dev/null; done; wait; echo raced";
    let r = d
        .shell(api::ShellRequest {
            session_id: id,
            command: vec!["bash".into(), "-c".into(), script.into()],
            timeout_ms: Some(60_000),
            ..Default::default()
        })
        .await;
    assert!(r.output.contains("raced"), "{}", r.output);
    assert_eq!(
        tree_hash(who, &cwd.path().join(".git")),
        before,
        ".git changed"
    );
    assert!(cwd.path().join(".git").is_dir() && !cwd.path().join(".git").is_symlink());
    assert!(!cwd.path().join("g").exists());
}

// E3 (shell part): a command has no controlling terminal, so it cannot inject keystrokes.
async fn commands_have_no_controlling_terminal(who: &RunAs) {
    let d = who.start(&[]).await;
    let cwd = who.scratch();
    let id = d.open(cwd.path(), RO).await;
    let r = d
        .sh(
            &id,
            "ps -o tty= -p $$; test -e /dev/tty && (exec 3</dev/tty) 2>&1 | head -1",
        )
        .await;
    assert!(r.output.starts_with('?'), "{}", r.output);
}
