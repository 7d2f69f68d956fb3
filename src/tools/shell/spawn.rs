//! Starting a command's leader with `posix_spawn` (glibc: `clone(CLONE_VM | CLONE_VFORK)`), not
//! `fork`: no page tables of the multi-threaded worker are copied, which is most of what a
//! `fork` + `pre_exec` spawn cost over a bare one (docs/BENCHMARKS.md §1).
//!
//! What the old `pre_exec` hook did, and what std's `Command` did around it, is carried over item
//! by item, as spawn attributes and file actions executed in the child before `exec`:
//! - a new session (`POSIX_SPAWN_SETSID`): no controlling terminal, and the session id names the
//!   command's processes for the tree kill (proctree.rs);
//! - every signal at its default disposition (`POSIX_SPAWN_SETSIGDEF` with signals 1-64;
//!   ignored dispositions would otherwise survive `exec`) and an empty signal mask
//!   (`POSIX_SPAWN_SETSIGMASK`);
//! - stdin `/dev/null`, stdout and stderr the write ends of two pipes;
//! - the working directory (`posix_spawn_file_actions_addchdir_np`, applied before `exec`, so
//!   relative program paths and `PATH` entries resolve against it as they did);
//! - every descriptor above 2 closed (`posix_spawn_file_actions_addclosefrom_np`), on top of
//!   close-on-exec everywhere: the worker's request socket can never reach a command, even if a
//!   descriptor were one day opened without `O_CLOEXEC`;
//! - the exact environment (std's rules: last value of a name wins, names sorted, NUL refused);
//! - `execvp`'s program search in the request's `PATH` (default `/bin:/usr/bin`), including its
//!   error choice (`EACCES` if any candidate was not executable, else the last error) and its
//!   `/bin/sh` fallback for a file the kernel cannot execute (`ENOEXEC`).
//!
//! Resource limits, Landlock, seccomp, namespaces and credentials are the worker's and are
//! inherited as before; nothing is set per command.
//!
//! unified_exec's processes do not start here: a PTY must become its new session's controlling
//! terminal (`TIOCSCTTY`), which `posix_spawn` cannot do, so they keep a `pre_exec` hook
//! (tools/unified_exec/process/spawn.rs).

use std::collections::BTreeMap;
use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;

/// The search path `execvp` uses when the environment has no `PATH` (glibc's default).
const DEFAULT_PATH: &[u8] = b"/bin:/usr/bin";

/// A started command leader, not yet reaped.
#[derive(Debug)]
pub(crate) struct Spawned {
    pub pid: i32,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

fn nul_error() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        "nul byte found in provided data",
    )
}

fn cstring(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| nul_error())
}

/// `0` or an error number, as the `posix_spawn*` functions return.
fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(rc))
    }
}

/// Spawn attributes, destroyed on drop.
struct Attr(libc::posix_spawnattr_t);

impl Attr {
    fn new() -> io::Result<Self> {
        // SAFETY: posix_spawnattr_init initialises the zeroed struct in place.
        unsafe {
            let mut attr: libc::posix_spawnattr_t = std::mem::zeroed();
            check(libc::posix_spawnattr_init(&mut attr))?;
            let mut this = Attr(attr);
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            // glibc's sigfillset leaves out the two signals it uses internally (32 and 33), and
            // its spawn child then sets those to SIG_IGN, which survives exec. Signals 1-64 are
            // the first 64 bits of the set (bit n-1 for signal n): set them all by hand.
            (&mut all as *mut libc::sigset_t)
                .cast::<u64>()
                .write(u64::MAX);
            libc::sigemptyset(&mut none);
            check(libc::posix_spawnattr_setsigdefault(&mut this.0, &all))?;
            check(libc::posix_spawnattr_setsigmask(&mut this.0, &none))?;
            let flags = libc::POSIX_SPAWN_SETSID as libc::c_int
                | libc::POSIX_SPAWN_SETSIGDEF
                | libc::POSIX_SPAWN_SETSIGMASK;
            check(libc::posix_spawnattr_setflags(
                &mut this.0,
                flags as libc::c_short,
            ))?;
            Ok(this)
        }
    }
}

impl Drop for Attr {
    fn drop(&mut self) {
        // SAFETY: initialised in `new`.
        unsafe { libc::posix_spawnattr_destroy(&mut self.0) };
    }
}

/// File actions, destroyed on drop.
struct Actions(libc::posix_spawn_file_actions_t);

/// How the child gets to its working directory: by descriptor (the pinned one, H24) or by path.
enum Chdir<'a> {
    Fd(std::os::fd::RawFd),
    Path(&'a CString),
}

impl Actions {
    fn new(stdout: &OwnedFd, stderr: &OwnedFd, cwd: Chdir<'_>) -> io::Result<Self> {
        // SAFETY: init initialises the zeroed struct; the add* functions copy their path
        // arguments, and the descriptors outlive the spawn.
        unsafe {
            let mut fa: libc::posix_spawn_file_actions_t = std::mem::zeroed();
            check(libc::posix_spawn_file_actions_init(&mut fa))?;
            let mut this = Actions(fa);
            check(libc::posix_spawn_file_actions_addopen(
                &mut this.0,
                0,
                c"/dev/null".as_ptr(),
                libc::O_RDONLY,
                0,
            ))?;
            // dup2 clears close-on-exec on the copy only.
            check(libc::posix_spawn_file_actions_adddup2(
                &mut this.0,
                stdout.as_raw_fd(),
                1,
            ))?;
            check(libc::posix_spawn_file_actions_adddup2(
                &mut this.0,
                stderr.as_raw_fd(),
                2,
            ))?;
            match cwd {
                Chdir::Fd(fd) => {
                    check(libc::posix_spawn_file_actions_addfchdir_np(&mut this.0, fd))?
                }
                Chdir::Path(path) => check(libc::posix_spawn_file_actions_addchdir_np(
                    &mut this.0,
                    path.as_ptr(),
                ))?,
            }
            // Belt and braces over close-on-exec, which every descriptor the worker holds has
            // (its request socket is marked at start). musl has no closefrom action: the static
            // build relies on close-on-exec alone, as fork + exec did.
            #[cfg(not(target_env = "musl"))]
            check(libc::posix_spawn_file_actions_addclosefrom_np(
                &mut this.0,
                3,
            ))?;
            Ok(this)
        }
    }
}

impl Drop for Actions {
    fn drop(&mut self) {
        // SAFETY: initialised in `new`.
        unsafe { libc::posix_spawn_file_actions_destroy(&mut self.0) };
    }
}

/// A pipe whose both ends are close-on-exec: (read, write).
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both are fresh descriptors we own.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// The environment block, built as std's `Command` builds it after `env_clear` + `envs`.
fn envp(env: &[(String, String)]) -> io::Result<Vec<CString>> {
    let map: BTreeMap<&str, &str> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    map.into_iter()
        .map(|(k, v)| {
            let mut entry = Vec::with_capacity(k.len() + v.len() + 1);
            entry.extend_from_slice(k.as_bytes());
            entry.push(b'=');
            entry.extend_from_slice(v.as_bytes());
            cstring(&entry)
        })
        .collect()
}

/// Pointer array terminated by NULL, borrowing `items`.
fn ptrs(items: &[CString]) -> Vec<*mut libc::c_char> {
    items
        .iter()
        .map(|s| s.as_ptr() as *mut libc::c_char)
        .chain(std::iter::once(std::ptr::null_mut()))
        .collect()
}

/// The candidates `execvp` would try for `program`, in order: the program itself if it names a
/// path, else each `PATH` entry joined with it (an empty entry is the working directory).
fn candidates(program: &str, env: &[(String, String)]) -> Vec<Vec<u8>> {
    if program.contains('/') {
        return vec![program.as_bytes().to_vec()];
    }
    // The last PATH wins, as in the environment block.
    let path = env
        .iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map_or(DEFAULT_PATH, |(_, v)| v.as_bytes());
    path.split(|b| *b == b':')
        .map(|dir| {
            let mut full = Vec::with_capacity(dir.len() + program.len() + 1);
            if !dir.is_empty() {
                full.extend_from_slice(dir);
                full.push(b'/');
            }
            full.extend_from_slice(program.as_bytes());
            full
        })
        .collect()
}

/// Spawns `argv` in `cwd` with exactly `env`, as described in the module comment.
pub(crate) fn spawn(argv: &[String], env: &[(String, String)], cwd: &Path) -> io::Result<Spawned> {
    let Some(program) = argv.first() else {
        return Err(io::Error::from_raw_os_error(libc::ENOENT));
    };
    let args: Vec<CString> = argv
        .iter()
        .map(|a| cstring(a.as_bytes()))
        .collect::<io::Result<_>>()?;
    let envs = envp(env)?;
    let cwd_c = cstring(cwd.as_os_str().as_bytes())?;
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    let attr = Attr::new()?;
    // Held until the spawn is done: the child fchdirs to it.
    let start = super::pinned_cwd::open(cwd).transpose()?;
    let actions = Actions::new(
        &out_w,
        &err_w,
        match &start {
            Some(dir) => Chdir::Fd(dir.raw()),
            None => Chdir::Path(&cwd_c),
        },
    )?;
    let argv_p = ptrs(&args);
    let envp_p = ptrs(&envs);

    let try_spawn = |path: &CString, argv_p: &[*mut libc::c_char]| -> io::Result<i32> {
        let mut pid: libc::pid_t = 0;
        // SAFETY: every pointer is valid and NULL-terminated for the duration of the call;
        // posix_spawn does not retain them.
        let rc = unsafe {
            libc::posix_spawn(
                &mut pid,
                path.as_ptr(),
                &actions.0,
                &attr.0,
                argv_p.as_ptr(),
                envp_p.as_ptr(),
            )
        };
        check(rc).map(|()| pid)
    };

    let mut eacces = false;
    let mut last = io::Error::from_raw_os_error(libc::ENOENT);
    let searching = !program.contains('/');
    for candidate in candidates(program, env) {
        let path = cstring(&candidate)?;
        // A candidate that does not exist would fail exec the same way; skipping it here saves
        // a whole spawn per PATH entry before the right one. Relative ones resolve in `cwd` (from
        // the pinned directory, where the command starts).
        if searching {
            let abs = cwd.join(OsStr::from_bytes(&candidate));
            if let Err(e) = std::fs::metadata(super::pinned_cwd::fs_path(&abs))
                && matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR))
            {
                last = e;
                continue;
            }
        }
        let result = match try_spawn(&path, &argv_p) {
            Err(e) if e.raw_os_error() == Some(libc::ENOEXEC) => {
                // execvp runs a file the kernel cannot execute as a shell script.
                let mut sh_args = vec![c"/bin/sh".to_owned(), path.clone()];
                sh_args.extend(args.iter().skip(1).cloned());
                try_spawn(&sh_args[0], &ptrs(&sh_args))
            }
            other => other,
        };
        match result {
            Ok(pid) => {
                return Ok(Spawned {
                    pid,
                    stdout: out_r,
                    stderr: err_r,
                });
            }
            Err(e) if !searching => return Err(e),
            Err(e) => match e.raw_os_error() {
                Some(libc::EACCES) => eacces = true,
                Some(libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV)
                | Some(libc::ETIMEDOUT) => last = e,
                _ => return Err(e),
            },
        }
    }
    if eacces {
        Err(io::Error::from_raw_os_error(libc::EACCES))
    } else {
        Err(last)
    }
}

/// Reaps the leader `pid` (retrying on `EINTR`).
pub(crate) fn wait(pid: i32) -> io::Result<ExitStatus> {
    let mut status: libc::c_int = 0;
    loop {
        // SAFETY: waitpid writes the status through the pointer.
        let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
        if rc == pid {
            return Ok(ExitStatus::from_raw(status));
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_follow_execvp() {
        let env = |p: &str| vec![("PATH".to_string(), p.to_string())];
        assert_eq!(candidates("./x", &env("/a")), vec![b"./x".to_vec()]);
        assert_eq!(
            candidates("x", &env("/a::b")),
            vec![b"/a/x".to_vec(), b"x".to_vec(), b"b/x".to_vec()]
        );
        assert_eq!(
            candidates("x", &[]),
            vec![b"/bin/x".to_vec(), b"/usr/bin/x".to_vec()]
        );
    }

    #[test]
    fn environment_is_sorted_last_value_wins_and_nul_refused() {
        let env = vec![
            ("B".to_string(), "1".to_string()),
            ("A".to_string(), "2".to_string()),
            ("B".to_string(), "3".to_string()),
        ];
        let block = envp(&env).unwrap();
        assert_eq!(block, vec![c"A=2".to_owned(), c"B=3".to_owned()]);
        let bad = vec![("X".to_string(), "a\0b".to_string())];
        assert_eq!(envp(&bad).unwrap_err().kind(), io::ErrorKind::InvalidInput);
    }
}
