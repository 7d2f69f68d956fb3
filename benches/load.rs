//! Load and soak: many concurrent clients, each on its own connection and in its own session,
//! against one real daemon, with a mix of tool calls like an agent's.
//!
//! `cargo bench --bench load` (harness = false: `cargo test` never runs it).
//!
//! Load mode (the default): for each client count N (default 1, 8, 64, 256), three phases of
//! `--duration` each (default 20 s), every client calling back to back:
//!
//! - `health`: `grpc.health.v1.Health/Check` — the baseline (the same server, connection and
//!   gRPC stack, no session, no worker);
//! - `read_file`: `ReadFile` of a random file of the scratch tree;
//! - `mix`: per call, at random: `ReadFile` 60 %, `ListDir` 10 %, `GrepFiles` over the tree
//!   10 %, `ApplyPatch` (one line of the client's own file) 10 %, `Shell ["true"]` 10 %.
//!
//! Each phase reports throughput, p50/p90/p99/p99.9 (client side, `Instant` around the RPC),
//! errors, the daemon's and the workers' peak RSS (sampled every second from /proc), CPU per call
//! (utime + stime of the daemon and all its descendants, reaped children included, over the
//! phase, divided by the calls) and the load average.
//!
//! Soak mode (`-- --soak 30m`): 64 clients (`--clients`) run the mix for the given time, plus 1 %
//! of calls that end early: half `Shell ["sleep","5"]` with `timeout_ms` 100 (the daemon kills it),
//! half the same without a timeout that the client abandons after 100 ms (the RPC is cancelled).
//! Every 10 s it samples the daemon's RSS, the workers' RSS, open file descriptors (daemon +
//! workers), the daemon's descendant processes and threads, and the calls in the window; it writes
//! them to `docs/load-soak.csv`, draws `docs/load-soak.svg`, and compares the first and last
//! fifths of the run (the first minute is warm-up and not compared).
//!
//! The daemon runs with a config that raises the per-user caps so that 256 clients of one user
//! fit (max_sessions 64 → 512, max_concurrent_commands 8 → 512); all sessions are workspace-write
//! on the same scratch tree of 300 files, so they share one sandbox worker (one worker per
//! distinct session policy).
//!
//! Flags (after `--`): `--duration 20s`, `--clients 1,8,64,256`, `--soak 30m`, `--files 300`,
//! `--workloads health,read_file,mix` (a subset, e.g. to profile one).
//! Environment: `CORRAL_LOAD_DURATION`, `CORRAL_LOAD_CLIENTS`, `CORRAL_BIN`.

mod support;

use corral::api::{self, SandboxMode, sessions_client::SessionsClient, tools_client::ToolsClient};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use support::procfs::{Sample, clock_ticks, mib, sample, self_cpu_ticks};
use support::{Daemon, fail, load_average, ms, pct};
use tonic::transport::Channel;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

/// Per-user caps raised for the bench (the built-in defaults are 64 sessions and 8 concurrent
/// commands per user; all clients here are one user).
const CONFIG: &str = "\
[policy.default]
max_sessions = 512
max_workers = 16
max_concurrent_commands = 512
";

const DIRS: usize = 20;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Op {
    Health,
    Read,
    List,
    Grep,
    Patch,
    Shell,
    /// `sleep 5` with a 100 ms timeout (soak only).
    Timeout,
    /// `sleep 5` abandoned by the client after 100 ms (soak only).
    Cancel,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Health => "health check",
            Op::Read => "read_file",
            Op::List => "list_dir",
            Op::Grep => "grep_files",
            Op::Patch => "apply_patch",
            Op::Shell => "shell true",
            Op::Timeout => "shell sleep, timed out",
            Op::Cancel => "shell sleep, cancelled",
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Workload {
    Health,
    Read,
    Mix,
    /// The mix plus 1 % timeouts and cancellations.
    Soak,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::Health => "health",
            Workload::Read => "read_file",
            Workload::Mix => "mix",
            Workload::Soak => "soak mix",
        }
    }
}

struct Client {
    index: usize,
    tools: ToolsClient<Channel>,
    health: HealthClient<Channel>,
    session: String,
    rng: u64,
    /// The number in the client's own file, which each apply_patch increments.
    value: u64,
    files: usize,
}

#[derive(Default)]
struct Outcome {
    latencies: BTreeMap<Op, Vec<Duration>>,
    errors: BTreeMap<Op, u64>,
    error_samples: Vec<String>,
}

impl Outcome {
    fn merge(&mut self, other: Outcome) {
        for (op, mut l) in other.latencies {
            self.latencies.entry(op).or_default().append(&mut l);
        }
        for (op, e) in other.errors {
            *self.errors.entry(op).or_default() += e;
        }
        for s in other.error_samples {
            if self.error_samples.len() < 5 {
                self.error_samples.push(s);
            }
        }
    }

    fn all(&self) -> Vec<Duration> {
        let mut all: Vec<Duration> = self.latencies.values().flatten().copied().collect();
        all.sort();
        all
    }

    fn errors(&self) -> u64 {
        self.errors.values().sum()
    }
}

impl Client {
    fn next(&mut self) -> u64 {
        // xorshift64: a fixed, cheap sequence per client.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    fn pick(&mut self, workload: Workload) -> Op {
        match workload {
            Workload::Health => Op::Health,
            Workload::Read => Op::Read,
            Workload::Mix | Workload::Soak => {
                let r = self.next() % 1000;
                if workload == Workload::Soak && r < 10 {
                    return if r < 5 { Op::Timeout } else { Op::Cancel };
                }
                match r % 100 {
                    0..60 => Op::Read,
                    60..70 => Op::List,
                    70..80 => Op::Grep,
                    80..90 => Op::Patch,
                    _ => Op::Shell,
                }
            }
        }
    }

    /// One call; `Err` is a message for the report.
    async fn call(&mut self, op: Op) -> Result<(), String> {
        let session = self.session.clone();
        match op {
            Op::Health => {
                let r = self
                    .health
                    .check(HealthCheckRequest {
                        service: String::new(),
                    })
                    .await
                    .map_err(|s| format!("{s:?}"))?
                    .into_inner();
                if r.status != 1 {
                    return Err(format!("health status {}", r.status));
                }
            }
            Op::Read => {
                let f = self.next() as usize % self.files;
                let r = self
                    .tools
                    .read_file(api::ReadFileRequest {
                        session_id: session,
                        file_path: file_name(f),
                        ..Default::default()
                    })
                    .await
                    .map_err(|s| format!("read_file: {s:?}"))?
                    .into_inner();
                if r.lines.len() != LINES {
                    return Err(format!("read_file: {} lines", r.lines.len()));
                }
            }
            Op::List => {
                let d = self.next() as usize % DIRS;
                self.tools
                    .list_dir(api::ListDirRequest {
                        session_id: session,
                        dir_path: format!("d{d:02}"),
                        ..Default::default()
                    })
                    .await
                    .map_err(|s| format!("list_dir: {s:?}"))?;
            }
            Op::Grep => {
                let n = self.next() as usize % self.files;
                let r = self
                    .tools
                    .grep_files(api::GrepFilesRequest {
                        session_id: session,
                        pattern: format!("fn handle_{n}\\b"),
                        include: "*.rs".into(),
                        ..Default::default()
                    })
                    .await
                    .map_err(|s| format!("grep_files: {s:?}"))?
                    .into_inner();
                if r.matches.len() != 1 {
                    return Err(format!("grep_files: {} matches", r.matches.len()));
                }
            }
            Op::Patch => {
                let patch = format!(
                    "*** Begin Patch\n*** Update File: clients/c{}.txt\n@@\n-value = {}\n+value = {}\n*** End Patch\n",
                    self.index,
                    self.value,
                    self.value + 1
                );
                self.tools
                    .apply_patch(api::ApplyPatchRequest {
                        session_id: session,
                        patch,
                    })
                    .await
                    .map_err(|s| format!("apply_patch: {s:?}"))?;
                self.value += 1;
            }
            Op::Shell => {
                let r = self
                    .tools
                    .shell(api::ShellRequest {
                        session_id: session,
                        command: vec!["true".into()],
                        ..Default::default()
                    })
                    .await
                    .map_err(|s| format!("shell: {s:?}"))?
                    .into_inner();
                if r.exit_code != 0 {
                    return Err(format!("shell true: exit {}", r.exit_code));
                }
            }
            Op::Timeout => {
                let r = self
                    .tools
                    .shell(api::ShellRequest {
                        session_id: session,
                        command: vec!["sleep".into(), "5".into()],
                        timeout_ms: Some(100),
                        ..Default::default()
                    })
                    .await
                    .map_err(|s| format!("shell (timeout): {s:?}"))?
                    .into_inner();
                if !r.timed_out {
                    return Err(format!("sleep 5 did not time out: exit {}", r.exit_code));
                }
            }
            Op::Cancel => {
                let call = self.tools.shell(api::ShellRequest {
                    session_id: session,
                    command: vec!["sleep".into(), "5".into()],
                    ..Default::default()
                });
                // Dropping the call resets its HTTP/2 stream: the daemon sees a cancellation.
                match tokio::time::timeout(Duration::from_millis(100), call).await {
                    Err(_) => {}
                    Ok(r) => return Err(format!("sleep 5 was not cancelled: {r:?}")),
                }
            }
        }
        Ok(())
    }
}

/// Lines in each scratch file (read_file returns them all).
const LINES: usize = 120;

fn file_name(i: usize) -> String {
    format!("d{:02}/m{i:03}.rs", i % DIRS)
}

/// The scratch tree: `files` Rust-like files in [`DIRS`] directories (~4 KiB each) and one
/// file per client for apply_patch.
fn make_tree(root: &Path, files: usize, clients: usize) {
    for d in 0..DIRS {
        std::fs::create_dir_all(root.join(format!("d{d:02}"))).unwrap();
    }
    for i in 0..files {
        let mut text = String::new();
        writeln!(text, "// module {i}").unwrap();
        writeln!(text, "pub fn handle_{i}(x: u64) -> u64 {{").unwrap();
        for l in 2..LINES - 1 {
            writeln!(
                text,
                "    let v{l} = x.wrapping_mul({l}) ^ 0x{i:04x}; // line {l}"
            )
            .unwrap();
        }
        writeln!(text, "}}").unwrap();
        std::fs::write(root.join(file_name(i)), text).unwrap();
    }
    std::fs::create_dir_all(root.join("clients")).unwrap();
    for c in 0..clients {
        std::fs::write(root.join(format!("clients/c{c}.txt")), "value = 0\n").unwrap();
    }
}

/// Runs `clients` for `duration` on `workload`; `on_tick` is called every `tick` with the calls
/// and errors so far (for the soak's samples).
async fn run(
    clients: Vec<Client>,
    workload: Workload,
    duration: Duration,
    daemon_pid: i32,
    tick: Duration,
    mut on_tick: impl FnMut(Duration, u64, u64),
) -> (Vec<Client>, Outcome, Sample, Sample, f64) {
    let calls = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let before = sample(daemon_pid);
    let self_before = self_cpu_ticks();
    let start = Instant::now();
    let mut tasks = Vec::new();
    for mut c in clients {
        let (calls, errors, stop) = (calls.clone(), errors.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut out = Outcome::default();
            while !stop.load(Ordering::Relaxed) {
                let op = c.pick(workload);
                let t = Instant::now();
                let r = c.call(op).await;
                let d = t.elapsed();
                calls.fetch_add(1, Ordering::Relaxed);
                match r {
                    Ok(()) => out.latencies.entry(op).or_default().push(d),
                    Err(e) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        *out.errors.entry(op).or_default() += 1;
                        if out.error_samples.len() < 5 {
                            out.error_samples.push(e);
                        }
                    }
                }
            }
            (c, out)
        }));
    }
    let mut peak = before;
    let mut next_tick = tick;
    while start.elapsed() < duration {
        tokio::time::sleep(Duration::from_secs(1).min(duration.saturating_sub(start.elapsed())))
            .await;
        let s = sample(daemon_pid);
        peak.daemon_rss = peak.daemon_rss.max(s.daemon_rss);
        peak.workers_rss = peak.workers_rss.max(s.workers_rss);
        peak.workers = peak.workers.max(s.workers);
        if start.elapsed() >= next_tick {
            on_tick(
                start.elapsed(),
                calls.load(Ordering::Relaxed),
                errors.load(Ordering::Relaxed),
            );
            next_tick += tick;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let mut outcome = Outcome::default();
    let mut back = Vec::new();
    for t in tasks {
        let (c, o) = t.await.expect("client task");
        back.push(c);
        outcome.merge(o);
    }
    let elapsed = start.elapsed().as_secs_f64();
    let after = sample(daemon_pid);
    peak.cpu_ticks = after.cpu_ticks - before.cpu_ticks;
    peak.daemon_ticks = after.daemon_ticks - before.daemon_ticks;
    let mut client_cpu = after;
    client_cpu.cpu_ticks = self_cpu_ticks() - self_before;
    back.sort_by_key(|c| c.index);
    (back, outcome, peak, client_cpu, elapsed)
}

fn parse_duration(s: &str) -> Duration {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num
        .parse()
        .unwrap_or_else(|_| fail(&format!("bad duration {s:?} (e.g. 20s, 30m)")));
    match unit {
        "" | "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n * 60),
        "h" => Duration::from_secs(n * 3600),
        _ => fail(&format!("bad duration unit in {s:?} (s, m or h)")),
    }
}

struct Args {
    duration: Duration,
    clients: Vec<usize>,
    soak: Option<Duration>,
    files: usize,
    workloads: Vec<Workload>,
}

fn args() -> Args {
    let mut a = Args {
        duration: parse_duration(
            &std::env::var("CORRAL_LOAD_DURATION").unwrap_or_else(|_| "20s".into()),
        ),
        clients: Vec::new(),
        soak: None,
        files: 300,
        workloads: vec![Workload::Health, Workload::Read, Workload::Mix],
    };
    let mut clients = std::env::var("CORRAL_LOAD_CLIENTS").ok();
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .unwrap_or_else(|| fail(&format!("{name} needs a value")))
        };
        match arg.as_str() {
            "--duration" => a.duration = parse_duration(&value("--duration")),
            "--clients" => clients = Some(value("--clients")),
            "--soak" => a.soak = Some(parse_duration(&value("--soak"))),
            "--files" => {
                a.files = value("--files")
                    .parse()
                    .unwrap_or_else(|_| fail("--files takes a number"))
            }
            "--workloads" => {
                a.workloads = value("--workloads")
                    .split(',')
                    .map(|w| match w {
                        "health" => Workload::Health,
                        "read_file" => Workload::Read,
                        "mix" => Workload::Mix,
                        _ => fail(&format!("unknown workload {w:?}: health, read_file, mix")),
                    })
                    .collect()
            }
            // cargo bench passes --bench to harness = false binaries.
            "--bench" => {}
            other => fail(&format!(
                "unknown argument {other:?}; flags: --duration 20s, --clients 1,8,64,256, \
                 --soak 30m, --files 300, --workloads health,read_file,mix"
            )),
        }
    }
    let default = if a.soak.is_some() { "64" } else { "1,8,64,256" };
    a.clients = clients
        .as_deref()
        .unwrap_or(default)
        .split(',')
        .map(|n| {
            n.trim()
                .parse()
                .ok()
                .filter(|n| *n > 0)
                .unwrap_or_else(|| fail(&format!("bad client count {n:?}")))
        })
        .collect();
    if a.files < DIRS {
        fail(&format!("--files must be at least {DIRS}"));
    }
    a
}

async fn open_clients(daemon: &Daemon, root: &Path, n: usize, files: usize) -> Vec<Client> {
    let mut clients = Vec::with_capacity(n);
    for index in 0..n {
        // Each client its own connection, as separate agents would have.
        let channel = daemon.channel().await.unwrap_or_else(|e| fail(&e));
        let session = SessionsClient::new(channel.clone())
            .open_session(support::session_request(root, SandboxMode::WorkspaceWrite))
            .await
            .unwrap_or_else(|s| {
                fail(&format!(
                    "open_session #{index}: {s:?}\nlog:\n{}",
                    daemon.log_text()
                ))
            })
            .into_inner()
            .session_id;
        clients.push(Client {
            index,
            tools: ToolsClient::new(channel.clone()),
            health: HealthClient::new(channel),
            session,
            rng: 0x9E37_79B9_7F4A_7C15 ^ ((index as u64 + 1) << 17),
            value: 0,
            files,
        });
    }
    clients
}

struct PhaseResult {
    throughput: f64,
    p50: Duration,
    p99: Duration,
    errors: u64,
}

fn report_phase(
    n: usize,
    workload: Workload,
    outcome: &Outcome,
    peak: &Sample,
    client: &Sample,
    elapsed: f64,
) -> PhaseResult {
    let all = outcome.all();
    let calls = all.len() as u64 + outcome.errors();
    let tick = clock_ticks();
    let cpu_us = peak.cpu_ticks as f64 / tick * 1e6 / calls.max(1) as f64;
    let daemon_us = peak.daemon_ticks as f64 / tick * 1e6 / calls.max(1) as f64;
    let client_us = client.cpu_ticks as f64 / tick * 1e6 / calls.max(1) as f64;
    let (p50, p99) = if all.is_empty() {
        (Duration::ZERO, Duration::ZERO)
    } else {
        (pct(&all, 0.5), pct(&all, 0.99))
    };
    let q = |v: f64| {
        if all.is_empty() {
            "-".to_string()
        } else {
            format!("{:.2}", ms(pct(&all, v)))
        }
    };
    println!(
        "| {n} | {} | {calls} | {:.0} | {} | {} | {} | {} | {} | {:.1} | {:.1} ({}) | {:.0} ({:.0} + {:.0}) | {:.0} | {} |",
        workload.name(),
        calls as f64 / elapsed,
        q(0.5),
        q(0.9),
        q(0.99),
        q(0.999),
        outcome.errors(),
        mib(peak.daemon_rss),
        mib(peak.workers_rss),
        peak.workers,
        cpu_us,
        daemon_us,
        cpu_us - daemon_us,
        client_us,
        load_average(),
    );
    for e in &outcome.error_samples {
        eprintln!("  error ({n} clients, {}): {e}", workload.name());
    }
    PhaseResult {
        throughput: calls as f64 / elapsed,
        p50,
        p99,
        errors: outcome.errors(),
    }
}

fn report_ops(n: usize, outcome: &Outcome, elapsed: f64) {
    for (op, l) in &outcome.latencies {
        let mut l = l.clone();
        l.sort();
        println!(
            "| {n} | {} | {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {} |",
            op.name(),
            l.len(),
            l.len() as f64 / elapsed,
            ms(pct(&l, 0.5)),
            ms(pct(&l, 0.9)),
            ms(pct(&l, 0.99)),
            ms(pct(&l, 0.999)),
            outcome.errors.get(op).copied().unwrap_or(0),
        );
    }
}

const PHASE_HEADER: &str = "| clients | workload | calls | calls/s | p50 ms | p90 ms | p99 ms | p99.9 ms | errors | daemon RSS MiB | RSS below the daemon MiB (workers) | CPU µs/call: daemon + workers (daemon + workers) | bench client CPU µs/call | load avg |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|";
const OPS_HEADER: &str = "| clients | call (in the mix) | calls | calls/s | p50 ms | p90 ms | p99 ms | p99.9 ms | errors |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|";

async fn load(args: &Args) {
    let max = *args.clients.iter().max().unwrap();
    let daemon = Daemon::start_with_config(Some(CONFIG))
        .await
        .unwrap_or_else(|e| fail(&e));
    let tree = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    make_tree(tree.path(), args.files, max);
    let pid = daemon.pid() as i32;
    println!(
        "load bench: {} CPUs, {} files, {:?} per phase, clients {:?}, load average {} at start",
        support::cpus(),
        args.files,
        args.duration,
        args.clients,
        load_average()
    );
    let mut all = open_clients(&daemon, tree.path(), max, args.files).await;
    // Warm-up: every session's first call, the worker's start, the page cache.
    let warm;
    (all, warm, _, _, _) = run(
        all,
        Workload::Mix,
        Duration::from_secs(2),
        pid,
        Duration::MAX,
        |_, _, _| {},
    )
    .await;
    if warm.errors() > 0 {
        fail(&format!("errors in the warm-up: {:?}", warm.error_samples));
    }
    let mut summary = Vec::new();
    let mut ops = Vec::new();
    println!("\n{PHASE_HEADER}");
    for &n in &args.clients {
        let rest = all.split_off(n);
        let mut clients = all;
        let mut results = BTreeMap::new();
        for &workload in &args.workloads {
            let (c, outcome, peak, client, elapsed) = run(
                clients,
                workload,
                args.duration,
                pid,
                Duration::MAX,
                |_, _, _| {},
            )
            .await;
            clients = c;
            let r = report_phase(n, workload, &outcome, &peak, &client, elapsed);
            if workload == Workload::Mix {
                ops.push((n, outcome, elapsed));
            }
            results.insert(workload.name(), r);
        }
        summary.push((n, results));
        all = clients;
        all.extend(rest);
    }
    println!("\n{OPS_HEADER}");
    for (n, outcome, elapsed) in &ops {
        report_ops(*n, outcome, *elapsed);
    }
    println!(
        "\n| clients | read_file / health throughput | mix p99 / p50 | read_file p99 / p50 | errors (all phases) |\n|---:|---:|---:|---:|---:|"
    );
    for (n, r) in &summary {
        let (Some(h), Some(rd), Some(mx)) = (r.get("health"), r.get("read_file"), r.get("mix"))
        else {
            continue;
        };
        println!(
            "| {n} | {:.2} | {:.1} | {:.1} | {} |",
            rd.throughput / h.throughput,
            mx.p99.as_secs_f64() / mx.p50.as_secs_f64(),
            rd.p99.as_secs_f64() / rd.p50.as_secs_f64(),
            h.errors + rd.errors + mx.errors,
        );
    }
    println!("\nload average at the end: {}", load_average());
}

struct SoakRow {
    t: f64,
    s: Sample,
    calls_per_s: f64,
    errors: u64,
}

async fn soak(args: &Args, length: Duration) {
    let n = args.clients[0];
    let daemon = Daemon::start_with_config(Some(CONFIG))
        .await
        .unwrap_or_else(|e| fail(&e));
    let tree = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    make_tree(tree.path(), args.files, n);
    let pid = daemon.pid() as i32;
    println!(
        "soak: {n} clients, {length:?}, {} CPUs, load average {} at start",
        support::cpus(),
        load_average()
    );
    let clients = open_clients(&daemon, tree.path(), n, args.files).await;
    let mut rows: Vec<SoakRow> = vec![SoakRow {
        t: 0.0,
        s: sample(pid),
        calls_per_s: 0.0,
        errors: 0,
    }];
    let mut last = (Duration::ZERO, 0u64);
    let (_clients, outcome, peak, client, elapsed) = run(
        clients,
        Workload::Soak,
        length,
        pid,
        Duration::from_secs(10),
        |t, calls, errors| {
            let s = sample(pid);
            let rate = (calls - last.1) as f64 / (t - last.0).as_secs_f64();
            last = (t, calls);
            eprintln!(
                "soak {:>5.0} s: {rate:.0} calls/s, daemon {:.1} MiB, workers {:.1} MiB, fds {}+{}, \
                 processes {}, threads {}, errors {errors}, load {}",
                t.as_secs_f64(),
                mib(s.daemon_rss),
                mib(s.workers_rss),
                s.daemon_fds,
                s.workers_fds,
                s.processes,
                s.threads,
                load_average()
            );
            rows.push(SoakRow {
                t: t.as_secs_f64(),
                s,
                calls_per_s: rate,
                errors,
            });
        },
    )
    .await;
    println!("\n{PHASE_HEADER}");
    report_phase(n, Workload::Soak, &outcome, &peak, &client, elapsed);
    println!("\n{OPS_HEADER}");
    report_ops(n, &outcome, elapsed);
    // Let the last cancelled and timed-out commands finish being cleaned up.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = sample(pid);
    println!(
        "\nafter the clients stopped (2 s): daemon {:.1} MiB, workers {:.1} MiB, fds {}+{}, processes {}, threads {}",
        mib(after.daemon_rss),
        mib(after.workers_rss),
        after.daemon_fds,
        after.workers_fds,
        after.processes,
        after.threads
    );

    // Growth: the first and last fifth of the samples after the first minute.
    let steady: Vec<&SoakRow> = rows.iter().filter(|r| r.t >= 60.0).collect();
    if steady.len() >= 5 {
        let fifth = steady.len() / 5;
        let (first, last) = (&steady[..fifth], &steady[steady.len() - fifth..]);
        type Metric = fn(&SoakRow) -> f64;
        let metrics: [(&str, Metric); 6] = [
            ("daemon RSS MiB", |r| mib(r.s.daemon_rss)),
            ("workers RSS MiB", |r| mib(r.s.workers_rss)),
            ("daemon fds", |r| r.s.daemon_fds as f64),
            ("workers fds", |r| r.s.workers_fds as f64),
            ("processes below the daemon", |r| r.s.processes as f64),
            ("threads (daemon + below)", |r| r.s.threads as f64),
        ];
        println!(
            "\n| metric (samples every 10 s, from 60 s) | first fifth: mean (max) | last fifth: mean (max) | change of means | slope per hour (least squares) |\n|---|---:|---:|---:|---:|"
        );
        for (name, f) in metrics {
            let mean = |rs: &[&SoakRow]| rs.iter().map(|r| f(r)).sum::<f64>() / rs.len() as f64;
            let max = |rs: &[&SoakRow]| rs.iter().map(|r| f(r)).fold(f64::MIN, f64::max);
            let (m1, m2) = (mean(first), mean(last));
            println!(
                "| {name} | {m1:.1} ({:.1}) | {m2:.1} ({:.1}) | {:+.1} % | {:+.2} |",
                max(first),
                max(last),
                if m1 > 0.0 {
                    (m2 - m1) / m1 * 100.0
                } else {
                    0.0
                },
                slope(&steady, f) * 3600.0,
            );
        }
    }
    let docs = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs");
    let mut csv = String::from(
        "seconds,calls_per_s,errors,daemon_rss_bytes,workers_rss_bytes,workers,processes,threads,daemon_fds,workers_fds\n",
    );
    for r in &rows {
        writeln!(
            csv,
            "{:.0},{:.1},{},{},{},{},{},{},{},{}",
            r.t,
            r.calls_per_s,
            r.errors,
            r.s.daemon_rss,
            r.s.workers_rss,
            r.s.workers,
            r.s.processes,
            r.s.threads,
            r.s.daemon_fds,
            r.s.workers_fds
        )
        .unwrap();
    }
    std::fs::write(docs.join("load-soak.csv"), csv).expect("write docs/load-soak.csv");
    std::fs::write(docs.join("load-soak.svg"), svg(&rows, n)).expect("write docs/load-soak.svg");
    println!(
        "\nwrote docs/load-soak.csv and docs/load-soak.svg ({} samples); load average at the end: {}",
        rows.len(),
        load_average()
    );
}

fn slope(rows: &[&SoakRow], f: fn(&SoakRow) -> f64) -> f64 {
    let n = rows.len() as f64;
    let mx = rows.iter().map(|r| r.t).sum::<f64>() / n;
    let my = rows.iter().map(|r| f(r)).sum::<f64>() / n;
    let sxy: f64 = rows.iter().map(|r| (r.t - mx) * (f(r) - my)).sum();
    let sxx: f64 = rows.iter().map(|r| (r.t - mx).powi(2)).sum();
    if sxx > 0.0 { sxy / sxx } else { 0.0 }
}

/// A stack of small line charts (one per quantity) sharing the time axis.
fn svg(rows: &[SoakRow], clients: usize) -> String {
    type Series = (&'static str, &'static str, fn(&SoakRow) -> f64);
    let panels: [(&str, Vec<Series>); 4] = [
        (
            "RSS (MiB)",
            vec![
                ("daemon", "#1f77b4", |r| mib(r.s.daemon_rss)),
                ("workers", "#d62728", |r| mib(r.s.workers_rss)),
            ],
        ),
        (
            "open file descriptors",
            vec![
                ("daemon", "#1f77b4", |r| r.s.daemon_fds as f64),
                ("workers", "#d62728", |r| r.s.workers_fds as f64),
            ],
        ),
        (
            "processes and threads below/in the daemon",
            vec![
                ("processes", "#2ca02c", |r| r.s.processes as f64),
                ("threads", "#9467bd", |r| r.s.threads as f64),
            ],
        ),
        (
            "throughput (calls/s, 10 s windows)",
            vec![("calls/s", "#ff7f0e", |r| r.calls_per_s)],
        ),
    ];
    let (w, ph, left, top, gap) = (760.0, 150.0, 60.0, 40.0, 50.0);
    let height = top + panels.len() as f64 * (ph + gap) + 10.0;
    let tmax = rows.last().map_or(1.0, |r| r.t).max(1.0);
    let mut s = String::new();
    writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"11\">",
        w + left + 20.0
    )
    .unwrap();
    writeln!(s, "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>").unwrap();
    writeln!(
        s,
        "<text x=\"{left}\" y=\"18\" font-size=\"14\">corral soak: {clients} clients, mix + 1 % timeouts/cancellations, {:.0} min, sampled every 10 s</text>",
        tmax / 60.0
    )
    .unwrap();
    for (i, (title, series)) in panels.iter().enumerate() {
        let y0 = top + i as f64 * (ph + gap);
        let ymax = series
            .iter()
            .flat_map(|(_, _, f)| rows.iter().map(f))
            .fold(0.0, f64::max)
            .max(1.0)
            * 1.1;
        writeln!(s, "<text x=\"{left}\" y=\"{}\">{title}</text>", y0 - 6.0).unwrap();
        writeln!(
            s,
            "<rect x=\"{left}\" y=\"{y0}\" width=\"{w}\" height=\"{ph}\" fill=\"none\" stroke=\"#999\"/>"
        )
        .unwrap();
        for k in 0..=4 {
            let v = ymax * k as f64 / 4.0;
            let y = y0 + ph - ph * k as f64 / 4.0;
            writeln!(
                s,
                "<line x1=\"{left}\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#eee\"/><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{v:.0}</text>",
                left + w,
                left - 4.0,
                y + 4.0
            )
            .unwrap();
        }
        for k in 0..=6 {
            let t = tmax * k as f64 / 6.0;
            writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{:.0} min</text>",
                left + w * k as f64 / 6.0,
                y0 + ph + 14.0,
                t / 60.0
            )
            .unwrap();
        }
        for (j, (name, colour, f)) in series.iter().enumerate() {
            let points: Vec<String> = rows
                .iter()
                .filter(|r| r.t > 0.0 || *name != "calls/s")
                .map(|r| {
                    format!(
                        "{:.1},{:.1}",
                        left + w * r.t / tmax,
                        y0 + ph - ph * f(r) / ymax
                    )
                })
                .collect();
            writeln!(
                s,
                "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.5\" points=\"{}\"/>",
                points.join(" ")
            )
            .unwrap();
            writeln!(
                s,
                "<text x=\"{}\" y=\"{}\" fill=\"{colour}\" text-anchor=\"end\">{name}</text>",
                left + w - 8.0,
                y0 + 14.0 + 13.0 * j as f64
            )
            .unwrap();
        }
    }
    s.push_str("</svg>\n");
    s
}

fn main() {
    let args = args();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
        .block_on(async {
            match args.soak {
                Some(length) => soak(&args, length).await,
                None => load(&args).await,
            }
        });
}
