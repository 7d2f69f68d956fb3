//! Commands start in the session's working directory as the worker found it, not wherever its
//! path leads later (spec/sandbox.md H24): another session of the same user can swap a parent
//! of a nested root for a symlink (in its own mount namespace the parent is no mount point), and
//! a `chdir` by path would then follow the link. The worker opens the directory once, right
//! after its mounts are built, and every command starts with `fchdir` to it (or to a directory
//! opened beneath it, for a relative workdir).
//!
//! The worker's file tools reach the same directory the same way: every path they touch that
//! lies at or below the pinned path (by its text) goes through [`fs_path`], which names it from
//! the descriptor (`/proc/self/fd/N/…`), so neither a swapped parent nor a later `chdir` redirects
//! it. What they show (outputs, messages) stays the path as the caller gave it; a walk started
//! from the descriptor gives its paths back in those terms with [`shown`]. Paths elsewhere are
//! left as they are, and so is everything in a process that pinned nothing (tests, the CLI).

use std::borrow::Cow;
use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

static PINNED: OnceLock<(PathBuf, OwnedFd)> = OnceLock::new();
/// Whether `/proc/self/fd/N` reaches the pinned directory (the file tools' [`fs_path`]).
static BY_PROC: OnceLock<bool> = OnceLock::new();

/// Opens `cwd` (`O_PATH | O_DIRECTORY`) as the directory commands start from. Once per worker;
/// a second call is ignored.
pub fn pin(cwd: &Path) -> io::Result<()> {
    let fd = open_dir(libc::AT_FDCWD, cwd)?;
    // A view without /proc would leave the file tools nothing to name the descriptor by: they
    // then use paths as before (commands still start from the descriptor).
    let by_proc = match (
        nix::sys::stat::stat(through(fd.as_raw_fd()).as_str()),
        nix::sys::stat::fstat(&fd),
    ) {
        (Ok(a), Ok(b)) => (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino),
        _ => false,
    };
    if PINNED.set((cwd.to_path_buf(), fd)).is_ok() {
        let _ = BY_PROC.set(by_proc);
    }
    Ok(())
}

/// The pinned directory's descriptor, which the worker keeps open when it closes the others.
pub fn fd() -> Option<RawFd> {
    PINNED.get().map(|(_, fd)| fd.as_raw_fd())
}

/// Where a command whose working directory is `cwd` starts: a descriptor reached from the
/// pinned directory when `cwd` is it or lies below it (by its path's text), else `None` (chdir
/// by path, as before: an absolute workdir elsewhere, or a worker that pinned nothing).
pub fn open(cwd: &Path) -> Option<io::Result<StartDir>> {
    let (pinned, fd) = PINNED.get()?;
    let rel = cwd.strip_prefix(pinned).ok()?;
    if rel.as_os_str().is_empty() {
        return Some(Ok(StartDir::Pinned(fd.as_raw_fd())));
    }
    Some(open_dir(fd.as_raw_fd(), rel).map(StartDir::Beneath))
}

/// The pinned path and what follows it in `path`: `path` is the pinned path, or continues it
/// with `/` (the rest has its leading slashes removed; `.` and `..` in it are kept, and resolve
/// from the directory as the kernel resolves them). `None` when nothing is pinned (or the file
/// tools cannot reach it, see [`pin`]), when the pinned directory is `/` (it has no parent to
/// swap), or when `path` lies elsewhere.
pub fn beneath(path: &Path) -> Option<(&'static Path, &Path)> {
    let (pinned, _) = PINNED.get()?;
    if BY_PROC.get() != Some(&true) {
        return None;
    }
    let prefix = pinned.as_os_str().as_bytes();
    if prefix == b"/" || prefix.is_empty() {
        return None;
    }
    let rest = path.as_os_str().as_bytes().strip_prefix(prefix)?;
    if rest.first().is_some_and(|&b| b != b'/') {
        return None;
    }
    let start = rest.iter().position(|&b| b != b'/').unwrap_or(rest.len());
    Some((
        pinned.as_path(),
        Path::new(OsStr::from_bytes(&rest[start..])),
    ))
}

/// `path` (absolute, and not at or below the pinned directory) spelled from the pinned
/// directory: as many `..` as lead from it up to the deepest ancestor the two share, then the
/// rest of `path`. Resolved as paths at or below the pinned directory are (its `..` is its real
/// parent), this names where `path` lies beside the directory as it really is, not where the
/// text leads after a parent was swapped: the place a `..` from the cwd reaches. `None` when
/// [`beneath`] would be for any path (nothing pinned, no /proc, `/` pinned), or when `path` is
/// relative or lies at or below the pinned directory.
pub fn from_pinned(path: &Path) -> Option<PathBuf> {
    let (pinned, _) = PINNED.get()?;
    if !path.is_absolute() || beneath(pinned).is_none() || beneath(path).is_some() {
        return None;
    }
    let up: Vec<_> = pinned.components().collect();
    let to: Vec<_> = path.components().collect();
    let common = up.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut out = pinned.clone();
    for _ in common..up.len() {
        out.push("..");
    }
    for c in &to[common..] {
        out.push(c);
    }
    Some(out)
}

/// The path the worker's system calls use for `path`: for the pinned directory or anything
/// below it, the same path taken from the pinned descriptor — the pinned path's text replaced by
/// `/proc/self/fd/N/.` (the `.` makes an `lstat` see the directory, not the descriptor's link),
/// the rest kept byte for byte, so that paths keep their prefixes and [`shown`] can undo it —
/// else `path` unchanged.
pub fn fs_path(path: &Path) -> Cow<'_, Path> {
    let (Some((pinned, _)), Some(fd)) = (beneath(path), fd()) else {
        return Cow::Borrowed(path);
    };
    let mut bytes = through(fd).into_bytes();
    bytes.extend_from_slice(&path.as_os_str().as_bytes()[pinned.as_os_str().len()..]);
    Cow::Owned(PathBuf::from(std::ffi::OsString::from_vec(bytes)))
}

/// A path found by a walk started at an [`fs_path`] (a directory's entries, a search's
/// matches), named as the same walk from the path as shown would have named it: the inverse of
/// [`fs_path`]. Any other path is returned as it is.
pub fn shown(walked: &Path) -> Cow<'_, Path> {
    let (Some((pinned, _)), Some(fd)) = (PINNED.get(), fd()) else {
        return Cow::Borrowed(walked);
    };
    let prefix = through(fd);
    match walked
        .as_os_str()
        .as_bytes()
        .strip_prefix(prefix.as_bytes())
    {
        Some(rest) if rest.is_empty() || rest[0] == b'/' => {
            let mut bytes = pinned.as_os_str().as_bytes().to_vec();
            bytes.extend_from_slice(rest);
            Cow::Owned(PathBuf::from(std::ffi::OsString::from_vec(bytes)))
        }
        _ => Cow::Borrowed(walked),
    }
}

/// `/proc/self/fd/N/.`: the pinned directory, through its descriptor.
fn through(fd: RawFd) -> String {
    format!("/proc/self/fd/{fd}/.")
}

/// A directory to `fchdir` to.
pub enum StartDir {
    /// The pinned directory itself (held for the worker's life).
    Pinned(RawFd),
    /// A directory opened beneath it for this command.
    Beneath(OwnedFd),
}

impl StartDir {
    pub fn raw(&self) -> RawFd {
        match self {
            StartDir::Pinned(fd) => *fd,
            StartDir::Beneath(fd) => fd.as_raw_fd(),
        }
    }
}

fn open_dir(at: RawFd, path: &Path) -> io::Result<OwnedFd> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: a valid NUL-terminated path; the result is checked before being owned.
    let fd = unsafe {
        libc::openat(
            at,
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor this function owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    //! The one test of this process that pins (a directory of its own, so no other test's
    //! paths lie below it): the file tools after the pinned directory's parent was swapped.
    use super::*;
    use crate::tools::apply_patch::{self, PatchContext};
    use crate::tools::transfer::{Item, destination, send, small};
    use crate::tools::{ErrorKind, grep_files, list_dir, read_file};
    use std::fs;

    fn args<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn file_tools_reach_the_pinned_directory_not_where_its_path_leads() {
        let dir = tempfile::tempdir().unwrap();
        let base = fs::canonicalize(dir.path()).unwrap();
        let proj = base.join("a/proj");
        fs::create_dir_all(proj.join("sub")).unwrap();
        fs::write(proj.join("file"), "real\n").unwrap();
        fs::write(proj.join("sub/deep.txt"), "needle\n").unwrap();
        let decoy = base.join("decoy/proj");
        fs::create_dir_all(decoy.join("sub")).unwrap();
        fs::write(decoy.join("file"), "decoy\n").unwrap();
        fs::write(decoy.join("sub/deep.txt"), "needle\n").unwrap();
        fs::write(decoy.join("decoy.txt"), "needle\n").unwrap();
        pin(&proj).unwrap();
        assert_eq!(BY_PROC.get(), Some(&true), "/proc reaches the descriptor");
        let real = base.join("a.old/proj");
        fs::rename(base.join("a"), base.join("a.old")).unwrap();
        std::os::unix::fs::symlink("decoy", base.join("a")).unwrap();

        // The mapping: by text, at a component boundary, the directory itself as `N/.`.
        let fd = fd().unwrap();
        assert_eq!(fs_path(&proj), Path::new(&format!("/proc/self/fd/{fd}/.")));
        assert_eq!(
            fs_path(&proj.join("x/../y")),
            Path::new(&format!("/proc/self/fd/{fd}/./x/../y"))
        );
        let odd = PathBuf::from(format!("{}//x/", proj.display()));
        assert_eq!(
            fs_path(&odd),
            Path::new(&format!("/proc/self/fd/{fd}/.//x/"))
        );
        assert_eq!(shown(&fs_path(&odd)), odd);
        let sibling = base.join("a/proj2/x");
        assert_eq!(fs_path(&sibling), sibling.as_path());
        assert_eq!(fs_path(Path::new("/etc")), Path::new("/etc"));
        let reached = fs_path(&proj).into_owned();
        assert_eq!(shown(&reached.join("sub/x")), proj.join("sub/x"));
        assert_eq!(shown(&reached), proj);
        let other = PathBuf::from(format!("/proc/self/fd/{fd}/.x"));
        assert_eq!(shown(&other), other);
        // Beside the pinned directory: spelled from it, so `..` is its real parent.
        assert_eq!(from_pinned(&base.join("a/gd")), Some(proj.join("../gd")));
        assert_eq!(
            apply_patch::resolve_target(&from_pinned(&base.join("a/gd")).unwrap(), true).unwrap(),
            base.join("a.old/gd")
        );
        assert_eq!(from_pinned(&proj.join("x")), None);
        assert_eq!(from_pinned(&proj), None);
        assert_eq!(from_pinned(Path::new("rel")), None);

        let cwd = proj.as_path();
        // read_file: absolute, relative, and `..` through the directory's real parent.
        for path in [proj.join("file").to_str().unwrap(), "file", "../proj/file"] {
            let out =
                read_file::read_file(cwd, &args(serde_json::json!({ "file_path": path }))).unwrap();
            assert_eq!(out.model_text(), "L1: real", "{path}");
            assert_eq!(out.path, cwd.join(path));
        }
        // list_dir: the real entries, the path as given.
        let out = list_dir::list_dir(cwd, &args(serde_json::json!({ "dir_path": "." }))).unwrap();
        assert_eq!(
            out.model_text(),
            format!(
                "Absolute path: {}/.\nfile\nsub/\n  deep.txt",
                proj.display()
            )
        );
        // grep_files: the real files, named under the cwd; an anchored include still matches.
        for a in [
            serde_json::json!({ "pattern": "needle" }),
            serde_json::json!({ "pattern": "needle", "path": "sub", "include": "sub/*.txt" }),
        ] {
            let out = grep_files::grep_files(cwd, &args(a.clone())).unwrap();
            assert_eq!(
                out.model_text(),
                proj.join("sub/deep.txt").display().to_string(),
                "{a}"
            );
        }
        let out = grep_files::grep_files(
            cwd,
            &args(serde_json::json!({ "pattern": "needle", "path": "sub/deep.txt" })),
        )
        .unwrap();
        assert_eq!(out.model_text(), format!("{}/sub/deep.txt", proj.display()));

        // apply_patch: add, update, move, delete, a new directory: all in the real tree.
        let ctx = PatchContext {
            cwd: proj.clone(),
            writable_roots: vec![proj.clone()],
            read_only: false,
            protected_names: vec![".git".into()],
            protected_paths: vec![],
        };
        let patch = "*** Begin Patch\n*** Add File: new/added.txt\n+added\n\
                     *** Update File: file\n@@\n-real\n+patched\n\
                     *** Update File: sub/deep.txt\n*** Move to: moved.txt\n@@\n-needle\n+moved\n\
                     *** End Patch";
        let out = apply_patch::apply_patch(patch, &ctx).unwrap();
        assert_eq!(
            out.summary(),
            "Success. Updated the following files:\nA new/added.txt\nM file\nM moved.txt\n"
        );
        assert_eq!(
            fs::read_to_string(real.join("new/added.txt")).unwrap(),
            "added\n"
        );
        assert_eq!(fs::read_to_string(real.join("file")).unwrap(), "patched\n");
        assert_eq!(
            fs::read_to_string(real.join("moved.txt")).unwrap(),
            "moved\n"
        );
        assert!(!real.join("sub/deep.txt").exists());
        let out = apply_patch::apply_patch(
            "*** Begin Patch\n*** Delete File: moved.txt\n*** End Patch",
            &ctx,
        )
        .unwrap();
        assert_eq!(out.changes[0].path, proj.join("moved.txt"));
        assert!(!real.join("moved.txt").exists());
        // Protected names and the roots are checked where the write lands.
        let e = apply_patch::apply_patch(
            "*** Begin Patch\n*** Add File: .git/x\n+x\n*** End Patch",
            &ctx,
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::PermissionDenied, "{e}");
        assert!(
            e.message.contains(&format!("{}/.git/x", proj.display())),
            "{e}"
        );
        // `..` out of the root: its real parent, outside the root.
        let e = apply_patch::apply_patch(
            "*** Begin Patch\n*** Add File: ../escaped.txt\n+x\n*** End Patch",
            &ctx,
        )
        .unwrap_err();
        assert_eq!(e.message, apply_patch::OUTSIDE_REJECTION);
        // With the enclosing directory writable, `..` writes to the real parent, as a command's
        // `../escaped.txt` would; never to the decoy's.
        let wide = PatchContext {
            writable_roots: vec![base.clone()],
            ..ctx.clone()
        };
        apply_patch::apply_patch(
            "*** Begin Patch\n*** Add File: ../escaped.txt\n+x\n*** End Patch",
            &wide,
        )
        .unwrap();
        assert!(base.join("a.old/escaped.txt").exists());
        assert!(!base.join("decoy/escaped.txt").exists());

        // Files: ReadBytes, WriteBytes, a download of the directory itself.
        let r = small::read_bytes(cwd, "file").unwrap();
        assert_eq!((r.path, r.data), (proj.join("file"), b"patched\n".to_vec()));
        let req = small::WriteBytes {
            path: "written.bin",
            data: b"w",
            ..Default::default()
        };
        assert_eq!(
            small::write_bytes(&ctx, &req).unwrap(),
            proj.join("written.bin")
        );
        assert_eq!(fs::read(real.join("written.bin")).unwrap(), b"w");
        // The directory itself is a root: never replaced.
        let e = destination::for_write(&ctx, ".", "", false).unwrap_err();
        assert_eq!(e.kind, ErrorKind::PermissionDenied, "{e}");
        let mut names = Vec::new();
        let sum = send::send(&proj, 1 << 16, &mut |item| {
            if let Item::Entry(e) = item {
                names.push(e.path);
            }
            Ok(())
        })
        .unwrap();
        assert_eq!(sum.path, proj);
        names.sort();
        assert_eq!(
            names,
            ["", "file", "new", "new/added.txt", "sub", "written.bin"]
        );

        // The decoy was never touched.
        let mut left: Vec<_> = fs::read_dir(&decoy)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        left.sort();
        assert_eq!(left, ["decoy.txt", "file", "sub"]);
        assert_eq!(fs::read_to_string(decoy.join("file")).unwrap(), "decoy\n");
        assert_eq!(
            fs::read_to_string(decoy.join("sub/deep.txt")).unwrap(),
            "needle\n"
        );
    }
}
