//! Pure parsers of the kernel's text files the cgroup code reads: `/proc/self/cgroup` with the
//! mount table (where this daemon's cgroup is), `meminfo` (`MemTotal`) and the `key value` files
//! (`memory.events`, `memory.oom_control`). No I/O here, so they are tested on fixed text.

use super::CgroupVersion;
use std::path::{Path, PathBuf};

pub(super) fn mem_total_bytes(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// `key value` lines (`memory.events`, `memory.oom_control`).
pub(super) fn keyed_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// The daemon's own cgroup directory in the hierarchy of `version` (v1: the one with the
/// `memory` controller), from `/proc/self/cgroup` and the mount table.
pub(super) fn own_cgroup_dir(
    cgroups: &str,
    mountinfo: &str,
    version: CgroupVersion,
) -> Option<PathBuf> {
    own_cgroup_dir_of(cgroups, mountinfo, version, "memory")
}

/// [`own_cgroup_dir`] for the v1 hierarchy of `controller`.
pub(super) fn own_cgroup_dir_of(
    cgroups: &str,
    mountinfo: &str,
    version: CgroupVersion,
    controller: &str,
) -> Option<PathBuf> {
    // /proc/self/cgroup: `hierarchy-id:controllers:path`; v2 is `0::path`.
    let path = cgroups.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let wanted = match version {
            CgroupVersion::V2 => id == "0" && controllers.is_empty(),
            CgroupVersion::V1 => controllers.split(',').any(|c| c == controller),
        };
        wanted.then_some(path)
    })?;
    // mountinfo: `id parent dev root mountpoint opts [optional...] - fstype source superopts`.
    mountinfo.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let left: Vec<&str> = left.split(' ').collect();
        let right: Vec<&str> = right.split(' ').collect();
        let (root, mountpoint) = (unescape(left.get(3)?), unescape(left.get(4)?));
        let matches = match version {
            CgroupVersion::V2 => *right.first()? == "cgroup2",
            CgroupVersion::V1 => {
                *right.first()? == "cgroup" && right.get(2)?.split(',').any(|o| o == controller)
            }
        };
        if !matches {
            return None;
        }
        // The mount shows the hierarchy from `root` down; our path must lie below it.
        let rel = Path::new(path).strip_prefix(&root).ok()?;
        Some(PathBuf::from(mountpoint).join(rel))
    })
}

/// Undoes mountinfo's octal escapes (`\040` for a space, ...).
fn unescape(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_files() {
        let cgroups = "4:memory:/process_api/abc\n0::/user.slice/u.service\n";
        let mountinfo = "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n\
            35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n\
            41 31 0:38 /user.slice /sys/fs/cgroup/uni\\040fied rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            own_cgroup_dir(cgroups, mountinfo, CgroupVersion::V1),
            Some(PathBuf::from("/sys/fs/cgroup/memory/process_api/abc"))
        );
        assert_eq!(
            own_cgroup_dir(cgroups, mountinfo, CgroupVersion::V2),
            Some(PathBuf::from("/sys/fs/cgroup/uni fied/u.service"))
        );
        // A cgroup outside the mounted part of the hierarchy cannot be reached.
        let elsewhere = "0::/system.slice/x\n";
        assert_eq!(
            own_cgroup_dir(elsewhere, mountinfo, CgroupVersion::V2),
            None
        );
        assert_eq!(
            own_cgroup_dir("1:cpu:/\n", mountinfo, CgroupVersion::V1),
            None
        );
        assert_eq!(
            keyed_value("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n", "oom_kill"),
            Some(3)
        );
        assert_eq!(
            mem_total_bytes("MemTotal:       24684092 kB\nMemFree: 1 kB\n"),
            Some(24684092 * 1024)
        );
    }
}
