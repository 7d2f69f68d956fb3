//! Helpers for the layer tests: every layer is applied in a forked child (a layer cannot be
//! removed again, and Landlock/seccomp must never touch the test harness itself), the child
//! attempts the escape, and the parent asserts on the child's verdict and on the host afterwards.
//!
//! Forking the multi-threaded test harness is acceptable here because the child only performs
//! syscalls, simple std fs calls and `std::process::Command` (fork+exec) before `_exit`; glibc
//! makes malloc safe across fork, and nothing in these tests writes the environment.

use std::ffi::CString;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{ForkResult, fork};

/// How a forked child ended and what it said.
#[derive(Debug)]
pub(crate) struct Outcome {
    pub status: WaitStatus,
    /// The child's error text (empty on success).
    pub message: String,
}

impl Outcome {
    pub fn exited_ok(&self) -> bool {
        matches!(self.status, WaitStatus::Exited(_, 0))
    }
}

/// Runs `f` in a forked child and returns how it ended. `Err(text)` from `f` makes the child
/// exit 1 and `text` arrive in `Outcome::message`; a panic exits 2.
pub(crate) fn in_child(f: impl FnOnce() -> Result<(), String>) -> Outcome {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two fds into the array.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both fds were just created and are owned here.
    let (read_end, write_end) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: the child only runs `f` (syscalls, fs, Command) and then _exit.
    match unsafe { fork() }.expect("fork") {
        ForkResult::Child => {
            drop(read_end);
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
            let (code, text) = match result {
                Ok(Ok(())) => (0, String::new()),
                Ok(Err(text)) => (1, text),
                Err(_) => (2, "child panicked".to_string()),
            };
            // SAFETY: writing a valid buffer to our own pipe, then leaving without running
            // the harness's destructors or atexit handlers.
            unsafe {
                libc::write(write_end.as_raw_fd(), text.as_ptr().cast(), text.len());
                libc::_exit(code);
            }
        }
        ForkResult::Parent { child } => {
            drop(write_end);
            let mut message = String::new();
            std::fs::File::from(read_end)
                .read_to_string(&mut message)
                .expect("read child message");
            let status = waitpid(child, None).expect("waitpid");
            Outcome { status, message }
        }
    }
}

/// Runs `f` in a child and panics with the child's message unless it exited 0.
#[track_caller]
pub(crate) fn assert_child_ok(f: impl FnOnce() -> Result<(), String>) {
    let outcome = in_child(f);
    assert!(
        outcome.exited_ok(),
        "child failed: {:?}: {}",
        outcome.status,
        outcome.message
    );
}

/// The errno of the last failed libc call.
pub(crate) fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// `Ok(return value)` or `Err(errno)` of a raw syscall result.
pub(crate) fn sys(ret: i64) -> Result<i64, i32> {
    if ret < 0 { Err(errno()) } else { Ok(ret) }
}

/// Checks that a raw syscall failed with `want`; `what` names the attempt in the error.
pub(crate) fn expect_errno(what: &str, ret: i64, want: i32) -> Result<(), String> {
    match sys(ret) {
        Err(e) if e == want => Ok(()),
        Err(e) => Err(format!("{what}: expected errno {want}, got errno {e}")),
        Ok(v) => Err(format!(
            "{what}: expected errno {want}, but it succeeded ({v})"
        )),
    }
}

/// Checks that a raw syscall succeeded.
pub(crate) fn expect_success(what: &str, ret: i64) -> Result<i64, String> {
    sys(ret).map_err(|e| format!("{what}: expected success, got errno {e}"))
}

/// `/bin/sh -c script` with its output captured (run by a confined child: fork+exec from there,
/// so the command inherits every layer just as a tool command would).
pub(crate) fn sh(script: &str) -> Result<Output, String> {
    Command::new("/bin/sh")
        .arg("-c")
        .arg(script)
        .output()
        .map_err(|e| format!("spawning /bin/sh -c {script:?}: {e}"))
}

/// Runs `sh -c script` and requires exit 0.
pub(crate) fn sh_ok(script: &str) -> Result<Output, String> {
    let out = sh(script)?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(format!(
            "`{script}` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Runs `sh -c script` and requires failure whose stderr contains `needle`.
pub(crate) fn sh_denied(script: &str, needle: &str) -> Result<Output, String> {
    let out = sh(script)?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        return Err(format!("`{script}` unexpectedly succeeded"));
    }
    if !stderr.contains(needle) {
        return Err(format!("`{script}` failed without {needle:?}: {stderr}"));
    }
    Ok(out)
}

/// A C string for raw syscalls.
pub(crate) fn cstr(p: impl AsRef<Path>) -> CString {
    CString::new(p.as_ref().as_os_str().as_encoded_bytes()).expect("no NUL in path")
}

/// A unique directory under /tmp, removed (recursively) on drop.
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "corral-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&path).expect("create temp dir");
        Self(path.canonicalize().expect("canonical temp dir"))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
