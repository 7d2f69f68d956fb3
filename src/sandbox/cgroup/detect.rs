//! Finding a memory controller this daemon may make children in (cgroup v2, else v1), enabling
//! `memory` (and `pids`, H21) for the subtree, making `corral-workers/daemon-<pid>` with a probe
//! cgroup to prove it works, and clearing the directories of daemons that are gone. Runs once,
//! at daemon start ([`MemoryCgroups::detect`]; only [`enable`] serves each new user group too);
//! apart so the start-up checks and their error texts read on their own.

use super::parse::own_cgroup_dir_of;
use super::{
    CgroupVersion, MIN_DEFAULT_LIMIT, MemoryCgroups, PROBE_PROCESSES, PidsHome, WORKERS_DIR,
};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

// ---------------------------------------------------------------------------------------------
// Detection.

/// v2: `memory` must be available to the daemon's cgroup and enabled for its subtree.
pub(super) fn prepare_v2(own: &Path) -> Result<MemoryCgroups, String> {
    let controllers = fs::read_to_string(own.join("cgroup.controllers"))
        .map_err(|e| format!("reading {}/cgroup.controllers: {e}", own.display()))?;
    if !controllers.split_whitespace().any(|c| c == "memory") {
        return Err(format!(
            "the memory controller is not available in {} (hybrid host, or not delegated)",
            own.display()
        ));
    }
    enable_memory(own).map_err(|e| {
        format!(
            "{e} (a cgroup with processes of its own cannot enable controllers for its subtree: \
             run the daemon in a delegated cgroup, e.g. systemd Delegate=yes with the daemon in \
             a leaf below it)"
        )
    })?;
    prepare(CgroupVersion::V2, own)
}

/// Adds `memory` to `dir`'s `cgroup.subtree_control` unless it is there.
fn enable_memory(dir: &Path) -> Result<(), String> {
    enable(dir, "memory")
}

/// Adds `controller` to `dir`'s `cgroup.subtree_control` unless it is there.
pub(super) fn enable(dir: &Path, controller: &str) -> Result<(), String> {
    let p = dir.join("cgroup.subtree_control");
    let current = fs::read_to_string(&p).map_err(|e| format!("reading {}: {e}", p.display()))?;
    if current.split_whitespace().any(|c| c == controller) {
        return Ok(());
    }
    fs::write(&p, format!("+{controller}"))
        .map_err(|e| format!("enabling {controller} in {}: {e}", p.display()))
}

/// Where workers' `pids.max` can go (H21): v2, `pids` enabled along the memory cgroups' path;
/// v1, this daemon's directory in the `pids` hierarchy. `None` (with the reason logged) when
/// neither works: workers then have `RLIMIT_NPROC` only.
fn pids_home(version: CgroupVersion, own: &Path, memory_dir: &Path) -> Option<PidsHome> {
    let found = match version {
        CgroupVersion::V2 => {
            let workers = own.join(WORKERS_DIR);
            [own, workers.as_path(), memory_dir]
                .iter()
                .try_for_each(|d| enable(d, "pids"))
                .map(|()| PidsHome::SameDir)
        }
        CgroupVersion::V1 => (|| {
            let cgroups = fs::read_to_string("/proc/self/cgroup")
                .map_err(|e| format!("reading /proc/self/cgroup: {e}"))?;
            let mountinfo = fs::read_to_string("/proc/self/mountinfo")
                .map_err(|e| format!("reading /proc/self/mountinfo: {e}"))?;
            let own = own_cgroup_dir_of(&cgroups, &mountinfo, CgroupVersion::V1, "pids")
                .ok_or("no cgroup v1 pids controller mounted")?;
            Ok(PidsHome::V1(daemon_dir(&own)?.1))
        })(),
    };
    match found {
        Ok(home) => Some(home),
        Err(why) => {
            tracing::warn!(
                "no pids cgroup for sandbox workers ({why}): each is held to RLIMIT_NPROC only, \
                 which does not bind root"
            );
            None
        }
    }
}

/// Makes `<own>/corral-workers/daemon-<pid>` (clearing directories of daemons that are gone)
/// and, on v2, enables `memory` for the children of both levels.
pub(super) fn prepare(version: CgroupVersion, own: &Path) -> Result<MemoryCgroups, String> {
    let (workers, dir) = daemon_dir(own)?;
    let mut m = MemoryCgroups {
        version,
        dir,
        pids: None,
    };
    if version == CgroupVersion::V2 {
        enable_memory(&workers)?;
        enable_memory(&m.dir)?;
    }
    m.pids = pids_home(version, own, &m.dir);
    // Prove a worker cgroup with a limit can really be made (read-only cgroupfs, no rights).
    if let Err(e) = m.create("probe", MIN_DEFAULT_LIMIT, PROBE_PROCESSES) {
        if m.pids.is_none() {
            return Err(format!("creating a test cgroup: {e}"));
        }
        // The pids part failed: memory limits alone are still worth having.
        tracing::warn!("no pids cgroup for sandbox workers ({e}); RLIMIT_NPROC only");
        m.pids = None;
        m.create("probe", MIN_DEFAULT_LIMIT, PROBE_PROCESSES)
            .map_err(|e| format!("creating a test cgroup: {e}"))?;
    }
    Ok(m)
}

/// `<own>/corral-workers` and this daemon's `daemon-<pid>` in it, made, with the directories
/// of daemons that are gone cleared.
fn daemon_dir(own: &Path) -> Result<(PathBuf, PathBuf), String> {
    let workers = own.join(WORKERS_DIR);
    mkdir_ok_if_exists(&workers)?;
    remove_stale(&workers);
    let dir = workers.join(format!("daemon-{}", std::process::id()));
    mkdir_ok_if_exists(&dir)?;
    Ok((workers, dir))
}

fn mkdir_ok_if_exists(p: &Path) -> Result<(), String> {
    match fs::create_dir(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(format!("mkdir {}: {e}", p.display())),
    }
}

/// Removes `daemon-<pid>` directories whose daemon no longer runs, with their empty children
/// (a crashed daemon's leftovers). Busy cgroups refuse `rmdir`, so nothing in use is lost.
fn remove_stale(workers: &Path) {
    let Ok(entries) = fs::read_dir(workers) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("daemon-"))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        remove_empty_tree(&entry.path());
    }
}

/// Removes `dir` and its child cgroups (user groups hold workers: two levels), deepest first.
fn remove_empty_tree(dir: &Path) {
    if let Ok(children) = fs::read_dir(dir) {
        for child in children.flatten() {
            if child.file_type().is_ok_and(|t| t.is_dir()) {
                remove_empty_tree(&child.path());
            }
        }
    }
    let _ = fs::remove_dir(dir);
}
