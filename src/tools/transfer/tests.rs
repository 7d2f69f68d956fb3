//! Round trips and refusals of the transfer stream, on plain directories (no sandbox).

use super::*;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};

fn items_of(path: &Path) -> (Vec<Item>, Summary) {
    let mut items = Vec::new();
    let summary = send::send(path, 1000, &mut |i| {
        items.push(i);
        Ok(())
    })
    .unwrap();
    (items, summary)
}

fn receive_into(dest: &Path, overwrite: bool, items: Vec<Item>) -> Result<Summary, ToolError> {
    let mut r = Receiver::new(Destination::local(dest)?, overwrite)?;
    for item in items {
        match item {
            Item::Entry(e) => r.entry(e)?,
            Item::Data(d) => r.data(&d)?,
        }
    }
    r.finish()
}

fn entry(path: &str, kind: Kind, size: u64) -> Item {
    Item::Entry(Entry {
        path: path.into(),
        kind,
        mode: None,
        size,
        link_target: if kind == Kind::Symlink {
            "t".into()
        } else {
            String::new()
        },
    })
}

/// Every node below `root`: relative path, mode bits, and content or link target.
fn snapshot(root: &Path) -> Vec<(String, u32, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let m = fs::symlink_metadata(&p).unwrap();
        let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
        let content = if m.file_type().is_symlink() {
            fs::read_link(&p)
                .unwrap()
                .into_os_string()
                .into_encoded_bytes()
        } else if m.is_file() {
            fs::read(&p).unwrap()
        } else {
            let mut names: Vec<_> = fs::read_dir(&p)
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect();
            names.sort();
            stack.extend(names);
            Vec::new()
        };
        out.push((rel, m.mode() & 0o7777, content));
    }
    out.sort();
    out
}

/// Nothing but `allowed` names in `dir` (no staging left behind).
fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn sample_tree(root: &Path) {
    fs::create_dir_all(root.join("a/b")).unwrap();
    fs::create_dir(root.join("empty")).unwrap();
    fs::write(root.join("a/b/all-bytes"), (0..=255u8).collect::<Vec<_>>()).unwrap();
    fs::write(root.join("empty-file"), b"").unwrap();
    fs::write(root.join("big"), vec![7u8; 5000]).unwrap();
    symlink("../a/b/all-bytes", root.join("a/link")).unwrap();
    fs::set_permissions(root.join("big"), fs::Permissions::from_mode(0o700)).unwrap();
    fs::set_permissions(root.join("a/b"), fs::Permissions::from_mode(0o555)).unwrap();
}

#[test]
fn a_tree_round_trips_byte_for_byte_and_mode_for_mode() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let root = src.path().join("tree");
    sample_tree(&root);
    let (items, sent) = items_of(&root);
    assert_eq!((sent.files, sent.directories, sent.symlinks), (3, 4, 1));
    assert_eq!(sent.bytes, 256 + 5000);
    // The root comes first, parents before children, data in chunks of at most 1000.
    assert!(matches!(&items[0], Item::Entry(e) if e.path.is_empty() && e.kind == Kind::Directory));
    assert!(
        items
            .iter()
            .all(|i| !matches!(i, Item::Data(d) if d.len() > 1000))
    );
    let got = receive_into(&dst.path().join("copy"), false, items).unwrap();
    assert_eq!(
        (got.files, got.directories, got.symlinks, got.bytes),
        (3, 4, 1, 5256)
    );
    assert_eq!(snapshot(&root), snapshot(&dst.path().join("copy")));
    assert_eq!(names_in(dst.path()), ["copy"]);
    fs::set_permissions(root.join("a/b"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(
        dst.path().join("copy/a/b"),
        fs::Permissions::from_mode(0o755),
    )
    .unwrap();
}

#[test]
fn a_single_file_and_a_symlink_round_trip() {
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    fs::write(src.path().join("f"), b"hello").unwrap();
    fs::set_permissions(src.path().join("f"), fs::Permissions::from_mode(0o640)).unwrap();
    symlink("/nowhere", src.path().join("l")).unwrap();
    let (items, _) = items_of(&src.path().join("f"));
    receive_into(&dst.path().join("f"), false, items).unwrap();
    let (items, s) = items_of(&src.path().join("l"));
    assert_eq!(s.symlinks, 1, "a symlink root is sent as a symlink");
    receive_into(&dst.path().join("l"), false, items).unwrap();
    assert_eq!(fs::read(dst.path().join("f")).unwrap(), b"hello");
    assert_eq!(
        fs::metadata(dst.path().join("f")).unwrap().mode() & 0o7777,
        0o640
    );
    assert_eq!(
        fs::read_link(dst.path().join("l")).unwrap(),
        Path::new("/nowhere")
    );
}

#[test]
fn special_files_are_skipped_and_never_block() {
    let src = tempfile::tempdir().unwrap();
    fs::create_dir(src.path().join("t")).unwrap();
    nix::unistd::mkfifo(
        &src.path().join("t/fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    fs::write(src.path().join("t/f"), b"x").unwrap();
    let (_, s) = items_of(&src.path().join("t"));
    assert_eq!(s.skipped, ["fifo"]);
    assert_eq!(s.files, 1);
    let e = send::send(&src.path().join("t/fifo"), 10, &mut |_| Ok(())).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
    assert!(e.message.contains("FIFO"), "{e}");
}

#[test]
fn bad_streams_change_nothing_and_leave_no_staging() {
    let dst = tempfile::tempdir().unwrap();
    let d = dst.path().join("out");
    let cases: Vec<(&str, Vec<Item>, ErrorKind)> = vec![
        (
            "short file",
            vec![entry("", Kind::File, 5), Item::Data(b"abc".to_vec())],
            ErrorKind::InvalidArgument,
        ),
        (
            "long file",
            vec![entry("", Kind::File, 2), Item::Data(b"abc".to_vec())],
            ErrorKind::InvalidArgument,
        ),
        (
            "child short",
            vec![
                entry("", Kind::Directory, 0),
                entry("f", Kind::File, 3),
                Item::Data(b"a".to_vec()),
                entry("g", Kind::File, 0),
            ],
            ErrorKind::InvalidArgument,
        ),
        (
            "dotdot",
            vec![entry("", Kind::Directory, 0), entry("../x", Kind::File, 0)],
            ErrorKind::InvalidArgument,
        ),
        (
            "dot",
            vec![entry("", Kind::Directory, 0), entry("./x", Kind::File, 0)],
            ErrorKind::InvalidArgument,
        ),
        (
            "absolute",
            vec![entry("", Kind::Directory, 0), entry("/x", Kind::File, 0)],
            ErrorKind::InvalidArgument,
        ),
        (
            "under a symlink",
            vec![
                entry("", Kind::Directory, 0),
                entry("l", Kind::Symlink, 0),
                entry("l/x", Kind::File, 0),
            ],
            ErrorKind::InvalidArgument,
        ),
        (
            "under a file",
            vec![
                entry("", Kind::Directory, 0),
                entry("f", Kind::File, 0),
                entry("f/x", Kind::File, 0),
            ],
            ErrorKind::InvalidArgument,
        ),
        (
            "parent not sent",
            vec![entry("", Kind::Directory, 0), entry("a/x", Kind::File, 0)],
            ErrorKind::InvalidArgument,
        ),
        (
            "duplicate",
            vec![
                entry("", Kind::Directory, 0),
                entry("x", Kind::File, 0),
                entry("x", Kind::Directory, 0),
            ],
            ErrorKind::InvalidArgument,
        ),
        (
            "root twice",
            vec![entry("", Kind::Directory, 0), entry("", Kind::Directory, 0)],
            ErrorKind::InvalidArgument,
        ),
        (
            "root not first",
            vec![entry("x", Kind::File, 0)],
            ErrorKind::InvalidArgument,
        ),
        (
            "data first",
            vec![Item::Data(b"x".to_vec())],
            ErrorKind::InvalidArgument,
        ),
        (
            "entry after a file root",
            vec![entry("", Kind::File, 0), entry("x", Kind::File, 0)],
            ErrorKind::InvalidArgument,
        ),
        ("nothing", vec![], ErrorKind::InvalidArgument),
    ];
    for (name, items, kind) in cases {
        let e = receive_into(&d, false, items).unwrap_err();
        assert_eq!(e.kind, kind, "{name}: {e}");
        assert!(
            names_in(dst.path()).is_empty(),
            "{name}: left {:?}",
            names_in(dst.path())
        );
    }
    // Set-id, sticky and file-type bits are refused, never set.
    for mode in [0o4755, 0o2755, 0o1777, 0o100644] {
        let mut e = Entry {
            path: String::new(),
            kind: Kind::File,
            mode: Some(mode),
            size: 0,
            link_target: String::new(),
        };
        let err = receive_into(&d, false, vec![Item::Entry(e.clone())]).unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidArgument, "{mode:o}");
        e.kind = Kind::Directory;
        assert!(receive_into(&d, false, vec![Item::Entry(e)]).is_err());
        assert!(names_in(dst.path()).is_empty());
    }
    // Dropped half way (a cancelled call): nothing is left.
    let mut r = Receiver::new(Destination::local(&d).unwrap(), false).unwrap();
    r.entry(Entry {
        path: String::new(),
        kind: Kind::Directory,
        mode: Some(0o555),
        size: 0,
        link_target: String::new(),
    })
    .unwrap();
    r.entry(Entry {
        path: "sub".into(),
        kind: Kind::Directory,
        mode: Some(0o000),
        size: 0,
        link_target: String::new(),
    })
    .unwrap();
    r.entry(Entry {
        path: "sub/f".into(),
        kind: Kind::File,
        mode: None,
        size: 10,
        link_target: String::new(),
    })
    .unwrap();
    r.data(b"12345").unwrap();
    drop(r);
    assert!(names_in(dst.path()).is_empty());
}

#[test]
fn overwrite_replaces_atomically_and_only_the_same_kind() {
    let dst = tempfile::tempdir().unwrap();
    let d = dst.path().join("out");
    fs::create_dir_all(d.join("old/deep")).unwrap();
    fs::write(d.join("old/deep/f"), b"old").unwrap();
    fs::set_permissions(d.join("old"), fs::Permissions::from_mode(0o555)).unwrap();
    let tree = || {
        vec![
            entry("", Kind::Directory, 0),
            entry("new", Kind::File, 2),
            Item::Data(b"hi".to_vec()),
        ]
    };
    let e = receive_into(&d, false, tree()).unwrap_err();
    assert_eq!(e.kind, ErrorKind::AlreadyExists, "{e}");
    assert!(d.join("old/deep/f").exists());
    let e = receive_into(&d, true, vec![entry("", Kind::File, 0)]).unwrap_err();
    assert_eq!(e.kind, ErrorKind::FailedPrecondition, "{e}");
    receive_into(&d, true, tree()).unwrap();
    assert_eq!(names_in(&d), ["new"]);
    assert_eq!(names_in(dst.path()), ["out"], "the old tree was removed");
    // A file replaces a file (and a symlink itself, never its target).
    let f = dst.path().join("f");
    fs::write(&f, b"1").unwrap();
    receive_into(
        &f,
        true,
        vec![entry("", Kind::File, 1), Item::Data(b"2".to_vec())],
    )
    .unwrap();
    assert_eq!(fs::read(&f).unwrap(), b"2");
    let target = dst.path().join("target");
    fs::write(&target, b"keep").unwrap();
    symlink(&target, dst.path().join("l")).unwrap();
    receive_into(
        &dst.path().join("l"),
        true,
        vec![entry("", Kind::File, 1), Item::Data(b"3".to_vec())],
    )
    .unwrap();
    assert_eq!(fs::read(&target).unwrap(), b"keep");
    assert!(
        fs::symlink_metadata(dst.path().join("l"))
            .unwrap()
            .is_file()
    );
    let e = receive_into(&f, true, vec![entry("", Kind::Directory, 0)]).unwrap_err();
    assert_eq!(e.kind, ErrorKind::FailedPrecondition, "{e}");
    assert_eq!(names_in(dst.path()), ["f", "l", "out", "target"]);
}

#[test]
fn a_file_that_shrinks_while_read_aborts() {
    let src = tempfile::tempdir().unwrap();
    let f = src.path().join("f");
    fs::write(&f, vec![1u8; 10_000]).unwrap();
    let mut first = true;
    let e = send::send(&f, 1000, &mut |item| {
        if first {
            first = false;
            assert!(matches!(item, Item::Entry(_)));
            fs::OpenOptions::new()
                .write(true)
                .open(&f)
                .unwrap()
                .set_len(2500)
                .unwrap();
        }
        Ok(())
    })
    .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Aborted, "{e}");
    assert!(e.message.contains("shrank"), "{e}");
}

#[test]
fn small_files_read_and_write_whole() {
    let dir = tempfile::tempdir().unwrap();
    let root = fs::canonicalize(dir.path()).unwrap();
    let rules = crate::tools::apply_patch::PatchContext {
        cwd: root.clone(),
        writable_roots: vec![root.clone()],
        read_only: false,
        protected_names: vec![".git".into()],
        protected_paths: vec![],
    };
    let all: Vec<u8> = (0..=255u8).collect();
    let req = small::WriteBytes {
        path: "d/f",
        data: &all,
        mode: Some(0o600),
        create_parents: true,
        no_overwrite: false,
    };
    assert_eq!(small::write_bytes(&rules, &req).unwrap(), root.join("d/f"));
    let read = small::read_bytes(&root, "d/f").unwrap();
    assert_eq!((read.data, read.mode), (all.clone(), 0o600));
    // Mode kept on replace when not given; no_overwrite refuses.
    let req = small::WriteBytes {
        path: "d/f",
        data: b"x",
        ..Default::default()
    };
    small::write_bytes(&rules, &req).unwrap();
    assert_eq!(small::read_bytes(&root, "d/f").unwrap().mode, 0o600);
    let req = small::WriteBytes {
        no_overwrite: true,
        ..req
    };
    assert_eq!(
        small::write_bytes(&rules, &req).unwrap_err().kind,
        ErrorKind::AlreadyExists
    );
    let big = vec![0u8; SMALL_FILE_LIMIT as usize + 1];
    let req = small::WriteBytes {
        path: "big",
        data: &big,
        ..Default::default()
    };
    let e = small::write_bytes(&rules, &req).unwrap_err();
    assert!(e.message.contains("Upload"), "{e}");
    fs::write(root.join("big"), &big).unwrap();
    let e = small::read_bytes(&root, "big").unwrap_err();
    assert_eq!(e.kind, ErrorKind::ResourceExhausted);
    assert!(e.message.contains("Download"), "{e}");
    for special in ["/dev/zero", "/dev/null"] {
        let e = small::read_bytes(&root, special).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{special}: {e}");
    }
    nix::unistd::mkfifo(
        &root.join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    assert!(small::read_bytes(&root, "fifo").is_err());
    assert_eq!(names_in(&root), ["big", "d", "fifo"]);
}

#[test]
fn a_staged_directory_swapped_for_a_symlink_redirects_nothing() {
    let dst = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let mut r = Receiver::new(Destination::local(&dst.path().join("t")).unwrap(), false).unwrap();
    let dir = |path: &str| Entry {
        path: path.into(),
        kind: Kind::Directory,
        mode: None,
        size: 0,
        link_target: String::new(),
    };
    r.entry(dir("")).unwrap();
    r.entry(dir("a")).unwrap();
    r.entry(dir("b")).unwrap();
    // A concurrent process (the sandbox itself) swaps the staged `a` for a symlink out.
    let staged = dst.path().join(&names_in(dst.path())[0]);
    fs::rename(staged.join("a"), dst.path().join("moved")).unwrap();
    symlink(out.path(), staged.join("a")).unwrap();
    let e = r
        .entry(Entry {
            path: "a/x".into(),
            kind: Kind::File,
            mode: None,
            size: 0,
            link_target: String::new(),
        })
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
    assert!(
        names_in(out.path()).is_empty(),
        "nothing was written through the link"
    );
    drop(r);
    assert_eq!(names_in(dst.path()), ["moved"], "the staging is gone");
}

/// A staging name of `name` as a transfer makes it (16 hex digits).
fn staging_like(name: &str, tag: &str) -> String {
    format!(".{name}.corral-{tag}-0123456789abcdef")
}

#[test]
fn stagings_a_dead_transfer_left_are_removed_by_the_next_transfer_there() {
    fsx::set_leftovers_possible(true);
    let dst = tempfile::tempdir().unwrap();
    let d = dst.path();
    // Left behind by transfers whose process died: a file, a half-built tree (with a locked-down
    // directory inside).
    fs::write(d.join(staging_like("out", "upload")), b"half").unwrap();
    let tree = d.join(".out.corral-upload-00000000000000ff");
    fs::create_dir_all(tree.join("a/b")).unwrap();
    fs::write(tree.join("a/b/f"), b"x").unwrap();
    fs::set_permissions(tree.join("a"), fs::Permissions::from_mode(0o500)).unwrap();
    // A replaced tree moved aside (where the filesystem cannot swap) may be the user's only copy
    // of it; not stagings of `out`, or not anything a transfer makes: all left alone.
    let keep = [
        ".out.corral-old-0123456789abcdef",
        ".out.corral-upload-0123456789ABCDEF",
        ".out.corral-upload-0123",
        ".outer.corral-upload-0123456789abcdef",
        ".out.corral-patch-0123456789abcdef",
        "out.corral-upload-0123456789abcdef",
    ];
    for k in keep {
        fs::write(d.join(k), b"mine").unwrap();
    }
    // Named like a staging but a FIFO, and a fresh symlink: never opened, never removed.
    nix::unistd::mkfifo(
        &d.join(".out.corral-upload-1111111111111111"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    symlink("/etc/passwd", d.join(".out.corral-upload-2222222222222222")).unwrap();

    let got = receive_into(
        &d.join("out"),
        false,
        vec![entry("", Kind::File, 2), Item::Data(b"ok".to_vec())],
    )
    .unwrap();
    assert_eq!(got.bytes, 2);
    let mut want: Vec<String> = keep.iter().map(|k| k.to_string()).collect();
    want.extend([
        ".out.corral-upload-1111111111111111".into(),
        ".out.corral-upload-2222222222222222".into(),
        "out".into(),
    ]);
    want.sort();
    assert_eq!(names_in(d), want);
    assert_eq!(fs::read(d.join("out")).unwrap(), b"ok");
}

#[test]
fn a_staging_in_use_is_left_to_its_transfer() {
    fsx::set_leftovers_possible(true);
    let dst = tempfile::tempdir().unwrap();
    let d = dst.path();
    for root in [entry("", Kind::File, 4), entry("", Kind::Directory, 0)] {
        let target = d.join("busy");
        let _ = fs::remove_dir_all(&target);
        let _ = fs::remove_file(&target);
        let mut first = Receiver::new(Destination::local(&target).unwrap(), true).unwrap();
        let Item::Entry(e) = root else { unreachable!() };
        let kind = e.kind;
        first.entry(e).unwrap();
        if kind == Kind::File {
            first.data(b"fi").unwrap();
        }
        let staged = names_in(d);
        assert_eq!(staged.len(), 1, "{staged:?}");
        // A second transfer to the same destination runs to its end while the first is
        // mid-way: it must not take the first one's staging for one left behind.
        let second = receive_into(
            &target,
            true,
            vec![entry("", Kind::File, 1), Item::Data(b"2".to_vec())],
        );
        assert!(second.is_ok(), "{second:?}");
        assert!(
            names_in(d).contains(&staged[0]),
            "the live staging was removed: {:?}",
            names_in(d)
        );
        fs::remove_file(&target).unwrap();
        if kind == Kind::File {
            first.data(b"rs").unwrap();
        }
        let done = first.finish().unwrap();
        assert_eq!(done.path, target);
        assert_eq!(names_in(d), ["busy"], "{kind:?}");
    }
}

#[test]
fn only_the_removers_own_stagings_in_its_own_private_directory_are_removed() {
    fsx::set_leftovers_possible(true);
    let dst = tempfile::tempdir().unwrap();
    let d = dst.path();
    let upload = |name: &str| {
        receive_into(
            &d.join(name),
            true,
            vec![entry("", Kind::File, 1), Item::Data(b"x".to_vec())],
        )
        .unwrap()
    };
    // Someone else's thing under a staging's name (e.g. a tree they could not remove, renamed):
    // a more privileged remover must not remove it for them.
    if nix::unistd::geteuid().is_root() {
        let theirs = d.join(staging_like("a", "upload"));
        fs::create_dir(&theirs).unwrap();
        nix::unistd::chown(
            &theirs,
            Some(nix::unistd::Uid::from_raw(65534)),
            Some(nix::unistd::Gid::from_raw(65534)),
        )
        .unwrap();
        upload("a");
        assert!(theirs.exists(), "another user's entry was removed");
    }
    // In a directory others may write to, nothing is removed, not even one's own.
    fs::write(d.join(staging_like("b", "upload")), b"stale").unwrap();
    fs::set_permissions(d, fs::Permissions::from_mode(0o777)).unwrap();
    upload("b");
    assert!(d.join(staging_like("b", "upload")).exists());
    // The same staging in a private directory is removed.
    fs::set_permissions(d, fs::Permissions::from_mode(0o700)).unwrap();
    upload("b");
    assert!(!d.join(staging_like("b", "upload")).exists());
}
