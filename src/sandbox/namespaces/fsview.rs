//! What the sandbox sees: the filesystem view the namespace layer's child builds inside its new
//! mount namespace (spec/sandbox.md §2.5–§2.8, §3.2), in the order of §3.2. Writable roots are
//! pinned and bound read-write over a read-only, nosuid, nodev `/`; the way to nested roots and
//! protected paths is pinned against renames; `/dev` and `/proc` are fresh; protected paths are
//! read-only again inside the roots; masked paths are hidden.
//!
//! It exists apart from the layer (`namespaces`) so that entering the namespaces and deciding
//! what is visible in them can be read, and changed, one at a time. Every system call it makes
//! goes through the thin wrappers of `mount_api`.

use super::mount_api::{
    AT_RECURSIVE, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY,
    attach_at, clone_tree_of, empty_tmpfs, move_mount, open_no_symlinks, open_tree, open_tree_at,
    setattr,
};
use super::{check, fail};
use crate::sandbox::error::LayerError;
use crate::sandbox::policy::SandboxPolicy;
use nix::errno::Errno;
use nix::mount::{MsFlags, mount};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

/// Size of the private `/dev/shm` (spec/sandbox.md §2.5: "size-limited").
pub const DEV_SHM_SIZE: &str = "64m";

/// Host device nodes bound into the fresh `/dev` (spec/sandbox.md §2.5).
pub const DEV_NODES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

/// Builds the filesystem view of §3.2, in its order.
pub(super) fn build_view(policy: &SandboxPolicy) -> Result<(), LayerError> {
    // 1. Nothing below may propagate to the host.
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| {
        fail(
            format!("making / recursively private failed: {}", e.desc()),
            e,
        )
    })?;

    // 2. Each writable root, opened without following any symlink and checked against the
    //    identity pinned when the session opened (H4), is cloned as a detached bind mount while
    //    the host's flags are still on it: a read-only submount below a root stays read-only
    //    (H8). The clones are sealed nosuid/nodev before anything can use them.
    let mut clones: Vec<(PathBuf, OwnedFd)> = Vec::new();
    for (i, root) in policy.writable_roots.iter().enumerate() {
        let dir = open_pinned(root, policy.root_ids.get(i).copied())?;
        let clone = clone_tree_of(&dir, root)?;
        setattr(
            Some(&clone),
            Path::new(""),
            AT_RECURSIVE,
            MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
            0,
        )?;
        clones.push((root.clone(), clone));
    }

    // 3. Everything read-only, nosuid, nodev.
    setattr(
        None,
        Path::new("/"),
        AT_RECURSIVE,
        MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        0,
    )?;

    // 3b. The roots' clones attached over them, shallowest first (a nested root lands in its
    //     enclosing root's clone), each onto the directory it was pinned as — by descriptor, so
    //     no path is followed between the check and the mount. Roots under /dev wait for it.
    let dev = Path::new("/dev");
    let (dev_roots, mut roots): (Vec<_>, Vec<_>) =
        clones.into_iter().partition(|(r, _)| r.starts_with(dev));
    roots.sort_by_key(|(r, _)| r.components().count());
    for (root, clone) in &roots {
        let i = policy.writable_roots.iter().position(|r| r == root);
        let target = open_pinned(root, i.and_then(|i| policy.root_ids.get(i).copied()))?;
        attach_at(clone, &target, root)?;
    }

    // 3c. Pin the way to nested roots and protected paths (H4, H9): every directory between an
    //     enclosing writable root and a nested root or protected path becomes a mount point, so
    //     renaming it from inside fails with EBUSY and a root or a gitdir cannot be swapped.
    for (dir, needed) in ancestors_to_pin(policy) {
        // Only on the way to a protected path or a missing gitdir (not to a nested root), a
        // directory gone or replaced since the session's protection was computed has nothing to
        // pin: every write first recomputes the protection (`check_current`), finds the change,
        // and the daemon builds a worker for what is there now.
        let fd = match open_no_symlinks(&dir) {
            Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) if !needed => continue,
            _ => open_pinned(&dir, None)?,
        };
        let clone = clone_tree_of(&fd, &dir)?;
        attach_at(&clone, &fd, &dir)?;
    }

    // 4. The minimal /dev. Host nodes and /dev roots are cloned before the host /dev is covered.
    build_dev(dev_roots)?;

    // 5. A fresh procfs for the new PID namespace; never the host's (no fallback).
    mount(
        Some("proc"),
        "/proc",
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC | MsFlags::MS_RDONLY,
        None::<&str>,
    )
    .map_err(|e| fail(format!("mounting a fresh /proc failed: {}", e.desc()), e))?;

    // 6. Protected paths read-only, and explicit roots nested inside them writable again.
    protect(policy)?;

    // 7. corral's state and the runtime sockets hidden.
    mask(&policy.masked_paths)?;

    // /dev itself is read-only, so nothing can be created beside the nodes (§2.1 "write nothing").
    setattr(None, Path::new("/dev"), 0, MOUNT_ATTR_RDONLY, 0)?;

    // Our cwd still names the mount that was there before the binds (now read-only);
    // re-resolve it so relative paths of the worker see the new view.
    if let Ok(cwd) = std::env::current_dir() {
        let _ = std::env::set_current_dir(cwd);
    }
    Ok(())
}

/// Mounts the fresh `/dev` of §2.5 over the host's. `dev_roots` are the writable roots under
/// `/dev`, already cloned (step 2), attached read-write in the new `/dev`.
fn build_dev(dev_roots: Vec<(PathBuf, OwnedFd)>) -> Result<(), LayerError> {
    let dev = Path::new("/dev");
    // Clones of the host nodes (bind mounts not attached anywhere yet).
    let mut nodes = Vec::new();
    for name in DEV_NODES {
        let src = dev.join(name);
        let fd = open_tree(&src, 0)?;
        // The clone inherited nodev from step 3; a device node must be openable. It stays
        // read-only, so chmod/chown of the host node is refused while reads and writes work.
        setattr(Some(&fd), Path::new(""), 0, 0, MOUNT_ATTR_NODEV)?;
        nodes.push((name, fd));
    }
    // `/dev` itself as a root is covered by the fresh one like any other host /dev.
    let dev_roots: Vec<_> = dev_roots.into_iter().filter(|(r, _)| r != dev).collect();

    mount(
        Some("tmpfs"),
        dev,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("mode=0755,size=64k"),
    )
    .map_err(|e| {
        fail(
            format!("mounting the tmpfs for /dev failed: {}", e.desc()),
            e,
        )
    })?;

    for (name, fd) in &nodes {
        let target = dev.join(name);
        std::fs::File::create(&target).map_err(|e| io_fail(&target, e))?;
        move_mount(fd, &target)?;
    }

    let pts = dev.join("pts");
    mkdir(&pts)?;
    mount(
        Some("devpts"),
        &pts,
        Some("devpts"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620"),
    )
    .map_err(|e| {
        fail(
            format!("mounting a private devpts on /dev/pts failed: {}", e.desc()),
            e,
        )
    })?;

    let shm = dev.join("shm");
    mkdir(&shm)?;
    if !dev_roots.iter().any(|(r, _)| r == &shm) {
        let opts = format!("mode=1777,size={DEV_SHM_SIZE}");
        mount(
            Some("tmpfs"),
            &shm,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(opts.as_str()),
        )
        .map_err(|e| {
            fail(
                format!("mounting the private /dev/shm failed: {}", e.desc()),
                e,
            )
        })?;
    }
    for (root, fd) in &dev_roots {
        std::fs::create_dir_all(root).map_err(|e| io_fail(root, e))?;
        move_mount(fd, root)?;
    }

    for (link, target) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        let path = dev.join(link);
        symlink(target, &path).map_err(|e| io_fail(&path, e))?;
    }
    Ok(())
}

/// Step 6: binds each protected path read-only onto itself. Paths are handled shallowest first,
/// and a writable root lying inside a protected path (an explicit override, §2.3) is made
/// writable again after its enclosing protected mount, so the deepest rule wins.
fn protect(policy: &SandboxPolicy) -> Result<(), LayerError> {
    enum Item<'a> {
        Protect(&'a Path),
        Reopen(&'a Path),
    }
    let mut items: Vec<(usize, Item)> = Vec::new();
    for p in &policy.protected_paths {
        items.push((p.components().count(), Item::Protect(p)));
    }
    for r in &policy.writable_roots {
        if policy
            .protected_paths
            .iter()
            .any(|p| r.starts_with(p) && r != p)
        {
            items.push((r.components().count(), Item::Reopen(r)));
        }
    }
    items.sort_by_key(|(depth, _)| *depth);
    for (_, item) in items {
        match item {
            Item::Protect(path) => {
                // Gone since the protection was computed (removed on the host): nothing to make
                // read-only. Every write first recomputes the protection (`check_current`),
                // finds it changed and gets a worker built for what is there now.
                if std::fs::symlink_metadata(path)
                    .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
                {
                    continue;
                }
                // Clone without following a final symlink and seal the clone before attaching it,
                // so there is no moment where the new mount is writable, and a path swapped for a
                // symlink since the policy was computed cannot redirect the mount.
                let fd = open_tree(
                    path,
                    AT_RECURSIVE | libc::AT_SYMLINK_NOFOLLOW as libc::c_uint,
                )?;
                setattr(
                    Some(&fd),
                    Path::new(""),
                    AT_RECURSIVE,
                    MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
                    0,
                )?;
                move_mount(&fd, path)?;
            }
            Item::Reopen(root) => setattr(None, root, AT_RECURSIVE, 0, MOUNT_ATTR_RDONLY)?,
        }
    }
    Ok(())
}

/// Step 7: hides each existing masked path behind an empty read-only directory or file. Both come
/// from one detached tmpfs that is never attached anywhere itself, so no placeholder is visible.
fn mask(paths: &[PathBuf]) -> Result<(), LayerError> {
    let targets: Vec<PathBuf> = paths
        .iter()
        // Resolve links (e.g. /var/run -> /run) so the mount lands on the object itself; a path
        // that does not exist has nothing to hide.
        .filter_map(|p| std::fs::canonicalize(p).ok())
        .collect();
    if targets.is_empty() {
        return Ok(());
    }
    let source = empty_tmpfs()?;
    for target in &targets {
        let is_dir = target.is_dir();
        let fd = open_tree_at(
            source.as_raw_fd(),
            Path::new(if is_dir { "dir" } else { "file" }),
            0,
        )?;
        setattr(
            Some(&fd),
            Path::new(""),
            0,
            MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
            0,
        )?;
        move_mount(&fd, target)?;
    }
    Ok(())
}

/// Directories that must not be renamed from inside (step 3c): for each writable root nested in
/// another, each protected path and each guarded missing path (a `.git` file's gitdir that does
/// not exist yet: the guard takes it away if it appears, and the pin keeps it from being built
/// in a parent moved away and moved back), every directory strictly between the deepest
/// enclosing writable root and it. A guarded missing path is the first missing component, so
/// its ancestors existed when it was computed. Each with whether it must exist: `true` on the
/// way to a nested root (H4), `false` when it is only on the way to a protected path or a
/// missing gitdir. Shallowest first, deduplicated.
fn ancestors_to_pin(policy: &SandboxPolicy) -> Vec<(PathBuf, bool)> {
    let mut out: Vec<(PathBuf, bool)> = Vec::new();
    let targets = policy
        .writable_roots
        .iter()
        .map(|t| (t, true))
        .chain(policy.protected_paths.iter().map(|t| (t, false)))
        .chain(policy.protected_missing.iter().map(|t| (t, false)));
    for (target, needed) in targets {
        let Some(enclosing) = policy
            .writable_roots
            .iter()
            .filter(|r| *r != target && target.starts_with(r))
            .max_by_key(|r| r.components().count())
        else {
            continue;
        };
        let mut dir = target.parent();
        while let Some(d) = dir {
            if d == enclosing.as_path() || !d.starts_with(enclosing) {
                break;
            }
            match out.iter_mut().find(|(o, _)| o == d) {
                Some((_, n)) => *n |= needed,
                None => out.push((d.to_path_buf(), needed)),
            }
            dir = d.parent();
        }
    }
    out.sort_by_key(|(d, _)| d.components().count());
    out
}

/// Opens the canonical directory `path` as an `O_PATH` descriptor without following any
/// symlink on the way (`openat2` with `RESOLVE_NO_SYMLINKS`), and, when `pinned` is given,
/// checks it is that `(st_dev, st_ino)` (spec/sandbox.md §8.6 H4). A root that was replaced or
/// redirected since the session opened refuses the worker: nothing is ever re-resolved.
fn open_pinned(path: &Path, pinned: Option<(u64, u64)>) -> Result<OwnedFd, LayerError> {
    let fd = match open_no_symlinks(path) {
        Ok(fd) => fd,
        Err(Errno::ELOOP) => {
            return Err(fail(
                format!(
                    "{} now passes through a symlink; it was a plain directory path when the \
                     session opened",
                    path.display()
                ),
                Errno::ESTALE,
            ));
        }
        Err(e) => {
            return Err(fail(
                format!(
                    "opening {} without following symlinks failed: {}",
                    path.display(),
                    e.desc()
                ),
                e,
            ));
        }
    };
    if let Some(want) = pinned {
        // SAFETY: fstat on our descriptor into a zeroed struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        check(
            unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } as i64,
            &format!("fstat of {}", path.display()),
        )?;
        let now = (st.st_dev, st.st_ino);
        if now != want {
            return Err(fail(
                format!(
                    "writable root {} is no longer the directory pinned when the session opened \
                     (it was replaced or one of its parents was renamed)",
                    path.display()
                ),
                Errno::ESTALE,
            ));
        }
    }
    Ok(fd)
}

fn mkdir(path: &Path) -> Result<(), LayerError> {
    std::fs::create_dir(path).map_err(|e| io_fail(path, e))
}

fn io_fail(path: &Path, e: std::io::Error) -> LayerError {
    let errno = Errno::from_raw(e.raw_os_error().unwrap_or(0));
    fail(format!("preparing {} failed: {e}", path.display()), errno)
}

#[cfg(test)]
mod tests {
    //! Each test enters the namespaces in a forked child with the layer's harness (the parent
    //! module's tests) and checks what the child sees and the host afterwards.

    use super::*;
    use crate::sandbox::namespaces::tests::{Scratch, is_root, run};
    use crate::sandbox::roots::build_policy;
    use std::collections::HashMap;
    use std::os::unix::fs::PermissionsExt;
    use std::time::Duration;

    #[test]
    fn the_existing_parents_of_a_missing_gitdir_are_pinned() {
        let s = Scratch::new();
        std::fs::create_dir_all(s.root.join("sub/deeper")).unwrap();
        // A gitdir one and two levels below existing directories, and one whose first missing
        // component is directly in the root (nothing between to pin).
        std::fs::write(
            s.root.join(".git"),
            format!("gitdir: {}\n", s.root.join("sub/deeper/wt").display()),
        )
        .unwrap();
        let policy = s.policy();
        assert!(
            policy
                .protected_missing
                .contains(&s.root.join("sub/deeper/wt")),
            "{:?}",
            policy.protected_missing
        );
        let pins = ancestors_to_pin(&policy);
        assert_eq!(
            pins,
            [
                (s.root.join("sub"), false),
                (s.root.join("sub/deeper"), false)
            ]
        );

        std::fs::write(
            s.root.join(".git"),
            format!("gitdir: {}\n", s.root.join("gone/wt").display()),
        )
        .unwrap();
        let policy = s.policy();
        assert!(policy.protected_missing.contains(&s.root.join("gone")));
        assert_eq!(ancestors_to_pin(&policy), Vec::<(PathBuf, bool)>::new());
    }

    #[test]
    fn writes_outside_roots_are_read_only() {
        if !is_root() {
            return;
        }
        let s = Scratch::new();
        let existing = s.out.join("existing");
        std::fs::write(&existing, "orig\n").unwrap();
        std::fs::set_permissions(&existing, std::fs::Permissions::from_mode(0o644)).unwrap();
        // Baseline (§8.1 rule 1): outside the sandbox these all work.
        std::fs::write(s.out.join("baseline"), "b").unwrap();
        std::fs::remove_file(s.out.join("baseline")).unwrap();
        std::fs::set_permissions(&existing, std::fs::Permissions::from_mode(0o777)).unwrap();
        std::fs::set_permissions(&existing, std::fs::Permissions::from_mode(0o644)).unwrap();

        let script = s.script(
            "echo in > ROOT/f && echo inside-ok\n\
             echo x > OUT/new || echo new-denied\n\
             echo x >> OUT/existing || echo append-denied\n\
             chmod 777 OUT/existing || echo chmod-denied\n\
             touch -d 2000-01-01 OUT/existing || echo touch-denied\n\
             exec 3<OUT/existing; echo x > /proc/self/fd/3 || echo fd-denied\n\
             echo x > /proc/self/rootOUT/existing || echo root-denied\n\
             chmod 700 ROOT/f && echo chmod-inside-ok\n",
        );
        let (code, out) = run(&s.policy(), &s.root, &script);
        assert_eq!(code, 0, "{out}");
        for want in [
            "inside-ok",
            "new-denied",
            "append-denied",
            "chmod-denied",
            "touch-denied",
            "fd-denied",
            "root-denied",
            "chmod-inside-ok",
        ] {
            assert!(out.contains(want), "missing {want} in:\n{out}");
        }
        assert!(out.contains("Read-only file system"), "{out}");
        // Host-side effects.
        assert_eq!(std::fs::read_to_string(s.root.join("f")).unwrap(), "in\n");
        assert!(!s.out.join("new").exists());
        assert_eq!(std::fs::read_to_string(&existing).unwrap(), "orig\n");
        let meta = std::fs::metadata(&existing).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o644);
        assert!(
            meta.modified().unwrap()
                > std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000)
        );
    }

    #[test]
    fn protected_paths_are_read_only_and_explicit_roots_win() {
        if !is_root() {
            return;
        }
        let s = Scratch::new();
        let wt = s.root.join(".git/worktrees/wt");
        std::fs::create_dir_all(&wt).unwrap();
        std::fs::create_dir_all(s.root.join(".git/hooks")).unwrap();
        std::fs::write(s.root.join(".git/config"), "[core]\n").unwrap();
        std::fs::create_dir_all(s.root.join(".codex")).unwrap();
        let mut params = s.params();
        // An explicitly listed gitdir inside the protected .git stays writable (§2.3 override).
        params.writable_roots = vec![wt.clone()];
        let policy = build_policy(&params).unwrap();
        assert!(policy.protected_paths.contains(&s.root.join(".git")));

        let script = "echo x >> .git/config || echo config-denied\n\
             echo x > .git/hooks/pre-commit || echo hook-denied\n\
             echo x > .codex/config.toml || echo codex-denied\n\
             rm -rf .git 2>/dev/null || echo rm-denied\n\
             mv .git moved 2>/dev/null || echo mv-denied\n\
             echo w > .git/worktrees/wt/index.lock && echo wt-ok\n\
             echo ordinary > file && echo file-ok\n";
        let (code, out) = run(&policy, &s.root, script);
        assert_eq!(code, 0, "{out}");
        for want in [
            "config-denied",
            "hook-denied",
            "codex-denied",
            "rm-denied",
            "mv-denied",
            "wt-ok",
            "file-ok",
        ] {
            assert!(out.contains(want), "missing {want} in:\n{out}");
        }
        assert_eq!(
            std::fs::read_to_string(s.root.join(".git/config")).unwrap(),
            "[core]\n"
        );
        assert!(!s.root.join(".git/hooks/pre-commit").exists());
        assert!(!s.root.join(".codex/config.toml").exists());
        assert_eq!(
            std::fs::read_to_string(wt.join("index.lock")).unwrap(),
            "w\n"
        );
    }

    #[test]
    fn dev_is_minimal() {
        if !is_root() {
            return;
        }
        let s = Scratch::new();
        let script = "for n in null zero full random urandom tty; do test -c /dev/$n || echo missing-$n; done\n\
             ls -A /dev | tr '\\n' ' '; echo\n\
             echo x > /dev/null && head -c1 /dev/urandom >/dev/null && echo hi > /dev/stdout\n\
             test \"$(head -c3 /dev/zero | wc -c)\" = 3 && echo zero-ok\n\
             echo x > /dev/full 2>/dev/null || echo full-enospc\n\
             echo s > /dev/shm/s && cat /dev/shm/s\n\
             test -c /dev/pts/ptmx && test -L /dev/ptmx && echo pts-ok\n\
             echo x > /dev/newfile 2>/dev/null || echo dev-ro\n\
             chmod 666 /dev/null 2>/dev/null || echo node-chmod-denied\n\
             mknod /dev/shm/n c 1 3 2>/dev/null; echo x > /dev/shm/n 2>/dev/null || echo shm-nodev\n";
        let (code, out) = run(&s.policy(), &s.root, script);
        assert_eq!(code, 0, "{out}");
        assert!(!out.contains("missing-"), "{out}");
        let listing = out.lines().next().unwrap();
        let mut names: Vec<&str> = listing.split_whitespace().collect();
        names.sort_unstable();
        assert_eq!(
            names,
            vec![
                "fd", "full", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin", "stdout",
                "tty", "urandom", "zero"
            ],
            "{out}"
        );
        for want in [
            "hi",
            "zero-ok",
            "full-enospc",
            "s",
            "pts-ok",
            "dev-ro",
            "node-chmod-denied",
            "shm-nodev",
        ] {
            assert!(out.lines().any(|l| l == want), "missing {want} in:\n{out}");
        }
    }

    #[test]
    fn host_dev_shm_as_a_root_is_bound_read_write() {
        if !is_root() {
            return;
        }
        if !Path::new("/dev/shm").is_dir() {
            eprintln!("skipped: the host has no /dev/shm");
            return;
        }
        let s = Scratch::new();
        // A scratch file on the host's /dev/shm, overwritten from inside (Codex's
        // bwrap_preserves_writable_dev_shm_bind_mount).
        let name = format!("corral-ns-shm-{}", std::process::id());
        let host_file = Path::new("/dev/shm").join(&name);
        std::fs::write(&host_file, "before").unwrap();
        let mut params = s.params();
        params.writable_roots = vec!["/dev/shm".into()];
        let policy = build_policy(&params).unwrap();
        let script = format!("printf sandbox-after > /dev/shm/{name} && cat /dev/shm/{name}");
        let (code, out) = run(&policy, &s.root, &script);
        let host = std::fs::read_to_string(&host_file).unwrap();
        std::fs::remove_file(&host_file).unwrap();
        assert_eq!((code, out.as_str()), (0, "sandbox-after"));
        assert_eq!(host, "sandbox-after");
    }

    #[test]
    fn mountinfo_is_read_only_nosuid_nodev() {
        if !is_root() {
            return;
        }
        let s = Scratch::new();
        std::fs::create_dir_all(s.root.join(".git")).unwrap();
        let policy = s.policy();
        let (code, out) = run(&policy, &s.root, "cat /proc/self/mountinfo");
        assert_eq!(code, 0, "{out}");
        let dev_nodes: Vec<String> = DEV_NODES.iter().map(|n| format!("/dev/{n}")).collect();
        // mountinfo also lists the host mounts now covered (host /dev, /proc and their children);
        // they must be sealed too, so every line is checked, with implications rather than
        // equalities. The last entry for a mount point is the one on top.
        let mut top: HashMap<&str, Vec<&str>> = HashMap::new();
        for line in out.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            let (point, opts) = (f[4], f[5]);
            let opts: Vec<&str> = opts.split(',').collect();
            assert!(opts.contains(&"nosuid"), "{line}");
            if opts.contains(&"rw") {
                let allowed = point == "/dev/shm"
                    || point == "/dev/pts"
                    || policy
                        .writable_roots
                        .iter()
                        .any(|r| Path::new(point).starts_with(r))
                        && !policy
                            .protected_paths
                            .iter()
                            .any(|p| Path::new(point).starts_with(p));
                assert!(allowed, "writable mount outside the roots: {line}");
            }
            if !opts.contains(&"nodev") {
                let device = point == "/dev/pts" || dev_nodes.iter().any(|d| d == point);
                assert!(device, "device-capable mount: {line}");
            }
            top.insert(point, opts);
        }
        let root = s.root.to_string_lossy();
        let git = s.root.join(".git");
        let git = git.to_string_lossy();
        assert!(top[root.as_ref()].contains(&"rw"), "{out}");
        assert!(top[git.as_ref()].contains(&"ro"), "{out}");
        assert!(top["/"].contains(&"ro"), "{out}");
        assert!(
            top["/proc"].contains(&"ro") && top["/proc"].contains(&"noexec"),
            "{out}"
        );
        assert!(top["/dev"].contains(&"ro"), "{out}");
        assert!(top["/dev/null"].contains(&"ro"), "{out}");
        assert!(top["/dev/shm"].contains(&"rw"), "{out}");
    }

    #[test]
    fn masked_paths_are_hidden() {
        if !is_root() {
            return;
        }
        let s = Scratch::new();
        let state = s.out.join("state");
        std::fs::create_dir_all(&state).unwrap();
        std::fs::write(state.join("audit.log"), "secret").unwrap();
        let token = s.out.join("token");
        std::fs::write(&token, "tok").unwrap();
        let sock = s.out.join("docker.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let mut params = s.params();
        params.masked_paths = vec![
            state.clone(),
            token.clone(),
            sock.clone(),
            s.out.join("missing"),
        ];
        let policy = build_policy(&params).unwrap();
        let script = s.script(
            "echo entries=$(ls -A OUT/state | wc -l)\n\
             echo token=[$(cat OUT/token)]\n\
             test -S OUT/docker.sock && echo sock-visible || echo sock-hidden\n\
             echo x > OUT/token 2>/dev/null || echo token-ro\n\
             touch OUT/state/x 2>/dev/null || echo state-ro\n",
        );
        let (code, out) = run(&policy, &s.root, &script);
        assert_eq!(code, 0, "{out}");
        for want in [
            "entries=0",
            "token=[]",
            "sock-hidden",
            "token-ro",
            "state-ro",
        ] {
            assert!(out.lines().any(|l| l == want), "missing {want} in:\n{out}");
        }
        assert_eq!(
            std::fs::read_to_string(state.join("audit.log")).unwrap(),
            "secret"
        );
        assert_eq!(std::fs::read_to_string(&token).unwrap(), "tok");
    }
}
