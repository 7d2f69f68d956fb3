//! Shared dev boxes: two real unprivileged users (created for the test, removed after) call one
//! root daemon over its Unix socket. Each runs as themselves; neither can read, list, grep,
//! patch, execute in, or attach to what belongs to the other — while each works on their own.
//! Needs root (CI runs as root); skipped with a note otherwise.

mod common;

use common::{CORRAL, Daemon};
use std::os::unix::fs::{PermissionsExt, chown};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A user created for the test and deleted on drop, with a private 0700 directory.
struct TestUser {
    name: String,
    uid: u32,
    dir: PathBuf,
}

impl TestUser {
    fn create(tag: &str) -> TestUser {
        let name = format!("crl{tag}{}", std::process::id());
        let out = Command::new("useradd")
            .args(["--no-create-home", "--shell", "/bin/bash", &name])
            .output()
            .expect("useradd");
        assert!(
            out.status.success(),
            "useradd: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let user = nix::unistd::User::from_name(&name).unwrap().unwrap();
        let dir = PathBuf::from(format!("/tmp/{name}"));
        std::fs::create_dir_all(&dir).unwrap();
        chown(&dir, Some(user.uid.as_raw()), Some(user.gid.as_raw())).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let secret = dir.join("secret.txt");
        std::fs::write(&secret, format!("{name} secret\n")).unwrap();
        chown(&secret, Some(user.uid.as_raw()), Some(user.gid.as_raw())).unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        TestUser {
            name,
            uid: user.uid.as_raw(),
            dir,
        }
    }

    /// Runs the corral CLI as this user; returns (exit code, stdout, stderr).
    fn corral(&self, socket: &str, args: &[&str]) -> (i32, String, String) {
        let out = Command::new("setpriv")
            .args([
                "--reuid",
                &self.name,
                "--regid",
                &self.name,
                "--init-groups",
                "--",
            ])
            .arg(client_binary())
            .args(args)
            .args(["--socket", socket])
            .current_dir(&self.dir)
            .output()
            .expect("setpriv");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).trim_end().to_string(),
            String::from_utf8_lossy(&out.stderr).trim_end().to_string(),
        )
    }

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

/// The CLI binary where every user may run it: the checkout may live in a directory only root
/// can enter (e.g. /root), so the test runs a copy.
fn client_binary() -> &'static Path {
    static COPY: std::sync::OnceLock<(tempfile::TempDir, PathBuf)> = std::sync::OnceLock::new();
    let (_, path) = COPY.get_or_init(|| {
        let dir = common::outside();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = dir.path().join("corral");
        std::fs::copy(CORRAL, &path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        (dir, path)
    });
    path
}

impl Drop for TestUser {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = Command::new("userdel").arg(&self.name).output();
    }
}

#[tokio::test]
async fn two_users_cannot_touch_each_others_files_or_sessions() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: creating users and serving them needs root (CI runs as root)");
        return;
    }
    let d = Daemon::start(&[]).await;
    // Local users must reach the socket (its directory is private to the test by default).
    std::fs::set_permissions(
        d.socket.parent().unwrap(),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let socket = d.target().to_string();
    let a = TestUser::create("a");
    let b = TestUser::create("b");
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
