//! Spawn latency: a sandboxed `true` through the daemon's typed `Shell` RPC against bare spawns.
//!
//! `cargo bench --bench spawn` (harness = false: `cargo test` never runs it). One run measures,
//! interleaved round-robin so load drift hits every variant alike:
//!
//! - bare `/bin/true` (`std::process::Command::status`), the baseline;
//! - `Shell { command: ["true"] }` in a read-only and in a workspace-write session, over the Unix
//!   socket, with the session opened and the channel connected beforehand;
//! - `bwrap --ro-bind / / --unshare-net --unshare-pid true`, if `bwrap` is on PATH;
//! - bare `/bin/sh -c true`;
//! - for context: `Shell { command: ["true"] }` in a workspace-write session that gives the
//!   protected-name watcher nothing to guard (its only writable root already has `.git`, `.codex`
//!   and `.agents`; `/tmp` excluded), a gRPC health check (daemon round trip only) and a
//!   `ReadFile` of a one-line file (round trip through the daemon and the worker, no spawn).
//! - `OpenSession` + the first `Shell { command: ["true"] }` of a new session (a fresh directory
//!   each time, so the session needs a worker of its own; the session is closed afterwards,
//!   untimed), in read-only and workspace-write mode, in a second phase after the per-call
//!   variants, each open followed by a 40 ms pause off the clock (its background work must not
//!   land on another variant); the "back to back" variant times the second of two opens made
//!   one right after the other, so any worker the daemon prepares ahead has had no time to get
//!   ready.
//!
//! Environment: `CORRAL_BENCH_N` (measured iterations, default 300), `CORRAL_BENCH_WARMUP`
//! (default 30), `CORRAL_BIN` (daemon binary; default the `corral` cargo built with this bench),
//! `CORRAL_BENCH_VARIANTS` (comma-separated keys of the variants to run, e.g. `ro,ww`: bare,
//! ro, ww, ww-nowatch, bwrap, sh, health, readfile, open-ro, open-ww, open-b2b; default all;
//! the bare spawn always runs, it is the baseline).

mod support;

use corral::api::{self, SandboxMode, sessions_client::SessionsClient, tools_client::ToolsClient};
use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use support::{Daemon, env_usize, load_average, pct, us};
use tonic::transport::Channel;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

/// The pause after each timed open (phase two): long enough for the daemon to start its next
/// spare worker and reap the closed session's worker.
const OPEN_SETTLE: Duration = Duration::from_millis(40);

fn run_status(cmd: &mut Command) {
    let status = cmd.status().expect("spawn");
    assert!(status.success(), "{cmd:?} failed: {status}");
}

#[derive(Clone, Copy, PartialEq)]
enum Variant {
    BareTrue,
    ShellReadOnly,
    ShellWorkspaceWrite,
    ShellWorkspaceWriteNoWatch,
    Bwrap,
    BareSh,
    Health,
    ReadFile,
    OpenFirstReadOnly,
    OpenFirstWorkspaceWrite,
    OpenFirstBackToBack,
}

impl Variant {
    /// The key `CORRAL_BENCH_VARIANTS` selects this variant by.
    fn key(self) -> &'static str {
        match self {
            Variant::BareTrue => "bare",
            Variant::ShellReadOnly => "ro",
            Variant::ShellWorkspaceWrite => "ww",
            Variant::ShellWorkspaceWriteNoWatch => "ww-nowatch",
            Variant::Bwrap => "bwrap",
            Variant::BareSh => "sh",
            Variant::Health => "health",
            Variant::ReadFile => "readfile",
            Variant::OpenFirstReadOnly => "open-ro",
            Variant::OpenFirstWorkspaceWrite => "open-ww",
            Variant::OpenFirstBackToBack => "open-b2b",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Variant::BareTrue => "(a) bare /bin/true",
            Variant::ShellReadOnly => "(b) Shell `true`, read-only",
            Variant::ShellWorkspaceWrite => "(b) Shell `true`, workspace-write",
            Variant::ShellWorkspaceWriteNoWatch => {
                "(ctx) Shell `true`, workspace-write, no protected-name watcher"
            }
            Variant::Bwrap => "(c) bwrap --ro-bind / / --unshare-net --unshare-pid true",
            Variant::BareSh => "(d) bare /bin/sh -c true",
            Variant::Health => "(ctx) gRPC health Check (no worker)",
            Variant::ReadFile => "(ctx) ReadFile 1 line (daemon + worker, no spawn)",
            Variant::OpenFirstReadOnly => "(e) OpenSession + first Shell `true`, read-only",
            Variant::OpenFirstWorkspaceWrite => {
                "(e) OpenSession + first Shell `true`, workspace-write"
            }
            Variant::OpenFirstBackToBack => {
                "(e) OpenSession + first Shell `true`, read-only, back to back"
            }
        }
    }
}

struct Bench {
    tools: ToolsClient<Channel>,
    sessions: SessionsClient<Channel>,
    health: HealthClient<Channel>,
    ro: String,
    ww: String,
    ww_nowatch: String,
    small_file: String,
    /// Wall time the worker reported (`duration_seconds`) per Shell variant.
    inner: HashMap<&'static str, Vec<Duration>>,
}

impl Bench {
    /// Opens a session in a new directory, runs `true` in it (timed together), closes it.
    async fn open_first(&mut self, mode: SandboxMode) -> Duration {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
        let (took, id) = self.open_first_in(dir.path(), mode).await;
        self.close(id).await;
        took
    }

    /// Opens a session in `dir` and runs `true` in it (timed together); the session stays open.
    async fn open_first_in(&mut self, dir: &Path, mode: SandboxMode) -> (Duration, String) {
        let req = support::session_request(dir, mode);
        let start = Instant::now();
        let id = self
            .sessions
            .open_session(req)
            .await
            .expect("open_session")
            .into_inner()
            .session_id;
        let r = self
            .tools
            .shell(api::ShellRequest {
                session_id: id.clone(),
                command: vec!["true".to_string()],
                ..Default::default()
            })
            .await
            .expect("shell")
            .into_inner();
        let took = start.elapsed();
        assert_eq!(r.exit_code, 0, "sandboxed `true` failed: {r:?}");
        (took, id)
    }

    async fn close(&mut self, session_id: String) {
        self.sessions
            .close_session(api::CloseSessionRequest { session_id })
            .await
            .expect("close_session");
    }

    async fn shell(&mut self, session: &str) -> Duration {
        let req = api::ShellRequest {
            session_id: session.to_string(),
            command: vec!["true".to_string()],
            ..Default::default()
        };
        let start = Instant::now();
        let r = self.tools.shell(req).await.expect("shell").into_inner();
        let took = start.elapsed();
        assert_eq!(r.exit_code, 0, "sandboxed `true` failed: {r:?}");
        let key = if session == self.ro {
            "ro"
        } else if session == self.ww {
            "ww"
        } else {
            "ww-nowatch"
        };
        self.inner
            .entry(key)
            .or_default()
            .push(Duration::from_secs_f64(r.duration_seconds));
        took
    }

    async fn once(&mut self, v: Variant) -> Duration {
        match v {
            Variant::BareTrue => {
                let start = Instant::now();
                run_status(&mut Command::new("/bin/true"));
                start.elapsed()
            }
            Variant::BareSh => {
                let start = Instant::now();
                run_status(Command::new("/bin/sh").args(["-c", "true"]));
                start.elapsed()
            }
            Variant::ShellWorkspaceWriteNoWatch => {
                let s = self.ww_nowatch.clone();
                self.shell(&s).await
            }
            Variant::Bwrap => {
                let start = Instant::now();
                run_status(Command::new("bwrap").args([
                    "--ro-bind",
                    "/",
                    "/",
                    "--unshare-net",
                    "--unshare-pid",
                    "true",
                ]));
                start.elapsed()
            }
            Variant::ShellReadOnly => {
                let s = self.ro.clone();
                self.shell(&s).await
            }
            Variant::ShellWorkspaceWrite => {
                let s = self.ww.clone();
                self.shell(&s).await
            }
            Variant::Health => {
                let start = Instant::now();
                self.health
                    .check(HealthCheckRequest {
                        service: String::new(),
                    })
                    .await
                    .expect("health check");
                start.elapsed()
            }
            Variant::OpenFirstReadOnly => self.open_first(SandboxMode::ReadOnly).await,
            Variant::OpenFirstWorkspaceWrite => self.open_first(SandboxMode::WorkspaceWrite).await,
            // Two sessions opened one right after the other (each with its first call), both
            // closed afterwards; the second is timed.
            Variant::OpenFirstBackToBack => {
                let dirs = [(); 2]
                    .map(|()| tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir"));
                let (_, first) = self
                    .open_first_in(dirs[0].path(), SandboxMode::ReadOnly)
                    .await;
                let (took, second) = self
                    .open_first_in(dirs[1].path(), SandboxMode::ReadOnly)
                    .await;
                self.close(first).await;
                self.close(second).await;
                took
            }
            Variant::ReadFile => {
                let req = api::ReadFileRequest {
                    session_id: self.ro.clone(),
                    file_path: self.small_file.clone(),
                    ..Default::default()
                };
                let start = Instant::now();
                self.tools.read_file(req).await.expect("read_file");
                start.elapsed()
            }
        }
    }
}

fn on_path(name: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
        .unwrap_or(false)
}

fn main() {
    let n = env_usize("CORRAL_BENCH_N", 300).max(1);
    let warmup = env_usize("CORRAL_BENCH_WARMUP", 30);
    support::block_on(async_main(n, warmup));
}

/// Opens a session in `cwd`; `exclude_slash_tmp` keeps /tmp out of its writable roots.
async fn open(daemon: &Daemon, cwd: &Path, mode: SandboxMode, exclude_slash_tmp: bool) -> String {
    let req = api::OpenSessionRequest {
        exclude_slash_tmp,
        ..support::session_request(cwd, mode)
    };
    daemon
        .open_session(req)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

async fn async_main(n: usize, warmup: usize) {
    let bwrap = on_path("bwrap");
    let mut variants = vec![
        Variant::BareTrue,
        Variant::ShellReadOnly,
        Variant::ShellWorkspaceWrite,
    ];
    if bwrap {
        variants.push(Variant::Bwrap);
    }
    variants.extend([
        Variant::BareSh,
        Variant::ShellWorkspaceWriteNoWatch,
        Variant::Health,
        Variant::ReadFile,
        Variant::OpenFirstReadOnly,
        Variant::OpenFirstWorkspaceWrite,
        Variant::OpenFirstBackToBack,
    ]);
    // A subset, to profile one variant alone (the baseline always stays, first).
    if let Ok(only) = std::env::var("CORRAL_BENCH_VARIANTS") {
        let keys: Vec<&str> = only.split(',').map(str::trim).collect();
        for k in &keys {
            assert!(
                variants.iter().any(|v| v.key() == *k) || *k == "bwrap",
                "CORRAL_BENCH_VARIANTS: unknown variant {k:?}"
            );
        }
        variants.retain(|v| *v == Variant::BareTrue || keys.contains(&v.key()));
    }

    let daemon = Daemon::start().await.unwrap_or_else(|e| panic!("{e}"));
    let ro_dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let ww_dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let small = ro_dir.path().join("one-line.txt");
    std::fs::write(&small, "hello\n").expect("write");
    let ro = open(&daemon, ro_dir.path(), SandboxMode::ReadOnly, false).await;
    let ww = open(&daemon, ww_dir.path(), SandboxMode::WorkspaceWrite, false).await;
    // A workspace-write session with nothing for the protected-name watcher to guard: its only
    // writable root (no /tmp, no $TMPDIR) already has .git, .codex and .agents.
    let nw_dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    for name in [".git", ".codex", ".agents"] {
        std::fs::create_dir(nw_dir.path().join(name)).expect("mkdir");
    }
    let ww_nowatch = open(&daemon, nw_dir.path(), SandboxMode::WorkspaceWrite, true).await;
    let channel = daemon.channel().await.expect("connect");
    let mut bench = Bench {
        tools: ToolsClient::new(channel.clone()),
        sessions: SessionsClient::new(channel.clone()),
        health: HealthClient::new(channel),
        ro,
        ww,
        ww_nowatch,
        small_file: small.display().to_string(),
        inner: HashMap::new(),
    };

    let load_before = load_average();
    // Warm-up (also spawns the per-policy workers), then N measured rounds, each running every
    // variant once, in a rotating order.
    for _ in 0..warmup {
        for &v in &variants {
            bench.once(v).await;
        }
    }
    bench.inner.clear();
    let mut samples: Vec<Vec<Duration>> = vec![Vec::with_capacity(n); variants.len()];
    let started = Instant::now();
    // Two phases. An open leaves work running in the daemon after its reply (the replacement
    // spare worker starts, the closed session's worker exits): interleaved with the per-call
    // variants it landed on whichever variant came next (read-only Shell, which followed it in
    // the rotation, measured ~0.3 ms slower than workspace-write for that reason alone). So the
    // per-call variants rotate among themselves, and the opens run after them, each followed by
    // a pause off the clock that lets that background work finish, as between a user's sessions
    // (the back-to-back variant is the case without the pause). All ratios use phase one's
    // bare spawn.
    let is_open = |v: &Variant| {
        matches!(
            v,
            Variant::OpenFirstReadOnly
                | Variant::OpenFirstWorkspaceWrite
                | Variant::OpenFirstBackToBack
        )
    };
    let per_call: Vec<usize> = (0..variants.len())
        .filter(|&j| !is_open(&variants[j]))
        .collect();
    let opens: Vec<usize> = (0..variants.len())
        .filter(|&j| is_open(&variants[j]))
        .collect();
    for i in 0..n {
        for k in 0..per_call.len() {
            let j = per_call[(i + k) % per_call.len()];
            let d = bench.once(variants[j]).await;
            samples[j].push(d);
        }
    }
    let settle = Duration::from_millis(env_usize(
        "CORRAL_BENCH_SETTLE_MS",
        OPEN_SETTLE.as_millis() as usize,
    ) as u64);
    for i in 0..n {
        for k in 0..opens.len() {
            let j = opens[(i + k) % opens.len()];
            let d = bench.once(variants[j]).await;
            samples[j].push(d);
            tokio::time::sleep(settle).await;
        }
    }
    let elapsed = started.elapsed();
    let load_after = load_average();

    for s in &mut samples {
        s.sort();
    }
    let base = &samples[0];
    let (b50, b90, b99) = (pct(base, 0.5), pct(base, 0.9), pct(base, 0.99));

    println!();
    println!(
        "spawn latency: N={n} per variant after {warmup} warm-up rounds, interleaved; {:.1} s; \
         load average {load_before} -> {load_after}; {} CPUs",
        elapsed.as_secs_f64(),
        support::cpus()
    );
    if !bwrap {
        println!("(bwrap not on PATH: variant (c) skipped; `apt-get install -y bubblewrap`)");
    }
    println!();
    println!(
        "| variant | p50 µs | p90 µs | p99 µs | min µs | p50 ÷ bare | p90 ÷ bare | p99 ÷ bare |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for (v, s) in variants.iter().zip(&samples) {
        let (p50, p90, p99) = (pct(s, 0.5), pct(s, 0.9), pct(s, 0.99));
        println!(
            "| {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2}× | {:.2}× | {:.2}× |",
            v.label(),
            us(p50),
            us(p90),
            us(p99),
            us(s[0]),
            us(p50) / us(b50),
            us(p90) / us(b90),
            us(p99) / us(b99),
        );
    }
    println!();
    for (key, label) in [
        ("ro", "read-only"),
        ("ww", "workspace-write"),
        ("ww-nowatch", "workspace-write, no watcher"),
    ] {
        if let Some(inner) = bench.inner.get_mut(key) {
            inner.sort();
            println!(
                "worker-reported duration_seconds ({label}): p50 {:.0} µs, p90 {:.0} µs",
                us(pct(inner, 0.5)),
                us(pct(inner, 0.9))
            );
        }
    }
    let ratio_of = |v: Variant| {
        let i = variants.iter().position(|x| *x == v)?;
        Some(us(pct(&samples[i], 0.5)) / us(b50))
    };
    let verdict = |r: Option<f64>, bound: f64| match r {
        Some(r) if r <= bound => format!("{r:.2}x (met)"),
        Some(r) => format!("{r:.2}x (NOT met)"),
        None => "not run".to_string(),
    };
    println!();
    println!(
        "goal: p50 of Shell `true` <= 1.5x bare spawn: read-only {}, workspace-write {}",
        verdict(ratio_of(Variant::ShellReadOnly), 1.5),
        verdict(ratio_of(Variant::ShellWorkspaceWrite), 1.5),
    );
    println!(
        "goal: p50 of OpenSession + first Shell `true` <= 10x bare spawn: read-only {}, \
         workspace-write {}, read-only back to back {}",
        verdict(ratio_of(Variant::OpenFirstReadOnly), 10.0),
        verdict(ratio_of(Variant::OpenFirstWorkspaceWrite), 10.0),
        verdict(ratio_of(Variant::OpenFirstBackToBack), 10.0),
    );
    drop(daemon);
}
