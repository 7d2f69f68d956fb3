//! H3 (spec/sandbox.md §8.6, red-team finding 3): no set-user-ID or set-group-ID bit can be set
//! from a sandboxed session. Every case runs through a real daemon; the caller is root with the
//! default `root_callers`, so the session is uid 0 confined — the case where a planted setuid
//! copy of a shell would give root to every local user. The baseline proves the same commands
//! plant a working setuid shell outside the sandbox; the host-side check stats every file the
//! sandbox touched, and runs the planted copy as `nobody` to show it grants nothing.

use crate::common::{Daemon, host_sh, outside};
use corral::api::{self, SandboxMode};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

const WW: SandboxMode = SandboxMode::WorkspaceWrite;
const SETID: u32 = libc::S_ISUID | libc::S_ISGID;

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p)
        .unwrap_or_else(|e| panic!("stat {}: {e}", p.display()))
        .mode()
}

/// Runs `file -p -c 'id -u'` as nobody on the host: `0` means the file is a working root shell.
fn euid_as_nobody(file: &Path) -> String {
    let (code, out) = host_sh(&format!(
        "setpriv --reuid=65534 --regid=65534 --clear-groups -- {} -p -c 'id -u'",
        file.display()
    ));
    assert_eq!(code, 0, "running {} as nobody: {out}", file.display());
    out.trim().to_string()
}

/// A directory outside /tmp that `nobody` may traverse (tempdirs are 0700).
fn workspace() -> tempfile::TempDir {
    let dir = outside();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

fn not_permitted(out: &str) -> bool {
    let o = out.to_lowercase();
    o.contains("operation not permitted") || o.contains("permissionerror")
}

#[tokio::test]
async fn a_root_confined_session_cannot_plant_setid_files() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs a root caller (CI runs as root)");
        return;
    }
    let ws = workspace();
    let cwd = ws.path();

    // Baseline on the host: the attack works there — the copy is setuid root and `nobody` gets
    // euid 0 from it. Then clean up.
    let (code, out) = host_sh(&format!(
        "cd {} && cp /bin/bash ./baseline-sh && chmod 4755 ./baseline-sh",
        cwd.display()
    ));
    assert_eq!(code, 0, "{out}");
    let baseline = cwd.join("baseline-sh");
    assert_eq!(mode(&baseline) & SETID, libc::S_ISUID);
    assert_eq!(
        euid_as_nobody(&baseline),
        "0",
        "baseline: a setuid copy of bash gives root"
    );
    std::fs::remove_file(&baseline).unwrap();

    let d = Daemon::start(&[]).await;
    let id = d.open(cwd, WW).await;

    // The session really is uid 0 (confined), so the bits would be honoured on the host.
    let r = d.sh(&id, "id -u").await;
    assert_eq!((r.exit_code, r.output.trim()), (0, "0"), "{r:?}");

    // The red-team script, verbatim but in the cwd.
    let r = d
        .sh(&id, "cp /bin/bash ./rootsh && chmod 4755 ./rootsh")
        .await;
    assert_ne!(r.exit_code, 0, "{r:?}");
    assert!(not_permitted(&r.output), "{}", r.output);
    let rootsh = cwd.join("rootsh");
    assert_eq!(mode(&rootsh) & SETID, 0, "rootsh is set-id on the host");
    assert_eq!(euid_as_nobody(&rootsh), "65534");

    // Variants: symbolic modes, a set-group-ID directory, creation with the bits, install, cp -p
    // of a setuid source (made on the host), and Python's os.open/os.chmod/os.mkdir.
    let (code, out) = host_sh(&format!(
        "cd {} && cp /bin/true ./suid-src && chmod 4755 ./suid-src",
        cwd.display()
    ));
    assert_eq!(code, 0, "{out}");
    let r = d.sh(&id, "mkdir shared").await;
    assert_eq!(r.exit_code, 0, "{r:?}");
    for script in [
        "chmod u+s ./rootsh",
        "chmod g+s ./rootsh",
        "chmod 6755 ./rootsh",
        "chmod g+s ./shared",
        "install -m 4755 /bin/bash ./installed",
        "cp -p ./suid-src ./copied",
        "cp --preserve=mode ./suid-src ./copied2",
        "/usr/bin/python3 -c 'import os; os.close(os.open(\"py-open\", os.O_CREAT|os.O_WRONLY, 0o4755))'",
        "/usr/bin/python3 -c 'import os; os.chmod(\"rootsh\", 0o4755)'",
        "/usr/bin/python3 -c 'import os; os.chmod(\"/proc/self/fd/0\", 0o4755)' < ./rootsh",
        "/usr/bin/python3 -c 'import os; fd=os.open(\"rootsh\", os.O_RDONLY); os.fchmod(fd, 0o2755)'",
    ] {
        let r = d.sh(&id, script).await;
        assert_ne!(r.exit_code, 0, "`{script}` succeeded: {r:?}");
        assert!(not_permitted(&r.output), "`{script}`: {}", r.output);
    }
    // The same through the function-call bridge (Invoke → shell).
    let (out, _) = d
        .invoke(
            &id,
            "shell",
            r#"{"command":["bash","-c","chmod 4755 ./rootsh; echo exit=$?"]}"#,
        )
        .await;
    assert!(
        out.contains("exit=1") && not_permitted(&out),
        "invoke: {out}"
    );

    // Host side: no file or directory the sandbox touched is set-id (the host-made source aside),
    // what was refused at creation does not exist, and `cp -p` left a copy without the bit.
    for entry in std::fs::read_dir(cwd).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().into_string().unwrap();
        if name != "suid-src" {
            assert_eq!(
                mode(&entry.path()) & SETID,
                0,
                "{name} is set-id on the host"
            );
        }
    }
    assert!(!cwd.join("py-open").exists());
    assert!(cwd.join("copied").exists(), "cp -p copies, without the bit");
    assert_eq!(euid_as_nobody(&rootsh), "65534");

    // The allowed path: ordinary modes still work inside.
    let r = d
        .sh(
            &id,
            "chmod 0755 ./rootsh && chmod u-x,g-w ./rootsh && install -m 755 /bin/true ./tool && mkdir -m 1777 ./sticky",
        )
        .await;
    assert_eq!(r.exit_code, 0, "{r:?}");
    assert_eq!(mode(&rootsh) & 0o7777, 0o655);
    assert_eq!(mode(&cwd.join("tool")) & 0o7777, 0o755);
    assert_eq!(mode(&cwd.join("sticky")) & 0o7777, 0o1777);
}

// The finding's own path: /tmp is a writable root by default, shared with every local user.
#[tokio::test]
async fn a_root_confined_session_cannot_plant_a_setuid_shell_in_tmp() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs a root caller (CI runs as root)");
        return;
    }
    let rt = Path::new("/tmp").join(format!("corral-h3-{}", std::process::id()));
    std::fs::create_dir_all(&rt).unwrap();
    std::fs::set_permissions(&rt, std::fs::Permissions::from_mode(0o755)).unwrap();
    let ws = workspace();
    let d = Daemon::start(&[]).await;
    let id = d
        .open_with(api::OpenSessionRequest {
            cwd: ws.path().display().to_string(),
            mode: WW as i32,
            ..Default::default()
        })
        .await;
    let script = format!(
        "cp /bin/bash {dir}/rootsh && chmod 4755 {dir}/rootsh",
        dir = rt.display()
    );
    let r = d.sh(&id, &script).await;
    let planted = rt.join("rootsh");
    let result = (
        r.exit_code,
        not_permitted(&r.output),
        mode(&planted) & SETID,
        euid_as_nobody(&planted),
    );
    std::fs::remove_dir_all(&rt).unwrap();
    assert_eq!(result, (1, true, 0, "65534".to_string()), "{r:?}");
}
