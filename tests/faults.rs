//! Faults against a real daemon (issue 13): a worker killed in the middle of apply_patch, a full
//! disk during apply_patch, SIGTERM of the daemon with many running commands, a client that
//! disconnects mid-command, and a worker that dies under its calls.
//!
//! Processes are checked on the host's process table by `(pid, start time)`, so a reused pid is
//! never mistaken for a survivor.

mod common;

use common::{Daemon, eventually, scratch};
use corral::api::{self, SandboxMode};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tonic::Code;

const WW: SandboxMode = SandboxMode::WorkspaceWrite;

// ---------------------------------------------------------------------------------------------
// The host's process table.

/// One host process as `/proc/<pid>/stat` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Proc {
    pid: i32,
    ppid: i32,
    /// Clock ticks after boot: with the pid, names the process even after its pid is reused.
    start: u64,
    state: char,
}

fn stat(pid: i32) -> Option<Proc> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: the fields start after the last ')'.
    let fields: Vec<&str> = text.get(text.rfind(')')? + 2..)?.split(' ').collect();
    Some(Proc {
        pid,
        state: fields.first()?.chars().next()?,
        ppid: fields.get(1)?.parse().ok()?,
        start: fields.get(19)?.parse().ok()?,
    })
}

fn processes() -> Vec<Proc> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter_map(stat)
        .collect()
}

/// Every descendant of `root` (not `root` itself).
fn descendants(root: i32) -> Vec<Proc> {
    let all = processes();
    let mut found: Vec<Proc> = Vec::new();
    let mut parents = vec![root];
    while let Some(parent) = parents.pop() {
        for p in all.iter().filter(|p| p.ppid == parent) {
            found.push(*p);
            parents.push(p.pid);
        }
    }
    found
}

/// Still in the process table as the same process (a zombie counts: it is left behind too).
fn present(p: &Proc) -> bool {
    stat(p.pid).is_some_and(|now| now.start == p.start)
}

fn cmdline(pid: i32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

fn is_worker(p: &Proc) -> bool {
    cmdline(p.pid).contains("__worker")
}

/// The daemon's workers: every `__worker` process below it (a sandboxed worker is two, the
/// parent that waits and PID 1 of the sandbox's pid namespace).
fn workers(daemon: &Daemon) -> Vec<Proc> {
    descendants(daemon.pid() as i32)
        .into_iter()
        .filter(is_worker)
        .collect()
}

/// The worker process that serves calls: a `__worker` with no `__worker` child (in a sandboxed
/// mode, PID 1 of the sandbox; in danger-full-access, the only one). A command being forked
/// still has the worker's command line for a moment, so this is for workers with none.
fn serving_workers(daemon: &Daemon) -> Vec<Proc> {
    let all = workers(daemon);
    all.iter()
        .filter(|w| !all.iter().any(|c| c.ppid == w.pid))
        .copied()
        .collect()
}

/// The serving worker (the nearest `__worker` ancestor) of host process `pid`.
fn worker_of(pid: i32) -> Option<Proc> {
    let mut p = stat(pid)?;
    loop {
        p = stat(p.ppid)?;
        if is_worker(&p) {
            return Some(p);
        }
    }
}

fn sigkill(p: &Proc) {
    if present(p) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(p.pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// Host processes below the daemon whose command line contains `marker`.
fn marked(daemon: &Daemon, marker: &str) -> Vec<Proc> {
    descendants(daemon.pid() as i32)
        .into_iter()
        .filter(|p| cmdline(p.pid).contains(marker))
        .collect()
}

/// A small, seedable generator (xorshift64*): the seed is printed so a failure can be replayed.
struct Random(u64);

impl Random {
    fn seeded() -> Random {
        let seed = match std::env::var("CORRAL_FAULTS_SEED") {
            Ok(s) => s.parse().expect("CORRAL_FAULTS_SEED is a number"),
            Err(_) => {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
                    | 1
            }
        };
        eprintln!("seed: CORRAL_FAULTS_SEED={seed}");
        Random(seed)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n.max(1)
    }
}

// ---------------------------------------------------------------------------------------------
// A patch over 50 files, and what each of its paths may hold.

/// What one path holds: absent, or these bytes.
type State = Option<Vec<u8>>;

/// One path the patch touches, with its content before and after.
struct Touched {
    path: &'static str,
    old: State,
    new: State,
}

/// A 50-file patch: 35 updates, 5 adds (in a directory that does not exist yet), 5 deletes and
/// 5 moves with an update, each file a few KiB so a write is more than one page.
struct FiftyFiles {
    patch: String,
    touched: Vec<Touched>,
    /// For each move: (source index, destination index) in `touched`.
    moves: Vec<(usize, usize)>,
}

fn body(tag: &str, i: usize) -> String {
    (0..200)
        .map(|line| format!("{tag} file {i} line {line}\n"))
        .collect()
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

impl FiftyFiles {
    fn new() -> FiftyFiles {
        let mut patch = String::from("*** Begin Patch\n");
        let mut touched = Vec::new();
        let mut moves = Vec::new();
        let update = |i: usize| format!("@@\n-old file {i} line 100\n+new file {i} line 100\n");
        let updated = |i: usize| {
            body("old", i).replace(
                &format!("old file {i} line 100\n"),
                &format!("new file {i} line 100\n"),
            )
        };
        for i in 0..35 {
            let path = leak(format!("u{i:02}.txt"));
            patch.push_str(&format!("*** Update File: {path}\n{}", update(i)));
            touched.push(Touched {
                path,
                old: Some(body("old", i).into_bytes()),
                new: Some(updated(i).into_bytes()),
            });
        }
        for i in 35..40 {
            let path = leak(format!("added/deeper/a{i:02}.txt"));
            patch.push_str(&format!("*** Add File: {path}\n"));
            for line in body("new", i).lines() {
                patch.push_str(&format!("+{line}\n"));
            }
            touched.push(Touched {
                path,
                old: None,
                new: Some(body("new", i).into_bytes()),
            });
        }
        for i in 40..45 {
            let path = leak(format!("d{i:02}.txt"));
            patch.push_str(&format!("*** Delete File: {path}\n"));
            touched.push(Touched {
                path,
                old: Some(body("old", i).into_bytes()),
                new: None,
            });
        }
        for i in 45..50 {
            let (from, to) = (
                leak(format!("m{i:02}.txt")),
                leak(format!("m{i:02}-moved.txt")),
            );
            patch.push_str(&format!(
                "*** Update File: {from}\n*** Move to: {to}\n{}",
                update(i)
            ));
            moves.push((touched.len(), touched.len() + 1));
            touched.push(Touched {
                path: from,
                old: Some(body("old", i).into_bytes()),
                new: None,
            });
            touched.push(Touched {
                path: to,
                old: None,
                new: Some(updated(i).into_bytes()),
            });
        }
        patch.push_str("*** End Patch");
        FiftyFiles {
            patch,
            touched,
            moves,
        }
    }

    /// Empties `ws` and writes every file's old state.
    fn reset(&self, ws: &Path) {
        for entry in std::fs::read_dir(ws).unwrap().flatten() {
            let path = entry.path();
            if entry.file_type().unwrap().is_dir() {
                std::fs::remove_dir_all(&path).unwrap();
            } else {
                std::fs::remove_file(&path).unwrap();
            }
        }
        for t in &self.touched {
            if let Some(bytes) = &t.old {
                std::fs::write(ws.join(t.path), bytes).unwrap();
            }
        }
    }
}

/// Every regular file below `dir`, relative to it.
fn files_below(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            if entry.file_type().unwrap().is_dir() {
                dirs.push(entry.path());
            } else {
                out.push(entry.path().strip_prefix(dir).unwrap().to_path_buf());
            }
        }
    }
    out.sort();
    out
}

fn is_patch_temp(path: &Path) -> bool {
    let name = path.file_name().unwrap().to_string_lossy();
    name.starts_with(".corral-patch-") && name.ends_with(".tmp")
}

/// How the files stood after one killed patch.
#[derive(Debug, Default)]
struct Outcome {
    old: usize,
    new: usize,
    /// Temporary files a killed commit left behind.
    temps: usize,
}

/// Checks that each touched path holds exactly its old or its new state, that a move never
/// loses its content (the destination is written before the source is removed), and that no
/// other file exists except commit temporaries; says how many paths were old and new.
fn check_each_file(plan: &FiftyFiles, ws: &Path, rep: usize) -> Outcome {
    let mut outcome = Outcome::default();
    let mut states = Vec::new();
    for t in &plan.touched {
        let now: State = match std::fs::read(ws.join(t.path)) {
            Ok(bytes) => Some(bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => panic!("rep {rep}: {}: {e}", t.path),
        };
        let is_old = now == t.old;
        let is_new = now == t.new;
        assert!(
            is_old || is_new,
            "rep {rep}: {} is neither wholly old nor wholly new: {:?} bytes",
            t.path,
            now.as_ref().map(Vec::len)
        );
        if is_old {
            outcome.old += 1;
        } else {
            outcome.new += 1;
        }
        states.push(is_new);
    }
    for &(source, dest) in &plan.moves {
        assert!(
            !(states[source] && !states[dest]),
            "rep {rep}: {} was removed before {} was written",
            plan.touched[source].path,
            plan.touched[dest].path
        );
    }
    for f in files_below(ws) {
        if is_patch_temp(&f) {
            outcome.temps += 1;
            continue;
        }
        assert!(
            plan.touched.iter().any(|t| Path::new(t.path) == f),
            "rep {rep}: unexpected file {}",
            f.display()
        );
    }
    outcome
}

/// SIGKILL of the worker at random moments of a 50-file apply_patch, 200 times: every file is
/// wholly old or wholly new. The set of files is not all-or-nothing: each file is replaced
/// atomically (temporary file, fsync, rename), but a killed worker cannot roll back the files it
/// already replaced (spec/tools.md §5.7 step 4; docs/SECURITY.md, known limits).
#[tokio::test]
async fn sigkill_of_a_worker_mid_patch_leaves_every_file_wholly_old_or_wholly_new() {
    const REPS: usize = 200;
    let d = Daemon::start(&[]).await;
    let ws = scratch();
    let plan = FiftyFiles::new();
    plan.reset(ws.path());
    let s = d.open(ws.path(), WW).await;
    let mut tools = d.tools().await;
    let request = api::ApplyPatchRequest {
        session_id: s.clone(),
        patch: plan.patch.clone(),
    };
    let warm = api::ListDirRequest {
        session_id: s.clone(),
        dir_path: ws.path().display().to_string(),
        ..Default::default()
    };

    // How long the whole call takes when nothing is killed.
    let mut took = Vec::new();
    for _ in 0..3 {
        plan.reset(ws.path());
        let start = Instant::now();
        let r = tools
            .apply_patch(request.clone())
            .await
            .unwrap()
            .into_inner();
        took.push(start.elapsed());
        assert_eq!(r.changes.len(), 50, "{}", r.text);
        let o = check_each_file(&plan, ws.path(), 0);
        assert_eq!((o.old, o.new, o.temps), (0, plan.touched.len(), 0));
    }
    took.sort();
    let window = took[1] + took[1] / 10;

    let mut random = Random::seeded();
    let (mut all_old, mut all_new, mut mixed, mut temps, mut killed) = (0, 0, 0, 0, 0);
    let started = Instant::now();
    for rep in 1..=REPS {
        plan.reset(ws.path());
        // The worker is up (a kill replaced it) before the patch is sent.
        tools.list_dir(warm.clone()).await.unwrap();
        let serving = serving_workers(&d);
        assert_eq!(serving.len(), 1, "rep {rep}: one worker: {serving:?}");
        let delay = Duration::from_micros(random.below(window.as_micros() as u64));
        let mut client = tools.clone();
        let req = request.clone();
        let call = tokio::spawn(async move { client.apply_patch(req).await });
        tokio::time::sleep(delay).await;
        sigkill(&serving[0]);
        let result = call.await.unwrap();
        // Once it is gone, the next call must find a new worker, not this one.
        assert!(
            eventually(Duration::from_secs(5), || !present(&serving[0])).await,
            "rep {rep}: the killed worker is gone"
        );
        match result {
            Ok(_) => {}
            Err(e) => {
                killed += 1;
                assert_eq!(e.code(), Code::Unavailable, "rep {rep}: {e:?}");
                assert!(
                    e.message().contains("sandbox worker") && e.message().contains("retry"),
                    "rep {rep}: {e:?}"
                );
            }
        }
        let o = check_each_file(&plan, ws.path(), rep);
        temps += o.temps;
        match (o.old, o.new) {
            (_, 0) => all_old += 1,
            (0, _) => all_new += 1,
            _ => mixed += 1,
        }
    }
    eprintln!(
        "{REPS} kills in {:?} (patch alone {:?}): {killed} calls failed; files all old {all_old}, \
         all new {all_new}, mixed {mixed}; {temps} temporary files left",
        started.elapsed(),
        took[1]
    );
    // The kills landed inside the commit often enough for the check to mean something.
    assert!(mixed >= REPS / 10, "only {mixed} kills landed mid-commit");
}

/// A small tmpfs mounted for one test (root only), unmounted on drop.
struct SmallDisk(tempfile::TempDir);

impl SmallDisk {
    fn mount(bytes: u64) -> SmallDisk {
        let dir = scratch();
        let (code, out) = common::host_sh(&format!(
            "mount -t tmpfs -o size={bytes},mode=0755 corral-test {}",
            dir.path().display()
        ));
        assert_eq!(code, 0, "mount: {out}");
        SmallDisk(dir)
    }

    fn used(&self) -> u64 {
        let st = nix::sys::statvfs::statvfs(self.0.path()).unwrap();
        (st.blocks() - st.blocks_free()) * st.fragment_size()
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = common::host_sh(&format!("umount -l {}", self.0.path().display()));
    }
}

/// Every entry below `dir` (directories too) with the content of each file and its mode.
fn tree(dir: &Path) -> Vec<(PathBuf, Option<Vec<u8>>, u32)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let content = if meta.is_dir() {
                dirs.push(path.clone());
                None
            } else {
                Some(std::fs::read(&path).unwrap())
            };
            let rel = path.strip_prefix(dir).unwrap().to_path_buf();
            out.push((rel, content, meta.permissions().mode()));
        }
    }
    out.sort();
    out
}

/// A patch whose files fit one by one but not together fills the disk half way through its
/// commit: the call fails with RESOURCE_EXHAUSTED, everything already written is rolled back
/// and the space is free again.
#[tokio::test]
async fn a_full_disk_during_apply_patch_changes_nothing() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: mounting a small disk needs root (CI runs as root)");
        return;
    }
    let disk = SmallDisk::mount(1 << 20);
    let ws = disk.0.path();
    std::fs::write(ws.join("a.txt"), "one\ntwo\n").unwrap();
    std::fs::write(ws.join("gone.txt"), "bye\n").unwrap();
    std::fs::create_dir(ws.join("src")).unwrap();
    std::fs::write(ws.join("src/m.txt"), "move me\n").unwrap();
    let d = Daemon::start(&[]).await;
    let s = d.open(ws, WW).await;
    let before = (tree(ws), disk.used());

    // Updates, a delete and a move first, then four files of 300 KiB on a 1 MiB disk.
    let line = format!("+{}\n", "x".repeat(1023));
    let big: String = line.repeat(300);
    let mut patch = String::from(
        "*** Begin Patch\n*** Update File: a.txt\n@@\n-two\n+TWO\n\
         *** Delete File: gone.txt\n\
         *** Update File: src/m.txt\n*** Move to: dst/m.txt\n@@\n-move me\n+moved\n",
    );
    for i in 0..4 {
        patch.push_str(&format!("*** Add File: new/big{i}.bin\n{big}"));
    }
    patch.push_str("*** End Patch");
    let e = d
        .tools()
        .await
        .apply_patch(api::ApplyPatchRequest {
            session_id: s.clone(),
            patch,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    // The disk filled after some of the big files were written (so there was something to undo).
    assert!(
        e.message().contains("new/big2.bin") || e.message().contains("new/big3.bin"),
        "{e:?}"
    );
    assert!(
        e.message().contains("No space left on device")
            && e.message()
                .contains("All changes made by this patch were rolled back."),
        "{e:?}"
    );
    assert_eq!(
        (tree(ws), disk.used()),
        before,
        "nothing changed (no temporary file, no new directory) and the space is free again"
    );

    // The same disk takes a patch that fits.
    let r = d
        .tools()
        .await
        .apply_patch(api::ApplyPatchRequest {
            session_id: s,
            patch: "*** Begin Patch\n*** Update File: a.txt\n@@\n-two\n+TWO\n*** End Patch".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.changes.len(), 1);
    assert_eq!(
        std::fs::read_to_string(ws.join("a.txt")).unwrap(),
        "one\nTWO\n"
    );
}
