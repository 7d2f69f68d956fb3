//! Review of H24 for the file tools (commit 6b17d43): the paths read_file, list_dir,
//! grep_files, view_image, apply_patch and the Files service touch at or below the worker's
//! pinned cwd are reached through `/proc/self/fd/N/.`. Each test attacks that mapping through a
//! real daemon — `..` out of the pinned directory, spellings that start with its text but are
//! not below it, symlinks inside the root, `/proc/self/fd/N/…` named by the caller, a read-only
//! session, a swapped parent with a protected gitdir beside the cwd — judges on the host side,
//! and includes the allowed path. What the tools show must stay as the caller gave it (never the
//! descriptor's name), and behave as on the host (symlink hops).

use crate::common::{self, Daemon, outside};
use corral::api::{self, SandboxMode};
use std::path::{Path, PathBuf};

/// A workspace-write session on `cwd` (without /tmp), plus extra roots.
async fn ww(d: &Daemon, cwd: &Path, roots: &[&Path]) -> String {
    d.try_open_with(api::OpenSessionRequest {
        cwd: cwd.to_string_lossy().into_owned(),
        mode: SandboxMode::WorkspaceWrite as i32,
        writable_roots: roots
            .iter()
            .map(|r| r.to_string_lossy().into_owned())
            .collect(),
        exclude_slash_tmp: true,
        env: common::session_env(cwd),
        ..Default::default()
    })
    .await
    .unwrap()
}

fn exists(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok()
}

async fn patch_add(d: &Daemon, s: &str, path: &str) -> (String, bool) {
    let patch = format!("*** Begin Patch\n*** Add File: {path}\n+x\n*** End Patch");
    d.invoke(
        s,
        "apply_patch",
        &serde_json::json!({ "input": patch }).to_string(),
    )
    .await
}

/// apply_patch that may be refused before it runs (a session whose roots moved).
async fn try_patch_add(d: &Daemon, s: &str, path: &str) -> Result<(String, bool), tonic::Status> {
    let patch = format!("*** Begin Patch\n*** Add File: {path}\n+x\n*** End Patch");
    d.bridge()
        .await
        .invoke(api::InvokeRequest {
            session_id: s.into(),
            name: "apply_patch".into(),
            arguments: serde_json::json!({ "input": patch }).to_string(),
            call_id: "call_1".into(),
            freeform: false,
        })
        .await
        .map(|r| {
            let r = r.into_inner();
            (r.output, r.success)
        })
}

async fn write_bytes(d: &Daemon, s: &str, path: &str) -> Result<String, tonic::Status> {
    d.files()
        .await
        .write_bytes(api::WriteBytesRequest {
            session_id: s.into(),
            path: path.into(),
            data: b"x\n".to_vec(),
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner().path)
}

/// Every file below `dir` (recursively), for host-side "nothing new appeared" checks.
fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(p.clone());
            }
            out.push(p);
        }
    }
    out.sort();
    out
}

const OUTSIDE: &str =
    "patch rejected: writing outside of the project; rejected by user approval settings";

fn protected(shown: &str) -> String {
    format!(
        "patch rejected: writing to protected workspace metadata path {shown} is blocked by the sandbox"
    )
}

/// `..` out of the pinned cwd and spellings that begin with the cwd's text without lying below
/// it (`proj2`, `//`, `/.`, `sub/..`): apply_patch and WriteBytes are refused exactly as before
/// (outside, or protected metadata), and the host shows nothing new outside the root or in
/// `.git`. The allowed path: the same odd spellings of a name inside the root write there.
#[tokio::test]
async fn h24r_dotdot_and_prefix_spellings_stay_inside_the_rules() {
    let d = Daemon::start(&[]).await;
    let base = outside();
    let b = std::fs::canonicalize(base.path()).unwrap();
    let proj = b.join("proj");
    std::fs::create_dir_all(proj.join("sub")).unwrap();
    std::fs::create_dir_all(proj.join(".git")).unwrap();
    std::fs::create_dir_all(b.join("proj2")).unwrap();
    let p = proj.display().to_string();
    let s = ww(&d, &proj, &[]).await;
    assert_eq!(d.sh(&s, "true").await.exit_code, 0);
    let before_base: Vec<PathBuf> = tree(&b)
        .into_iter()
        .filter(|x| !x.starts_with(&proj))
        .collect();

    let outside_paths = [
        "../escape.txt".to_string(),
        "sub/../../escape.txt".to_string(),
        "./../escape.txt".to_string(),
        format!("{p}/../proj2/x"),
        format!("{p}2/x"),
        format!("{p}//../proj2/x"),
        format!("{p}/./../proj2/x"),
        format!("{p}/.//..//proj2/x"),
        format!("{p}/sub/../../escape.txt"),
    ];
    for path in &outside_paths {
        let (out, ok) = patch_add(&d, &s, path).await;
        assert!(!ok, "{path}: {out}");
        assert_eq!(out, OUTSIDE, "{path}");
        let e = write_bytes(&d, &s, path).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{path}: {e:?}");
        assert!(
            e.message()
                .contains("is outside the session's writable roots"),
            "{path}: {e:?}"
        );
    }
    let protected_paths = [
        ".git/x".to_string(),
        ".//.git/x".to_string(),
        "sub/../.git/x".to_string(),
        "../proj/.git/x".to_string(),
        format!("{p}//.git/x"),
        format!("{p}/./.git/x"),
        format!("{p}/sub/..//.git/x"),
        format!("{p}/../proj/.git/x"),
    ];
    for path in &protected_paths {
        let (out, ok) = patch_add(&d, &s, path).await;
        assert!(!ok, "{path}: {out}");
        let shown = if path.starts_with('/') {
            path.clone()
        } else {
            format!("{p}/{path}")
        };
        assert_eq!(out, protected(&shown), "{path}");
        let e = write_bytes(&d, &s, path).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{path}: {e:?}");
        assert!(e.message().contains("protected"), "{path}: {e:?}");
    }
    // The root itself, however spelled, is never replaced by a WriteBytes.
    for path in [".", "./", &format!("{p}/."), &format!("{p}//"), "sub/.."] {
        assert!(write_bytes(&d, &s, path).await.is_err(), "{path}");
    }
    assert!(tree(&proj.join(".git")).is_empty(), "{:?}", tree(&proj));
    let after_base: Vec<PathBuf> = tree(&b)
        .into_iter()
        .filter(|x| !x.starts_with(&proj))
        .collect();
    assert_eq!(before_base, after_base);

    // The allowed path: odd spellings of names inside the root.
    for (i, path) in [
        format!("{p}//ok0.txt"),
        format!("{p}/./ok1.txt"),
        "sub/../ok2.txt".to_string(),
        format!("{p}/../proj/ok3.txt"),
    ]
    .iter()
    .enumerate()
    {
        let (out, ok) = patch_add(&d, &s, path).await;
        assert!(ok, "{path}: {out}");
        assert_eq!(
            std::fs::read_to_string(proj.join(format!("ok{i}.txt"))).unwrap(),
            "x\n"
        );
        std::fs::remove_file(proj.join(format!("ok{i}.txt"))).unwrap();
        let w = write_bytes(&d, &s, path).await.unwrap();
        assert_eq!(
            std::fs::read_to_string(proj.join(format!("ok{i}.txt"))).unwrap(),
            "x\n",
            "{w}"
        );
        assert!(!w.contains("/proc/"), "{w}");
    }
}

/// Symlinks inside the root — to `.git` (relative and absolute), to the root's parent, to
/// `/proc/self/fd` — are followed to where the write would land, which is checked: apply_patch
/// and WriteBytes through them are refused, nothing appears in `.git` or beside the root. The
/// allowed path: a link to a directory inside the root.
#[tokio::test]
async fn h24r_symlinks_inside_the_root_are_checked_where_they_lead() {
    let d = Daemon::start(&[]).await;
    let base = outside();
    let b = std::fs::canonicalize(base.path()).unwrap();
    let proj = b.join("proj");
    std::fs::create_dir_all(proj.join("sub")).unwrap();
    std::fs::create_dir_all(proj.join(".git/hooks")).unwrap();
    let ln =
        |target: &str, name: &str| std::os::unix::fs::symlink(target, proj.join(name)).unwrap();
    ln(".git", "g");
    ln(&format!("{}/.git", proj.display()), "ga");
    ln("..", "up");
    ln(&b.display().to_string(), "upabs");
    ln("/proc/self/fd", "pfd");
    ln("/proc/self/cwd", "pcwd");
    ln("sub", "inside");
    let s = ww(&d, &proj, &[]).await;
    assert_eq!(d.sh(&s, "true").await.exit_code, 0);
    let before = tree(&b);

    let mut refused = vec![
        "g/hooks/pre-commit".to_string(),
        "ga/hooks/pre-commit".to_string(),
        "up/escape.txt".to_string(),
        "up/proj/.git/x".to_string(),
        "upabs/escape.txt".to_string(),
        "upabs/proj/.git/x".to_string(),
        "pcwd/.git/x".to_string(),
        "pcwd/../escape.txt".to_string(),
    ];
    for n in 0..24 {
        refused.push(format!("pfd/{n}/.git/x"));
        refused.push(format!("pfd/{n}/../escape.txt"));
    }
    for path in &refused {
        let (out, ok) = patch_add(&d, &s, path).await;
        assert!(!ok, "{path}: {out}");
        assert!(
            out.starts_with("patch rejected: ") || out.contains("No such file"),
            "{path}: {out}"
        );
        assert!(write_bytes(&d, &s, path).await.is_err(), "{path}");
    }
    assert_eq!(tree(&b), before);

    // The allowed path: through a link inside the root.
    let (out, ok) = patch_add(&d, &s, "inside/through.txt").await;
    assert!(ok, "{out}");
    assert!(exists(&proj.join("sub/through.txt")));
    // Answered as where it landed (the resolved destination), as before.
    let w = write_bytes(&d, &s, "inside/written.txt").await.unwrap();
    assert_eq!(w, format!("{}/sub/written.txt", proj.display()));
    assert!(exists(&proj.join("sub/written.txt")));
}

/// The caller names the worker's descriptors itself: `/proc/self/fd/N/…` for every small N. A
/// write through one is resolved to where it really lands (the descriptor's directory's path)
/// and checked there, so `.git` and the root's parent stay out of reach; the pinned
/// descriptor's own name writes inside the root (the allowed path) and is answered as given.
/// Reads through such names show the name as given, never rewritten to the cwd, and what the
/// tools show for ordinary paths never names a descriptor.
#[tokio::test]
async fn h24r_caller_named_descriptors_gain_nothing() {
    let d = Daemon::start(&[]).await;
    let base = outside();
    let b = std::fs::canonicalize(base.path()).unwrap();
    let proj = b.join("proj");
    std::fs::create_dir_all(proj.join("sub")).unwrap();
    std::fs::create_dir_all(proj.join(".git")).unwrap();
    std::fs::write(proj.join("file"), "needle\n").unwrap();
    std::fs::write(proj.join("sub/deep.txt"), "needle\n").unwrap();
    let s = ww(&d, &proj, &[]).await;
    assert_eq!(d.sh(&s, "true").await.exit_code, 0);
    let before: Vec<PathBuf> = tree(&b)
        .into_iter()
        .filter(|x| !x.starts_with(proj.join("allowed")))
        .collect();

    let mut allowed = Vec::new();
    for n in 0..64 {
        let fd = format!("/proc/self/fd/{n}");
        for path in [
            format!("{fd}/./.git/h24r"),
            format!("{fd}/.git/h24r"),
            format!("{fd}/../h24r-escape"),
            format!("{fd}/./../h24r-escape"),
            format!("{fd}/../proj/.git/h24r"),
        ] {
            let (out, ok) = patch_add(&d, &s, &path).await;
            assert!(!ok, "{path}: {out}");
            assert!(write_bytes(&d, &s, &path).await.is_err(), "{path}");
        }
        let path = format!("{fd}/./allowed{n}.txt");
        let (out, ok) = patch_add(&d, &s, &path).await;
        if ok {
            assert!(exists(&proj.join(format!("allowed{n}.txt"))), "{path}");
            assert!(out.contains(&format!("A {path}\n")), "{out}");
            allowed.push(n);
            // Read back under the name given: shown as given, not as the cwd.
            let (out, ok) = d
                .invoke(
                    &s,
                    "grep_files",
                    &serde_json::json!({ "pattern": "needle", "path": format!("{fd}/.") })
                        .to_string(),
                )
                .await;
            assert!(ok, "{out}");
            let mut lines: Vec<&str> = out.lines().collect();
            lines.sort();
            assert_eq!(
                lines,
                [format!("{fd}/./file"), format!("{fd}/./sub/deep.txt")],
                "{out}"
            );
            let (out, ok) = d
                .invoke(
                    &s,
                    "list_dir",
                    &serde_json::json!({ "dir_path": format!("{fd}/.") }).to_string(),
                )
                .await;
            assert!(ok, "{out}");
            assert!(
                out.starts_with(&format!("Absolute path: {fd}/.\n")),
                "{out}"
            );
        }
    }
    assert_eq!(
        allowed.len(),
        1,
        "exactly the pinned descriptor: {allowed:?}"
    );
    let after: Vec<PathBuf> = tree(&b)
        .into_iter()
        .filter(|x| {
            !x.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("allowed")
        })
        .collect();
    assert_eq!(after, before);

    // Ordinary paths: nothing shown names a descriptor.
    let p = proj.display().to_string();
    for (tool, args) in [
        ("grep_files", serde_json::json!({ "pattern": "needle" })),
        (
            "grep_files",
            serde_json::json!({ "pattern": "needle", "path": p }),
        ),
        (
            "grep_files",
            serde_json::json!({ "pattern": "needle", "path": "missing" }),
        ),
        ("list_dir", serde_json::json!({ "dir_path": p, "depth": 3 })),
        ("list_dir", serde_json::json!({ "dir_path": "missing" })),
        ("read_file", serde_json::json!({ "file_path": "missing" })),
        ("read_file", serde_json::json!({ "file_path": "sub" })),
        ("view_image", serde_json::json!({ "path": "missing.png" })),
        ("view_image", serde_json::json!({ "path": "file" })),
    ] {
        let (out, _) = d.invoke(&s, tool, &args.to_string()).await;
        assert!(!out.contains("/proc/"), "{tool} {args}: {out}");
    }
    let (out, ok) = d
        .invoke(
            &s,
            "apply_patch",
            &serde_json::json!({
                "input": "*** Begin Patch\n*** Update File: missing\n@@\n-a\n+b\n*** End Patch"
            })
            .to_string(),
        )
        .await;
    assert!(!ok);
    assert!(!out.contains("/proc/"), "{out}");
    let e = d
        .files()
        .await
        .read_bytes(api::ReadBytesRequest {
            session_id: s.clone(),
            path: "missing".into(),
        })
        .await
        .unwrap_err();
    assert!(!e.message().contains("/proc/"), "{e:?}");
    assert!(e.message().contains(&format!("{p}/missing")), "{e:?}");
}

/// A read-only session (its cwd is no writable root): apply_patch and WriteBytes refuse every
/// spelling, the pinned one included, before anything resolves; the reads still answer from the
/// cwd (the allowed path).
#[tokio::test]
async fn h24r_read_only_session_writes_nothing_through_the_descriptor() {
    let d = Daemon::start(&[]).await;
    let base = outside();
    let b = std::fs::canonicalize(base.path()).unwrap();
    let proj = b.join("proj");
    std::fs::create_dir_all(&proj).unwrap();
    std::fs::write(proj.join("file"), "ro\n").unwrap();
    let s = d.open(&proj, SandboxMode::ReadOnly).await;
    assert_eq!(d.sh(&s, "cat file").await.output, "ro\n");
    let p = proj.display().to_string();
    let mut paths = vec!["x".to_string(), format!("{p}/x"), format!("{p}//x")];
    for n in 0..32 {
        paths.push(format!("/proc/self/fd/{n}/./x"));
    }
    for path in &paths {
        let (out, ok) = patch_add(&d, &s, path).await;
        assert!(!ok, "{path}: {out}");
        assert_eq!(
            out,
            "patch rejected: writing is blocked by read-only sandbox; rejected by user approval settings"
        );
        let e = write_bytes(&d, &s, path).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{path}: {e:?}");
    }
    assert_eq!(tree(&proj), [proj.join("file")]);
    let (out, ok) = d.invoke(&s, "read_file", r#"{"file_path":"file"}"#).await;
    assert!(ok, "{out}");
    assert_eq!(out, "L1: ro");
}

/// Symlink hops: a chain of links inside the cwd reads through read_file and ReadBytes as on
/// the host — up to 38 hops the same content, and a chain the host refuses (41 hops) refused
/// the same way (`ELOOP`).
#[tokio::test]
async fn h24r_symlink_hops_as_on_the_host() {
    symlink_hops(&[38, 41]).await;
}

/// Known deviation, not fixed (found in this review): naming the pinned directory as
/// `/proc/self/fd/N/.` spends two of the kernel's 40 link hops per lookup (`/proc/self` and the
/// descriptor's magic link), so a chain of 39 or 40 links inside the cwd, which the host (and
/// Codex) reads, fails with `ELOOP` through read_file, list_dir, view_image and ReadBytes
/// (apply_patch resolves links itself and is not affected). Closing it needs lookups relative
/// to the descriptor (`openat`) instead of paths through /proc. Run with `--ignored`.
#[tokio::test]
#[ignore = "known deviation: /proc/self/fd/N costs two symlink hops (see the doc comment)"]
async fn h24r_symlink_hops_39_and_40_as_on_the_host() {
    symlink_hops(&[39, 40]).await;
}

async fn symlink_hops(chains: &[usize]) {
    let d = Daemon::start(&[]).await;
    let base = outside();
    let b = std::fs::canonicalize(base.path()).unwrap();
    let proj = b.join("proj");
    std::fs::create_dir_all(&proj).unwrap();
    std::fs::write(proj.join("target"), "end\n").unwrap();
    // c{n}_0 -> c{n}_1 -> ... -> c{n}_{n-1} -> target: n hops.
    for &n in chains {
        for i in 0..n {
            let to = if i + 1 == n {
                "target".to_string()
            } else {
                format!("c{n}_{}", i + 1)
            };
            std::os::unix::fs::symlink(&to, proj.join(format!("c{n}_{i}"))).unwrap();
        }
    }
    let s = ww(&d, &proj, &[]).await;
    for &n in chains {
        let path = format!("c{n}_0");
        // Baseline on the host: up to 40 hops read, more do not.
        let host = std::fs::read_to_string(proj.join(&path));
        assert_eq!(host.is_ok(), n <= 40, "{n}: {host:?}");
        let abs = format!("{}/{path}", proj.display());
        for p in [path.as_str(), abs.as_str()] {
            let (out, ok) = d
                .invoke(
                    &s,
                    "read_file",
                    &serde_json::json!({ "file_path": p }).to_string(),
                )
                .await;
            if n <= 40 {
                assert!(ok, "{n} hops, {p}: {out}");
                assert_eq!(out, "L1: end", "{p}");
            } else {
                assert!(!ok, "{p}: {out}");
                assert_eq!(
                    out,
                    "failed to read file: Too many levels of symbolic links (os error 40)"
                );
            }
            let r = d
                .files()
                .await
                .read_bytes(api::ReadBytesRequest {
                    session_id: s.clone(),
                    path: p.into(),
                })
                .await;
            assert_eq!(r.is_ok(), n <= 40, "{n} hops, {p}: {r:?}");
        }
    }
}

/// A swapped parent and a `.git` file whose gitdir lies beside the cwd (`../gd`): A's `..` now
/// reaches the real parent (`a.old`), where the real gitdir is, while the gitdir's path leads
/// into the decoy (which mirrors the `.git` file and its gitdir, so that the protected set
/// recomputed by path looks unchanged). A write into the real gitdir — through `..`, or named
/// by its new path — is refused (before the call runs, or by the tool, or by the kernel), and
/// the host's gitdir gains nothing. The allowed path: `..` writes beside the cwd, before the
/// swap into `a`, after it into the real parent.
#[tokio::test]
async fn h24r_swapped_parent_leaves_the_gitdir_beside_the_cwd_protected() {
    let d = Daemon::start(&[]).await;
    let base = outside();
    let b = std::fs::canonicalize(base.path()).unwrap();
    for top in ["a", "decoy"] {
        let gd = b.join(top).join("gd");
        for sub in ["hooks", "objects", "refs"] {
            std::fs::create_dir_all(gd.join(sub)).unwrap();
        }
        std::fs::write(gd.join("HEAD"), "ref: refs/heads/main\n").unwrap();
        std::fs::create_dir_all(b.join(top).join("proj")).unwrap();
        std::fs::write(b.join(top).join("proj/.git"), "gitdir: ../gd\n").unwrap();
    }
    let proj = b.join("a/proj");
    let a = ww(&d, &proj, &[&b]).await;
    assert_eq!(d.sh(&a, "true").await.exit_code, 0);
    // Before the swap: `..` writes beside the cwd; the gitdir is refused.
    let (out, ok) = patch_add(&d, &a, "../beside.txt").await;
    assert!(ok, "{out}");
    assert!(exists(&b.join("a/beside.txt")));
    let (out, ok) = patch_add(&d, &a, "../gd/hooks/pre-commit").await;
    assert!(!ok, "{out}");
    // B, the same user on `base`, swaps `a` for a link to the decoy.
    let s = ww(&d, &b, &[]).await;
    let r = d.sh(&s, "mv a a.old && ln -s decoy a").await;
    assert_eq!(r.exit_code, 0, "{}", r.output);
    let real_gd = b.join("a.old/gd");
    let before = tree(&real_gd);
    let abs = format!("{}/hooks/pre-commit", real_gd.display());
    let mut ran = 0;
    for path in [
        "../gd/hooks/pre-commit",
        "../gd/config",
        "../gd/HEAD",
        "../../a.old/gd/hooks/pre-commit",
        abs.as_str(),
    ] {
        // Baseline, before the review's fix: the tool's own check let these through (the
        // gitdir's path led into the decoy, `..` into the real parent) and only the kernel's
        // read-only view stopped the write (`Read-only file system`).
        match try_patch_add(&d, &a, path).await {
            Ok((out, ok)) => {
                assert!(!ok, "{path}: {out}");
                let shown = if path.starts_with('/') {
                    path.to_string()
                } else {
                    format!("{}/{path}", proj.display())
                };
                assert_eq!(out, protected(&shown), "{path}");
                ran += 1;
            }
            Err(e) => assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}"),
        }
        match write_bytes(&d, &a, path).await {
            Ok(w) => panic!("{path}: written at {w}"),
            Err(e) if e.code() == tonic::Code::FailedPrecondition => {}
            Err(e) => {
                assert_eq!(e.code(), tonic::Code::PermissionDenied, "{path}: {e:?}");
                assert!(
                    e.message().contains("is protected workspace metadata"),
                    "{path}: {e:?}"
                );
            }
        }
    }
    assert_eq!(
        ran, 5,
        "the session still serves after a swap that keeps its roots' protection"
    );
    assert_eq!(tree(&real_gd), before);
    assert_eq!(
        std::fs::read_to_string(real_gd.join("HEAD")).unwrap(),
        "ref: refs/heads/main\n"
    );
    // The allowed path after the swap, when the session still serves: `..` is the real parent.
    if let Ok((out, ok)) = try_patch_add(&d, &a, "../after.txt").await {
        assert!(ok, "{out}");
        assert!(exists(&b.join("a.old/after.txt")));
        assert!(!exists(&b.join("decoy/after.txt")));
    }
}
