//! Fuzz target: the Upload stream checks (`corral::tools::transfer::Receiver`), fed an arbitrary
//! sequence of entries and data as a client's stream would carry them, into a fresh directory.
//!
//! Properties (the module's guarantees):
//! - any refused entry, data or end leaves the directory exactly as it was once the receiver is
//!   dropped (no staging, the destination untouched);
//! - a finished upload leaves only the destination, and the summary's counts are what was sent;
//! - a file entry larger than the file size limit (set here to 1 MiB) is refused.
//!
//! Symlink targets are plain names (no `/`): a receiver bug could then at worst write inside
//! the fuzzer's own directory, never on the host.
#![no_main]

use corral::tools::transfer::{Destination, Entry, Kind, Receiver};
use libfuzzer_sys::fuzz_target;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Once;

const FSIZE_LIMIT: u64 = 1 << 20;

struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }
    fn bytes(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        head
    }
    fn string(&mut self) -> String {
        let n = self.byte().unwrap_or(0) as usize % 24;
        String::from_utf8_lossy(self.bytes(n)).into_owned()
    }
    fn number(&mut self, width: usize) -> u64 {
        self.bytes(width)
            .iter()
            .fold(0u64, |n, &b| (n << 8) | u64::from(b))
    }
}

/// The directory's tree: path → (kind, content or link target, permission bits).
fn snapshot(dir: &Path) -> BTreeMap<String, (char, Vec<u8>, u32)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            let rel = p.strip_prefix(dir).unwrap().to_string_lossy().into_owned();
            let meta = std::fs::symlink_metadata(&p).unwrap();
            let mode = meta.permissions().mode() & 0o7777;
            let node = if meta.is_symlink() {
                let t = std::fs::read_link(&p).unwrap();
                ('l', t.into_os_string().into_encoded_bytes(), 0)
            } else if meta.is_dir() {
                stack.push(p);
                ('d', Vec::new(), mode)
            } else {
                ('f', std::fs::read(&p).unwrap(), mode)
            };
            out.insert(rel, node);
        }
    }
    out
}

fuzz_target!(|data: &[u8]| {
    static LIMIT: Once = Once::new();
    LIMIT.call_once(|| {
        // SAFETY: plain libc calls on this process's own limits and signal dispositions.
        unsafe {
            // A write past the limit then fails with EFBIG instead of killing the fuzzer.
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            let lim = libc::rlimit {
                rlim_cur: FSIZE_LIMIT,
                rlim_max: FSIZE_LIMIT,
            };
            assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &lim), 0);
        }
    });
    let mut input = Input(data);
    let Some(setup) = input.byte() else { return };
    let dir = tempfile::Builder::new()
        .prefix("corral-fuzz-")
        .tempdir_in(if Path::new("/dev/shm").is_dir() {
            "/dev/shm"
        } else {
            "/tmp"
        })
        .expect("temp dir");
    let dest = dir.path().join("dest");
    // What the destination already holds.
    match setup % 4 {
        0 => {}
        1 => std::fs::write(&dest, b"old").unwrap(),
        2 => std::fs::create_dir_all(dest.join("old")).unwrap(),
        _ => std::os::unix::fs::symlink("old", &dest).unwrap(),
    }
    let overwrite = setup & 0x80 != 0;
    let before = snapshot(dir.path());

    let destination = Destination::local(&dest).expect("a local destination");
    let mut receiver = match Receiver::new(destination, overwrite) {
        Ok(r) => Some(r),
        Err(_) => {
            assert!(setup % 4 != 0 && !overwrite, "refused an empty destination");
            assert_eq!(snapshot(dir.path()), before);
            return;
        }
    };
    let (mut files, mut dirs, mut links, mut bytes) = (0u64, 0u64, 0u64, 0u64);
    let outcome = loop {
        let Some(op) = input.byte() else {
            break receiver.take().unwrap().finish().map(Some);
        };
        let step = match op % 3 {
            0 => {
                let kind = match input.byte().unwrap_or(0) % 3 {
                    0 => Kind::File,
                    1 => Kind::Directory,
                    _ => Kind::Symlink,
                };
                // Mostly nested plain names, sometimes raw bytes.
                let path = input.string();
                let mode = match input.byte().unwrap_or(0) {
                    0..=127 => None,
                    _ => Some(input.number(2) as u32),
                };
                let size = match kind {
                    Kind::File => {
                        let width = input.byte().unwrap_or(0) as usize % 9;
                        input.number(width)
                    }
                    _ => 0,
                };
                let link_target = input.string().replace('/', "_");
                let entry = Entry {
                    path,
                    kind,
                    mode,
                    size,
                    link_target,
                };
                let result = receiver.as_mut().unwrap().entry(entry.clone());
                if result.is_ok() {
                    if let Some(m) = entry.mode {
                        assert_eq!(m & !0o777, 0, "mode {m:o} accepted");
                    }
                    match kind {
                        Kind::File => {
                            assert!(size <= FSIZE_LIMIT, "a {size}-byte file accepted");
                            files += 1;
                        }
                        Kind::Directory => dirs += 1,
                        Kind::Symlink => links += 1,
                    }
                }
                result
            }
            1 => {
                let n = input.number(2) as usize;
                let chunk = input.bytes(n);
                let result = receiver.as_mut().unwrap().data(chunk);
                if result.is_ok() {
                    bytes += chunk.len() as u64;
                }
                result
            }
            _ => break receiver.take().unwrap().finish().map(Some),
        };
        if let Err(e) = step {
            break Err(e);
        }
    };
    // Dropping an unfinished receiver is what removes its staging.
    drop(receiver);
    match outcome {
        Ok(Some(summary)) => {
            assert_eq!(
                (
                    summary.files,
                    summary.directories,
                    summary.symlinks,
                    summary.bytes
                ),
                (files, dirs, links, bytes)
            );
            let after = snapshot(dir.path());
            for path in after.keys() {
                assert!(
                    path == "dest" || path.starts_with("dest/"),
                    "{path} left beside the destination"
                );
            }
            let nodes = after.len() as u64;
            assert_eq!(nodes, files + dirs + links, "{after:?}");
        }
        Ok(None) => unreachable!(),
        Err(_) => {
            assert_eq!(
                snapshot(dir.path()),
                before,
                "a refused upload changed the directory"
            );
        }
    }
});
