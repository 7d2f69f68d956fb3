//! The Files service through a real daemon: ReadBytes/WriteBytes, and Upload/Download of whole
//! trees, byte for byte and mode for mode, checked on the host. Every refusal is checked on the
//! host too: a refused or cancelled transfer changes nothing and leaves no staging behind. The
//! round trip also runs against a daemon of an ordinary user (no root: a user namespace sandbox).

mod common;

use common::{Daemon, RunAs, TestUser, eventually, outside, scratch};
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

async fn upload(
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
    let mut done = |f: Option<(String, u32, u64, Vec<u8>)>, out: &mut BTreeMap<String, Node>| {
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
