//! What a process's confinement looks like from outside, read from `/proc`: whether a process
//! is more confined than this one (NoNewPrivs, seccomp, other pid or mount namespace; fails
//! closed), and whether it runs inside a corral sandbox. The daemon judges its socket's peers by
//! it (spec/sandbox.md §8.6 H7, H19) and so does the exec-server front its loopback peers.

use std::path::Path;

/// The confinement facts of one process, from `/proc/PID/status` and `/proc/PID/ns`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Confinement {
    pub no_new_privs: bool,
    /// `Seccomp:` 0 none, 1 strict, 2 filter.
    pub seccomp: u32,
    /// `Seccomp_filters:` (Linux ≥ 5.9).
    pub seccomp_filters: Option<u32>,
    /// Inodes of `ns/pid` and `ns/mnt` (their `readlink` text, e.g. `pid:[4026531836]`).
    pub pid_ns: String,
    pub mnt_ns: String,
    /// The effective uid (second field of `Uid:`), what the socket's peer credentials report.
    pub uid: u32,
}

impl Confinement {
    /// Reads the facts of the process whose `/proc` directory is `proc_dir`.
    pub fn read(proc_dir: &Path) -> std::io::Result<Confinement> {
        let status = std::fs::read_to_string(proc_dir.join("status"))?;
        let field = |name: &str| {
            status.lines().find_map(|l| {
                l.strip_prefix(name)
                    .and_then(|rest| rest.strip_prefix(':'))
                    .map(str::trim)
            })
        };
        let number = |name: &str| -> std::io::Result<u32> {
            field(name)
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| {
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("no {name} in {}/status", proc_dir.display()),
                    )
                })
        };
        let ns = |name: &str| -> std::io::Result<String> {
            Ok(std::fs::read_link(proc_dir.join("ns").join(name))?
                .to_string_lossy()
                .into_owned())
        };
        Ok(Confinement {
            no_new_privs: number("NoNewPrivs")? != 0,
            seccomp: number("Seccomp")?,
            seccomp_filters: number("Seccomp_filters").ok(),
            pid_ns: ns("pid")?,
            mnt_ns: ns("mnt")?,
            uid: field("Uid")
                .and_then(|v| v.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| {
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("no Uid in {}/status", proc_dir.display()),
                    )
                })?,
        })
    }

    /// Whether a process with these facts is more confined than `daemon`.
    pub fn more_confined_than(&self, daemon: &Confinement) -> bool {
        let seccomp = match (self.seccomp, daemon.seccomp) {
            (0, _) => false,
            (_, 0) => true,
            // Both filtered: only the count can tell; without it, fail closed.
            _ => match (self.seccomp_filters, daemon.seccomp_filters) {
                (Some(peer), Some(own)) => peer > own,
                _ => true,
            },
        };
        (self.no_new_privs && !daemon.no_new_privs)
            || seccomp
            || self.pid_ns != daemon.pid_ns
            || self.mnt_ns != daemon.mnt_ns
    }
}

/// How `pid` is known to run inside a corral sandbox: its cgroup is one of a daemon's worker
/// cgroups, or one of its ancestors is a `corral __worker` (a sandboxed process cannot leave
/// the worker's process tree: the worker is a child subreaper). `None` if neither.
/// `Err` when the process (or an ancestor on the way) cannot be read: undecided, which the
/// caller treats as sandboxed.
pub fn corral_sandbox_of(pid: i32) -> std::io::Result<Option<String>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))?;
    if let Some(at) = text.find(&format!("/{}/daemon-", crate::sandbox::cgroup::WORKERS_DIR)) {
        let rest = &text[at + 1..];
        let group = rest.split(['\n', ' ']).next().unwrap_or(rest);
        return Ok(Some(format!("cgroup {group}")));
    }
    let unreadable =
        |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
    let mut at = pid;
    for _ in 0..64 {
        let status = std::fs::read_to_string(format!("/proc/{at}/status"))?;
        let ppid: i32 = status
            .lines()
            .find_map(|l| l.strip_prefix("PPid:"))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| unreadable("no PPid"))?;
        if ppid <= 1 {
            return Ok(None);
        }
        let cmdline = std::fs::read(format!("/proc/{ppid}/cmdline"))?;
        if cmdline.split(|b| *b == 0).nth(1) == Some(b"__worker".as_slice()) {
            return Ok(Some(format!("worker process {ppid}")));
        }
        at = ppid;
    }
    Err(unreadable("ancestry deeper than 64"))
}

/// Whether the caller process `pid` (from the socket's peer credentials), claiming `uid`, must be
/// treated as sandboxed. `None` (TCP) is not judged here.
pub fn is_sandboxed(pid: Option<i32>, uid: u32) -> bool {
    let Some(pid) = pid else { return false };
    if pid <= 0 {
        return true;
    }
    let daemon = match Confinement::read(Path::new("/proc/self")) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!("cannot read the daemon's own confinement: {e}; refusing escalation");
            return true;
        }
    };
    match Confinement::read(&Path::new("/proc").join(pid.to_string())) {
        // The uid check guards against the pid having been reused by another user's process.
        Ok(peer) => peer.uid != uid || peer.more_confined_than(&daemon),
        Err(e) => {
            tracing::info!(
                pid,
                "cannot inspect the calling process ({e}); treating it as sandboxed"
            );
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain() -> Confinement {
        Confinement {
            no_new_privs: false,
            seccomp: 0,
            seccomp_filters: Some(0),
            pid_ns: "pid:[1]".into(),
            mnt_ns: "mnt:[2]".into(),
            uid: 1000,
        }
    }

    #[test]
    fn each_sign_of_confinement_counts() {
        let daemon = plain();
        assert!(!plain().more_confined_than(&daemon));
        let nnp = Confinement {
            no_new_privs: true,
            ..plain()
        };
        assert!(nnp.more_confined_than(&daemon));
        let filtered = Confinement {
            seccomp: 2,
            seccomp_filters: Some(1),
            ..plain()
        };
        assert!(filtered.more_confined_than(&daemon));
        let pid_ns = Confinement {
            pid_ns: "pid:[9]".into(),
            ..plain()
        };
        assert!(pid_ns.more_confined_than(&daemon));
        let mnt_ns = Confinement {
            mnt_ns: "mnt:[9]".into(),
            ..plain()
        };
        assert!(mnt_ns.more_confined_than(&daemon));
    }

    #[test]
    fn a_daemon_confined_itself_compares_filter_counts() {
        // E.g. under systemd with NoNewPrivileges= and SystemCallFilter=.
        let daemon = Confinement {
            no_new_privs: true,
            seccomp: 2,
            seccomp_filters: Some(3),
            ..plain()
        };
        let same = daemon.clone();
        assert!(!same.more_confined_than(&daemon));
        assert!(!plain().more_confined_than(&daemon));
        let more = Confinement {
            seccomp_filters: Some(4),
            ..daemon.clone()
        };
        assert!(more.more_confined_than(&daemon));
        let unknown = Confinement {
            seccomp_filters: None,
            ..daemon.clone()
        };
        assert!(unknown.more_confined_than(&daemon), "fails closed");
    }

    #[test]
    fn unknown_peers_count_as_sandboxed() {
        assert!(!is_sandboxed(None, 0), "TCP is not judged here");
        assert!(is_sandboxed(Some(0), 0));
        assert!(is_sandboxed(Some(-1), 0));
        // A pid beyond pid_max: no such process.
        assert!(is_sandboxed(Some(i32::MAX), 0));
        let me = std::process::id() as i32;
        let my_uid = nix::unistd::getuid().as_raw();
        // The test process itself is as confined as itself...
        let own = Confinement::read(Path::new("/proc/self")).unwrap();
        if !own.no_new_privs || own.seccomp == 0 {
            assert!(!is_sandboxed(Some(me), my_uid));
        }
        // ...but not when its credentials claim another uid (a reused pid).
        assert!(is_sandboxed(Some(me), my_uid + 1));
    }

    #[test]
    fn reads_a_process_under_no_new_privs() {
        let mut child = std::process::Command::new("setpriv")
            .args(["--no-new-privs", "sleep", "5"])
            .spawn()
            .expect("setpriv");
        // Give setpriv the moment it needs to set the flag and exec.
        std::thread::sleep(std::time::Duration::from_millis(300));
        let peer = Confinement::read(&Path::new("/proc").join(child.id().to_string()));
        let _ = child.kill();
        let _ = child.wait();
        let peer = peer.unwrap();
        assert!(peer.no_new_privs);
        let own = Confinement::read(Path::new("/proc/self")).unwrap();
        assert_eq!(
            peer.more_confined_than(&own),
            !own.no_new_privs,
            "{peer:?} vs {own:?}"
        );
    }
}
