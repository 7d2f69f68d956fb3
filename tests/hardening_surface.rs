//! H26: the surface the November 27 review did not reach, attacked here, each with a baseline
//! on the host first.

mod common;

use common::{Daemon, TestUser, connect_as, host_sh, scratch};
use corral::api;
use corral::api::SandboxMode;
use std::path::Path;
use std::time::Duration;

/// Pushes a byte into the terminal's input (TIOCSTI) and asks the console for a selection
/// paste (TIOCLINUX 6); prints how each went.
const TTY_INJECT: &str = "import fcntl, termios
for name, req, arg in (('TIOCSTI', termios.TIOCSTI, b'x'), ('TIOCLINUX', 0x541C, bytes([6]))):
    try:
        fcntl.ioctl(0, req, arg)
        print(name, 'ok')
    except OSError as e:
        print(name, 'errno', e.errno)
";

/// TIOCSTI and TIOCLINUX through `exec_command {tty: true}`: a command on a terminal must not
/// be able to type into it (what the terminal's reader — the user — would then run).
#[tokio::test]
async fn h26_a_tty_command_cannot_inject_terminal_input() {
    let script = scratch();
    let file = script.path().join("inject.py");
    std::fs::write(&file, TTY_INJECT).unwrap();
    // Baseline: on the host, as this (root) user, on a pty from script(1), TIOCSTI works.
    let (_, host) = host_sh(&format!(
        "script -qec 'python3 {}' /dev/null",
        file.display()
    ));
    let host_ok = host.contains("TIOCSTI ok");
    if !host_ok {
        eprintln!("note: TIOCSTI is refused on this host already: {host}");
    }
    let d = Daemon::start(&[]).await;
    let id = d.open(script.path(), SandboxMode::WorkspaceWrite).await;
    let (out, _) = d
        .invoke(
            &id,
            "exec_command",
            &serde_json::json!({"cmd": format!("python3 {}", file.display()), "tty": true,
                "login": false, "yield_time_ms": 5000})
            .to_string(),
        )
        .await;
    assert!(out.contains("TIOCSTI errno 1"), "{out}");
    assert!(out.contains("TIOCLINUX errno 1"), "{out}");
    // The allowed path: the terminal itself works (a size query).
    let (out, _) = d
        .invoke(
            &id,
            "exec_command",
            r#"{"cmd":"stty size","tty":true,"login":false,"yield_time_ms":5000}"#,
        )
        .await;
    assert!(out.contains("24 80"), "{out}");
}

// ---------------------------------------------------------------------------------------------
// The metrics endpoint.
// ---------------------------------------------------------------------------------------------

/// A free TCP port on the loopback.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET path` on the metrics port, as the local user `user` (curl run through setpriv): TCP
/// carries no identity, so any local user gets what this gets.
fn scrape_as(user: &TestUser, port: u16, path: &str) -> String {
    let out = std::process::Command::new("setpriv")
        .args([
            "--reuid",
            &user.name,
            "--regid",
            &user.name,
            "--init-groups",
            "--",
            "curl",
            "-s",
            "--max-time",
            "10",
            &format!("http://127.0.0.1:{port}{path}"),
        ])
        .output()
        .expect("curl");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A bridge call on `bridge`'s connection (another user's, here).
async fn invoke_as(
    bridge: &mut api::bridge_client::BridgeClient<tonic::transport::Channel>,
    session: &str,
    name: &str,
    arguments: serde_json::Value,
) -> api::InvokeResponse {
    bridge
        .invoke(api::InvokeRequest {
            session_id: session.into(),
            name: name.into(),
            arguments: arguments.to_string(),
            call_id: "c".into(),
            freeform: false,
        })
        .await
        .unwrap()
        .into_inner()
}

/// The distinct `tool` label values in a Prometheus text body.
fn tool_labels(body: &str) -> std::collections::BTreeSet<String> {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split("tool=\"").nth(1))
        .filter_map(|rest| rest.split('"').next())
        .map(String::from)
        .collect()
}

/// The metrics endpoint shows another local user nothing of a user's calls (session ids,
/// paths, commands, user names, and tool names the caller chose: an unknown tool's name is
/// the caller's text, and each new name would be a new series kept for the daemon's life),
/// and it serves nothing but metrics: neither corral.v1 nor anything else over its plain TCP.
/// The health port (plain TCP too) serves no corral.v1 service.
#[tokio::test]
async fn h26_b_metrics_show_no_users_data_and_serve_nothing_else() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: other users need root (CI runs as root)");
        return;
    }
    let alice = TestUser::create("ma");
    let bob = TestUser::create("mb");
    let (port, health) = (free_port(), free_port());
    let d = Daemon::start(&[
        "--metrics-listen",
        &format!("127.0.0.1:{port}"),
        "--health-listen",
        &format!("127.0.0.1:{health}"),
    ])
    .await;
    d.open_to_local_users();
    let marker = "zq7secretmarker";
    let project = alice.dir.join(format!("project-{marker}"));
    std::fs::create_dir(&project).unwrap();
    std::fs::write(project.join(format!("notes-{marker}.txt")), "x\n").unwrap();
    std::os::unix::fs::chown(&project, Some(alice.uid), Some(alice.gid)).unwrap();
    let channel = connect_as(&d.socket, alice.uid, alice.gid).await.unwrap();
    let id = api::sessions_client::SessionsClient::new(channel.clone())
        .open_session(api::OpenSessionRequest {
            cwd: project.display().to_string(),
            mode: SandboxMode::WorkspaceWrite as i32,
            env: common::session_env(&project),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .session_id;
    let mut bridge = api::bridge_client::BridgeClient::new(channel.clone());
    let r = invoke_as(&mut bridge, &id,
        "exec_command",
        serde_json::json!({"cmd": format!("echo run-{marker}; touch made-{marker}"), "yield_time_ms": 5000}),
    )
    .await;
    assert!(r.output.contains(&format!("run-{marker}")), "{}", r.output);
    invoke_as(
        &mut bridge,
        &id,
        "read_file",
        serde_json::json!({"file_path": format!("notes-{marker}.txt")}),
    )
    .await;
    // A sandbox denial (counted, by tool).
    invoke_as(
        &mut bridge,
        &id,
        "exec_command",
        serde_json::json!({"cmd": format!("touch /etc/denied-{marker}"), "yield_time_ms": 5000}),
    )
    .await;
    // Tool names of the caller's choosing: one with the marker, then many.
    let r = invoke_as(
        &mut bridge,
        &id,
        &format!("mcp__{marker}__create_issue"),
        serde_json::json!({}),
    )
    .await;
    assert!(!r.success, "{}", r.output);
    for i in 0..40 {
        invoke_as(
            &mut bridge,
            &id,
            &format!("zzname{i}"),
            serde_json::json!({}),
        )
        .await;
    }

    // Baseline (the allowed path): bob reads the counters; alice's calls are counted.
    let body = scrape_as(&bob, port, "/metrics");
    assert!(
        body.contains(r#"corral_calls_total{tool="exec_command",outcome="ok"}"#),
        "{body}"
    );
    assert!(
        body.contains(r#"corral_calls_total{tool="read_file",outcome="ok"} 1"#),
        "{body}"
    );
    // Nothing of alice's.
    for secret in [
        id.as_str(),
        marker,
        alice.name.as_str(),
        alice.dir.to_str().unwrap(),
        "zzname",
    ] {
        assert!(!body.contains(secret), "{secret:?} visible to bob:\n{body}");
    }
    assert!(
        !body.contains("uid=\"") && !body.contains("user=\""),
        "{body}"
    );
    // A bounded set of series whatever callers name: the known tools, and one for the rest.
    let labels = tool_labels(&body);
    assert!(labels.len() <= 24, "{labels:?}");
    // Other paths on the port show the same metrics or nothing; never more.
    for path in ["/", "/debug", "/metrics?session=x", "/../etc/passwd"] {
        let other = scrape_as(&bob, port, path);
        assert!(
            !other.contains(marker) && !other.contains(&id),
            "{path}: {other}"
        );
        assert!(!other.contains("root:x:0:0"), "{path}: {other}");
    }
    // Neither port serves corral.v1 over plain TCP: OpenSession there is refused or fails.
    for (p, what) in [(port, "metrics"), (health, "health")] {
        let attempt = async {
            let ch = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{p}"))
                .unwrap()
                .connect()
                .await
                .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
            api::sessions_client::SessionsClient::new(ch)
                .open_session(api::OpenSessionRequest {
                    cwd: "/".into(),
                    mode: SandboxMode::DangerFullAccess as i32,
                    ..Default::default()
                })
                .await
        };
        let r = tokio::time::timeout(Duration::from_secs(10), attempt).await;
        match r {
            Err(_) => {}
            Ok(Err(s)) => {
                if p == health {
                    assert_eq!(s.code(), tonic::Code::Unimplemented, "{what}: {s:?}");
                }
            }
            Ok(Ok(r)) => panic!("{what} port opened a session: {:?}", r.into_inner()),
        }
    }
    // Alice's own session still works (the allowed path after the attempts).
    let r = invoke_as(
        &mut bridge,
        &id,
        "exec_command",
        serde_json::json!({"cmd": "echo still", "yield_time_ms": 5000}),
    )
    .await;
    assert!(r.output.contains("still"), "{}", r.output);
    assert!(project.join(format!("made-{marker}")).exists());
}

// ---------------------------------------------------------------------------------------------
// `corral mcp`: the same rules as gRPC.
// ---------------------------------------------------------------------------------------------

/// A `bash` script that runs `corral --socket SOCKET mcp ARGS` as an MCP client would: the
/// handshake, then one `tools/call` of `tool` with `arguments`; it keeps stdin open until the
/// call's answer arrived (or the front failed; at most 20 s), then prints `rc=N` and everything the front wrote.
fn mcp_script(socket: &str, args: &str, tool: &str, arguments: serde_json::Value) -> String {
    let init = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "h26", "version": "1"}}});
    let inited = serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let call = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": tool, "arguments": arguments}});
    for m in [&init, &inited, &call] {
        assert!(!m.to_string().contains('\''), "quote-free JSON: {m}");
    }
    format!(
        "out=$(mktemp); {{ printf '%s\\n' '{init}' '{inited}' '{call}'; for i in $(seq 200); do \
         grep -q -e '\"id\":2' -e '^error' \"$out\" && break; sleep 0.1; done; }} | {CORRAL} --socket {socket} \
         mcp {args} > \"$out\" 2>&1; echo rc=$?; cat \"$out\"; rm -f \"$out\"",
        CORRAL = common::CORRAL
    )
}

/// H19 through the MCP front: a sandboxed command that reaches another daemon's socket (B, on
/// a non-default path inside its writable root) cannot use `corral mcp` there to get a wider
/// session — danger-full-access, or workspace-write rooted outside its own roots — nor
/// escalate a call in a session whose id it was given. Baseline: the same MCP exchange from
/// the host writes the mark through B each time.
#[tokio::test]
async fn h26_c_mcp_front_gives_a_sandbox_no_wider_session() {
    let a = Daemon::start(&[]).await;
    let ws = common::outside();
    let b_socket = ws.path().join("b/corral.sock");
    std::fs::create_dir(ws.path().join("b")).unwrap();
    let _b = Daemon::start_at(
        &b_socket,
        &["--root-callers", "trusted", "--allow-escalation"],
        &[],
        std::process::Stdio::null(),
    )
    .await;
    let b = b_socket.to_str().unwrap().to_string();
    let marks = common::outside();
    let mark = marks.path().join("escaped");
    let m = marks.path().to_str().unwrap().to_string();
    let touch =
        serde_json::json!({"cmd": format!("touch {}", mark.display()), "yield_time_ms": 5000});
    let escalated = serde_json::json!({"cmd": format!("touch {}", mark.display()),
        "sandbox_permissions": "require_escalated", "justification": "h26", "yield_time_ms": 5000});
    let (code, ro, err) = {
        let o = std::process::Command::new(common::CORRAL)
            .args([
                "--socket",
                &b,
                "open-session",
                "--mode",
                "read-only",
                "--cwd",
                &m,
            ])
            .output()
            .unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).trim().to_string(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    assert_eq!(code, Some(0), "{err}");
    let attempts = [
        (
            "danger-full-access",
            format!("--mode danger-full-access --cwd {m}"),
            &touch,
        ),
        (
            "workspace-write outside",
            format!("--mode workspace-write --exclude-slash-tmp --cwd {m}"),
            &touch,
        ),
        ("escalation", format!("--session {ro}"), &escalated),
    ];
    // Baselines on the host: each exchange writes the mark through B.
    for (what, args, arguments) in &attempts {
        let (_, out) = host_sh(&mcp_script(&b, args, "exec_command", (*arguments).clone()));
        assert!(out.contains("rc=0"), "{what}: {out}");
        assert!(mark.exists(), "{what}: the host's MCP exchange ran: {out}");
        std::fs::remove_file(&mark).unwrap();
    }
    // The same exchanges from inside a workspace-write sandbox of daemon A, network on (with
    // the network off, the sandbox cannot even connect to B's socket).
    let session = a
        .open_with(api::OpenSessionRequest {
            cwd: ws.path().display().to_string(),
            mode: SandboxMode::WorkspaceWrite as i32,
            network_access: true,
            env: common::session_env(ws.path()),
            ..Default::default()
        })
        .await;
    for (what, args, arguments) in &attempts {
        let r = a
            .sh(
                &session,
                &mcp_script(&b, args, "exec_command", (*arguments).clone()),
            )
            .await;
        // B's refusal, not a failure to reach it: H19's message for a new session, an error
        // result of the call for the escalation.
        assert!(
            r.output.contains("inside a corral sandbox")
                || (r.output.contains(r#""id":2"#) && r.output.contains(r#""isError":true"#)),
            "{what}: B must have answered with a refusal: {}",
            r.output
        );
        assert!(
            !mark.exists(),
            "{what}: a sandbox wrote outside its roots through B's MCP front: {}",
            r.output
        );
    }
    // The allowed path from the sandbox: the read-only session whose id it was given, used
    // through B's MCP front within that session's limits.
    let r = a
        .sh(
            &session,
            &mcp_script(
                &b,
                &format!("--session {ro}"),
                "exec_command",
                serde_json::json!({"cmd": "echo allowed-through-b", "yield_time_ms": 5000}),
            ),
        )
        .await;
    assert!(r.output.contains("rc=0"), "{}", r.output);
    assert!(r.output.contains("allowed-through-b"), "{}", r.output);
}

/// The MCP front gets the gRPC answer, word for word: a root caller (`root_callers =
/// confined`, the default) is refused danger-full-access by `corral mcp` as by OpenSession, and
/// an escalated exec_command in a session the front opened gets the same refusal as the same
/// call through Invoke; nothing is written on the host. The allowed path: a workspace-write
/// session through the front writes in its root.
#[tokio::test]
async fn h26_d_mcp_front_gets_the_same_policy_refusals_as_grpc() {
    let d = Daemon::start(&[]).await;
    let ws = common::outside();
    let w = ws.path().to_str().unwrap().to_string();
    let marks = common::outside();
    let mark = marks.path().join("escalated");
    // Baseline: this (root) process can write the mark.
    let (code, _) = host_sh(&format!("touch {0} && rm {0}", mark.display()));
    assert_eq!(code, 0);
    // gRPC first.
    let refused = d
        .try_open(ws.path(), SandboxMode::DangerFullAccess)
        .await
        .expect_err("root_callers = confined refuses danger-full-access");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    let (_, out) = host_sh(&mcp_script(
        d.target(),
        &format!("--mode danger-full-access --cwd {w}"),
        "exec_command",
        serde_json::json!({"cmd": format!("touch {}", mark.display())}),
    ));
    assert!(out.contains("rc=2"), "{out}");
    assert!(
        out.contains(&format!("PermissionDenied: {}", refused.message())),
        "the front's refusal is the gRPC one ({}): {out}",
        refused.message()
    );
    assert!(!mark.exists());
    // An escalated call: Invoke's answer, then the front's.
    let escalated = serde_json::json!({"cmd": format!("touch {}", mark.display()),
        "sandbox_permissions": "require_escalated", "justification": "h26", "yield_time_ms": 5000});
    let grpc_session = d.open(ws.path(), SandboxMode::WorkspaceWrite).await;
    let (grpc_text, ok) = d
        .invoke(&grpc_session, "exec_command", &escalated.to_string())
        .await;
    assert!(!ok, "{grpc_text}");
    assert!(!mark.exists(), "{grpc_text}");
    let (_, out) = host_sh(&mcp_script(
        d.target(),
        &format!("--mode workspace-write --cwd {w}"),
        "exec_command",
        escalated.clone(),
    ));
    assert!(!mark.exists(), "the front escalated: {out}");
    let answer: serde_json::Value = out
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|m| m["id"] == 2)
        .unwrap_or_else(|| panic!("no answer: {out}"));
    assert_eq!(answer["result"]["isError"], true, "{out}");
    assert_eq!(
        answer["result"]["content"][0]["text"], grpc_text,
        "the front answers as Invoke does"
    );
    // The allowed path through the front.
    let made = ws.path().join("made-through-mcp");
    let (_, out) = host_sh(&mcp_script(
        d.target(),
        &format!("--mode workspace-write --cwd {w}"),
        "exec_command",
        serde_json::json!({"cmd": "touch made-through-mcp", "yield_time_ms": 5000}),
    ));
    assert!(out.contains("rc=0") && made.exists(), "{out}");
}

// ---------------------------------------------------------------------------------------------
// RENAME_EXCHANGE, O_PATH and openat2 against pinned roots and protected names.
// ---------------------------------------------------------------------------------------------

/// `python3 FS_ATTACK OP ARGS...` prints `OP=ERRNO` (0: it worked) for: `exchange A B`
/// (renameat2 RENAME_EXCHANGE), `rename A B`, `opath_write FILE` (an O_PATH descriptor, then a
/// write through its /proc/self/fd link), `opath_create DIR NAME` (an O_PATH descriptor of a
/// directory, then openat O_CREAT below it), `openat2_write FILE` and `openat2_create FILE`
/// (openat2 with RESOLVE_NO_MAGICLINKS|RESOLVE_NO_SYMLINKS).
const FS_ATTACK: &str = r#"import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD = -100
NR = {'x86_64': (316, 437), 'aarch64': (276, 437)}[os.uname().machine]
class How(ctypes.Structure):
    _fields_ = [('flags', ctypes.c_uint64), ('mode', ctypes.c_uint64), ('resolve', ctypes.c_uint64)]
def sys_(n, *a):
    r = libc.syscall(n, *a)
    return r if r >= 0 else -ctypes.get_errno()
def run(op, a):
    try:
        if op in ('exchange', 'rename'):
            r = sys_(NR[0], AT_FDCWD, a[0].encode(), AT_FDCWD, a[1].encode(), 2 if op == 'exchange' else 0)
            return -r if r < 0 else 0
        if op == 'opath_write':
            fd = os.open(a[0], os.O_PATH)
            w = os.open('/proc/self/fd/%d' % fd, os.O_WRONLY | os.O_APPEND)
            os.write(w, b'planted\n'); return 0
        if op == 'opath_create':
            fd = os.open(a[0], os.O_PATH | os.O_DIRECTORY)
            w = os.open(a[1], os.O_WRONLY | os.O_CREAT, 0o755, dir_fd=fd)
            os.write(w, b'#!/bin/sh\necho planted\n'); return 0
        if op in ('openat2_write', 'openat2_create'):
            flags = os.O_WRONLY | (os.O_CREAT if op == 'openat2_create' else os.O_APPEND)
            how = How(flags, 0o755 if op == 'openat2_create' else 0, 0x02 | 0x04)
            r = sys_(NR[1], AT_FDCWD, a[0].encode(), ctypes.byref(how), ctypes.sizeof(how))
            if r < 0: return -r
            os.write(r, b'planted\n'); return 0
    except OSError as e:
        return e.errno
    raise SystemExit('unknown op ' + op)
print('%s=%d' % (sys.argv[1], run(sys.argv[1], sys.argv[2:])))
"#;

/// A git repository at `dir` (`.git` with a config), a `.codex/config.toml`, and the prepared
/// trees an attacker swaps in: `evil` (a gitdir whose core.fsmonitor appends to `counter`) and
/// `evilcodex` (a planted config), and a top-level file `cfg`.
fn repo_layout(dir: &Path, counter: &Path) {
    let (code, out) = host_sh(&format!(
        "cd {d} && git init -q . && git config user.email t@t && mkdir .codex && \
         echo 'model = \"safe\"' > .codex/config.toml && {evil} && mkdir evilcodex && \
         echo 'planted = true' > evilcodex/config.toml && echo cfg > cfg",
        d = dir.display(),
        evil = common::gitdir_script("evil", counter),
    ));
    assert_eq!(code, 0, "{out}");
}

/// What the host's git and tools see of a layout: (inode of `.git`, `.git/config`, the hooks,
/// `.codex/config.toml`, the pinned root's inode).
fn repo_state(dir: &Path) -> (u64, String, Vec<String>, String, u64) {
    use std::os::unix::fs::MetadataExt;
    let mut hooks: Vec<String> = std::fs::read_dir(dir.join(".git/hooks"))
        .map(|r| {
            r.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| !n.ends_with(".sample"))
                .collect()
        })
        .unwrap_or_default();
    hooks.sort();
    (
        std::fs::metadata(dir.join(".git"))
            .map(|m| m.ino())
            .unwrap_or(0),
        std::fs::read_to_string(dir.join(".git/config")).unwrap_or_default(),
        hooks,
        std::fs::read_to_string(dir.join(".codex/config.toml")).unwrap_or_default(),
        std::fs::metadata(dir).map(|m| m.ino()).unwrap_or(0),
    )
}

/// The attacks, each `(op, args, errnos the sandbox answers)` run in the root (the pinned root's own name is `ROOT`, a
/// sibling in its writable parent `SIB`).
const FS_ATTACKS: &[(&str, &str, &[i32])] = &[
    // EBUSY: a protected name and the root are mount points in the sandbox; EXDEV: across them.
    ("exchange", "evil .git", &[libc::EBUSY]),
    ("exchange", ".git evil", &[libc::EBUSY]),
    ("exchange", "evilcodex .codex", &[libc::EBUSY]),
    ("exchange", "cfg .git/config", &[libc::EXDEV, libc::EBUSY]),
    ("rename", "evil .git", &[libc::EBUSY]),
    // EROFS: the read-only mount holds whatever descriptor reaches it.
    ("opath_write", ".git/config", &[libc::EROFS]),
    ("opath_write", ".codex/config.toml", &[libc::EROFS]),
    ("opath_create", ".git hooks/pre-commit", &[libc::EROFS]),
    // ENOSYS: openat2 is not offered in sandboxed modes (H3: its mode cannot be filtered).
    ("openat2_write", ".git/config", &[libc::ENOSYS]),
    (
        "openat2_create",
        ".git/hooks/post-checkout",
        &[libc::ENOSYS],
    ),
    ("exchange", "ROOT SIB", &[libc::EBUSY]),
    ("rename", "ROOT SIB2", &[libc::EBUSY]),
];

/// Runs [`FS_ATTACKS`] in `root` (a root whose parent is writable, with the sibling `sib`) by
/// `run` (a host shell or a sandboxed one); returns the `op=errno` lines in order.
fn fs_attack_script(script: &Path, root: &Path, sib: &Path) -> String {
    let mut lines = vec![format!("cd {}", root.display())];
    for (op, args, _) in FS_ATTACKS {
        let args = args
            .replace("ROOT", &root.display().to_string())
            .replace("SIB2", &format!("{}2", sib.display()))
            .replace("SIB", &sib.display().to_string());
        lines.push(format!("python3 {} {op} {args}", script.display()));
    }
    lines.join("\n")
}

/// RENAME_EXCHANGE, O_PATH and openat2 from a workspace-write sandbox cannot change a
/// protected name (`.git`, `.codex`) or the pinned root itself: swapping `.git` or `.codex`
/// with a prepared tree, swapping a file into `.git`, writing `.git/config` or creating a hook
/// through an O_PATH descriptor (its /proc link, openat below it, a hard link to it), openat2
/// with RESOLVE flags, swapping or renaming the root (in a writable parent: the root lies below
/// /tmp, itself a writable root). Judged on the host: the same inodes and contents, no hook,
/// and the host's `git status` runs nothing planted. Baseline: the same script as the same
/// (root) user on the host, on a copy of the layout, does every one of these things.
#[tokio::test]
async fn h26_e_exchange_opath_openat2_change_no_protected_name_or_root() {
    let py = common::outside();
    let script = py.path().join("fs_attack.py");
    std::fs::write(&script, FS_ATTACK).unwrap();
    let counters = common::outside();

    // Baseline on the host.
    let base = scratch();
    let (broot, bsib) = (base.path().join("proj"), base.path().join("sib"));
    std::fs::create_dir_all(&broot).unwrap();
    std::fs::create_dir_all(&bsib).unwrap();
    let bcount = counters.path().join("base");
    repo_layout(&broot, &bcount);
    let (_, out) = host_sh(&fs_attack_script(&script, &broot, &bsib));
    let host: Vec<&str> = out.lines().collect();
    assert_eq!(host.len(), FS_ATTACKS.len(), "{out}");
    for (line, (op, args, _)) in host.iter().zip(FS_ATTACKS) {
        // The exchange back (`.git evil` after `evil .git`) and `rename evil .git` (onto a
        // non-empty directory) are the only ones that may fail on the host.
        let may_fail = (*op == "rename" && args.starts_with("evil"))
            || (*op == "exchange" && args.starts_with(".git"));
        assert!(
            may_fail || line.ends_with("=0"),
            "baseline {op} {args}: {line}\n{out}"
        );
    }
    // Their effect on the host (the root and its sibling were swapped, then the sibling
    // renamed: the repository is now at `sib`): a planted hook, config and .codex config.
    let (_, st) = host_sh(&format!(
        "cd {} && ls .git/hooks && cat .git/config .codex/config.toml",
        bsib.display()
    ));
    assert!(
        st.contains("pre-commit") && st.contains("planted"),
        "the baseline planted: {st}"
    );
    // And the swap of `.git` alone makes the host's git run the planted fsmonitor.
    let base2 = scratch();
    let bcount2 = counters.path().join("base2");
    repo_layout(base2.path(), &bcount2);
    let (_, out) = host_sh(&format!(
        "cd {} && python3 {} exchange evil .git && git status",
        base2.path().display(),
        script.display()
    ));
    assert!(common::count_lines(&bcount2) > 0, "baseline: {out}");

    // The sandbox: the same layout, the root below /tmp (a writable root: its parent is
    // writable), and the same script.
    let ws = scratch();
    let (root, sib) = (ws.path().join("proj"), ws.path().join("sib"));
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&sib).unwrap();
    let count = counters.path().join("sandbox");
    repo_layout(&root, &count);
    let before = repo_state(&root);
    let d = Daemon::start(&[]).await;
    let id = d.open(&root, SandboxMode::WorkspaceWrite).await;
    let r = d.sh(&id, &fs_attack_script(&script, &root, &sib)).await;
    let inside: Vec<&str> = r.output.lines().filter(|l| l.contains('=')).collect();
    assert_eq!(inside.len(), FS_ATTACKS.len(), "{}", r.output);
    for (line, (op, args, errnos)) in inside.iter().zip(FS_ATTACKS) {
        let errno: i32 = line.split('=').nth(1).unwrap().trim().parse().unwrap();
        assert!(
            errnos.contains(&errno),
            "sandbox {op} {args}: errno {errno}, expected one of {errnos:?}\n{}",
            r.output
        );
    }
    assert_eq!(repo_state(&root), before, "{}", r.output);
    assert!(!sib.join(".git").exists() && !ws.path().join("sib2").exists());
    let (_, st) = host_sh(&format!("cd {} && git status 2>&1", root.display()));
    assert_eq!(common::count_lines(&count), 0, "planted code ran: {st}");
    // The allowed path in the same session: writes in the root, a rename there, and an
    // O_PATH descriptor of a plain file written through its /proc link.
    let r = d
        .sh(
            &id,
            &format!(
                "cd {} && echo ok > plain && mv plain plain2 && python3 {} opath_write plain2",
                root.display(),
                script.display()
            ),
        )
        .await;
    assert!(r.output.contains("opath_write=0"), "{}", r.output);
    assert_eq!(
        std::fs::read_to_string(root.join("plain2")).unwrap(),
        "ok\nplanted\n"
    );
}

// ---------------------------------------------------------------------------------------------
// A disk that fills up mid-upload and mid-patch.
// ---------------------------------------------------------------------------------------------

/// Names and contents of the files at the top of `dir` (what a half-written file or a staging
/// left behind would change).
fn top_files(dir: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let bytes = if e.file_type().unwrap().is_file() {
                std::fs::read(e.path()).unwrap()
            } else {
                Vec::new()
            };
            (e.file_name().to_string_lossy().into_owned(), bytes)
        })
        .collect()
}

fn up(item: api::upload_request::Item) -> api::UploadRequest {
    api::UploadRequest { item: Some(item) }
}

/// An upload that replaces `keep` on a 2 MiB disk while a sandboxed command of the same
/// session fills the disk, its data on the way: the upload reserved its declared size when its
/// file began, so it completes whole and the filler gets the rest. On the disk the fillers
/// left full, an upload and a WriteBytes over `keep` fail with RESOURCE_EXHAUSTED; `keep` is
/// intact, no staging is left, and the space is free again once the fillers are gone. The
/// allowed path: both succeed on the same disk with room.
#[tokio::test]
async fn h26_f_disk_full_mid_upload_keeps_the_original() {
    use api::upload_request::Item;
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: mounting a small disk needs root (CI runs as root)");
        return;
    }
    let disk = common::SmallDisk::mount(2 << 20);
    let ws = disk.0.path();
    std::fs::write(ws.join("keep"), "old\n").unwrap();
    let d = Daemon::start(&[]).await;
    let s = d.open(ws, SandboxMode::WorkspaceWrite).await;
    let before = (top_files(ws), disk.used());
    let chunk = vec![7u8; 256 << 10];
    let messages = |session: &str| {
        let mut m = vec![
            up(Item::Start(api::UploadStart {
                session_id: session.into(),
                path: "keep".into(),
                overwrite: true,
                ..Default::default()
            })),
            up(Item::Entry(api::TransferEntry {
                path: String::new(),
                kind: api::EntryKind::File as i32,
                mode: Some(0o644),
                size: 1 << 20,
                link_target: String::new(),
            })),
        ];
        m.extend((0..4).map(|_| up(Item::Data(chunk.clone()))));
        m.push(up(Item::Finish(api::UploadFinish {
            entries: 1,
            bytes: 1 << 20,
        })));
        m
    };
    let mut all = messages(&s).into_iter();
    let (tx, rx) = tokio::sync::mpsc::channel::<api::UploadRequest>(16);
    let stream =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
    let mut files = d.files().await;
    let upload = tokio::spawn(async move { files.upload(stream).await });
    // Start, entry and the first quarter of the data.
    for m in all.by_ref().take(3) {
        tx.send(m).await.unwrap();
    }
    // Its file began: the declared size is reserved on the disk.
    assert!(
        common::eventually(Duration::from_secs(20), || disk.used()
            >= before.1 + (1 << 20))
        .await,
        "the upload's file began"
    );
    // The session's own command fills the disk (its root: allowed).
    let r = d
        .sh(
            &s,
            "dd if=/dev/zero of=filler bs=64k 2>&1; df -k . | tail -1",
        )
        .await;
    assert!(r.output.contains("No space left"), "{}", r.output);
    for m in all {
        if tx.send(m).await.is_err() {
            break;
        }
    }
    drop(tx);
    // The upload reserved its declared size when its file began (fallocate): the filler
    // got only the rest, and the upload completes whole.
    tokio::time::timeout(Duration::from_secs(30), upload)
        .await
        .expect("the upload ends")
        .unwrap()
        .unwrap_or_else(|e| panic!("the reserved upload completes: {e:?}\n{}", r.output));
    assert_eq!(std::fs::read(ws.join("keep")).unwrap(), vec![7u8; 1 << 20]);
    std::fs::write(ws.join("keep"), "old\n").unwrap();
    // Now the disk is full before the next upload starts (the filler took the freed space
    // too): the upload over `keep` is refused and changes nothing.
    let r = d.sh(&s, "dd if=/dev/zero of=filler2 bs=64k 2>&1").await;
    assert!(r.output.contains("No space left"), "{}", r.output);
    let e = d
        .files()
        .await
        .upload(tokio_stream::iter(messages(&s)))
        .await
        .expect_err("no room for the upload");
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert!(
        e.message().contains("nothing was changed"),
        "a clear reason: {e:?}"
    );
    // WriteBytes over `keep` on the full disk.
    let w = d
        .files()
        .await
        .write_bytes(api::WriteBytesRequest {
            session_id: s.clone(),
            path: "keep".into(),
            data: vec![9u8; 200 << 10],
            mode: None,
            create_parents: false,
            no_overwrite: false,
        })
        .await
        .expect_err("no room");
    assert_eq!(w.code(), tonic::Code::ResourceExhausted, "{w:?}");
    // Host side: the original intact, nothing but the filler added.
    let mut now = top_files(ws);
    assert!(now.remove("filler").is_some() && now.remove("filler2").is_some());
    assert_eq!(now, before.0, "only the sandbox's fillers are new: {e:?}");
    std::fs::remove_file(ws.join("filler")).unwrap();
    std::fs::remove_file(ws.join("filler2")).unwrap();
    assert_eq!(disk.used(), before.1, "the space is free again");
    // The allowed path on the same disk with room.
    d.files()
        .await
        .upload(tokio_stream::iter(messages(&s)))
        .await
        .unwrap();
    assert_eq!(std::fs::read(ws.join("keep")).unwrap(), vec![7u8; 1 << 20]);
    d.files()
        .await
        .write_bytes(api::WriteBytesRequest {
            session_id: s.clone(),
            path: "keep".into(),
            data: b"new\n".to_vec(),
            mode: None,
            create_parents: false,
            no_overwrite: false,
        })
        .await
        .unwrap();
    assert_eq!(std::fs::read(ws.join("keep")).unwrap(), b"new\n");
}

/// An Update of an existing file that grows it past the free space, through the model's two
/// routes (the bridge's apply_patch and exec_command's `apply_patch <<EOF`, which Codex
/// intercepts): the call fails with a clear error, the file is intact (never truncated), no
/// temporary file remains and the space is free again. The allowed path: a small update works.
#[tokio::test]
async fn h26_g_disk_full_mid_patch_keeps_the_original() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: mounting a small disk needs root (CI runs as root)");
        return;
    }
    let disk = common::SmallDisk::mount(1 << 20);
    let ws = disk.0.path();
    let original: String = (0..2000).map(|i| format!("line {i}\n")).collect();
    std::fs::write(ws.join("big.txt"), &original).unwrap();
    let d = Daemon::start(&[]).await;
    let s = d.open(ws, SandboxMode::WorkspaceWrite).await;
    let before = (top_files(ws), disk.used());
    let line = format!("+{}\n", "x".repeat(1023));
    let patch = format!(
        "*** Begin Patch\n*** Update File: big.txt\n@@\n line 999\n-line 1000\n{}*** End Patch",
        line.repeat(1200)
    );
    let (text, ok) = d
        .invoke(
            &s,
            "apply_patch",
            &serde_json::json!({"input": patch}).to_string(),
        )
        .await;
    assert!(!ok, "{text}");
    assert!(text.contains("No space left on device"), "{text}");
    assert_eq!(
        (top_files(ws), disk.used()),
        before,
        "bridge: the file intact, nothing left: {text}"
    );
    let (text, _) = d
        .invoke(
            &s,
            "exec_command",
            &serde_json::json!({"cmd": format!("apply_patch <<'EOF'\n{patch}\nEOF\n"),
                "yield_time_ms": 10000})
            .to_string(),
        )
        .await;
    assert!(text.contains("No space left on device"), "{text}");
    assert_eq!(
        (top_files(ws), disk.used()),
        before,
        "exec_command: the file intact, nothing left: {text}"
    );
    // The allowed path.
    let (text, ok) = d
        .invoke(
            &s,
            "apply_patch",
            &serde_json::json!({"input": "*** Begin Patch\n*** Update File: big.txt\n@@\n line 999\n-line 1000\n+LINE 1000\n*** End Patch"})
                .to_string(),
        )
        .await;
    assert!(ok, "{text}");
    assert_eq!(
        std::fs::read_to_string(ws.join("big.txt")).unwrap(),
        original.replace("line 1000\n", "LINE 1000\n")
    );
}
