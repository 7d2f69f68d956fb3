//! A read-only worker's Landlock ruleset does not handle `READ_FILE`, `READ_DIR`, `EXECUTE` and
//! `TRUNCATE` (they made every `open` walk to `/`; src/sandbox/landlock.rs says what covers them
//! instead: the read-only mounts, seccomp's read-only entries, Landlock's own refusal to mount,
//! the capability drop). Each case attacks one of those covers through a real daemon, against a
//! root daemon and an ordinary user's single-user daemon (whose sandbox is built in a user
//! namespace), proves the baseline on the host, checks the host afterwards, and checks that
//! reading, grep and exec still work.

use crate::common::{self, RunAs};
use corral::api::{self, SandboxMode};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

const RO: SandboxMode = SandboxMode::ReadOnly;

common::on_both_daemons! {
    "rol";
    only_dev_shm_and_dev_pts_are_writable_mounts,
    no_truncation_or_write_outside_while_reads_grep_and_exec_work,
    a_host_descriptor_cannot_be_truncated_through_proc_self_fd,
}

/// `name -> outcome` lines printed by the Python probes (`OK` or an errno number).
fn outcomes(output: &str) -> std::collections::BTreeMap<String, String> {
    output
        .lines()
        .filter_map(|l| l.strip_prefix("@ "))
        .filter_map(|l| l.split_once(' '))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Python helper shared by the probes: `attempt(name, fn)` prints `@ name OK` or `@ name ERRNO`.
const PY_ATTEMPT: &str = r#"
import os, errno, sys
def attempt(name, f):
    try:
        r = f()
        if isinstance(r, int) and "open" in name:
            os.close(r)
        print("@", name, "OK")
    except OSError as e:
        print("@", name, e.errno)
"#;

async fn python(d: &common::Daemon, id: &str, script: &str, args: &[&str]) -> common::Ran {
    let mut command = vec![
        "python3".to_string(),
        "-c".to_string(),
        format!("{PY_ATTEMPT}{script}"),
    ];
    command.extend(args.iter().map(|a| a.to_string()));
    d.shell(api::ShellRequest {
        session_id: id.to_string(),
        command,
        ..Default::default()
    })
    .await
}

/// The claim the ruleset rests on: in a read-only worker every mount is read-only except the
/// private `/dev/shm` (Landlock grants it everything anyway) and `/dev/pts` (character devices
/// only, which cannot be truncated), and `/proc` is the sandbox's own.
async fn only_dev_shm_and_dev_pts_are_writable_mounts(who: &RunAs) {
    let d = who.start(&[]).await;
    let cwd = who.scratch();
    let id = d.open(cwd.path(), RO).await;
    let r = d.sh(&id, "cat /proc/self/mountinfo").await;
    assert_eq!(r.exit_code, 0, "{}", r.output);
    let mut writable = Vec::new();
    let mut mounts = 0;
    for line in r.output.lines() {
        // id parent major:minor root mount-point options ... - fstype source super-options
        let fields: Vec<&str> = line.split(' ').collect();
        assert!(fields.len() >= 6, "{line}");
        mounts += 1;
        if fields[5].split(',').any(|o| o == "rw") {
            writable.push(fields[4].to_string());
        }
    }
    writable.sort();
    assert!(mounts > 5, "{}", r.output);
    assert_eq!(
        writable,
        ["/dev/pts", "/dev/shm"],
        "writable mounts in a read-only worker:\n{}",
        r.output
    );
    // Nothing under /dev/pts is a regular file (truncate(2) refuses anything else).
    let r = d
        .sh(&id, "find /dev/pts -mindepth 1 ! -type c | wc -l")
        .await;
    assert_eq!((r.exit_code, r.output.trim()), (0, "0"), "{}", r.output);
    // Baseline: the host itself has writable mounts beyond those (the scratch dir's, at least).
    let host = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        host.lines()
            .any(|l| l.split(' ').nth(5).is_some_and(|o| o.starts_with("rw"))
                && !l.contains(" /dev/")),
        "{host}"
    );
}

/// Every path-based way to truncate or change a host file, on a file outside any root, through
/// `/proc/self/root`, on procfs and sysfs; `/dev/shm` still works; reading, grep and exec work.
async fn no_truncation_or_write_outside_while_reads_grep_and_exec_work(who: &RunAs) {
    let d = who.start(&[]).await;
    let cwd = who.scratch();
    let out = who.outside();
    let victim = out.path().join("victim.txt");
    who.write(&victim, "original deprecated\n");
    let before = std::fs::metadata(&victim).unwrap();

    // Baseline on the host, as the sandbox's uid, on a copy: the same probes change it.
    let copy = out.path().join("copy.txt");
    who.write(&copy, "original\n");
    let (code, text) = who.host_sh(&format!(
        "python3 -c 'import os; os.truncate(\"{0}\", 0)' && test ! -s {0} && echo x >> {0} && \
         truncate -s0 {0} && chmod 600 {0} && mv {0} {0}.moved && echo baseline-ok",
        copy.display()
    ));
    assert_eq!((code, text.trim()), (0, "baseline-ok"), "{text}");

    let id = d.open(cwd.path(), RO).await;
    let script = r#"
p = sys.argv[1]
d = os.path.dirname(p)
via_root = "/proc/self/root" + p
O_NOACCESS = 3   # "check read and write permission, grant neither"
for name, path in [("plain", p), ("proc_root", via_root)]:
    attempt(name + "_truncate", lambda: os.truncate(path, 0))
    attempt(name + "_open_rdonly_trunc", lambda: os.open(path, os.O_RDONLY | os.O_TRUNC))
    attempt(name + "_open_noaccess_trunc", lambda: os.open(path, O_NOACCESS | os.O_TRUNC))
    attempt(name + "_open_wronly_trunc", lambda: os.open(path, os.O_WRONLY | os.O_TRUNC))
    attempt(name + "_open_rdwr", lambda: os.open(path, os.O_RDWR))
    attempt(name + "_open_append", lambda: os.open(path, os.O_WRONLY | os.O_APPEND))
attempt("rename", lambda: os.rename(p, p + ".moved"))
attempt("link", lambda: os.link(p, d + "/hard"))
attempt("symlink", lambda: os.symlink(p, d + "/soft"))
attempt("mknod_fifo", lambda: os.mknod(d + "/fifo", 0o600 | 0o010000))
attempt("mknod_char", lambda: os.mknod(d + "/null", 0o600 | 0o020000, os.makedev(1, 3)))
attempt("chmod", lambda: os.chmod(p, 0o600))
attempt("utime", lambda: os.utime(p, (0, 0)))
attempt("unlink", lambda: os.unlink(p))
attempt("mkdir", lambda: os.mkdir(d + "/sub"))
attempt("create", lambda: os.open(d + "/new", os.O_WRONLY | os.O_CREAT, 0o644))
# Not beneath the view: a file handle, and a mount (Landlock refuses mounts to any domain that
# handles a filesystem right, seccomp and the capability drop too).
import ctypes, struct
libc = ctypes.CDLL(None, use_errno=True)
NR = {"x86_64": (303, 304, 165), "aarch64": (264, 265, 40)}[os.uname().machine]
def raw(nr, *a):
    if libc.syscall(nr, *a) < 0:
        raise OSError(ctypes.get_errno(), "")
buf = ctypes.create_string_buffer(struct.pack("I", 128) + bytes(132))
mid = ctypes.c_int(0)
# (name_to_handle_at is allowed: a handle is useless without open_by_handle_at.)
attempt("name_to_handle_at", lambda: raw(NR[0], -100, p.encode(), buf, ctypes.byref(mid), 0))
attempt("open_by_handle_at", lambda: raw(NR[1], os.open("/", os.O_RDONLY), buf, 0))
attempt("mount_tmpfs", lambda: raw(NR[2], b"none", d.encode(), b"tmpfs", 0, None))
# procfs and sysfs: read-only mounts (harmless targets: the sandbox's own hostname, a sysfs
# attribute opened without writing).
attempt("proc_truncate", lambda: os.truncate("/proc/sys/kernel/hostname", 0))
attempt("proc_open_wronly_trunc", lambda: os.open("/proc/sys/kernel/hostname", os.O_WRONLY | os.O_TRUNC))
attempt("sys_open_rdonly_trunc", lambda: os.open("/sys/kernel/mm/transparent_hugepage/enabled", os.O_RDONLY | os.O_TRUNC))
# The allowed path: /dev/shm is writable and truncatable with a descriptor.
s = "/dev/shm/f"
def shm():
    fd = os.open(s, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, b"abcdef"); os.ftruncate(fd, 2); os.close(fd)
    assert open(s).read() == "ab"
attempt("shm_write_ftruncate", shm)
attempt("shm_path_truncate", lambda: os.truncate(s, 0))
print("@ read", open(p).read().strip().replace(" ", "_"))
"#;
    let victim_s = victim.display().to_string();
    let r = python(&d, &id, script, &[&victim_s]).await;
    let got = outcomes(&r.output);
    let (eperm, eacces, erofs) = (
        libc::EPERM.to_string(),
        libc::EACCES.to_string(),
        libc::EROFS.to_string(),
    );
    // seccomp's read-only entries answer first (EPERM) for truncation by path.
    for name in [
        "plain_truncate",
        "plain_open_rdonly_trunc",
        "plain_open_noaccess_trunc",
        "proc_root_truncate",
        "proc_root_open_rdonly_trunc",
        "proc_root_open_noaccess_trunc",
        "proc_truncate",
        "sys_open_rdonly_trunc",
        "shm_path_truncate",
        "open_by_handle_at",
        "mount_tmpfs",
    ] {
        assert_eq!(got.get(name), Some(&eperm), "{name}: {}", r.output);
    }
    // Every other change fails: the read-only mount (EROFS) or Landlock (EACCES).
    for name in [
        "plain_open_wronly_trunc",
        "plain_open_rdwr",
        "plain_open_append",
        "proc_root_open_wronly_trunc",
        "proc_root_open_rdwr",
        "proc_root_open_append",
        "rename",
        "link",
        "symlink",
        "mknod_fifo",
        "mknod_char",
        "chmod",
        "utime",
        "unlink",
        "mkdir",
        "create",
        "proc_open_wronly_trunc",
    ] {
        let v = got
            .get(name)
            .unwrap_or_else(|| panic!("{name}: {}", r.output));
        assert!(
            [&eperm, &eacces, &erofs].contains(&v),
            "{name} gave {v}: {}",
            r.output
        );
    }
    assert_eq!(
        got.get("shm_write_ftruncate").map(String::as_str),
        Some("OK"),
        "{}",
        r.output
    );
    assert_eq!(
        got.get("read").map(String::as_str),
        Some("original_deprecated"),
        "{}",
        r.output
    );

    // The host file is untouched, nothing appeared beside it.
    let after = std::fs::metadata(&victim).unwrap();
    assert_eq!(
        std::fs::read_to_string(&victim).unwrap(),
        "original deprecated\n"
    );
    assert_eq!(
        (after.mode(), after.mtime(), after.ino()),
        (before.mode(), before.mtime(), before.ino())
    );
    let mut names: Vec<String> = std::fs::read_dir(out.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["copy.txt.moved", "victim.txt"]);

    // The allowed path: grep_files finds the file, directories list, programs run.
    let (text, ok) = d
        .invoke(
            &id,
            "grep_files",
            &format!(
                r#"{{"pattern":"deprecated","path":"{}"}}"#,
                out.path().display()
            ),
        )
        .await;
    assert!(ok && text.contains(&victim_s), "{text}");
    let r = d
        .sh(
            &id,
            &format!("ls {} && /bin/sh -c 'echo exec-ok'", out.path().display()),
        )
        .await;
    assert_eq!(r.exit_code, 0, "{}", r.output);
    assert!(
        r.output.contains("victim.txt") && r.output.contains("exec-ok"),
        "{}",
        r.output
    );
}

/// The one way out of the read-only view: a descriptor a host process hands over a UNIX socket
/// (network on) names a file on the host's writable mount, and `/proc/self/fd/N` reopens it
/// there. Landlock no longer handles `TRUNCATE` in read-only mode, so seccomp must refuse every
/// truncation by path; writing still needs `WRITE_FILE`.
async fn a_host_descriptor_cannot_be_truncated_through_proc_self_fd(who: &RunAs) {
    let d = who.start(&[]).await;
    let cwd = who.scratch();
    let out = who.outside();
    let victim = out.path().join("victim.txt");
    let copy = out.path().join("copy.txt");
    who.write(&victim, "original\n");
    who.write(&copy, "original\n");
    let sock = out.path().join("fds.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    who.own(&sock);

    // The receiving probe, run on the host first (baseline: it truncates through the magic
    // link), then in the sandbox.
    let probe = r#"
import socket
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
except OSError as e:
    print("@ connect", e.errno); sys.exit(0)
msg, fds, _, _ = socket.recv_fds(s, 16, 2)
rd, opath = fds
print("@ received", len(fds))
for name, fd in [("rd", rd), ("opath", opath)]:
    m = "/proc/self/fd/%d" % fd
    attempt(name + "_open_wronly", lambda: os.open(m, os.O_WRONLY))
    attempt(name + "_open_wronly_trunc", lambda: os.open(m, os.O_WRONLY | os.O_TRUNC))
    attempt(name + "_truncate", lambda: os.truncate(m, 0))
    attempt(name + "_open_noaccess_trunc", lambda: os.open(m, 3 | os.O_TRUNC))
    attempt(name + "_open_rdonly_trunc", lambda: os.open(m, os.O_RDONLY | os.O_TRUNC))
attempt("rd_ftruncate", lambda: os.ftruncate(rd, 0))
print("@ read", os.read(os.open("/proc/self/fd/%d" % opath, os.O_RDONLY), 100).decode().strip())
"#;
    let serve = |listener: std::os::unix::net::UnixListener, file: std::path::PathBuf| {
        std::thread::spawn(move || {
            listener.set_nonblocking(false).unwrap();
            let Ok((conn, _)) = listener.accept() else {
                return;
            };
            let rd: OwnedFd = std::fs::File::open(&file).unwrap().into();
            let opath = nix::fcntl::open(
                &file,
                nix::fcntl::OFlag::O_PATH,
                nix::sys::stat::Mode::empty(),
            )
            .unwrap();
            let fds = [rd.as_raw_fd(), opath.as_raw_fd()];
            let cmsg = [nix::sys::socket::ControlMessage::ScmRights(&fds)];
            let iov = [std::io::IoSlice::new(b"f")];
            nix::sys::socket::sendmsg::<()>(
                conn.as_raw_fd(),
                &iov,
                &cmsg,
                nix::sys::socket::MsgFlags::empty(),
                None,
            )
            .unwrap();
            // Hold the connection until the reader is done.
            let mut buf = [0u8; 1];
            let _ = std::io::Read::read(&mut &conn, &mut buf);
        })
    };
    let sock_s = sock.display().to_string();
    let script = format!("{PY_ATTEMPT}{probe}");
    let t = serve(listener.try_clone().unwrap(), copy.clone());
    let (code, text) = who.host_sh(&format!(
        "python3 -c '{}' {sock_s}",
        script.replace('\'', r"'\''")
    ));
    t.join().unwrap();
    assert_eq!(code, 0, "{text}");
    let base = outcomes(&text);
    assert_eq!(
        base.get("rd_open_rdonly_trunc").map(String::as_str),
        Some("OK"),
        "{text}"
    );
    assert_eq!(
        std::fs::read_to_string(&copy).unwrap(),
        "",
        "baseline truncated"
    );

    let id = d
        .open_with(api::OpenSessionRequest {
            cwd: cwd.path().display().to_string(),
            mode: RO as i32,
            network_access: true,
            ..Default::default()
        })
        .await;
    let t = serve(listener, victim.clone());
    let r = python(&d, &id, probe, &[&sock_s]).await;
    let got = outcomes(&r.output);
    if let Some(errno) = got.get("connect") {
        // Landlock ABI 9 (pathname UNIX socket connect) stops the variant one step earlier.
        assert_eq!(errno, &libc::EACCES.to_string(), "{}", r.output);
        assert!(corral_landlock_abi() >= 9, "{}", r.output);
        // Unblock the sender thread.
        drop(std::os::unix::net::UnixStream::connect(&sock));
    } else {
        assert_eq!(
            got.get("received").map(String::as_str),
            Some("2"),
            "{}",
            r.output
        );
        let (eperm, eacces) = (libc::EPERM.to_string(), libc::EACCES.to_string());
        for fd in ["rd", "opath"] {
            for op in ["truncate", "open_noaccess_trunc", "open_rdonly_trunc"] {
                let name = format!("{fd}_{op}");
                assert_eq!(got.get(&name), Some(&eperm), "{name}: {}", r.output);
            }
            for op in ["open_wronly", "open_wronly_trunc"] {
                let name = format!("{fd}_{op}");
                assert_eq!(got.get(&name), Some(&eacces), "{name}: {}", r.output);
            }
        }
        // ftruncate needs a descriptor open for writing; the host handed a read-only one.
        assert_eq!(
            got.get("rd_ftruncate"),
            Some(&libc::EINVAL.to_string()),
            "{}",
            r.output
        );
        // Reading what the host handed over is allowed (the holder could read it anyway).
        assert_eq!(
            got.get("read").map(String::as_str),
            Some("original"),
            "{}",
            r.output
        );
    }
    t.join().unwrap();
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "original\n");
}

/// The kernel's Landlock ABI (`landlock_create_ruleset(NULL, 0, VERSION)`).
fn corral_landlock_abi() -> i64 {
    // SAFETY: the documented version query; the kernel reads no user memory.
    unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            1u32,
        )
    }
}
