//! Shared dev boxes: two real unprivileged users (created for the test, removed after) call one
//! root daemon over its Unix socket. Each runs as themselves; neither can read, list, grep,
//! patch, execute in, or attach to what belongs to the other — while each works on their own.
//! Needs root (CI runs as root); skipped with a note otherwise.

use crate::common::{Daemon, TestUser};
use std::os::unix::fs::{PermissionsExt, chown};
use std::path::Path;

/// A test user with a secret file only they may read.
fn user_with_secret(tag: &str) -> TestUser {
    let user = TestUser::create(tag);
    let secret = user.dir.join("secret.txt");
    std::fs::write(&secret, format!("{} secret\n", user.name)).unwrap();
    chown(&secret, Some(user.uid), Some(user.gid)).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    user
}

/// What the tests below do as a user, through the CLI.
impl TestUser {
    fn open(&self, socket: &str, dir: &Path) -> String {
        let (code, id, err) = self.corral(
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
        assert_eq!(code, 0, "{}: open-session: {err}", self.name);
        id
    }

    /// `corral invoke` as this user in `session`; returns (output, success).
    fn invoke(&self, socket: &str, session: &str, name: &str, args: &str) -> (String, bool) {
        let (code, out, err) = self.corral(
            socket,
            &["invoke", name, args, "--session", session, "--json"],
        );
        assert!(
            code == 0 || code == 1,
            "{}: invoke {name}: {err}",
            self.name
        );
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        (
            v["output"].as_str().unwrap().to_string(),
            v["success"].as_bool().unwrap(),
        )
    }
}

#[tokio::test]
async fn two_users_cannot_touch_each_others_files_or_sessions() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: creating users and serving them needs root (CI runs as root)");
        return;
    }
    let d = Daemon::start(&[]).await;
    let socket = d.open_to_local_users();
    let a = user_with_secret("a");
    let b = user_with_secret("b");
    let sa = a.open(&socket, &a.dir);
    let sb = b.open(&socket, &b.dir);
    let b_secret = b.dir.join("secret.txt").display().to_string();

    // Each works on their own files, as themselves.
    assert_eq!(
        a.invoke(&socket, &sa, "read_file", r#"{"file_path":"secret.txt"}"#),
        (format!("L1: {} secret", a.name), true)
    );
    let (out, ok) = a.invoke(&socket, &sa, "shell", r#"{"command":["id","-u"]}"#);
    assert!(
        ok && out.contains(&format!("\"output\":\"{}\\n\"", a.uid)),
        "{out}"
    );
    let (out, ok) = b.invoke(
        &socket,
        &sb,
        "shell",
        r#"{"command":["bash","-c","echo mine > own.txt && cat own.txt"]}"#,
    );
    assert!(ok, "{out}");
    assert_eq!(
        std::fs::metadata(b.dir.join("own.txt"))
            .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
            .unwrap(),
        b.uid
    );

    // A cannot read, list, grep, execute in or patch B's files.
    let (out, ok) = a.invoke(
        &socket,
        &sa,
        "read_file",
        &format!(r#"{{"file_path":"{b_secret}"}}"#),
    );
    assert_eq!(
        (out.as_str(), ok),
        (
            "failed to read file: Permission denied (os error 13)",
            false
        )
    );
    let (out, ok) = a.invoke(
        &socket,
        &sa,
        "list_dir",
        &format!(r#"{{"dir_path":"{}"}}"#, b.dir.display()),
    );
    assert_eq!(
        (out.as_str(), ok),
        (
            "failed to read directory: Permission denied (os error 13)",
            false
        )
    );
    let (out, ok) = a.invoke(
        &socket,
        &sa,
        "grep_files",
        &format!(r#"{{"pattern":"secret","path":"{}"}}"#, b.dir.display()),
    );
    assert!(!ok && !out.contains("secret.txt"), "{out}");
    let (out, ok) = a.invoke(
        &socket,
        &sa,
        "shell",
        &format!(r#"{{"command":["cat","{b_secret}"]}}"#),
    );
    assert!(
        !ok && out.contains("Permission denied") && !out.contains("secret\\n"),
        "{out}"
    );
    let patch = serde_json::json!({"input": format!("*** Begin Patch\n*** Add File: {}/planted.txt\n+x\n*** End Patch", b.dir.display())}).to_string();
    let (out, ok) = a.invoke(&socket, &sa, "apply_patch", &patch);
    assert!(!ok, "{out}");
    assert!(!b.dir.join("planted.txt").exists());

    // A cannot attach to B's session: it does not exist for A.
    let (code, _, err) = a.corral(
        &socket,
        &[
            "invoke",
            "read_file",
            r#"{"file_path":"secret.txt"}"#,
            "--session",
            &sb,
        ],
    );
    assert_eq!(code, 2);
    assert!(err.contains("NotFound"), "{err}");
    // Nor open a session in B's directory.
    let (code, _, err) = a.corral(&socket, &["open-session", "--cwd", b.dir.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(err.contains("PermissionDenied"), "{err}");
    // B's session still works for B.
    let (out, ok) = b.invoke(&socket, &sb, "read_file", r#"{"file_path":"secret.txt"}"#);
    assert_eq!((out, ok), (format!("L1: {} secret", b.name), true));
}
