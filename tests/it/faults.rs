//! Faults against a real daemon (issue 13): a worker killed in the middle of apply_patch, a full
//! disk during apply_patch, SIGTERM of the daemon with many running commands, a client that
//! disconnects mid-command, a worker that dies under its calls, and danger-full-access commands
//! outliving neither their worker nor their daemon.
//!
//! Processes are checked on the host's process table by `(pid, start time)`, so a reused pid is
//! never mistaken for a survivor.

use crate::common::procs::*;
use crate::common::{self, Daemon, eventually, scratch};
use corral::api::{self, SandboxMode};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tonic::Code;

const WW: SandboxMode = SandboxMode::WorkspaceWrite;

// ---------------------------------------------------------------------------------------------
// The daemon's processes by command line (the rest of the process table: common::procs).

/// Host processes below the daemon whose command line contains `marker`.
fn marked(daemon: &Daemon, marker: &str) -> Vec<Proc> {
    descendants(daemon.pid() as i32)
        .into_iter()
        .filter(|p| cmdline(p.pid).contains(marker))
        .collect()
}

/// Of [`marked`], the `sleep` processes (not the shells whose scripts name them).
fn sleeping(daemon: &Daemon, marker: &str) -> Vec<Proc> {
    marked(daemon, marker)
        .into_iter()
        .filter(|p| cmdline(p.pid).starts_with("sleep "))
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
            // A removed source means the destination was written.
            !states[source] || states[dest],
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
/// wholly old or wholly new, and a move never loses its content. The set of files is *not*
/// all-or-nothing: each file is replaced atomically (unnamed file, fsync, link, rename), but a
/// killed worker cannot roll back the files it already replaced (spec/tools.md §5.7 step 4;
/// docs/SECURITY.md, known limits) — most kills here leave a mix. A kill between the link and
/// the rename leaves one `.corral-patch-*.tmp` file (never more: files are committed one at a
/// time), which the next patch writing in that directory removes (it is checked each time); the
/// count is printed.
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

    // How long the whole call takes when nothing is killed, measured again as the load on the
    // machine changes: the kills are spread over that window.
    let mut window = Duration::ZERO;
    let mut durations = Vec::new();
    let calibrate = async |tools: &mut api::tools_client::ToolsClient<_>| {
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
        took[1] + took[1] / 10
    };

    let mut random = Random::seeded();
    let (mut all_old, mut all_new, mut mixed, mut temps, mut killed) = (0, 0, 0, 0, 0);
    let mut swept = 0;
    let started = Instant::now();
    for rep in 1..=REPS {
        if rep % 50 == 1 {
            window = calibrate(&mut tools).await;
            durations.push(window);
        }
        plan.reset(ws.path());
        // The worker is up (a kill replaced it) before the patch is sent.
        tools.list_dir(warm.clone()).await.unwrap();
        let serving = serving_workers(&d);
        assert_eq!(serving.len(), 1, "rep {rep}: one worker: {serving:?}");
        // And the process that waits for it (the sandbox's pid 1) outside its pid namespace.
        let waiting = stat(serving[0].ppid).filter(is_worker);
        assert!(
            waiting.is_some(),
            "rep {rep}: a sandboxed worker is two processes"
        );
        let delay = Duration::from_micros(random.below(window.as_micros() as u64));
        let mut client = tools.clone();
        let req = request.clone();
        let call = tokio::spawn(async move { client.apply_patch(req).await });
        tokio::time::sleep(delay).await;
        sigkill(&serving[0]);
        let result = call.await.unwrap();
        // Once it is gone (both its processes, reaped), the next call must start a new worker.
        assert!(
            eventually(Duration::from_secs(5), || !present(&serving[0])
                && !waiting.as_ref().is_some_and(present))
            .await,
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
        assert!(o.temps <= 1, "rep {rep}: {} temporary files", o.temps);
        temps += o.temps;
        // The next patch that writes in that directory removes it: its writer is dead.
        for temp in files_below(ws.path())
            .into_iter()
            .filter(|f| is_patch_temp(f))
        {
            let dir = temp.parent().unwrap_or(Path::new(""));
            let add = format!(
                "*** Begin Patch\n*** Add File: {}\n+swept\n*** End Patch",
                dir.join(format!("swept-{rep}.txt")).display()
            );
            let r = tools
                .apply_patch(api::ApplyPatchRequest {
                    session_id: s.clone(),
                    patch: add,
                })
                .await;
            assert!(r.is_ok(), "rep {rep}: {r:?}");
            assert!(
                !ws.path().join(&temp).exists(),
                "rep {rep}: {} is still there after the next patch in its directory",
                temp.display()
            );
            swept += 1;
        }
        match (o.old, o.new) {
            (_, 0) => all_old += 1,
            (0, _) => all_new += 1,
            _ => mixed += 1,
        }
    }
    eprintln!(
        "{REPS} kills in {:?} (kill windows {durations:?}): {killed} calls failed; files all old \
         {all_old}, all new {all_new}, mixed {mixed}; {temps} temporary files left, {swept} \
         removed by the next patch in their directory",
        started.elapsed(),
    );
    // The kills landed inside the commit often enough for the check to mean something.
    assert!(mixed >= REPS / 10, "only {mixed} kills landed mid-commit");
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
    let disk = common::SmallDisk::mount(1 << 20);
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

fn shell_request(session: &str, script: &str) -> api::ShellRequest {
    api::ShellRequest {
        session_id: session.into(),
        command: vec!["bash".into(), "-c".into(), script.into()],
        timeout_ms: Some(300_000),
        ..Default::default()
    }
}

/// SIGTERM with 100 commands running (each a shell with two children) in three workers, one of
/// them danger-full-access (no pid namespace to take its commands down): after the grace the
/// daemon exits 0, its socket is gone, and so is every process that was below it.
#[tokio::test]
async fn sigterm_of_the_daemon_with_100_running_commands_leaves_no_process_behind() {
    const COMMANDS: usize = 100;
    let mut d = Daemon::start(&["--shutdown-grace", "1", "--root-callers", "trusted"]).await;
    let ws = scratch();
    let mut sessions = Vec::new();
    for mode in [
        SandboxMode::ReadOnly,
        SandboxMode::WorkspaceWrite,
        SandboxMode::DangerFullAccess,
    ] {
        sessions.push(d.open(ws.path(), mode).await);
    }
    let mut calls = Vec::new();
    let mut tools = d.tools().await;
    for i in 0..COMMANDS {
        if i % 10 == 0 {
            // Several client connections, as several agents would have.
            tools = d.tools().await;
        }
        let mut client = tools.clone();
        let req = shell_request(
            &sessions[i % sessions.len()],
            "sleep 3131 & sleep 3132 & wait",
        );
        calls.push(tokio::spawn(async move { client.shell(req).await }));
    }
    let daemon_pid = d.pid() as i32;
    assert!(
        eventually(Duration::from_secs(60), || sleeping(&d, "sleep 313").len()
            == 2 * COMMANDS)
        .await,
        "all {COMMANDS} commands run: {} sleeps",
        sleeping(&d, "sleep 313").len()
    );
    let below = descendants(daemon_pid);
    let shells = below
        .iter()
        .filter(|p| cmdline(p.pid).starts_with("bash -c sleep 3131"))
        .count();
    assert_eq!(shells, COMMANDS, "every command's shell is running");
    assert_eq!(serving_workers(&d).len(), 3, "one worker per mode");

    let signalled = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon_pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let mut child = d.child.take().unwrap();
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    let exited = signalled.elapsed();
    let running_at_exit = below.iter().filter(|p| running(p)).count();
    assert!(status.success(), "{status:?}; log:\n{}", d.log_text());
    assert!(!d.socket.exists(), "the socket is removed");
    // Whatever is still dying when the daemon exits (e.g. a worker's commands taken down with
    // its pid namespace) is dead a moment later.
    let gone = eventually(Duration::from_secs(2), || below.iter().all(|p| !running(p))).await;
    let left: Vec<String> = below
        .iter()
        .filter(|p| running(p))
        .map(|p| format!("{} {:?}", p.pid, cmdline(p.pid)))
        .collect();
    assert!(gone, "left behind:\n{}", left.join("\n"));
    eprintln!(
        "{} processes below the daemon; it exited {exited:?} after SIGTERM with {running_at_exit} \
         still running; all dead {:?} after",
        below.len(),
        signalled.elapsed()
    );
    for call in calls {
        let result = tokio::time::timeout(Duration::from_secs(10), call)
            .await
            .expect("every call ended")
            .unwrap();
        assert!(result.is_err(), "no command finished: {result:?}");
    }
}

/// Starts `bash -c script` in `session` on a connection of its own; the call runs in a task.
async fn start_shell(
    d: &Daemon,
    session: &str,
    script: &str,
) -> tokio::task::JoinHandle<Result<tonic::Response<api::ShellResponse>, tonic::Status>> {
    let mut tools = d.tools().await;
    let req = shell_request(session, script);
    tokio::spawn(async move { tools.shell(req).await })
}

/// A connection to the daemon that the test can cut, as a client that crashes or loses its
/// network would: `shutdown(2)` of the socket under the gRPC channel.
async fn cuttable_channel(socket: &Path) -> (tonic::transport::Channel, std::os::fd::OwnedFd) {
    use hyper_util::rt::TokioIo;
    use std::os::fd::AsFd;
    let (tx, rx) = std::sync::mpsc::channel();
    let socket = socket.to_path_buf();
    let tx = std::sync::Mutex::new(tx);
    let channel = tonic::transport::Endpoint::from_static("http://corral.invalid")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let socket = socket.clone();
            let tx = tx.lock().unwrap().clone();
            async move {
                let stream = tokio::net::UnixStream::connect(&socket).await?;
                let _ = tx.send(stream.as_fd().try_clone_to_owned()?);
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }))
        .await
        .unwrap();
    (channel, rx.recv().unwrap())
}

/// A client that disconnects in the middle of a command: within a second the command's whole
/// tree is gone from the host — its shell, a child, a double-forked orphan and a child in a new
/// session — sandboxed and in danger-full-access (no pid namespace there).
#[tokio::test]
async fn a_client_that_disconnects_mid_command_has_its_tree_killed_within_a_second() {
    let d = Daemon::start(&["--root-callers", "trusted"]).await;
    let ws = scratch();
    for (mode, n) in [(WW, 1), (SandboxMode::DangerFullAccess, 2)] {
        let s = d.open(ws.path(), mode).await;
        let marker = format!("sleep 414{n}");
        let script = format!("{marker}1 & ({marker}2 &); setsid {marker}3 & {marker}4; echo never");
        let (channel, fd) = cuttable_channel(&d.socket).await;
        let mut tools = api::tools_client::ToolsClient::new(channel);
        let call = tokio::spawn(async move { tools.shell(shell_request(&s, &script)).await });
        assert!(
            eventually(Duration::from_secs(20), || {
                sleeping(&d, &marker).len() == 4
            })
            .await,
            "{mode:?}: the four sleeps run"
        );
        let tree = marked(&d, &marker);
        let cut = Instant::now();
        nix::sys::socket::shutdown(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            nix::sys::socket::Shutdown::Both,
        )
        .unwrap();
        let gone = eventually(Duration::from_secs(5), || tree.iter().all(|p| !present(p))).await;
        let took = cut.elapsed();
        assert!(gone, "{mode:?}: the tree was not killed");
        assert!(
            took < Duration::from_secs(1),
            "{mode:?}: the tree was killed only {took:?} after the disconnect"
        );
        eprintln!(
            "{mode:?}: {} processes gone {took:?} after the disconnect",
            tree.len()
        );
        assert!(
            call.await.unwrap().is_err(),
            "{mode:?}: the call did not finish"
        );
    }
}

/// A worker killed under its calls fails exactly the calls in flight on it (two sessions share
/// it), promptly, with UNAVAILABLE and a message that says what happened and to retry; their
/// commands are gone; a call in another worker finishes normally; the next call on the dead
/// worker's sessions starts a new worker and works.
#[tokio::test]
async fn a_worker_that_dies_fails_only_its_own_calls() {
    let d = Daemon::start(&["--root-callers", "trusted"]).await;
    let (one, other) = (scratch(), scratch());
    let a = d.open(one.path(), WW).await;
    let a2 = d.open(one.path(), WW).await;
    let b = d.open(other.path(), SandboxMode::ReadOnly).await;
    let c = d.open(other.path(), SandboxMode::DangerFullAccess).await;
    let call_a = start_shell(&d, &a, "sleep 5151").await;
    let call_a2 = start_shell(&d, &a2, "sleep 5152").await;
    let call_b = start_shell(&d, &b, "sleep 5153; echo still here").await;
    let call_c = start_shell(&d, &c, "sleep 5154; echo still here too").await;
    let find = |marker: &str| {
        marked(&d, marker)
            .into_iter()
            .find(|p| cmdline(p.pid) == format!("{marker} "))
    };
    assert!(
        eventually(Duration::from_secs(20), || [
            "sleep 5151",
            "sleep 5152",
            "sleep 5153",
            "sleep 5154"
        ]
        .iter()
        .all(|m| find(m).is_some()))
        .await,
        "all four commands run"
    );
    let (sa, sa2, sb, sc) = (
        find("sleep 5151").unwrap(),
        find("sleep 5152").unwrap(),
        find("sleep 5153").unwrap(),
        find("sleep 5154").unwrap(),
    );
    let dying = worker_of(sa.pid).unwrap();
    assert_eq!(worker_of(sa2.pid), Some(dying), "a and a2 share a worker");
    let (wb, wc) = (worker_of(sb.pid).unwrap(), worker_of(sc.pid).unwrap());
    assert!(wb != dying && wc != dying && wb != wc, "three workers");

    let killed = Instant::now();
    sigkill(&dying);
    for (name, call) in [("a", call_a), ("a2", call_a2)] {
        let e = call.await.unwrap().unwrap_err();
        assert!(
            killed.elapsed() < Duration::from_secs(2),
            "{name} failed only {:?} after the kill",
            killed.elapsed()
        );
        assert_eq!(e.code(), Code::Unavailable, "{name}: {e:?}");
        assert_eq!(
            e.message(),
            "the sandbox worker serving this session exited while the call was in flight; the \
             call was lost. A new worker is started on the next call; retry it",
            "{name}"
        );
    }
    assert!(
        eventually(Duration::from_secs(2), || !present(&sa) && !present(&sa2)).await,
        "the dead worker's commands are gone"
    );
    // The other workers did not notice.
    assert!(present(&wb) && present(&wc) && present(&sb) && present(&sc));
    for (session, ran) in [(&a, "one"), (&a2, "two")] {
        let r = d.sh(session, &format!("echo {ran}")).await;
        assert_eq!(
            (r.exit_code, r.output.as_str()),
            (0, format!("{ran}\n").as_str())
        );
    }
    let now = serving_workers(&d);
    assert_eq!(now.len(), 3, "a new worker for a and a2: {now:?}");
    assert!(now.contains(&wb) && now.contains(&wc) && !now.contains(&dying));
    for p in [&sb, &sc] {
        // Let the other calls finish on their own.
        sigkill(p);
    }
    for (name, call, text) in [
        ("b", call_b, "still here\n"),
        ("c", call_c, "still here too\n"),
    ] {
        let r = call.await.unwrap().unwrap().into_inner();
        assert_eq!(r.exit_code, 0, "{name}: {r:?}");
        assert_eq!(r.stdout.unwrap().head, text.as_bytes(), "{name}");
    }
}

/// A single-user daemon (not root: no memory cgroup to empty) in danger-full-access, where no
/// pid namespace takes a worker's commands down with it: when the worker is killed, and when the
/// daemon is stopped, its commands — a shell, its child and a child in a new session — are
/// killed too, not left to init. The client here is the CLI run as that user (the daemon
/// refuses danger-full-access to a caller it cannot inspect).
#[tokio::test]
async fn danger_full_access_commands_die_with_their_worker_and_their_daemon() {
    let common::RunAs::User(user) = common::RunAs::ordinary_user("flt") else {
        unreachable!("an ordinary user")
    };
    for stop in ["SIGKILL of the worker", "SIGTERM of the daemon"] {
        let mut d = Daemon::start_as(&user, &["--shutdown-grace", "1"]).await;
        let ws = user.dir.join(format!("ws-{}", stop.len()));
        std::fs::create_dir_all(&ws).unwrap();
        std::os::unix::fs::chown(&ws, Some(user.uid), Some(user.gid)).unwrap();
        let (code, session, err) = user.corral(
            d.target(),
            &[
                "open-session",
                "--cwd",
                ws.to_str().unwrap(),
                "--mode",
                "danger-full-access",
            ],
        );
        assert_eq!(code, 0, "{err}");
        let cli = std::process::Command::new("setpriv")
            .args(["--reuid", &user.name, "--regid", &user.name, "--init-groups", "--"])
            .arg(common::client_binary())
            .args([
                "invoke",
                "shell",
                r#"{"command":["bash","-c","sleep 6161 & setsid sleep 6162 & wait"],"timeout_ms":300000}"#,
                "--session",
                &session,
                "--socket",
                d.target(),
            ])
            .current_dir(&user.dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        assert!(
            eventually(Duration::from_secs(20), || sleeping(&d, "sleep 616").len()
                == 2)
            .await,
            "{stop}: the command runs; log:\n{}",
            d.log_text()
        );
        // The daemon's spare workers and path resolvers (`__spare_`, `__resolve`: started
        // ahead, no session's) are not part of this session and outlive a killed worker by
        // design.
        let below: Vec<Proc> = descendants(d.pid() as i32)
            .into_iter()
            .filter(|p| {
                let line = cmdline(p.pid);
                !line.contains("__spare_") && !line.contains("__resolve")
            })
            .collect();
        assert_eq!(serving_workers(&d).len(), 1);
        let t = Instant::now();
        if stop.contains("worker") {
            sigkill(&serving_workers(&d)[0]);
        } else {
            assert!(d.terminate().success(), "{}", d.log_text());
        }
        let gone = eventually(Duration::from_secs(3), || below.iter().all(|p| !running(p))).await;
        let took = t.elapsed();
        let left: Vec<_> = below.iter().filter(|p| running(p)).copied().collect();
        for p in &left {
            sigkill(p);
        }
        assert!(gone, "{stop}: left running: {left:?}");
        eprintln!("{stop}: {} processes dead after {took:?}", below.len());
        let out = cli.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stop}: {stderr}");
        if stop.contains("worker") {
            assert!(
                stderr.contains("Unavailable: the sandbox worker"),
                "{stderr}"
            );
            // The session goes on in a new worker.
            let (code, out, err) = user.corral(
                d.target(),
                &[
                    "invoke",
                    "shell",
                    r#"{"command":["echo","again"]}"#,
                    "--session",
                    &session,
                ],
            );
            assert_eq!(code, 0, "{err}");
            assert!(out.contains("again"), "{out}");
        }
    }
}
