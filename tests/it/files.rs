//! The Files service through a real daemon: ReadBytes/WriteBytes, and Upload/Download of whole
//! trees, byte for byte and mode for mode, checked on the host. Every refusal is checked on the
//! host too: a refused or cancelled transfer changes nothing and leaves no staging behind. The
//! round trip also runs against a daemon of an ordinary user (no root: a user namespace sandbox).

use crate::common::{self, Daemon, RunAs, TestUser, eventually, outside, scratch};
use corral::api::{
    self, EntryKind, SandboxMode, download_response::Item as Down, upload_request::Item as Up,
};
use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::Path;
use std::time::Duration;
use tonic::Code;

const WW: SandboxMode = SandboxMode::WorkspaceWrite;
const RO: SandboxMode = SandboxMode::ReadOnly;

fn start(session: &str, path: &str, overwrite: bool) -> api::UploadRequest {
    api::UploadRequest {
        item: Some(Up::Start(api::UploadStart {
            session_id: session.into(),
            path: path.into(),
            overwrite,
            ..Default::default()
        })),
    }
}

fn entry(path: &str, kind: EntryKind, mode: Option<u32>, size: u64) -> api::UploadRequest {
    api::UploadRequest {
        item: Some(Up::Entry(api::TransferEntry {
            path: path.into(),
            kind: kind as i32,
            mode,
            size,
            link_target: String::new(),
        })),
    }
}

fn link(path: &str, target: &str) -> api::UploadRequest {
    api::UploadRequest {
        item: Some(Up::Entry(api::TransferEntry {
            path: path.into(),
            kind: EntryKind::Symlink as i32,
            link_target: target.into(),
            ..Default::default()
        })),
    }
}

fn data(bytes: &[u8]) -> api::UploadRequest {
    api::UploadRequest {
        item: Some(Up::Data(bytes.to_vec())),
    }
}

/// The upload messages for a host tree (the test's own walk: sorted, parents first, files in
/// 1 MiB chunks).
fn tree_messages(root: &Path) -> Vec<api::UploadRequest> {
    fn walk(path: &Path, rel: &str, out: &mut Vec<api::UploadRequest>) {
        let m = std::fs::symlink_metadata(path).unwrap();
        let mode = Some(m.mode() & 0o777);
        if m.file_type().is_symlink() {
            out.push(link(
                rel,
                std::fs::read_link(path).unwrap().to_str().unwrap(),
            ));
        } else if m.is_file() {
            let bytes = std::fs::read(path).unwrap();
            out.push(entry(rel, EntryKind::File, mode, bytes.len() as u64));
            out.extend(bytes.chunks(1 << 20).map(data));
        } else {
            out.push(entry(rel, EntryKind::Directory, mode, 0));
            let mut names: Vec<_> = std::fs::read_dir(path)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            names.sort();
            for n in names {
                let child = if rel.is_empty() {
                    n.clone()
                } else {
                    format!("{rel}/{n}")
                };
                walk(&path.join(&n), &child, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(root, "", &mut out);
    out
}

/// A node of a tree: its permission bits (all twelve, so a set-id bit would show) and content.
#[derive(Debug, PartialEq, Eq)]
enum Node {
    File(u32, Vec<u8>),
    Dir(u32),
    Link(String),
}

/// Every node below (and including, as "") `root` on the host.
fn host_tree(root: &Path) -> BTreeMap<String, Node> {
    fn walk(path: &Path, rel: String, out: &mut BTreeMap<String, Node>) {
        let m = std::fs::symlink_metadata(path).unwrap();
        let node = if m.file_type().is_symlink() {
            Node::Link(std::fs::read_link(path).unwrap().to_str().unwrap().into())
        } else if m.is_file() {
            Node::File(m.mode() & 0o7777, std::fs::read(path).unwrap())
        } else {
            for e in std::fs::read_dir(path).unwrap() {
                let n = e.unwrap().file_name().into_string().unwrap();
                let child = if rel.is_empty() {
                    n.clone()
                } else {
                    format!("{rel}/{n}")
                };
                walk(&path.join(&n), child, out);
            }
            Node::Dir(m.mode() & 0o7777)
        };
        out.insert(rel, node);
    }
    let mut out = BTreeMap::new();
    walk(root, String::new(), &mut out);
    out
}

/// A tree with what a transfer must keep: nested directories (one 0555), an empty file, an
/// empty directory, a symlink, a 0700 file, every byte value, and a file of more than 5 MiB.
fn sample_tree(root: &Path) {
    std::fs::create_dir_all(root.join("nested/ro/deep")).unwrap();
    std::fs::create_dir(root.join("empty-dir")).unwrap();
    std::fs::write(root.join("nested/ro/deep/note.txt"), "deep\n").unwrap();
    std::fs::write(root.join("empty-file"), "").unwrap();
    std::fs::write(root.join("all-bytes"), (0..=255u8).collect::<Vec<_>>()).unwrap();
    std::fs::write(root.join("secret"), "s").unwrap();
    std::fs::set_permissions(root.join("secret"), std::fs::Permissions::from_mode(0o700)).unwrap();
    let big: Vec<u8> = (0..(5 << 20) + 4321u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(root.join("big.bin"), big).unwrap();
    symlink("nested/ro/deep/note.txt", root.join("link")).unwrap();
    std::fs::set_permissions(
        root.join("nested/ro"),
        std::fs::Permissions::from_mode(0o555),
    )
    .unwrap();
}

/// Uploads `msgs` followed by the UploadFinish that counts them.
async fn upload(
    d: &Daemon,
    mut msgs: Vec<api::UploadRequest>,
) -> Result<api::TransferSummary, tonic::Status> {
    msgs.push(finish_of(&msgs));
    upload_raw(d, msgs).await
}

/// The UploadFinish a correct client sends after `msgs`.
fn finish_of(msgs: &[api::UploadRequest]) -> api::UploadRequest {
    let mut sent = api::UploadFinish::default();
    for m in msgs {
        match &m.item {
            Some(Up::Entry(_)) => sent.entries += 1,
            Some(Up::Data(d)) => sent.bytes += d.len() as u64,
            _ => {}
        }
    }
    api::UploadRequest {
        item: Some(Up::Finish(sent)),
    }
}

/// Uploads exactly `msgs`.
async fn upload_raw(
    d: &Daemon,
    msgs: Vec<api::UploadRequest>,
) -> Result<api::TransferSummary, tonic::Status> {
    d.files()
        .await
        .upload(tokio_stream::iter(msgs))
        .await
        .map(|r| r.into_inner().summary.expect("a summary"))
}

/// Downloads `path` into a map like [`host_tree`], checking the stream's shape on the way.
async fn download(
    d: &Daemon,
    session: &str,
    path: &str,
) -> Result<(BTreeMap<String, Node>, api::TransferSummary), tonic::Status> {
    let mut stream = d
        .files()
        .await
        .download(api::DownloadRequest {
            session_id: session.into(),
            path: path.into(),
        })
        .await?
        .into_inner();
    let mut out = BTreeMap::new();
    let mut filling: Option<(String, u32, u64, Vec<u8>)> = None;
    let done = |f: Option<(String, u32, u64, Vec<u8>)>, out: &mut BTreeMap<String, Node>| {
        if let Some((p, mode, size, bytes)) = f {
            assert_eq!(bytes.len() as u64, size, "{p}: data matches its size");
            out.insert(p, Node::File(mode, bytes));
        }
    };
    while let Some(msg) = stream.message().await? {
        match msg.item.expect("an item") {
            Down::Entry(e) => {
                done(filling.take(), &mut out);
                if out.is_empty() {
                    assert_eq!(e.path, "", "the root comes first");
                } else {
                    let parent = e.path.rsplit_once('/').map_or("", |(p, _)| p);
                    assert!(
                        matches!(out.get(parent), Some(Node::Dir(_))),
                        "{}: parent first",
                        e.path
                    );
                }
                match EntryKind::try_from(e.kind).unwrap() {
                    EntryKind::File => {
                        filling = Some((e.path, e.mode.unwrap(), e.size, Vec::new()))
                    }
                    EntryKind::Directory => {
                        out.insert(e.path, Node::Dir(e.mode.unwrap()));
                    }
                    EntryKind::Symlink => {
                        out.insert(e.path, Node::Link(e.link_target));
                    }
                    k => panic!("unexpected kind {k:?}"),
                }
            }
            Down::Data(bytes) => {
                assert!(bytes.len() <= 1 << 20);
                filling
                    .as_mut()
                    .expect("data follows a file entry")
                    .3
                    .extend_from_slice(&bytes);
            }
            Down::Summary(s) => {
                done(filling.take(), &mut out);
                assert!(stream.message().await?.is_none(), "the summary is last");
                return Ok((out, s));
            }
        }
    }
    panic!("the download ended without a summary");
}

/// Names in `dir` that look like a transfer's staging.
fn staging_in(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".corral-"))
        .collect()
}

#[tokio::test]
async fn raw_bytes_round_trip_every_byte_value() {
    let d = Daemon::start(&[]).await;
    let ws = scratch();
    let s = d.open(ws.path(), WW).await;
    let all: Vec<u8> = (0..=255u8).rev().chain(0..=255u8).collect();
    let w = d
        .files()
        .await
        .write_bytes(api::WriteBytesRequest {
            session_id: s.clone(),
            path: "sub/dir/bytes.bin".into(),
            data: all.clone(),
            mode: Some(0o640),
            create_parents: true,
            no_overwrite: false,
        })
        .await
        .unwrap()
        .into_inner();
    let host = ws.path().join("sub/dir/bytes.bin");
    assert_eq!(w.size, 512);
    assert_eq!(Path::new(&w.path), std::fs::canonicalize(&host).unwrap());
    assert_eq!(
        std::fs::read(&host).unwrap(),
        all,
        "exact bytes on the host"
    );
    assert_eq!(std::fs::metadata(&host).unwrap().mode() & 0o7777, 0o640);
    let r = d
        .files()
        .await
        .read_bytes(api::ReadBytesRequest {
            session_id: s.clone(),
            path: "sub/dir/bytes.bin".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((r.data, r.mode), (all, 0o640));
    assert!(staging_in(&ws.path().join("sub/dir")).is_empty());
}

#[tokio::test]
async fn a_tree_round_trips_byte_for_byte_and_mode_for_mode() {
    round_trip(&RunAs::Root).await;
}

#[tokio::test]
async fn a_tree_round_trips_through_a_daemon_without_root() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: creating a user needs root (CI runs as root)");
        return;
    }
    round_trip(&RunAs::ordinary_user("files")).await;
}

async fn round_trip(who: &RunAs) {
    let d = who.start(&[]).await;
    let src = who.scratch();
    let ws = who.scratch();
    let tree = src.path().join("tree");
    sample_tree(&tree);
    who.own(&tree);
    let s = d.open(ws.path(), WW).await;
    let mut msgs = vec![start(&s, "copy", false)];
    msgs.extend(tree_messages(&tree));
    let sum = upload(&d, msgs).await.unwrap();
    assert_eq!(
        (sum.files, sum.directories, sum.symlinks),
        (5, 5, 1),
        "{sum:?}"
    );
    assert_eq!(sum.bytes, 5 + 256 + 1 + (5 << 20) + 4321);
    let want = host_tree(&tree);
    assert_eq!(
        host_tree(&ws.path().join("copy")),
        want,
        "upload: the host has the same tree"
    );
    assert!(staging_in(ws.path()).is_empty());
    let (got, sum) = download(&d, &s, "copy").await.unwrap();
    assert_eq!(got, want, "download: the same tree");
    assert!(sum.skipped.is_empty());
    assert_eq!(sum.bytes, (5 + 256 + 1 + (5 << 20) + 4321) as u64);
    // Owned by the caller.
    let uid = match who {
        RunAs::Root => 0,
        RunAs::User(u) => u.uid,
    };
    assert_eq!(
        std::fs::metadata(ws.path().join("copy/big.bin"))
            .unwrap()
            .uid(),
        uid
    );
    // Reading works in a read-only session too.
    let ro = d.open(ws.path(), RO).await;
    assert_eq!(
        download(&d, &ro, "copy/all-bytes").await.unwrap().0[""],
        want["all-bytes"]
    );
}

/// The status of a refused upload.
async fn refused(d: &Daemon, msgs: Vec<api::UploadRequest>) -> tonic::Status {
    upload(d, msgs).await.expect_err("the upload is refused")
}

#[tokio::test]
async fn set_id_bits_are_refused_and_never_set() {
    let d = Daemon::start(&[]).await;
    let ws = scratch();
    let s = d.open(ws.path(), WW).await;
    for mode in [0o4755, 0o2755, 0o6777, 0o1777] {
        let e = refused(
            &d,
            vec![
                start(&s, "f", false),
                entry("", EntryKind::File, Some(mode), 1),
                data(b"x"),
            ],
        )
        .await;
        assert_eq!(e.code(), Code::InvalidArgument, "{mode:o}: {e:?}");
        assert!(e.message().contains("0777"), "{e:?}");
        let e = refused(
            &d,
            vec![
                start(&s, "t", false),
                entry("", EntryKind::Directory, None, 0),
                entry("sub", EntryKind::Directory, Some(mode), 0),
            ],
        )
        .await;
        assert_eq!(e.code(), Code::InvalidArgument, "{mode:o}: {e:?}");
        let e = d
            .files()
            .await
            .write_bytes(api::WriteBytesRequest {
                session_id: s.clone(),
                path: "w".into(),
                data: b"x".to_vec(),
                mode: Some(mode),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{mode:o}: {e:?}");
    }
    assert!(
        std::fs::read_dir(ws.path()).unwrap().next().is_none(),
        "nothing was written"
    );
    // The most a mode can be is 0777, exactly as given (no umask).
    upload(
        &d,
        vec![
            start(&s, "f", false),
            entry("", EntryKind::File, Some(0o777), 1),
            data(b"x"),
        ],
    )
    .await
    .unwrap();
    let m = std::fs::metadata(ws.path().join("f")).unwrap().mode();
    assert_eq!(m & 0o7777, 0o777);
}

/// An upload to `dest` left under way: its start, a 64 MiB file (the root itself, or `big` in a
/// tree) and its first MiB sent, staged beside the destination. Returns the stream's sender and
/// the call.
async fn upload_under_way(
    d: &Daemon,
    ws: &Path,
    session: &str,
    dest: &str,
    overwrite: bool,
    tree: bool,
) -> (
    tokio::sync::mpsc::Sender<api::UploadRequest>,
    tokio::task::JoinHandle<Result<tonic::Response<api::UploadResponse>, tonic::Status>>,
) {
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let mut files = d.files().await;
    let call = tokio::spawn(async move {
        files
            .upload(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
    });
    tx.send(start(session, dest, overwrite)).await.unwrap();
    if tree {
        tx.send(entry("", EntryKind::Directory, None, 0))
            .await
            .unwrap();
        tx.send(entry("big", EntryKind::File, None, 64 << 20))
            .await
            .unwrap();
    } else {
        tx.send(entry("", EntryKind::File, None, 64 << 20))
            .await
            .unwrap();
    }
    tx.send(data(&[1u8; 1 << 20])).await.unwrap();
    assert!(
        eventually(Duration::from_secs(10), || !staging_in(ws).is_empty()).await,
        "the upload staged"
    );
    (tx, call)
}

#[tokio::test]
async fn a_cancelled_upload_changes_nothing_and_leaves_no_staging() {
    let d = Daemon::start(&[]).await;
    let ws = scratch();
    std::fs::create_dir(ws.path().join("dest")).unwrap();
    std::fs::write(ws.path().join("dest/keep"), "old").unwrap();
    let before = host_tree(&ws.path().join("dest"));
    let s = d.open(ws.path(), WW).await;
    // The worker is writing the staged tree beside the destination.
    let (tx, call) = upload_under_way(&d, ws.path(), &s, "dest", true, true).await;
    call.abort();
    let _ = call.await;
    drop(tx);
    assert!(
        eventually(Duration::from_secs(10), || staging_in(ws.path()).is_empty()).await,
        "the staging is removed: {:?}",
        staging_in(ws.path())
    );
    assert_eq!(
        host_tree(&ws.path().join("dest")),
        before,
        "the destination is unchanged"
    );
    // A stream that simply ends half way is a size mismatch: nothing changes either.
    let e = refused(
        &d,
        vec![
            start(&s, "dest", true),
            entry("", EntryKind::Directory, None, 0),
            entry("f", EntryKind::File, None, 10),
            data(b"12345"),
        ],
    )
    .await;
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("5 of its 10 bytes"), "{e:?}");
    assert_eq!(host_tree(&ws.path().join("dest")), before);
    assert!(staging_in(ws.path()).is_empty());
}

/// A worker killed in the middle of an upload (SIGKILL: nothing of it runs after) leaves its
/// staging behind on disk; its lock dies with it, and a new worker of the session removes it
/// before the client hears that the call was lost. For a file and for a tree.
#[tokio::test]
async fn an_upload_whose_worker_is_killed_leaves_no_staging() {
    let d = Daemon::start(&[]).await;
    for tree in [false, true] {
        let ws = scratch();
        let s = d.open(ws.path(), WW).await;
        let (tx, call) = upload_under_way(&d, ws.path(), &s, "out", false, tree).await;
        // The upload's worker (and the first round's session's, idle, when tree is true).
        assert!(!common::procs::kill_serving_workers(&d).await.is_empty());
        let e = call.await.unwrap().unwrap_err();
        assert_eq!(e.code(), Code::Unavailable, "tree {tree}: {e:?}");
        assert!(
            e.message().contains("exited while the call was in flight"),
            "{e:?}"
        );
        // Already gone when the client hears of it.
        assert!(
            staging_in(ws.path()).is_empty(),
            "tree {tree}: the staging was left behind: {:?}",
            staging_in(ws.path())
        );
        assert!(!ws.path().join("out").exists(), "tree {tree}");
        drop(tx);
        // Allowed: the same upload again, to its end.
        let done = upload(
            &d,
            vec![
                start(&s, "out", false),
                entry("", EntryKind::File, None, 2),
                data(b"ok"),
            ],
        )
        .await
        .unwrap();
        assert_eq!(done.bytes, 2);
        assert_eq!(std::fs::read(ws.path().join("out")).unwrap(), b"ok");
        assert!(staging_in(ws.path()).is_empty());
    }
}

/// What a dead writer left — a patch temporary and an upload staging, neither locked — is
/// removed by the next write there from the worker that replaces the dead one, and only then:
/// a worker that replaces nobody does not list directories for it.
#[tokio::test]
async fn a_replacement_worker_removes_what_a_dead_writer_left_and_a_first_worker_does_not_look() {
    let d = Daemon::start(&[]).await;
    let ws = scratch();
    let temp = ws.path().join(".corral-patch-aB3xY9.tmp");
    let staging = ws.path().join(".out.corral-upload-0123456789abcdef");
    std::fs::write(&temp, "left by a killed commit").unwrap();
    std::fs::write(&staging, "left by a killed upload").unwrap();
    let s = d.open(ws.path(), WW).await;
    let mut tools = d.tools().await;
    let patch = |name: &str| api::ApplyPatchRequest {
        session_id: s.clone(),
        patch: format!("*** Begin Patch\n*** Add File: {name}\n+x\n*** End Patch"),
    };
    let one_byte = || {
        vec![
            start(&s, "out", true),
            entry("", EntryKind::File, None, 1),
            data(b"y"),
        ]
    };
    tools.apply_patch(patch("one.txt")).await.unwrap();
    upload(&d, one_byte()).await.unwrap();
    assert!(
        temp.exists() && staging.exists(),
        "the first worker replaces nobody: it does not look"
    );

    assert_eq!(common::procs::kill_serving_workers(&d).await.len(), 1);
    tools.apply_patch(patch("two.txt")).await.unwrap();
    assert!(
        !temp.exists(),
        "the replacement's patch removed the temporary"
    );
    assert!(staging.exists(), "a patch looks for patch temporaries only");
    upload(&d, one_byte()).await.unwrap();
    assert!(
        !staging.exists(),
        "the replacement's upload removed the staging"
    );
    assert_eq!(std::fs::read(ws.path().join("out")).unwrap(), b"y");
    assert_eq!(std::fs::read(ws.path().join("two.txt")).unwrap(), b"x\n");
}

#[tokio::test]
async fn a_size_mismatch_changes_nothing() {
    let d = Daemon::start(&[]).await;
    let ws = scratch();
    std::fs::write(ws.path().join("f"), "old").unwrap();
    let s = d.open(ws.path(), WW).await;
    let cases = [
        (
            "fewer, then another entry",
            vec![
                entry("", EntryKind::Directory, None, 0),
                entry("a", EntryKind::File, None, 4),
                data(b"abc"),
                entry("b", EntryKind::File, None, 0),
            ],
            "dir",
        ),
        (
            "more",
            vec![entry("", EntryKind::File, None, 2), data(b"abc")],
            "f",
        ),
        (
            "more in two chunks",
            vec![
                entry("", EntryKind::File, None, 4),
                data(b"abc"),
                data(b"de"),
            ],
            "f",
        ),
        (
            "fewer, then the end",
            vec![entry("", EntryKind::File, None, 4), data(b"abc")],
            "f",
        ),
        (
            "data with no file",
            vec![entry("", EntryKind::Directory, None, 0), data(b"abc")],
            "dir",
        ),
    ];
    for (what, items, dest) in cases {
        let mut msgs = vec![start(&s, dest, true)];
        msgs.extend(items);
        let e = refused(&d, msgs).await;
        assert_eq!(e.code(), Code::InvalidArgument, "{what}: {e:?}");
        assert_eq!(
            std::fs::read(ws.path().join("f")).unwrap(),
            b"old",
            "{what}"
        );
        assert!(!ws.path().join("dir").exists(), "{what}");
        assert!(staging_in(ws.path()).is_empty(), "{what}");
    }
    // Protocol slips the daemon catches itself.
    let e = refused(&d, vec![entry("", EntryKind::File, None, 0)]).await;
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("UploadStart"), "{e:?}");
    let e = refused(
        &d,
        vec![
            start(&s, "g", false),
            entry("", EntryKind::File, None, 2 << 20),
            data(&vec![0u8; (1 << 20) + 1]),
        ],
    )
    .await;
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("1 MiB"), "{e:?}");
    assert!(!ws.path().join("g").exists());
    // The daemon answers its own refusal only once the worker has removed what it staged,
    // here a tree of 3000 files whose removal takes the worker a while.
    assert!(
        staging_in(ws.path()).is_empty(),
        "staging left when the refusal came"
    );
    let mut msgs = vec![
        start(&s, "tree", false),
        entry("", EntryKind::Directory, None, 0),
    ];
    msgs.extend((0..3000).map(|i| entry(&format!("f{i}"), EntryKind::File, None, 0)));
    msgs.push(data(&vec![0u8; (1 << 20) + 1]));
    let e = refused(&d, msgs).await;
    assert!(e.message().contains("1 MiB"), "{e:?}");
    assert!(!ws.path().join("tree").exists());
    assert!(
        staging_in(ws.path()).is_empty(),
        "staging left when the refusal came: {:?}",
        staging_in(ws.path())
    );
}

#[tokio::test]
async fn overwrite_replaces_atomically_else_already_exists() {
    let d = Daemon::start(&[]).await;
    let ws = scratch();
    std::fs::create_dir_all(ws.path().join("dest/old")).unwrap();
    std::fs::write(ws.path().join("dest/old/f"), "old").unwrap();
    std::fs::write(ws.path().join("file"), "old").unwrap();
    let s = d.open(ws.path(), WW).await;
    let tree = |overwrite| {
        vec![
            start(&s, "dest", overwrite),
            entry("", EntryKind::Directory, Some(0o750), 0),
            entry("new", EntryKind::File, None, 3),
            data(b"new"),
        ]
    };
    // Refused before any data is needed: the first message after the start could be the last.
    let e = refused(&d, vec![start(&s, "dest", false)]).await;
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
    assert!(e.message().contains("overwrite"), "{e:?}");
    let e = refused(&d, tree(false)).await;
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
    assert_eq!(std::fs::read(ws.path().join("dest/old/f")).unwrap(), b"old");
    // A directory replaces only a directory, a file only a file.
    let e = refused(
        &d,
        vec![start(&s, "dest", true), entry("", EntryKind::File, None, 0)],
    )
    .await;
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    let e = refused(
        &d,
        vec![
            start(&s, "file", true),
            entry("", EntryKind::Directory, None, 0),
        ],
    )
    .await;
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    let e = d
        .files()
        .await
        .write_bytes(api::WriteBytesRequest {
            session_id: s.clone(),
            path: "file".into(),
            data: b"x".to_vec(),
            no_overwrite: true,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
    assert_eq!(std::fs::read(ws.path().join("file")).unwrap(), b"old");
    // With overwrite the new tree takes the old one's place whole.
    upload(&d, tree(true)).await.unwrap();
    let mut want = BTreeMap::new();
    want.insert(String::new(), Node::Dir(0o750));
    want.insert("new".into(), Node::File(0o644, b"new".to_vec()));
    assert_eq!(host_tree(&ws.path().join("dest")), want);
    assert!(staging_in(ws.path()).is_empty(), "the old tree is gone");
    // cp's rule: an existing directory receives the upload inside it, under source_name.
    let mut msgs = vec![api::UploadRequest {
        item: Some(Up::Start(api::UploadStart {
            session_id: s.clone(),
            path: "dest".into(),
            source_name: "inner".into(),
            ..Default::default()
        })),
    }];
    msgs.extend([entry("", EntryKind::File, None, 2), data(b"hi")]);
    let sum = upload(&d, msgs).await.unwrap();
    assert_eq!(
        Path::new(&sum.path),
        std::fs::canonicalize(ws.path()).unwrap().join("dest/inner")
    );
    assert_eq!(std::fs::read(ws.path().join("dest/inner")).unwrap(), b"hi");
}

#[tokio::test]
async fn a_read_only_session_writes_nothing() {
    let d = Daemon::start(&[]).await;
    let ws = scratch();
    std::fs::write(ws.path().join("f"), "old").unwrap();
    let s = d.open(ws.path(), RO).await;
    let e = refused(
        &d,
        vec![
            start(&s, "new", false),
            entry("", EntryKind::File, None, 1),
            data(b"x"),
        ],
    )
    .await;
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("read-only"), "{e:?}");
    let e = d
        .files()
        .await
        .write_bytes(api::WriteBytesRequest {
            session_id: s.clone(),
            path: "f".into(),
            data: b"new".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(!ws.path().join("new").exists());
    assert_eq!(std::fs::read(ws.path().join("f")).unwrap(), b"old");
    assert!(staging_in(ws.path()).is_empty());
}

#[tokio::test]
async fn writes_outside_the_workspace_are_refused() {
    let d = Daemon::start(&[]).await;
    let ws = scratch();
    let out = outside();
    symlink(out.path(), ws.path().join("escape")).unwrap();
    let s = d
        .open_with(api::OpenSessionRequest {
            cwd: ws.path().display().to_string(),
            mode: WW as i32,
            exclude_slash_tmp: true,
            exclude_tmpdir_env_var: true,
            ..Default::default()
        })
        .await;
    let outside_file = out.path().join("f").display().to_string();
    let dotdot = format!(
        "../{}/f",
        out.path().strip_prefix("/").map(|_| "x").unwrap()
    );
    for path in [
        outside_file.as_str(),
        "escape/f",
        dotdot.as_str(),
        "/etc/corral-test",
    ] {
        let e = refused(
            &d,
            vec![
                start(&s, path, false),
                entry("", EntryKind::File, None, 1),
                data(b"x"),
            ],
        )
        .await;
        assert_eq!(e.code(), Code::PermissionDenied, "{path}: {e:?}");
        let e = d
            .files()
            .await
            .write_bytes(api::WriteBytesRequest {
                session_id: s.clone(),
                path: path.into(),
                data: b"x".to_vec(),
                create_parents: true,
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied, "{path}: {e:?}");
    }
    assert!(
        std::fs::read_dir(out.path()).unwrap().next().is_none(),
        "nothing outside"
    );
    assert!(!Path::new("/etc/corral-test").exists());
    assert!(!ws.path().parent().unwrap().join("x").exists());
}

#[tokio::test]
async fn entries_cannot_climb_out_of_the_tree() {
    let d = Daemon::start(&[]).await;
    let ws = scratch();
    let out = outside();
    let s = d.open(ws.path(), WW).await;
    let target = out.path().display().to_string();
    let cases = [
        vec![
            entry("", EntryKind::Directory, None, 0),
            entry("../escaped", EntryKind::File, None, 1),
            data(b"x"),
        ],
        vec![
            entry("", EntryKind::Directory, None, 0),
            entry("a/../../escaped", EntryKind::File, None, 1),
            data(b"x"),
        ],
        vec![
            entry("", EntryKind::Directory, None, 0),
            entry("/escaped", EntryKind::File, None, 1),
            data(b"x"),
        ],
        // A symlink entry to a directory outside, then a child "under" it.
        vec![
            entry("", EntryKind::Directory, None, 0),
            link("l", &target),
            entry("l/escaped", EntryKind::File, None, 1),
            data(b"x"),
        ],
        vec![
            entry("", EntryKind::Directory, None, 0),
            link("l", &target),
            entry("l/sub", EntryKind::Directory, None, 0),
        ],
    ];
    for items in cases {
        let mut msgs = vec![start(&s, "t", false)];
        msgs.extend(items);
        let e = refused(&d, msgs).await;
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(
            std::fs::read_dir(out.path()).unwrap().next().is_none(),
            "nothing outside"
        );
        assert!(!ws.path().join("t").exists() && !ws.path().join("escaped").exists());
        assert!(staging_in(ws.path()).is_empty());
    }
}

#[tokio::test]
async fn protected_names_at_the_top_are_refused_like_apply_patch() {
    let d = Daemon::start(&[]).await;
    let ws = scratch();
    let s = d.open(ws.path(), WW).await;
    for (path, source_name) in [(".git", ""), (".codex", ""), (".", ".git"), (".agents", "")] {
        let mut msgs = vec![api::UploadRequest {
            item: Some(Up::Start(api::UploadStart {
                session_id: s.clone(),
                path: path.into(),
                source_name: source_name.into(),
                create_parents: true,
                ..Default::default()
            })),
        }];
        msgs.extend([
            entry("", EntryKind::Directory, None, 0),
            entry("hooks", EntryKind::Directory, None, 0),
        ]);
        let e = refused(&d, msgs).await;
        assert_eq!(
            e.code(),
            Code::PermissionDenied,
            "{path}/{source_name}: {e:?}"
        );
        assert!(e.message().contains("protected"), "{e:?}");
    }
    let e = d
        .files()
        .await
        .write_bytes(api::WriteBytesRequest {
            session_id: s.clone(),
            path: ".git/config".into(),
            data: b"x".to_vec(),
            create_parents: true,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    for name in [".git", ".codex", ".agents"] {
        assert!(!ws.path().join(name).exists(), "{name} absent on the host");
    }
    assert!(staging_in(ws.path()).is_empty());
    // Below the top a `.git` is ordinary content.
    let sum = upload(
        &d,
        vec![
            start(&s, "vendor", false),
            entry("", EntryKind::Directory, None, 0),
            entry(".git", EntryKind::Directory, None, 0),
        ],
    )
    .await
    .unwrap();
    assert_eq!(sum.directories, 2);
    assert!(ws.path().join("vendor/.git").is_dir());
    // A `.git` that appears after the session opened is protected from the next call on (the
    // session moves to a worker built for it; the upload itself goes through).
    std::fs::create_dir(ws.path().join(".git")).unwrap();
    upload(
        &d,
        vec![
            start(&s, "after", false),
            entry("", EntryKind::File, None, 1),
            data(b"x"),
        ],
    )
    .await
    .unwrap();
    assert_eq!(std::fs::read(ws.path().join("after")).unwrap(), b"x");
    assert!(
        d.log_text().contains("protection changed"),
        "the upload found its worker stale and moved: {}",
        d.log_text()
    );
    let e = refused(
        &d,
        vec![
            start(&s, ".git/config", false),
            entry("", EntryKind::File, None, 1),
            data(b"x"),
        ],
    )
    .await;
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(!ws.path().join(".git/config").exists());
}

#[tokio::test]
async fn fifos_and_endless_devices_answer_at_once() {
    let d = Daemon::start(&[]).await;
    let ws = scratch();
    std::fs::create_dir(ws.path().join("t")).unwrap();
    nix::unistd::mkfifo(
        &ws.path().join("t/fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    std::fs::write(ws.path().join("t/f"), "x").unwrap();
    let s = d.open(ws.path(), WW).await;
    for path in ["t/fifo", "/dev/zero", "/dev/urandom", "t"] {
        let e = tokio::time::timeout(
            Duration::from_secs(10),
            d.files().await.read_bytes(api::ReadBytesRequest {
                session_id: s.clone(),
                path: path.into(),
            }),
        )
        .await
        .unwrap_or_else(|_| panic!("ReadBytes {path} blocked"))
        .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{path}: {e:?}");
        assert!(e.message().contains("not a regular file"), "{e:?}");
    }
    for path in ["t/fifo", "/dev/zero"] {
        let e = tokio::time::timeout(Duration::from_secs(10), download(&d, &s, path))
            .await
            .unwrap_or_else(|_| panic!("Download {path} blocked"))
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{path}: {e:?}");
    }
    let (got, sum) = tokio::time::timeout(Duration::from_secs(10), download(&d, &s, "t"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(sum.skipped, ["fifo"]);
    assert_eq!(got.len(), 2, "the directory and its file: {got:?}");
    // Too large for ReadBytes: named, with the way out.
    std::fs::write(ws.path().join("big"), vec![0u8; (3 << 20) + 1]).unwrap();
    let e = d
        .files()
        .await
        .read_bytes(api::ReadBytesRequest {
            session_id: s.clone(),
            path: "big".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(
        e.message().contains("3 MiB") && e.message().contains("Download"),
        "{e:?}"
    );
    let e = d
        .files()
        .await
        .write_bytes(api::WriteBytesRequest {
            session_id: s.clone(),
            path: "w".into(),
            data: vec![0u8; (3 << 20) + 1],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains("3 MiB") && e.message().contains("Upload"),
        "{e:?}"
    );
    assert!(!ws.path().join("w").exists());
}

#[tokio::test]
async fn another_users_session_is_not_found() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: creating a user needs root (CI runs as root)");
        return;
    }
    let d = Daemon::start(&[]).await;
    let ws = scratch();
    std::fs::write(ws.path().join("f"), "secret").unwrap();
    let s = d.open(ws.path(), WW).await;
    let other = TestUser::create("filesother");
    let channel = common::connect_as(&d.socket, other.uid, other.gid)
        .await
        .unwrap();
    let mut files = api::files_client::FilesClient::new(channel);
    let e = files
        .read_bytes(api::ReadBytesRequest {
            session_id: s.clone(),
            path: "f".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    let e = files
        .write_bytes(api::WriteBytesRequest {
            session_id: s.clone(),
            path: "g".into(),
            data: b"x".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    let e = files
        .upload(tokio_stream::iter(vec![
            start(&s, "g", false),
            entry("", EntryKind::File, None, 1),
            data(b"x"),
        ]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    let e = files
        .download(api::DownloadRequest {
            session_id: s.clone(),
            path: "f".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert!(!ws.path().join("g").exists());
}

#[tokio::test]
async fn transfers_are_audited_with_path_and_bytes() {
    let logs = outside();
    let log = logs.path().join("audit.log");
    let d = Daemon::start(&["--audit-log", log.to_str().unwrap()]).await;
    let ws = scratch();
    let s = d.open(ws.path(), WW).await;
    upload(
        &d,
        vec![
            start(&s, "up.bin", false),
            entry("", EntryKind::File, None, 3000),
            data(&[7u8; 3000]),
        ],
    )
    .await
    .unwrap();
    download(&d, &s, "up.bin").await.unwrap();
    let _ = upload(&d, vec![start(&s, "up.bin", false)]).await;
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let of = |tool: &str| {
        lines
            .iter()
            .filter(|l| l["tool"] == tool)
            .cloned()
            .collect::<Vec<_>>()
    };
    let ups = of("upload");
    assert_eq!(ups.len(), 2, "{lines:?}");
    assert_eq!(ups[0]["targets"][0], "up.bin");
    assert_eq!(ups[0]["outcome"], "ok");
    assert_eq!(ups[0]["bytes_in"], 3000);
    assert_eq!(ups[1]["outcome"], "ALREADY_EXISTS");
    let downs = of("download");
    assert_eq!(downs.len(), 1, "{lines:?}");
    assert_eq!(
        (downs[0]["outcome"].as_str(), downs[0]["bytes_out"].as_u64()),
        (Some("ok"), Some(3000))
    );
    assert!(
        !std::fs::read_to_string(&log)
            .unwrap()
            .contains("\u{7}\u{7}"),
        "no contents"
    );
}

#[tokio::test]
async fn the_profiles_file_size_limit_holds_and_the_worker_survives_it() {
    let profiles = outside();
    std::fs::write(
        profiles.path().join("small.toml"),
        include_str!("../../sandbox-profiles/workspace-write.toml")
            .replace("file_size_bytes = 17179869184", "file_size_bytes = 65536"),
    )
    .unwrap();
    let d = Daemon::start(&["--profiles-dir", profiles.path().to_str().unwrap()]).await;
    let ws = scratch();
    let s = d
        .open_with(api::OpenSessionRequest {
            cwd: ws.path().display().to_string(),
            profile: "small".into(),
            ..Default::default()
        })
        .await;
    let e = refused(
        &d,
        vec![
            start(&s, "big", false),
            entry("", EntryKind::File, None, 65537),
            data(&[1u8; 65537]),
        ],
    )
    .await;
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("file size limit"), "{e:?}");
    assert!(!ws.path().join("big").exists());
    assert!(staging_in(ws.path()).is_empty());
    // The worker is alive (a write past RLIMIT_FSIZE would have killed it with SIGXFSZ), and
    // a file of exactly the limit is fine.
    upload(
        &d,
        vec![
            start(&s, "max", false),
            entry("", EntryKind::File, None, 65536),
            data(&[1u8; 65536]),
        ],
    )
    .await
    .unwrap();
    assert_eq!(
        std::fs::metadata(ws.path().join("max")).unwrap().len(),
        65536
    );
}

/// Runs the CLI (`corral ARGS --socket SOCKET`) in `dir`; (exit code, stdout, stderr).
fn corral(d: &Daemon, dir: &Path, args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(common::client_binary())
        .args(args)
        .args(["--socket", d.target()])
        .current_dir(dir)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn corral_cp_copies_trees_both_ways() {
    let d = Daemon::start(&[]).await;
    let ws = scratch();
    let local = scratch();
    let tree = local.path().join("proj");
    sample_tree(&tree);
    let want = host_tree(&tree);
    let cwd = ws.path().to_str().unwrap();
    // Upload to a new name: it becomes the copy (a temporary workspace-write session in --cwd).
    let (code, out, err) = corral(&d, local.path(), &["cp", "proj", ":dest", "--cwd", cwd]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("uploaded proj -> :dest"), "{out}");
    assert_eq!(host_tree(&ws.path().join("dest")), want);
    // Into an existing directory: inside it, under the source's name.
    let (code, out, err) = corral(
        &d,
        local.path(),
        &["cp", "proj", ":dest", "--cwd", cwd, "--json"],
    );
    assert_eq!(code, 0, "{out}{err}");
    let summary: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(
        (summary["files"].as_u64(), summary["directories"].as_u64()),
        (Some(5), Some(5))
    );
    assert_eq!(host_tree(&ws.path().join("dest/proj")), want);
    // Download to a new local name, then into an existing local directory.
    let (code, out, err) = corral(
        &d,
        local.path(),
        &["cp", ":dest/proj", "back", "--cwd", cwd],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("downloaded :dest/proj -> back"), "{out}");
    assert_eq!(host_tree(&local.path().join("back")), want);
    std::fs::create_dir(local.path().join("into")).unwrap();
    let (code, out, err) = corral(
        &d,
        local.path(),
        &["cp", ":dest/proj", "into", "--cwd", cwd],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(host_tree(&local.path().join("into/proj")), want);
    assert!(
        staging_in(local.path()).is_empty() && staging_in(&local.path().join("into")).is_empty()
    );
    // A single file both ways, replacing the destination; --no-clobber refuses.
    let (code, out, err) = corral(
        &d,
        local.path(),
        &["cp", ":dest/all-bytes", "into/proj/secret", "--cwd", cwd],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        std::fs::read(local.path().join("into/proj/secret")).unwrap(),
        (0..=255u8).collect::<Vec<_>>()
    );
    let (code, _, err) = corral(
        &d,
        local.path(),
        &["cp", "-n", "proj/secret", ":dest/all-bytes", "--cwd", cwd],
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("AlreadyExists") && err.contains("overwrite"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(ws.path().join("dest/all-bytes")).unwrap(),
        (0..=255u8).collect::<Vec<_>>()
    );
    // An open session instead of a temporary one; a read-only one cannot receive.
    let ro = d.open(ws.path(), RO).await;
    let (code, out, err) = corral(
        &d,
        local.path(),
        &["cp", ":dest/secret", "s2", "--session", &ro],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(std::fs::read(local.path().join("s2")).unwrap(), b"s");
    let (code, _, err) = corral(&d, local.path(), &["cp", "s2", ":s3", "--session", &ro]);
    assert_eq!(code, 2);
    assert!(err.contains("read-only"), "{err}");
    assert!(!ws.path().join("s3").exists());
    // Exactly one side is remote.
    let (code, _, err) = corral(&d, local.path(), &["cp", "a", "b"]);
    assert_eq!(code, 2);
    assert!(err.contains("exactly one"), "{err}");
}

#[tokio::test]
async fn the_service_is_reflected_and_healthy() {
    use tonic_reflection::pb::v1;
    let d = Daemon::start(&[]).await;
    let status = tonic_health::pb::health_client::HealthClient::new(d.channel().await)
        .check(tonic_health::pb::HealthCheckRequest {
            service: "corral.v1.Files".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .status;
    assert_eq!(
        status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    let mut client = v1::server_reflection_client::ServerReflectionClient::new(d.channel().await);
    let req = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1::server_reflection_request::MessageRequest::FileContainingSymbol(
                "corral.v1.Files".into(),
            ),
        ),
    };
    let resp = client
        .server_reflection_info(tokio_stream::iter(vec![req]))
        .await
        .unwrap()
        .into_inner()
        .message()
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(
            resp.message_response,
            Some(v1::server_reflection_response::MessageResponse::FileDescriptorResponse(ref f))
                if !f.file_descriptor_proto.is_empty()
        ),
        "{resp:?}"
    );
    let req = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(
            String::new(),
        )),
    };
    let resp = client
        .server_reflection_info(tokio_stream::iter(vec![req]))
        .await
        .unwrap()
        .into_inner()
        .message()
        .await
        .unwrap()
        .unwrap();
    let Some(v1::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        resp.message_response
    else {
        panic!("unexpected reflection response");
    };
    assert!(
        list.service.iter().any(|s| s.name == "corral.v1.Files"),
        "{list:?}"
    );
}

/// The daemon's resident memory in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// The daemon's sandbox worker processes (children and grandchildren running `__worker`).
fn workers_of(daemon: u32) -> Vec<i32> {
    let parent = |pid: i32| -> Option<u32> {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("PPid:"))?
            .trim()
            .parse()
            .ok()
    };
    common::host_pids("[_]_worker")
        .iter()
        .filter_map(|p| p.parse::<i32>().ok())
        .filter(|&p| {
            parent(p) == Some(daemon) || parent(p).and_then(|pp| parent(pp as i32)) == Some(daemon)
        })
        .collect()
}

#[tokio::test]
async fn a_disk_slower_than_the_client_holds_the_client_not_the_daemon() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    let d = Daemon::start(&[]).await;
    let ws = scratch();
    let s = d.open(ws.path(), WW).await;
    const SIZE: u64 = 256 << 20;
    const CHUNK: usize = 256 << 10;
    let produced = Arc::new(AtomicU64::new(0));
    let counter = produced.clone();
    let head = vec![
        start(&s, "big", false),
        entry("", EntryKind::File, None, SIZE),
    ];
    let body = tokio_stream::StreamExt::chain(
        tokio_stream::iter(head),
        futures_util::stream::unfold(0u64, move |sent| {
            let counter = counter.clone();
            async move {
                (sent < SIZE).then(|| {
                    counter.fetch_add(CHUNK as u64, Ordering::SeqCst);
                    (data(&vec![(sent >> 18) as u8; CHUNK]), sent + CHUNK as u64)
                })
            }
        }),
    );
    let finish = api::UploadRequest {
        item: Some(Up::Finish(api::UploadFinish {
            entries: 1,
            bytes: SIZE,
        })),
    };
    let body = tokio_stream::StreamExt::chain(body, tokio_stream::once(finish));
    let mut files = d.files().await;
    let call = tokio::spawn(async move { files.upload(body).await });
    assert!(
        eventually(Duration::from_secs(30), || produced.load(Ordering::SeqCst)
            >= 32 << 20)
        .await,
        "the upload is under way"
    );
    // The disk (the worker) stops taking data.
    let workers = workers_of(d.pid());
    assert!(!workers.is_empty(), "found the worker");
    let (at_stop, rss_at_stop) = (produced.load(Ordering::SeqCst), rss_kib(d.pid()));
    for &w in &workers {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(w),
            nix::sys::signal::Signal::SIGSTOP,
        )
        .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (p0, r0) = (produced.load(Ordering::SeqCst), rss_kib(d.pid()));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (p1, r1) = (produced.load(Ordering::SeqCst), rss_kib(d.pid()));
    for &w in &workers {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(w),
            nix::sys::signal::Signal::SIGCONT,
        )
        .unwrap();
    }
    // In flight after the worker stopped: at most the worker's 4 MiB upload window and the
    // HTTP/2 windows (1 MiB each), never the daemon's 16 MiB queue to the worker or more.
    assert!(
        p1 - at_stop <= 8 << 20,
        "the client was held: {} bytes after the stop",
        p1 - at_stop
    );
    assert!(
        p1 - p0 <= 1 << 20,
        "and stayed held: {} bytes more",
        p1 - p0
    );
    assert!(p0 < SIZE, "the client had not finished");
    assert!(
        r1 < r0.max(rss_at_stop) + 16 * 1024,
        "the daemon did not grow: {rss_at_stop} -> {r1} KiB"
    );
    let sum = call.await.unwrap().unwrap().into_inner().summary.unwrap();
    assert_eq!(sum.bytes, SIZE);
    assert_eq!(
        std::fs::metadata(ws.path().join("big")).unwrap().len(),
        SIZE
    );
}

#[tokio::test]
async fn a_download_client_that_stops_reading_is_cut_off_after_the_budget() {
    let conf_dir = outside();
    let conf = conf_dir.path().join("corral.toml");
    std::fs::write(&conf, "stream_stall_timeout = 2\n").unwrap();
    let d = Daemon::start(&["--config", conf.to_str().unwrap()]).await;
    let ws = scratch();
    std::fs::write(ws.path().join("big"), vec![5u8; 64 << 20]).unwrap();
    let s = d.open(ws.path(), RO).await;
    let before = rss_kib(d.pid());
    let mut stream = d
        .files()
        .await
        .download(api::DownloadRequest {
            session_id: s.clone(),
            path: "big".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(stream.message().await.unwrap().is_some());
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        rss_kib(d.pid()) < before + 16 * 1024,
        "the daemon held back, not buffered"
    );
    let mut got = 0u64;
    let status = loop {
        match stream.message().await {
            Ok(Some(m)) => {
                if let Some(Down::Data(b)) = m.item {
                    got += b.len() as u64;
                }
            }
            Ok(None) => panic!("the stream ended normally after a stall"),
            Err(s) => break s,
        }
    };
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(got < 32 << 20, "only what was in flight arrived: {got}");
    // The session still works.
    assert!(download(&d, &s, "big").await.is_ok());
}

#[tokio::test]
async fn a_full_disk_during_an_upload_changes_nothing() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: mounting a small disk needs root (CI runs as root)");
        return;
    }
    let disk = common::SmallDisk::mount(4 << 20);
    let ws = disk.0.path();
    std::fs::write(ws.join("keep"), "old").unwrap();
    std::fs::create_dir(ws.join("tree")).unwrap();
    std::fs::write(ws.join("tree/old"), "old").unwrap();
    let d = Daemon::start(&[]).await;
    let s = d.open(ws, WW).await;
    let before = (host_tree(ws), disk.used());
    // One file larger than the disk: refused before its data is needed.
    let e = refused(
        &d,
        vec![
            start(&s, "keep", true),
            entry("", EntryKind::File, None, 8 << 20),
        ],
    )
    .await;
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("nothing was changed"), "{e:?}");
    // A tree whose files fit one by one but not together: the disk fills half way.
    let mut msgs = vec![
        start(&s, "tree", true),
        entry("", EntryKind::Directory, None, 0),
    ];
    for i in 0..4 {
        msgs.push(entry(&format!("f{i}"), EntryKind::File, None, 1536 << 10));
        msgs.extend((0..6).map(|_| data(&[i as u8; 256 << 10])));
    }
    let e = refused(&d, msgs).await;
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert_eq!(
        (host_tree(ws), disk.used()),
        before,
        "nothing changed, the space is free again"
    );
    assert!(staging_in(ws).is_empty());
}

/// To the server, a client that cancels its upload (RST_STREAM CANCEL) can look exactly like one
/// that ended its stream: only an upload that reaches its UploadFinish is committed. Here the
/// tree is complete (every entry and every byte) but the finish never comes.
#[tokio::test]
async fn an_upload_without_its_finish_changes_nothing() {
    let d = Daemon::start(&[]).await;
    let ws = scratch();
    std::fs::create_dir(ws.path().join("dest")).unwrap();
    std::fs::write(ws.path().join("dest/keep"), "old").unwrap();
    let before = host_tree(&ws.path().join("dest"));
    let s = d.open(ws.path(), WW).await;
    let complete_tree = vec![
        start(&s, "dest", true),
        entry("", EntryKind::Directory, None, 0),
        entry("new", EntryKind::File, None, 0),
    ];
    let e = upload_raw(&d, complete_tree.clone()).await.unwrap_err();
    assert_eq!(e.code(), Code::Cancelled, "{e:?}");
    assert!(e.message().contains("UploadFinish"), "{e:?}");
    let single = vec![
        start(&s, "f", false),
        entry("", EntryKind::File, None, 1),
        data(b"x"),
    ];
    let e = upload_raw(&d, single).await.unwrap_err();
    assert_eq!(e.code(), Code::Cancelled, "{e:?}");
    assert_eq!(host_tree(&ws.path().join("dest")), before, "dest unchanged");
    assert!(!ws.path().join("f").exists());
    assert!(
        eventually(Duration::from_secs(10), || staging_in(ws.path()).is_empty()).await,
        "no staging left"
    );
    // The same tree with its finish commits.
    upload(&d, complete_tree).await.unwrap();
    assert!(ws.path().join("dest/new").is_file());
    assert!(!ws.path().join("dest/keep").exists(), "replaced");
}

#[tokio::test]
async fn an_upload_whose_finish_disagrees_with_the_stream_changes_nothing() {
    let d = Daemon::start(&[]).await;
    let ws = scratch();
    let s = d.open(ws.path(), WW).await;
    let msgs = vec![
        start(&s, "f", false),
        entry("", EntryKind::File, None, 2),
        data(b"xy"),
    ];
    for (entries, bytes) in [(2, 2), (1, 1), (0, 2), (1, 3)] {
        let mut wrong = msgs.clone();
        wrong.push(api::UploadRequest {
            item: Some(Up::Finish(api::UploadFinish { entries, bytes })),
        });
        let e = upload_raw(&d, wrong).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{entries}/{bytes}: {e:?}");
        assert!(
            e.message().contains("received 1 entries and 2 bytes"),
            "{e:?}"
        );
        assert!(
            !ws.path().join("f").exists(),
            "{entries}/{bytes}: nothing written"
        );
    }
    assert!(
        eventually(Duration::from_secs(10), || staging_in(ws.path()).is_empty()).await,
        "no staging left"
    );
    upload(&d, msgs).await.unwrap();
    assert_eq!(std::fs::read(ws.path().join("f")).unwrap(), b"xy");
}
