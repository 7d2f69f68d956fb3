//! The Files service's filesystem operations through a real daemon: Stat, ListDirectory,
//! MakeDirectory, Remove and Copy. Each runs in the session's worker under WriteBytes's rules;
//! every effect and every refusal is judged on the host.

use crate::common::{Daemon, outside, scratch};
use corral::api::{self, EntryKind, SandboxMode};
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use tonic::Code;

const WW: SandboxMode = SandboxMode::WorkspaceWrite;
const RO: SandboxMode = SandboxMode::ReadOnly;

/// A session whose only writable root is `ws` (no /tmp, no $TMPDIR: the scratch directories
/// live there).
async fn session(d: &Daemon, ws: &Path, mode: SandboxMode) -> String {
    d.open_with(api::OpenSessionRequest {
        cwd: ws.display().to_string(),
        mode: mode as i32,
        exclude_slash_tmp: true,
        exclude_tmpdir_env_var: true,
        ..Default::default()
    })
    .await
}

async fn stat(
    d: &Daemon,
    s: &str,
    path: &str,
    follow: bool,
) -> Result<api::StatResponse, tonic::Status> {
    d.files()
        .await
        .stat(api::StatRequest {
            session_id: s.into(),
            path: path.into(),
            follow_symlinks: follow,
        })
        .await
        .map(|r| r.into_inner())
}

async fn list(
    d: &Daemon,
    s: &str,
    path: &str,
) -> Result<api::ListDirectoryResponse, tonic::Status> {
    d.files()
        .await
        .list_directory(api::ListDirectoryRequest {
            session_id: s.into(),
            path: path.into(),
        })
        .await
        .map(|r| r.into_inner())
}

async fn mkdir(d: &Daemon, s: &str, path: &str, recursive: bool) -> Result<String, tonic::Status> {
    d.files()
        .await
        .make_directory(api::MakeDirectoryRequest {
            session_id: s.into(),
            path: path.into(),
            recursive,
        })
        .await
        .map(|r| r.into_inner().path)
}

async fn remove(
    d: &Daemon,
    s: &str,
    path: &str,
    recursive: bool,
    force: bool,
) -> Result<String, tonic::Status> {
    d.files()
        .await
        .remove(api::RemoveRequest {
            session_id: s.into(),
            path: path.into(),
            recursive,
            force,
        })
        .await
        .map(|r| r.into_inner().path)
}

async fn copy(
    d: &Daemon,
    s: &str,
    from: &str,
    to: &str,
    recursive: bool,
) -> Result<String, tonic::Status> {
    d.files()
        .await
        .copy(api::CopyRequest {
            session_id: s.into(),
            source_path: from.into(),
            destination_path: to.into(),
            recursive,
        })
        .await
        .map(|r| r.into_inner().path)
}

fn canonical(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap()
}

fn mode_of(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

#[tokio::test]
async fn stat_and_list_directory_describe_what_the_host_has() {
    let d = Daemon::start(&[]).await;
    let ws = scratch();
    let root = canonical(ws.path());
    std::fs::write(root.join("file"), b"twelve bytes").unwrap();
    std::fs::set_permissions(root.join("file"), std::fs::Permissions::from_mode(0o640)).unwrap();
    std::fs::create_dir(root.join("dir")).unwrap();
    symlink("file", root.join("link")).unwrap();
    nix::unistd::mkfifo(
        &root.join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    let s = session(&d, &root, WW).await;

    let st = stat(&d, &s, "file", false).await.unwrap();
    let host = std::fs::metadata(root.join("file")).unwrap();
    assert_eq!(Path::new(&st.path), root.join("file"));
    assert_eq!(st.kind, EntryKind::File as i32);
    assert_eq!((st.size, st.mode), (12, 0o640));
    assert_eq!(
        st.modified_ms,
        host.mtime() * 1000 + host.mtime_nsec() / 1_000_000
    );
    let birth = host
        .created()
        .ok()
        .map(|t| t.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64);
    assert_eq!(st.created_ms, birth.unwrap_or(0));
    let st = stat(&d, &s, "link", false).await.unwrap();
    assert_eq!(st.kind, EntryKind::Symlink as i32);
    let st = stat(&d, &s, "link", true).await.unwrap();
    assert_eq!((st.kind, st.size), (EntryKind::File as i32, 12));
    let st = stat(&d, &s, &root.join("dir").display().to_string(), false)
        .await
        .unwrap();
    assert_eq!(
        (st.kind, st.mode),
        (
            EntryKind::Directory as i32,
            mode_of(&root.join("dir")) & 0o777
        )
    );
    assert_eq!(
        stat(&d, &s, "fifo", false).await.unwrap().kind,
        EntryKind::Other as i32
    );
    let e = stat(&d, &s, "missing", false).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert!(
        e.message()
            .contains("No such file or directory (os error 2)"),
        "{e:?}"
    );

    let l = list(&d, &s, ".").await.unwrap();
    let got: Vec<(String, i32)> = l.entries.iter().map(|e| (e.name.clone(), e.kind)).collect();
    assert_eq!(
        got,
        vec![
            ("dir".into(), EntryKind::Directory as i32),
            ("fifo".into(), EntryKind::Other as i32),
            ("file".into(), EntryKind::File as i32),
            ("link".into(), EntryKind::Symlink as i32),
        ]
    );
    let e = list(&d, &s, "file").await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    let e = list(&d, &s, "missing").await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert!(e.message().contains("(os error 2)"), "{e:?}");
    // Reads reach what the session's commands could read: outside the roots too.
    let out = outside();
    std::fs::write(out.path().join("seen"), "").unwrap();
    let l = list(&d, &s, &out.path().display().to_string())
        .await
        .unwrap();
    assert_eq!(l.entries.len(), 1);
}

#[tokio::test]
async fn make_directory_remove_and_copy_change_the_host() {
    let d = Daemon::start(&[]).await;
    let ws = scratch();
    let root = canonical(ws.path());
    let s = session(&d, &root, WW).await;

    // MakeDirectory: 0755, -p semantics, ALREADY_EXISTS without it.
    assert_eq!(
        Path::new(&mkdir(&d, &s, "a", false).await.unwrap()),
        root.join("a")
    );
    assert!(root.join("a").is_dir());
    assert_eq!(mode_of(&root.join("a")), 0o755);
    let e = mkdir(&d, &s, "a", false).await.unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
    mkdir(&d, &s, "a", true).await.unwrap();
    let e = mkdir(&d, &s, "p/q/r", false).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert!(e.message().contains("(os error 2)"), "{e:?}");
    assert!(!root.join("p").exists());
    mkdir(&d, &s, "p/q/r", true).await.unwrap();
    for p in ["p", "p/q", "p/q/r"] {
        assert_eq!(mode_of(&root.join(p)), 0o755, "{p}");
    }

    // Copy: a file (mode kept), a symlink as a symlink, a tree.
    std::fs::write(root.join("f"), b"content").unwrap();
    std::fs::set_permissions(root.join("f"), std::fs::Permissions::from_mode(0o600)).unwrap();
    symlink("f", root.join("l")).unwrap();
    assert_eq!(
        Path::new(&copy(&d, &s, "f", "a/g", false).await.unwrap()),
        root.join("a/g")
    );
    assert_eq!(std::fs::read(root.join("a/g")).unwrap(), b"content");
    assert_eq!(mode_of(&root.join("a/g")), 0o600);
    copy(&d, &s, "l", "a/l", false).await.unwrap();
    assert_eq!(
        std::fs::read_link(root.join("a/l")).unwrap(),
        Path::new("f")
    );
    std::fs::write(root.join("f"), b"newer").unwrap();
    copy(&d, &s, "f", "a/g", false).await.unwrap();
    assert_eq!(
        std::fs::read(root.join("a/g")).unwrap(),
        b"newer",
        "a file is replaced"
    );
    let e = copy(&d, &s, "a", "b", false).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(!root.join("b").exists());
    copy(&d, &s, "a", "b", true).await.unwrap();
    assert_eq!(std::fs::read(root.join("b/g")).unwrap(), b"newer");
    assert!(
        std::fs::symlink_metadata(root.join("b/l"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    let e = copy(&d, &s, "a", "b", true).await.unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
    let e = copy(&d, &s, "missing", "c", false).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert!(
        e.message()
            .contains("No such file or directory (os error 2)"),
        "{e:?}"
    );

    // Remove: a file, a directory only with recursive, force for a missing path.
    assert_eq!(
        Path::new(&remove(&d, &s, "f", false, false).await.unwrap()),
        root.join("f")
    );
    assert!(!root.join("f").exists());
    let e = remove(&d, &s, "f", false, false).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert!(
        e.message()
            .contains("No such file or directory (os error 2)"),
        "{e:?}"
    );
    remove(&d, &s, "f", false, true).await.unwrap();
    let e = remove(&d, &s, "b", false, false).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(root.join("b/g").exists());
    remove(&d, &s, "b", true, false).await.unwrap();
    assert!(!root.join("b").exists());
    // Nothing staged is left anywhere.
    let hidden: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".corral-"))
        .collect();
    assert!(hidden.is_empty(), "{hidden:?}");
}

#[tokio::test]
async fn remove_never_follows_a_symlink() {
    let d = Daemon::start(&[]).await;
    let ws = scratch();
    let root = canonical(ws.path());
    let out = outside();
    std::fs::write(out.path().join("keep"), "x").unwrap();
    std::fs::create_dir(root.join("d")).unwrap();
    symlink(out.path(), root.join("d/to-outside")).unwrap();
    symlink(out.path(), root.join("link")).unwrap();
    let s = session(&d, &root, WW).await;
    remove(&d, &s, "link", false, false).await.unwrap();
    assert!(
        std::fs::symlink_metadata(root.join("link")).is_err(),
        "the link is gone"
    );
    // A tree holding a link to outside: the link goes, not what it points to.
    remove(&d, &s, "d", true, false).await.unwrap();
    assert!(!root.join("d").exists());
    assert_eq!(std::fs::read(out.path().join("keep")).unwrap(), b"x");
    // A link to a directory named with a trailing component below it is still refused outside.
    symlink(out.path(), root.join("escape")).unwrap();
    let e = remove(&d, &s, "escape/keep", false, false)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(out.path().join("keep").exists());
}

#[tokio::test]
async fn writes_are_refused_where_write_bytes_is() {
    let d = Daemon::start(&[]).await;
    let ws = scratch();
    let root = canonical(ws.path());
    std::fs::create_dir(root.join(".git")).unwrap();
    std::fs::write(root.join(".git/config"), "[core]\n").unwrap();
    std::fs::write(root.join("f"), "f").unwrap();
    std::fs::create_dir(root.join("d")).unwrap();
    let out = outside();
    std::fs::write(out.path().join("keep"), "x").unwrap();
    let s = session(&d, &root, WW).await;
    let write_bytes_refusal = d
        .files()
        .await
        .write_bytes(api::WriteBytesRequest {
            session_id: s.clone(),
            path: ".git/x".into(),
            data: b"x".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(write_bytes_refusal.code(), Code::PermissionDenied);

    // Protected .git: removing it or anything in it, copying into it, a directory under it.
    for (what, e) in [
        (
            ".git",
            remove(&d, &s, ".git", true, true).await.unwrap_err(),
        ),
        (
            ".git/config",
            remove(&d, &s, ".git/config", false, false)
                .await
                .unwrap_err(),
        ),
        (
            "copy f .git/f",
            copy(&d, &s, "f", ".git/f", false).await.unwrap_err(),
        ),
        (
            "copy d .git",
            copy(&d, &s, "d", ".git", true).await.unwrap_err(),
        ),
        (
            "mkdir .git/hooks2",
            mkdir(&d, &s, ".git/hooks2", false).await.unwrap_err(),
        ),
        (
            "mkdir -p .git/x/y",
            mkdir(&d, &s, ".git/x/y", true).await.unwrap_err(),
        ),
    ] {
        assert_eq!(e.code(), Code::PermissionDenied, "{what}: {e:?}");
        assert!(
            e.message().contains("protected workspace metadata"),
            "{what}: {e:?}"
        );
    }
    // The same words WriteBytes uses.
    assert!(
        write_bytes_refusal
            .message()
            .contains("protected workspace metadata")
    );
    assert_eq!(
        std::fs::read(root.join(".git/config")).unwrap(),
        b"[core]\n"
    );
    assert_eq!(
        std::fs::read_dir(root.join(".git")).unwrap().count(),
        1,
        "nothing new in .git"
    );

    // The root itself, and what lies outside the roots.
    let e = remove(&d, &s, &root.display().to_string(), true, true)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(root.join("f").exists());
    let outside_keep = out.path().join("keep").display().to_string();
    let outside_new = out.path().join("new").display().to_string();
    for (what, e) in [
        (
            "remove outside",
            remove(&d, &s, &outside_keep, false, false)
                .await
                .unwrap_err(),
        ),
        (
            "remove ../",
            remove(&d, &s, "../x", true, true).await.unwrap_err(),
        ),
        (
            "mkdir outside",
            mkdir(&d, &s, &outside_new, false).await.unwrap_err(),
        ),
        (
            "copy to outside",
            copy(&d, &s, "f", &outside_new, false).await.unwrap_err(),
        ),
    ] {
        assert_eq!(e.code(), Code::PermissionDenied, "{what}: {e:?}");
        assert!(
            e.message().contains("outside the session's writable roots"),
            "{what}: {e:?}"
        );
    }
    assert_eq!(std::fs::read(out.path().join("keep")).unwrap(), b"x");
    assert!(!out.path().join("new").exists());
    // Reading outside is allowed, as for the session's commands: a copy from there in.
    copy(&d, &s, &outside_keep, "kept", false).await.unwrap();
    assert_eq!(std::fs::read(root.join("kept")).unwrap(), b"x");
}

#[tokio::test]
async fn a_read_only_session_changes_nothing() {
    let d = Daemon::start(&[]).await;
    let ws = scratch();
    let root = canonical(ws.path());
    std::fs::write(root.join("f"), "f").unwrap();
    std::fs::create_dir(root.join("d")).unwrap();
    let s = session(&d, &root, RO).await;
    for (what, e) in [
        ("mkdir", mkdir(&d, &s, "new", false).await.unwrap_err()),
        (
            "mkdir -p",
            mkdir(&d, &s, "new/deeper", true).await.unwrap_err(),
        ),
        ("rm", remove(&d, &s, "f", false, false).await.unwrap_err()),
        ("rm -r", remove(&d, &s, "d", true, true).await.unwrap_err()),
        ("cp", copy(&d, &s, "f", "g", false).await.unwrap_err()),
    ] {
        assert_eq!(e.code(), Code::PermissionDenied, "{what}: {e:?}");
        assert!(e.message().contains("read-only"), "{what}: {e:?}");
    }
    assert!(root.join("f").exists() && root.join("d").is_dir());
    assert!(!root.join("new").exists() && !root.join("g").exists());
    // Reads still work.
    assert_eq!(stat(&d, &s, "f", false).await.unwrap().size, 1);
    assert_eq!(list(&d, &s, ".").await.unwrap().entries.len(), 2);
}
