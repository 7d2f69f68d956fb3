//! grep_files over gRPC against ripgrep.
//!
//! `cargo bench --bench grep -- TREE` (harness = false: `cargo test` never runs it). One run
//! compares, for a literal and a regex pattern, interleaved round-robin so load drift hits every
//! command alike:
//!
//! - corral: `GrepFiles { pattern, limit: 2000 }` in a read-only session with cwd = TREE, over the
//!   Unix socket, session opened and channel connected beforehand (the time includes the gRPC round
//!   trip and the daemon ↔ worker IPC);
//! - `rg -l --sortr=modified PATTERN TREE` (the command Codex's grep_files runs);
//! - `rg -l PATTERN TREE` (parallel, unsorted).
//!
//! rg's stdout is read into memory (as corral's answer is). Besides wall time, each command's CPU
//! time (user + system) per call is reported: rg's from `getrusage(RUSAGE_CHILDREN)`, corral's as
//! the CPU time the daemon and its workers used during the call (`/proc/PID/stat`, 10 ms ticks).
//! Without TREE the tree is `$CARGO_HOME/registry/src`. Environment: `CORRAL_RG` (ripgrep >= 14;
//! default `rg` on PATH), `CORRAL_BENCH_RUNS` (default 10), `CORRAL_BENCH_WARMUP` (default 2),
//! `CORRAL_BIN` (daemon binary; default the `corral` cargo built with this bench),
//! `CORRAL_GREP_BASELINE` (a second daemon binary, e.g. a build of an earlier commit, timed as one
//! more interleaved command: before/after in the same run), `CORRAL_GREP_UNCONFINED` (set: one
//! more command, the same call in a danger-full-access session of a second daemon of the same
//! binary started with `root_callers = "trusted"`, i.e. without Landlock and seccomp: what
//! confinement costs), `CORRAL_BENCH_HOG` (N busy-looping
//! threads in this process for the whole run: a reproducible busy machine).

mod support;

use corral::api::{self, tools_client::ToolsClient};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};
use support::{Daemon, env_usize, fail, load_average, median, ms, ripgrep};
use tonic::transport::Channel;

const LIMIT: u64 = 2000;
const PATTERNS: [(&str, &str); 2] = [("literal", "deprecated"), ("regex", r"[A-Z][a-z]+Error\b")];

#[derive(Clone, Copy, PartialEq)]
enum Cmd {
    Corral,
    /// The `CORRAL_GREP_BASELINE` daemon.
    Baseline,
    /// A danger-full-access session (`CORRAL_GREP_UNCONFINED`): the same search without
    /// Landlock, seccomp and the capability drop, to measure what confinement costs.
    Unconfined,
    RgSorted,
    RgUnsorted,
}

impl Cmd {
    fn label(self) -> &'static str {
        match self {
            Cmd::Corral => "corral GrepFiles (gRPC, limit 2000)",
            Cmd::Baseline => "corral baseline build (`CORRAL_GREP_BASELINE`)",
            Cmd::Unconfined => "corral, danger-full-access session (no Landlock/seccomp)",
            Cmd::RgSorted => "`rg -l --sortr=modified`",
            Cmd::RgUnsorted => "`rg -l`",
        }
    }
}

/// The result of one run: its wall time and the paths it listed.
struct Run {
    took: Duration,
    /// CPU time (user + system) the command used.
    cpu: Duration,
    paths: Vec<String>,
    truncated: bool,
}

/// One daemon with a read-only session in the tree.
struct Server {
    daemon: Daemon,
    tools: ToolsClient<Channel>,
    session: String,
}

impl Server {
    async fn start(bin: &Path, tree: &Path) -> Server {
        Server::start_with(bin, tree, None, api::SandboxMode::ReadOnly).await
    }

    async fn start_with(
        bin: &Path,
        tree: &Path,
        config: Option<&str>,
        mode: api::SandboxMode,
    ) -> Server {
        let daemon = Daemon::start_binary(bin, config)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let session = Server::session(&daemon, tree, mode).await;
        let tools = ToolsClient::new(daemon.channel().await.expect("connect"));
        Server {
            daemon,
            tools,
            session,
        }
    }

    /// A session in the tree, with our PATH and no HOME.
    async fn session(daemon: &Daemon, tree: &Path, mode: api::SandboxMode) -> String {
        let mut req = support::session_request(tree, mode);
        req.env.remove("HOME");
        daemon
            .open_session(req)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }
}

struct Bench {
    corral: Server,
    baseline: Option<Server>,
    /// A daemon (the same binary) that lets root open danger-full-access sessions, and one.
    unconfined: Option<Server>,
    rg: PathBuf,
    tree: PathBuf,
}

/// CPU time (user + system) of `root` and all its descendants, from `/proc` (clock ticks).
fn tree_cpu_ticks(root: u32) -> u64 {
    let mut parent_of = Vec::new();
    let mut ticks_of = std::collections::HashMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // Fields after the command name, which is in parentheses and may contain spaces.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        // rest[1] = ppid, rest[11] = utime, rest[12] = stime (fields 4, 14, 15 of proc(5)).
        parent_of.push((pid, num(1) as u32));
        ticks_of.insert(pid, num(11) + num(12));
    }
    let mut members = vec![root];
    let mut i = 0;
    while i < members.len() {
        let p = members[i];
        members.extend(parent_of.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    members.iter().filter_map(|p| ticks_of.get(p)).sum()
}

fn ticks_to_duration(ticks: u64) -> Duration {
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_nanos(ticks * 1_000_000_000 / hz)
}

/// CPU time (user + system) of this process's waited-for children so far.
fn children_cpu() -> Duration {
    // SAFETY: getrusage fills the zeroed struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

impl Bench {
    fn commands(&self) -> Vec<Cmd> {
        let mut cmds = vec![Cmd::Corral];
        if self.baseline.is_some() {
            cmds.push(Cmd::Baseline);
        }
        if self.unconfined.is_some() {
            cmds.push(Cmd::Unconfined);
        }
        cmds.extend([Cmd::RgSorted, Cmd::RgUnsorted]);
        cmds
    }

    async fn once(&mut self, cmd: Cmd, pattern: &str) -> Run {
        match cmd {
            Cmd::Corral | Cmd::Baseline | Cmd::Unconfined => {
                let (server, session) = match cmd {
                    Cmd::Baseline => {
                        let server = self.baseline.as_mut().expect("baseline daemon");
                        let session = server.session.clone();
                        (server, session)
                    }
                    Cmd::Unconfined => {
                        let server = self.unconfined.as_mut().expect("unconfined daemon");
                        let session = server.session.clone();
                        (server, session)
                    }
                    _ => {
                        let session = self.corral.session.clone();
                        (&mut self.corral, session)
                    }
                };
                let req = api::GrepFilesRequest {
                    session_id: session,
                    pattern: pattern.to_string(),
                    limit: Some(LIMIT),
                    ..Default::default()
                };
                let pid = server.daemon.pid();
                let cpu_before = tree_cpu_ticks(pid);
                let start = Instant::now();
                let r = server
                    .tools
                    .grep_files(req)
                    .await
                    .unwrap_or_else(|s| panic!("grep_files: {s:?}"))
                    .into_inner();
                let took = start.elapsed();
                let cpu = ticks_to_duration(tree_cpu_ticks(pid).saturating_sub(cpu_before));
                Run {
                    took,
                    cpu,
                    paths: r.matches.into_iter().map(|m| m.path).collect(),
                    truncated: r.truncated,
                }
            }
            Cmd::RgSorted | Cmd::RgUnsorted => {
                let mut c = Command::new(&self.rg);
                c.arg("--files-with-matches");
                if matches!(cmd, Cmd::RgSorted) {
                    c.arg("--sortr=modified");
                }
                c.args(["--no-messages", "--regexp", pattern, "--"])
                    .arg(&self.tree)
                    .stdin(Stdio::null())
                    .stderr(Stdio::null());
                let cpu_before = children_cpu();
                let start = Instant::now();
                let out = c.output().expect("run rg");
                let took = start.elapsed();
                let cpu = children_cpu().saturating_sub(cpu_before);
                assert!(
                    matches!(out.status.code(), Some(0 | 1)),
                    "rg failed: {:?}",
                    out.status
                );
                Run {
                    took,
                    cpu,
                    paths: String::from_utf8_lossy(&out.stdout)
                        .lines()
                        .map(str::to_string)
                        .collect(),
                    truncated: false,
                }
            }
        }
    }
}

/// `n` threads that spin until dropped: a busy machine on demand.
struct Hog {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Hog {
    fn start(n: usize) -> Hog {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..n)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut x = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        x = std::hint::black_box(
                            x.wrapping_mul(6364136223846793005).wrapping_add(1),
                        );
                    }
                })
            })
            .collect();
        Hog { stop, threads }
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Checks corral's list against rg's full result set: every path is one rg lists, and the list is
/// the first `LIMIT` of rg's set ordered by (mtime desc, path asc). Returns a one-line verdict.
fn check(corral: &Run, rg_all: &[String]) -> String {
    let set: HashSet<&str> = rg_all.iter().map(String::as_str).collect();
    let foreign = corral
        .paths
        .iter()
        .filter(|p| !set.contains(p.as_str()))
        .count();
    let mut keyed: Vec<(SystemTime, &str)> = rg_all
        .iter()
        .map(|p| {
            let t = std::fs::metadata(p)
                .and_then(|m| m.modified())
                .unwrap_or(SystemTime::UNIX_EPOCH);
            (t, p.as_str())
        })
        .collect();
    keyed.sort_by(|a, b| {
        b.0.cmp(&a.0)
            .then_with(|| a.1.as_bytes().cmp(b.1.as_bytes()))
    });
    let expected: Vec<&str> = keyed.iter().take(LIMIT as usize).map(|(_, p)| *p).collect();
    let same = expected.len() == corral.paths.len()
        && expected.iter().zip(&corral.paths).all(|(a, b)| *a == b);
    format!(
        "rg lists {} files; corral returned {} (truncated: {}); paths not in rg's set: {}; \
         equals the first {} of rg's set by (mtime desc, path): {}",
        rg_all.len(),
        corral.paths.len(),
        corral.truncated,
        foreign,
        expected.len(),
        if same { "yes" } else { "NO" }
    )
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let (tree, default_tree) = match args.first() {
        Some(t) => (PathBuf::from(t), false),
        None => {
            let cargo_home = std::env::var_os("CARGO_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
                .unwrap_or_else(|| fail("no TREE given and neither CARGO_HOME nor HOME is set"));
            (cargo_home.join("registry").join("src"), true)
        }
    };
    let tree = tree
        .canonicalize()
        .unwrap_or_else(|e| fail(&format!("tree {}: {e}", tree.display())));
    if default_tree {
        println!(
            "no TREE given: using {} (pass one: `cargo bench --bench grep -- TREE`)",
            tree.display()
        );
    }
    let runs = env_usize("CORRAL_BENCH_RUNS", 10).max(1);
    let warmup = env_usize("CORRAL_BENCH_WARMUP", 2);
    let (rg, rg_version) = ripgrep();
    support::block_on(async_main(tree, rg, rg_version, runs, warmup));
}

async fn async_main(tree: PathBuf, rg: PathBuf, rg_version: String, runs: usize, warmup: usize) {
    let baseline_bin = std::env::var_os("CORRAL_GREP_BASELINE").map(PathBuf::from);
    let unconfined = match std::env::var_os("CORRAL_GREP_UNCONFINED") {
        Some(_) => Some(
            Server::start_with(
                &support::corral_bin(),
                &tree,
                Some("root_callers = \"trusted\"\n"),
                api::SandboxMode::DangerFullAccess,
            )
            .await,
        ),
        None => None,
    };
    let mut bench = Bench {
        unconfined,
        corral: Server::start(&support::corral_bin(), &tree).await,
        baseline: match &baseline_bin {
            Some(bin) => Some(Server::start(bin, &tree).await),
            None => None,
        },
        rg: rg.clone(),
        tree: tree.clone(),
    };
    let hog_threads = env_usize("CORRAL_BENCH_HOG", 0);
    println!(
        "grep: tree {}; {rg_version} ({}); {runs} measured runs per command after {warmup} \
         warm-up rounds, interleaved; {} CPUs; daemon {}{}{}",
        tree.display(),
        rg.display(),
        support::cpus(),
        support::corral_bin().display(),
        baseline_bin
            .as_ref()
            .map(|b| format!("; baseline daemon {}", b.display()))
            .unwrap_or_default(),
        if hog_threads > 0 {
            format!("; {hog_threads} busy-loop threads running (CORRAL_BENCH_HOG)")
        } else {
            String::new()
        }
    );
    let _hog = (hog_threads > 0).then(|| Hog::start(hog_threads));
    let cmds = bench.commands();

    for (kind, pattern) in PATTERNS {
        let load_before = load_average();
        for _ in 0..warmup {
            for &cmd in &cmds {
                bench.once(cmd, pattern).await;
            }
        }
        let mut times: Vec<Vec<Duration>> = vec![Vec::with_capacity(runs); cmds.len()];
        let mut cpu: Vec<Duration> = vec![Duration::ZERO; cmds.len()];
        let mut last: Vec<Option<Run>> = (0..cmds.len()).map(|_| None).collect();
        for i in 0..runs {
            for k in 0..cmds.len() {
                let j = (i + k) % cmds.len();
                let run = bench.once(cmds[j], pattern).await;
                times[j].push(run.took);
                cpu[j] += run.cpu;
                last[j] = Some(run);
            }
        }
        let load_after = load_average();
        for t in &mut times {
            t.sort();
        }
        let corral_med = median(&times[0]);
        let corral_min = times[0][0];
        let corral_cpu = ms(cpu[0]) / runs as f64;
        println!();
        println!("### {kind} `{pattern}` (load average {load_before} -> {load_after})");
        println!();
        println!(
            "| command | median ms | min ms | max ms | CPU ms per call | corral ÷ this (median) | \
             corral ÷ this (min) | corral ÷ this (CPU) |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|---:|");
        for ((cmd, t), c) in cmds.iter().zip(&times).zip(&cpu) {
            let c = ms(*c) / runs as f64;
            println!(
                "| {} | {:.1} | {:.1} | {:.1} | {:.0} | {:.2}× | {:.2}× | {:.2}× |",
                cmd.label(),
                ms(median(t)),
                ms(t[0]),
                ms(t[t.len() - 1]),
                c,
                ms(corral_med) / ms(median(t)),
                ms(corral_min) / ms(t[0]),
                corral_cpu / c,
            );
        }
        let at = |c: Cmd| cmds.iter().position(|x| *x == c).expect("command");
        let vs_sorted = ms(corral_med) / ms(median(&times[at(Cmd::RgSorted)]));
        let vs_unsorted = ms(corral_med) / ms(median(&times[at(Cmd::RgUnsorted)]));
        println!();
        println!(
            "goals (medians): corral <= 0.45x `rg -l --sortr=modified`: {vs_sorted:.2}x ({}); \
             corral <= 1.0x `rg -l`: {vs_unsorted:.2}x ({})",
            if vs_sorted <= 0.45 { "met" } else { "NOT met" },
            if vs_unsorted <= 1.0 { "met" } else { "NOT met" },
        );
        let rg_all = &last[at(Cmd::RgUnsorted)].as_ref().expect("rg ran").paths;
        for cmd in [Cmd::Corral, Cmd::Baseline, Cmd::Unconfined] {
            if let Some(run) = cmds
                .iter()
                .position(|x| *x == cmd)
                .and_then(|j| last[j].as_ref())
            {
                println!("check ({}): {}", cmd.label(), check(run, rg_all));
            }
        }
    }
}
