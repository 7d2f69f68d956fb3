//! H26: the surface the November 27 review did not reach, attacked here, each with a baseline
//! on the host first.

use crate::common::{self, Daemon, TestUser, connect_as, host_sh, scratch};
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

// ---------------------------------------------------------------------------------------------
// H9/H10/H13/H14/H17 variants the §8.6 tests (hardening_workspace.rs, hardening_noway.rs) do
// not try.
// ---------------------------------------------------------------------------------------------

/// A workspace-write session on `cwd` with `roots`, without /tmp, the test's PATH and HOME.
async fn ww_session(
    d: &Daemon,
    cwd: &Path,
    roots: &[&Path],
    env: &[(&str, &str)],
) -> Result<String, tonic::Status> {
    let mut session_env = common::session_env(cwd);
    for (k, v) in env {
        session_env.insert(k.to_string(), v.to_string());
    }
    d.try_open_with(api::OpenSessionRequest {
        cwd: cwd.to_string_lossy().into_owned(),
        mode: SandboxMode::WorkspaceWrite as i32,
        writable_roots: roots
            .iter()
            .map(|r| r.to_string_lossy().into_owned())
            .collect(),
        exclude_slash_tmp: true,
        env: session_env,
        ..Default::default()
    })
    .await
}

/// `renameat2(AT_FDCWD, a, AT_FDCWD, b, flags)` for each `flag a b` argument triple (flag
/// `exchange` = RENAME_EXCHANGE, `noreplace` = RENAME_NOREPLACE); prints `flag:a=errno`.
const RENAMEAT2: &str = r#"import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
args = sys.argv[1:]
for i in range(0, len(args), 3):
    flag, a, b = args[i:i + 3]
    rc = libc.renameat2(-100, a.encode(), -100, b.encode(), {'exchange': 2, 'noreplace': 1}[flag])
    print('%s:%s=%d' % (flag, a, 0 if rc == 0 else ctypes.get_errno()), flush=True)
"#;

/// A repository at `src/a/b/main` with a linked worktree at `src/wt` whose `.git` file names
/// its gitdir relatively, through `..` (`pointer`, relative to `src/wt`, which has an empty
/// directory `sub`).
fn nested_worktree(src: &Path, pointer: &str) {
    let main = src.join("a/b/main");
    std::fs::create_dir_all(&main).unwrap();
    let (code, out) = host_sh(&format!(
        "cd '{}' && git init -q && git -c user.email=t@t -c user.name=t commit -q --allow-empty \
         -m i && git worktree add -q ../../../wt && mkdir ../../../wt/sub && printf 'gitdir: \
         {pointer}\\n' > ../../../wt/.git && cd ../../../wt && git status --short",
        main.display()
    ));
    assert_eq!(code, 0, "{out}");
}

/// The attacker's preparation in `src`: a copy of `a` (the whole repository with the worktree's
/// gitdir) whose config runs `counter`'s fsmonitor.
fn decoy_script(src: &Path, counter: &Path) -> String {
    format!(
        "cd '{}' && cp -a a decoy && git config -f decoy/b/main/.git/config core.fsmonitor \
         'echo RAN >> {}; false'",
        src.display(),
        counter.display()
    )
}

/// Runs the host's `git status` in `wt` (the victim's next command, its config not shared).
fn host_status(wt: &Path) {
    host_sh(&format!(
        "cd '{}' && timeout 10 git status >/dev/null 2>&1",
        wt.display()
    ));
}

/// H9 variants: a worktree's gitdir two directories below the enclosing writable root
/// (`src/a/b/main/.git/worktrees/wt`), named by its `.git` file relatively through `..`, and
/// every intermediate directory attacked with `renameat2` — RENAME_EXCHANGE with a prepared
/// copy whose config runs a planted fsmonitor, and RENAME_NOREPLACE — not `mv`. Baseline on
/// the host: the exchange of `a` alone makes the host's git in the worktree run the planted
/// fsmonitor, and every call succeeds. In the sandbox each fails (EBUSY: the directories
/// between the root and the gitdir are mount points; EXDEV across them), and the host's git
/// runs nothing planted.
#[tokio::test]
async fn h26_h_h9_nested_gitdir_through_dotdot_survives_renameat2_of_every_parent() {
    let py = common::outside();
    let script = py.path().join("renameat2.py");
    std::fs::write(&script, RENAMEAT2).unwrap();
    let counters = common::outside();
    let ops = |src: &Path| {
        let s = |p: &str| src.join(p).display().to_string();
        [
            ("exchange", s("a"), s("decoy")),
            ("exchange", s("a/b"), s("decoy/b")),
            ("exchange", s("a/b/main"), s("decoy/b/main")),
            ("exchange", s("a/b/main/.git"), s("decoy/b/main/.git")),
            (
                "exchange",
                s("a/b/main/.git/worktrees"),
                s("decoy/b/main/.git/worktrees"),
            ),
            ("noreplace", s("a/b/main"), s("main2")),
            ("noreplace", s("a/b"), s("b2")),
            ("noreplace", s("a"), s("a2")),
        ]
        .iter()
        .map(|(f, a, b)| format!("{f} {a} {b}"))
        .collect::<Vec<_>>()
        .join(" ")
    };
    let pointer = "../a/b/main/.git/worktrees/wt";

    // Baseline on the host: one exchange of the outermost directory is enough.
    let base = common::outside();
    let bsrc = base.path().join("src");
    nested_worktree(&bsrc, pointer);
    let bcount = counters.path().join("base");
    let (code, out) = host_sh(&format!(
        "{} && python3 {} exchange {}/a {}/decoy",
        decoy_script(&bsrc, &bcount),
        script.display(),
        bsrc.display(),
        bsrc.display()
    ));
    assert!(code == 0 && out.contains("=0"), "{out}");
    host_status(&bsrc.join("wt"));
    assert!(
        common::count_lines(&bcount) > 0,
        "baseline: the host's git ran the planted fsmonitor"
    );
    // ... and every one of the calls succeeds there.
    let (_, out) = host_sh(&format!("python3 {} {}", script.display(), ops(&bsrc)));
    assert_eq!(out.matches("=0").count(), 8, "baseline: {out}");

    let ws = common::outside();
    let src = ws.path().join("src");
    nested_worktree(&src, pointer);
    let config = src.join("a/b/main/.git/config");
    let before = std::fs::read(&config).unwrap();
    let ino = |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
    let inodes = [src.join("a"), src.join("a/b"), src.join("a/b/main")].map(|p| ino(&p));
    let count = counters.path().join("sandbox");
    let d = Daemon::start(&[]).await;
    let id = ww_session(&d, &src.join("wt"), &[&src], &[]).await.unwrap();
    let r = d
        .sh(
            &id,
            &format!(
                "{}; python3 {} {}",
                decoy_script(&src, &count),
                script.display(),
                ops(&src)
            ),
        )
        .await;
    let results: Vec<&str> = r.output.lines().filter(|l| l.contains(":/")).collect();
    assert_eq!(results.len(), 8, "{}", r.output);
    for line in results {
        assert!(
            line.ends_with("=16") || line.ends_with("=18"),
            "EBUSY or EXDEV: {line}\n{}",
            r.output
        );
    }
    // Judged on the host.
    assert_eq!(std::fs::read(&config).unwrap(), before);
    assert_eq!(
        [src.join("a"), src.join("a/b"), src.join("a/b/main")].map(|p| ino(&p)),
        inodes
    );
    assert!(!src.join("a2").exists() && !src.join("b2").exists());
    host_status(&src.join("wt"));
    assert_eq!(common::count_lines(&count), 0, "planted code ran");
    // Allowed: files in the main checkout, a directory beside the pinned ones moved.
    let r = d
        .sh(
            &id,
            &format!(
                "cd {} && echo ok > a/b/main/f && mkdir a/other && mv a/other a/moved && \
                 echo ok > g",
                src.display()
            ),
        )
        .await;
    assert_eq!(r.exit_code, 0, "{}", r.output);
    assert!(src.join("a/b/main/f").exists() && src.join("a/moved").is_dir());
}

/// H9, the `..` itself: a `.git` file's `gitdir: sub/../../a/…` climbs out of `sub`, an
/// ordinary directory of the worktree. The kernel (and so the host's git) resolves `sub/..`
/// from wherever `sub` leads, so a sandbox that replaces `sub` with a symlink into a decoy tree
/// redirects the gitdir to one it built. Baseline: on the host that makes git run the decoy's
/// fsmonitor. In the sandbox: either the session is refused (the layout cannot be protected)
/// or `sub` cannot be replaced; judged by the host's git.
#[tokio::test]
async fn h26_i_h9_a_dotdot_in_a_gitdir_pointer_cannot_be_redirected() {
    let counters = common::outside();
    let pointer = "sub/../../a/b/main/.git/worktrees/wt";
    // The attack: a copy of the repository at decoy/a, and `sub` replaced by a link to a
    // directory two levels below `decoy` (so `sub/../..` is `decoy`).
    let attack = |src: &Path, counter: &Path| {
        format!(
            "{} && mv decoy copy && mkdir -p decoy/x/y && mv copy decoy/a && cd wt && \
             mv sub sub.old && ln -s ../decoy/x/y sub; echo swapped=$?",
            decoy_script(src, counter)
        )
    };
    let setup = |src: &Path| {
        nested_worktree(src, pointer);
        // The pointer works as written.
        let (code, out) = host_sh(&format!(
            "cd '{}' && git rev-parse --git-dir",
            src.join("wt").display()
        ));
        assert!(code == 0 && out.contains("worktrees/wt"), "{out}");
    };

    // Baseline on the host.
    let base = common::outside();
    let bsrc = base.path().join("src");
    setup(&bsrc);
    let bcount = counters.path().join("base");
    let (_, out) = host_sh(&attack(&bsrc, &bcount));
    assert!(out.contains("swapped=0"), "{out}");
    host_status(&bsrc.join("wt"));
    assert!(
        common::count_lines(&bcount) > 0,
        "baseline: the host's git ran the decoy's fsmonitor: {out}"
    );

    let ws = common::outside();
    let src = ws.path().join("src");
    setup(&src);
    let count = counters.path().join("sandbox");
    let d = Daemon::start(&[]).await;
    match ww_session(&d, &src.join("wt"), &[&src], &[]).await {
        Err(err) => {
            // Refusing the layout is an answer (H9): it must say why.
            assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
            assert!(err.message().contains("sub"), "{}", err.message());
        }
        Ok(id) => {
            let r = d.sh(&id, &attack(&src, &count)).await;
            host_status(&src.join("wt"));
            assert_eq!(
                common::count_lines(&count),
                0,
                "the host's git ran the decoy's fsmonitor: {}",
                r.output
            );
        }
    }
    // Allowed: the same worktree with a pointer that has no `..` below the root opens, and
    // its files are writable.
    std::fs::write(
        src.join("wt/.git"),
        "gitdir: ../a/b/main/.git/worktrees/wt\n",
    )
    .unwrap();
    let _ = std::fs::remove_file(src.join("wt/sub"));
    let id = ww_session(&d, &src.join("wt"), &[&src], &[]).await.unwrap();
    let r = d.sh(&id, "echo ok > f").await;
    assert_eq!(r.exit_code, 0, "{}", r.output);
}

/// H10 variants: with `roots_under = [allowed]`, every spelling that canonicalises outside is
/// refused whatever its source — writable_roots through `..`, through a symlink inside the
/// allowed tree, through `/proc/self/root`, a sibling sharing the allowed tree's name as a
/// prefix (`allowed-evil`), a trailing slash; `TMPDIR` through `..` and through a symlink; a
/// read-only session's cwd outside. Allowed: the same directory spelled with `//`, `.` and a
/// trailing slash, and an inside TMPDIR, open (and the roots the session reports are canonical).
#[tokio::test]
async fn h26_j_h10_roots_under_holds_for_every_spelling_and_source() {
    let top = common::outside();
    let allowed = top.path().join("allowed");
    let evil = top.path().join("allowed-evil");
    let elsewhere = top.path().join("elsewhere");
    for d in [&allowed, &evil, &elsewhere] {
        std::fs::create_dir_all(d).unwrap();
    }
    let inside = allowed.join("proj");
    std::fs::create_dir_all(inside.join("tmp")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, allowed.join("link")).unwrap();
    let conf = common::outside();
    let conf_file = conf.path().join("corral.toml");
    std::fs::write(
        &conf_file,
        format!(
            "[policy.users.root]\nroots_under = [\"{}\"]\n",
            allowed.display()
        ),
    )
    .unwrap();
    let d = Daemon::start(&["--config", conf_file.to_str().unwrap()]).await;
    let a = allowed.display().to_string();
    let e = elsewhere.display().to_string();

    // Baseline/allowed: odd spellings of inside directories open; the roots come back canonical.
    let spelled = format!("{a}//proj/./");
    let tmp_inside = format!("{a}/proj/tmp/");
    let id = ww_session(
        &d,
        &inside,
        &[Path::new(&spelled)],
        &[("TMPDIR", &tmp_inside)],
    )
    .await
    .unwrap();
    let r = d.sh(&id, "echo ok > f && echo ok > tmp/g").await;
    assert_eq!(r.exit_code, 0, "{}", r.output);

    let dotdot = format!("{a}/proj/../../elsewhere");
    let through_proc = format!("/proc/self/root{e}");
    let trailing = format!("{e}/");
    let via_link = format!("{a}/link");
    for root in [
        dotdot.as_str(),
        via_link.as_str(),
        through_proc.as_str(),
        &evil.display().to_string(),
        trailing.as_str(),
    ] {
        let err = ww_session(&d, &inside, &[Path::new(root)], &[])
            .await
            .expect_err(root);
        assert_eq!(err.code(), tonic::Code::PermissionDenied, "{root}: {err:?}");
        assert!(
            err.message().contains("outside"),
            "{root}: {}",
            err.message()
        );
    }
    for tmpdir in [dotdot.as_str(), via_link.as_str(), through_proc.as_str()] {
        let err = ww_session(&d, &inside, &[], &[("TMPDIR", tmpdir)])
            .await
            .expect_err(tmpdir);
        assert_eq!(
            err.code(),
            tonic::Code::PermissionDenied,
            "{tmpdir}: {err:?}"
        );
    }
    // cwd outside through `..`, in read-only mode too.
    for mode in [SandboxMode::WorkspaceWrite, SandboxMode::ReadOnly] {
        let err = d
            .try_open_with(api::OpenSessionRequest {
                cwd: dotdot.clone(),
                mode: mode as i32,
                exclude_slash_tmp: true,
                env: common::session_env(&inside),
                ..Default::default()
            })
            .await
            .expect_err("cwd outside");
        assert_eq!(
            err.code(),
            tonic::Code::PermissionDenied,
            "{mode:?}: {err:?}"
        );
    }
    // Judged on the host: nothing was written outside.
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
    assert_eq!(std::fs::read_dir(&evil).unwrap().count(), 0);
}

/// Tries to take per-uid notification resources and io_uring by routes libc's wrappers do not
/// take: raw syscall numbers (x86_64), the x32 ABI, the i386 ABI (`int 0x80` from a code page),
/// and every inotify/fanotify descriptor reachable in /proc (inherited, or another process's,
/// reopened through its /proc link). Prints `name rc=±1 errno=N` lines.
const NOTIFY_PROBE: &str = r#"import ctypes, mmap, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def sc(*a):
    r = libc.syscall(*[ctypes.c_long(x) for x in a])
    return r, (ctypes.get_errno() if r < 0 else 0)
def report(name, r):
    print('%s rc=%d errno=%d' % (name, 1 if r[0] >= 0 else -1, r[1]), flush=True)
op = sys.argv[1]
if op == 'native':
    report('inotify_init', sc(253))
    report('inotify_init1', sc(294, os.O_CLOEXEC))
    # FAN_CLASS_NOTIF | FAN_REPORT_FID: what an unprivileged caller may ask for.
    report('fanotify_init', sc(300, 0x200, os.O_RDONLY))
    params = ctypes.create_string_buffer(120)
    report('io_uring_setup', sc(425, 1, ctypes.addressof(params)))
    report('x32_inotify_init1', sc(0x40000000 | 294, 0))
elif op == 'i386':
    # mov eax, 332 (i386 inotify_init1); xor ebx, ebx; int 0x80; ret
    code = bytes([0xb8, 0x4c, 0x01, 0, 0, 0x31, 0xdb, 0xcd, 0x80, 0xc3])
    m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    m.write(code)
    f = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))
    r = f()
    report('i386_inotify_init1', (r, -r if r < 0 else 0))
elif op == 'reuse':
    found = 0
    for pid in os.listdir('/proc'):
        if not pid.isdigit():
            continue
        try:
            fds = os.listdir('/proc/%s/fd' % pid)
        except OSError:
            continue
        for fd in fds:
            p = '/proc/%s/fd/%s' % (pid, fd)
            try:
                link = os.readlink(p)
            except OSError:
                continue
            if 'inotify' not in link and 'fanotify' not in link:
                continue
            found += 1
            if int(pid) == os.getpid():
                n = int(fd)
            else:
                try:
                    n = os.open(p, os.O_RDONLY)
                except OSError as e:
                    print('reopen %s errno=%d' % (link, e.errno), flush=True)
                    continue
            wd = libc.inotify_add_watch(n, b'/', 0x100)
            print('USABLE %s pid=%s add_watch=%d' % (link, pid, wd), flush=True)
    print('reachable=%d' % found, flush=True)
"#;

/// H13 variants: no inotify instance, fanotify group or io_uring by any route — raw syscall
/// numbers, the x32 and i386 ABIs, or a descriptor reachable through /proc (the worker's own
/// guard holds an inotify instance). Baseline: on the host each native call succeeds, i386
/// `int 0x80` too, and an inotify descriptor a host process passes down is usable. Allowed:
/// other descriptors (a pipe) still work in the sandbox.
#[tokio::test]
async fn h26_k_h13_no_notification_instance_or_ring_by_any_route() {
    let py = common::outside();
    let probe = py.path().join("notify.py");
    std::fs::write(&probe, NOTIFY_PROBE).unwrap();
    let p = probe.display();
    // Baseline: the host, as this (root) user.
    let (_, host) = host_sh(&format!("python3 {p} native; python3 {p} i386"));
    for name in [
        "inotify_init",
        "inotify_init1",
        "fanotify_init",
        "io_uring_setup",
    ] {
        assert!(host.contains(&format!("{name} rc=1")), "baseline: {host}");
    }
    let i386_on_host = host.contains("i386_inotify_init1 rc=1");
    if !i386_on_host {
        eprintln!("note: no i386 syscalls on this host: {host}");
    }
    // A host process holding an instance is visible to another in /proc (reopening it is the
    // kernel's ENXIO, using it needs an inherited descriptor).
    let (_, host) = host_sh(&format!(
        "python3 -c 'import ctypes, subprocess; ctypes.CDLL(None).inotify_init1(0); \
         print(subprocess.run([\"python3\", \"{p}\", \"reuse\"], capture_output=True, \
         text=True, pass_fds=(3,)).stdout)'"
    ));
    assert!(
        host.contains("USABLE anon_inode:inotify") && host.contains("reachable="),
        "baseline: {host}"
    );

    let d = Daemon::start(&[]).await;
    let ws = scratch();
    let id = d.open(ws.path(), SandboxMode::WorkspaceWrite).await;
    // The worker's guard holds an inotify instance while the sandbox runs.
    let r = d
        .sh(
            &id,
            &format!(
                "python3 {p} native; python3 {p} i386; echo i386_status=$?; python3 {p} reuse; \
                 python3 -c 'import os; r, w = os.pipe(); os.write(w, b\"x\"); \
                 print(\"pipe\", os.read(r, 1))'"
            ),
        )
        .await;
    for name in [
        "inotify_init",
        "inotify_init1",
        "fanotify_init",
        "io_uring_setup",
        "x32_inotify_init1",
    ] {
        assert!(
            r.output.contains(&format!("{name} rc=-1 errno=1\n")),
            "{name}: {}",
            r.output
        );
    }
    // A foreign ABI kills the process (SIGSYS: 128 + 31); without i386 emulation the kernel
    // refuses `int 0x80` itself.
    if i386_on_host {
        assert!(r.output.contains("i386_status=159"), "{}", r.output);
    }
    assert!(
        !r.output.contains("i386_inotify_init1 rc=1"),
        "{}",
        r.output
    );
    assert!(!r.output.contains("USABLE"), "{}", r.output);
    assert!(r.output.contains("reachable="), "{}", r.output);
    assert!(r.output.contains("pipe b'x'"), "{}", r.output);
}

/// Opens the writable root `argv[1]` to other users by route `argv[2]`; prints `route=errno`.
const ROOT_OPENER: &str = r#"import ctypes, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
root, op = sys.argv[1], sys.argv[2]
def acl(*entries):
    # posix_acl_xattr_header { u32 version = 2 }, entries { u16 tag, u16 perm, u32 id }
    return struct.pack('<I', 2) + b''.join(struct.pack('<HHI', t, p, i) for t, p, i in entries)
NOID = 0xffffffff
try:
    if op == 'opath_proc':
        fd = os.open(root, os.O_PATH)
        os.chmod('/proc/self/fd/%d' % fd, 0o777)
    elif op == 'fchmodat2_empty':
        fd = os.open(root, os.O_PATH)
        if libc.syscall(452, fd, b'', 0o777, 0x1000) != 0:
            raise OSError(ctypes.get_errno(), 'fchmodat2')
    elif op == 'fchmod_fd':
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        os.fchmod(fd, 0o777)
    elif op == 'symlink':
        link = os.path.join(root, 'lnk')
        os.symlink(root, link)
        os.chmod(link, 0o777)
    elif op == 'proc_cwd':
        os.chdir(root)
        os.chmod('/proc/self/cwd', 0o757)
    elif op == 'acl_user':
        # u::rwx u:65534:rwx g::r-x m::rwx o::r-x: user 65534 may write.
        os.setxattr(root, 'system.posix_acl_access',
                    acl((1, 7, NOID), (2, 7, 65534), (4, 5, NOID), (0x10, 7, NOID), (0x20, 5, NOID)))
    else:
        raise SystemExit('unknown op ' + op)
    print('%s=0' % op)
except OSError as e:
    print('%s=%d' % (op, e.errno))
"#;

/// The routes [`ROOT_OPENER`] knows.
const OPENER_ROUTES: &[&str] = &[
    "opath_proc",
    "fchmodat2_empty",
    "fchmod_fd",
    "symlink",
    "proc_cwd",
    "acl_user",
];

/// Whether user 65534 (nobody) can create a file in `dir` on the host — the judge of H14.
fn nobody_can_write(dir: &Path) -> bool {
    let probe = dir.join("nobody-was-here");
    let (code, _) = host_sh(&format!(
        "setpriv --reuid 65534 --regid 65534 --clear-groups -- touch '{}'",
        probe.display()
    ));
    let wrote = std::fs::symlink_metadata(&probe).is_ok();
    let _ = std::fs::remove_file(&probe);
    code == 0 && wrote
}

/// `dir` back to `mode`, without ACL entries or the `lnk` a route leaves.
fn reset_root(dir: &Path, mode: u32) {
    let _ = std::fs::remove_file(dir.join("lnk"));
    host_sh(&format!(
        "python3 -c \"import os; os.removexattr('{0}', 'system.posix_acl_access')\" 2>/dev/null; \
         chmod {mode:o} '{0}'",
        dir.display()
    ));
}

/// A 0755 directory `proj` that user 65534 can reach (its parents searchable).
fn reachable_root() -> (tempfile::TempDir, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let base = common::outside();
    std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let proj = base.path().join("proj");
    std::fs::create_dir(&proj).unwrap();
    std::fs::set_permissions(&proj, std::fs::Permissions::from_mode(0o755)).unwrap();
    (base, proj)
}

/// H14 variants: a 0755 root opened to other users by routes other than `chmod PATH` — through
/// an O_PATH descriptor's /proc link, `fchmodat2(fd, "", AT_EMPTY_PATH)`, `fchmod` on a
/// directory descriptor, a symlink to the root made inside it, `/proc/self/cwd`, and a POSIX
/// ACL granting another user `rwx` (setxattr `system.posix_acl_access`). Baseline: on the host
/// each route lets user 65534 create a file in the directory. In the sandbox, after each call
/// (one route per call), user 65534 cannot, the mode has no group/other write bit, and the
/// call's output says the root was set back. Allowed: a world-writable file inside the root.
#[tokio::test]
async fn h26_l_h14_no_route_opens_a_root_to_other_users() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: judging as another user needs root (CI runs as root)");
        return;
    }
    let py = common::outside();
    let opener = py.path().join("opener.py");
    std::fs::write(&opener, ROOT_OPENER).unwrap();
    // Baseline on the host.
    let (_base, host_root) = reachable_root();
    assert!(
        !nobody_can_write(&host_root),
        "baseline: 0755 keeps others out"
    );
    for route in OPENER_ROUTES {
        reset_root(&host_root, 0o755);
        let (_, out) = host_sh(&format!(
            "python3 {} {} {route}",
            opener.display(),
            host_root.display()
        ));
        assert!(
            out.contains(&format!("{route}=0")),
            "baseline {route}: {out}"
        );
        assert!(nobody_can_write(&host_root), "baseline {route}: {out}");
    }

    let (_ws, proj) = reachable_root();
    let d = Daemon::start(&[]).await;
    let id = ww_session(&d, &proj, &[], &[]).await.unwrap();
    for route in OPENER_ROUTES {
        let r = d
            .sh(
                &id,
                &format!("python3 {} {} {route}", opener.display(), proj.display()),
            )
            .await;
        let mode = std::os::unix::fs::MetadataExt::mode(&std::fs::metadata(&proj).unwrap());
        assert!(
            !nobody_can_write(&proj),
            "{route}: another user can write the root (mode {mode:o}): {}",
            r.output
        );
        assert_eq!(mode & 0o022, 0, "{route}: mode {mode:o}: {}", r.output);
        // The route itself worked (it is the root's owner), and the guard said so.
        if r.output.contains(&format!("{route}=0")) {
            assert!(
                r.output.contains("sandbox blocked making writable root"),
                "{route}: {}",
                r.output
            );
        }
        let _ = std::fs::remove_file(proj.join("lnk"));
    }
    // Allowed: a world-writable file inside the root.
    let r = d
        .sh(&id, "echo x > open && chmod 666 open && stat -c %a open")
        .await;
    assert_eq!((r.exit_code, r.output.trim()), (0, "666"), "{}", r.output);
}

/// H14 with ACLs on a root that is group-writable already (0775, as under a umask of 002 with
/// user private groups): the mode has no bit left to gain, so a guard that compares mode bits
/// misses an ACL entry that grants one more user `rwx` (found by this test; the guard now
/// puts back each root's access ACL too). Baseline: on the host the ACL lets user 65534
/// write. In the sandbox it must not.
#[tokio::test]
async fn h26_m_h14_an_acl_cannot_add_a_writer_to_a_group_writable_root() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: judging as another user needs root (CI runs as root)");
        return;
    }
    let py = common::outside();
    let opener = py.path().join("opener.py");
    std::fs::write(&opener, ROOT_OPENER).unwrap();
    let (_base, host_root) = reachable_root();
    reset_root(&host_root, 0o775);
    assert!(
        !nobody_can_write(&host_root),
        "baseline: 0775 keeps 65534 out"
    );
    let (_, out) = host_sh(&format!(
        "python3 {} {} acl_user",
        opener.display(),
        host_root.display()
    ));
    assert!(
        out.contains("acl_user=0") && nobody_can_write(&host_root),
        "{out}"
    );

    let (_ws, proj) = reachable_root();
    reset_root(&proj, 0o775);
    let d = Daemon::start(&[]).await;
    let id = ww_session(&d, &proj, &[], &[]).await.unwrap();
    let r = d
        .sh(
            &id,
            &format!("python3 {} {} acl_user", opener.display(), proj.display()),
        )
        .await;
    assert!(
        !nobody_can_write(&proj),
        "user 65534 can write the root through the ACL the sandbox set: {}",
        r.output
    );
    // Allowed: the root stays usable to its owner and its group, as it was.
    let r = d.sh(&id, "echo ok > f").await;
    assert_eq!(r.exit_code, 0, "{}", r.output);
}

/// H14, a process that outlives its call: `exec_command` returns while its command is still
/// running, and the command opens the root to other users a second later, when no call is
/// being guarded. Judged on the host two seconds after that: user 65534 cannot write the root
/// (or could only until the session's next call — which is not the property).
#[tokio::test]
async fn h26_n_h14_a_background_command_cannot_open_the_root_after_its_call() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: judging as another user needs root (CI runs as root)");
        return;
    }
    let (_ws, proj) = reachable_root();
    let d = Daemon::start(&[]).await;
    let id = ww_session(&d, &proj, &[], &[]).await.unwrap();
    let (out, _) = d
        .invoke(
            &id,
            "exec_command",
            r#"{"cmd":"sleep 1; chmod 777 .; echo $? > chmod-ran; sleep 20","yield_time_ms":200}"#,
        )
        .await;
    assert!(
        !out.contains("chmod"),
        "the call returned before the chmod: {out}"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    // The command did run its chmod (as the root's owner it may), outside any call.
    assert_eq!(
        std::fs::read_to_string(proj.join("chmod-ran")).unwrap_or_default(),
        "0\n",
        "the chmod ran"
    );
    let mode = std::os::unix::fs::MetadataExt::mode(&std::fs::metadata(&proj).unwrap());
    assert!(
        !nobody_can_write(&proj),
        "3 s after its call a command left the root {mode:o} and user 65534 wrote into it"
    );
}

/// `corral health` with `--socket`/`CORRAL_SOCKET`; returns (exit code, stdout, stderr).
fn health_cli(socket: Option<&str>, env_socket: Option<&str>) -> (i32, String, String) {
    let mut cmd = std::process::Command::new(common::CORRAL);
    cmd.arg("health").env_remove("CORRAL_SOCKET");
    if let Some(s) = socket {
        cmd.args(["--socket", s]);
    }
    if let Some(s) = env_socket {
        cmd.env("CORRAL_SOCKET", s);
    }
    let out = cmd.output().expect("run the corral CLI");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
        String::from_utf8_lossy(&out.stderr).trim().to_string(),
    )
}

/// Removes a path on drop (a link left in /tmp).
struct RemoveOnDrop(std::path::PathBuf);
impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// H17 variants: a real daemon's socket reached through a location another user could have
/// replaced it in — a (hard) link to it in /tmp (1777) and in a world-writable directory
/// (0777, not sticky), named directly, through a symlink in a private directory (the socket
/// file is the link; what matters is where the socket lives), through a symlinked directory,
/// and through `..`; by `--socket`, `unix:` and `CORRAL_SOCKET`. The CLI must refuse each
/// (exit 2) with an error naming the directory the socket is really in. Baseline: the kernel
/// connects through every one of these paths to the daemon (so a client that did not check
/// would talk to whatever is there), and the CLI reaches the daemon by its private path.
#[tokio::test]
async fn h26_o_h17_no_socket_in_a_shared_directory_by_any_path() {
    use std::os::unix::fs::{PermissionsExt, symlink};
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let private = common::outside();
    let socket = private.path().join("c.sock");
    let d = Daemon::start_at(&socket, &[], &[], std::process::Stdio::null()).await;
    let (code, out, err) = health_cli(Some(d.target()), None);
    assert_eq!((code, out.as_str()), (0, "SERVING"), "baseline: {err}");

    // The shared places: /tmp, and a 0777 directory (hard links to the socket: same inode).
    let in_tmp = std::path::PathBuf::from(format!("/tmp/corral-h26o-{}.sock", std::process::id()));
    let _tmp_guard = RemoveOnDrop(in_tmp.clone());
    std::fs::hard_link(&socket, &in_tmp).unwrap();
    let shared = common::outside();
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let in_shared = shared.path().join("c.sock");
    std::fs::hard_link(&socket, &in_shared).unwrap();
    // Private spellings that lead there.
    let links = common::outside();
    symlink(&in_tmp, links.path().join("tmp.sock")).unwrap();
    symlink(&in_shared, links.path().join("shared.sock")).unwrap();
    symlink("/tmp", links.path().join("tmpdir")).unwrap();
    let via_dir = links
        .path()
        .join("tmpdir")
        .join(in_tmp.file_name().unwrap());
    let up = "../".repeat(links.path().components().count());
    let via_dotdot = format!(
        "{}/{up}tmp/{}",
        links.path().display(),
        in_tmp.file_name().unwrap().to_string_lossy()
    );
    let cases: Vec<(String, &str)> = vec![
        (in_tmp.display().to_string(), "/tmp"),
        (in_shared.display().to_string(), "0777"),
        (links.path().join("tmp.sock").display().to_string(), "/tmp"),
        (
            links.path().join("shared.sock").display().to_string(),
            "0777",
        ),
        (via_dir.display().to_string(), "1777"),
        (via_dotdot, "1777"),
    ];
    for (path, says) in &cases {
        // Baseline: the kernel connects there, to this daemon.
        std::os::unix::net::UnixStream::connect(path)
            .unwrap_or_else(|e| panic!("baseline: connect {path}: {e}"));
        for (flag, env) in [
            (Some(path.clone()), None),
            (Some(format!("unix:{path}")), None),
            (None, Some(path.clone())),
        ] {
            let (code, out, err) = health_cli(flag.as_deref(), env.as_deref());
            assert_eq!(
                code, 2,
                "{path} (flag {flag:?}, env {env:?}) must be refused: {out} {err}"
            );
            assert!(
                err.contains("refusing socket") && err.contains(says),
                "{path}: the error names where the socket is and why: {err}"
            );
        }
    }
    // Allowed: a symlink in a private directory to the socket in its private directory.
    symlink(&socket, links.path().join("ok.sock")).unwrap();
    let ok = links.path().join("ok.sock").display().to_string();
    let (code, out, err) = health_cli(None, Some(&ok));
    assert_eq!((code, out.as_str()), (0, "SERVING"), "{err}");
}
