//! H26: the surface the November 27 review did not reach, attacked here, each with a baseline
//! on the host first.

mod common;

use common::{Daemon, host_sh, scratch};
use corral::api::SandboxMode;

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
