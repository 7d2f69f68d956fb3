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
//! rg's stdout is read into memory (as corral's answer is). Without TREE the tree is
//! `$CARGO_HOME/registry/src`. Environment: `CORRAL_RG` (ripgrep >= 14; default `rg` on PATH),
//! `CORRAL_BENCH_RUNS` (default 10), `CORRAL_BENCH_WARMUP` (default 2), `CORRAL_BIN` (daemon binary;
//! default the `corral` cargo built with this bench).

mod support;

use corral::api::{self, tools_client::ToolsClient};
use std::collections::HashSet;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};
use support::{Daemon, env_usize, fail, load_average, median, ms, ripgrep};
use tonic::transport::Channel;

const LIMIT: u64 = 2000;
const PATTERNS: [(&str, &str); 2] = [("literal", "deprecated"), ("regex", r"[A-Z][a-z]+Error\b")];

#[derive(Clone, Copy)]
enum Cmd {
    Corral,
    RgSorted,
    RgUnsorted,
}

impl Cmd {
    const ALL: [Cmd; 3] = [Cmd::Corral, Cmd::RgSorted, Cmd::RgUnsorted];

    fn label(self) -> &'static str {
        match self {
            Cmd::Corral => "corral GrepFiles (gRPC, limit 2000)",
            Cmd::RgSorted => "`rg -l --sortr=modified`",
            Cmd::RgUnsorted => "`rg -l`",
        }
    }
}

/// The result of one run: its wall time and the paths it listed.
struct Run {
    took: Duration,
    paths: Vec<String>,
    truncated: bool,
}

struct Bench {
    tools: ToolsClient<Channel>,
    session: String,
    rg: PathBuf,
    tree: PathBuf,
}

impl Bench {
    async fn once(&mut self, cmd: Cmd, pattern: &str) -> Run {
        match cmd {
            Cmd::Corral => {
                let req = api::GrepFilesRequest {
                    session_id: self.session.clone(),
                    pattern: pattern.to_string(),
                    limit: Some(LIMIT),
                    ..Default::default()
                };
                let start = Instant::now();
                let r = self
                    .tools
                    .grep_files(req)
                    .await
                    .unwrap_or_else(|s| panic!("grep_files: {s:?}"))
                    .into_inner();
                let took = start.elapsed();
                Run {
                    took,
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
                let start = Instant::now();
                let out = c.output().expect("run rg");
                let took = start.elapsed();
                assert!(
                    matches!(out.status.code(), Some(0 | 1)),
                    "rg failed: {:?}",
                    out.status
                );
                Run {
                    took,
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
    let daemon = Daemon::start().await.unwrap_or_else(|e| panic!("{e}"));
    // A read-only session in the tree, with our PATH and no HOME.
    let mut req = support::session_request(&tree, api::SandboxMode::ReadOnly);
    req.env.remove("HOME");
    let session = daemon
        .open_session(req)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut bench = Bench {
        tools: ToolsClient::new(daemon.channel().await.expect("connect")),
        session,
        rg: rg.clone(),
        tree: tree.clone(),
    };
    println!(
        "grep: tree {}; {rg_version} ({}); {runs} measured runs per command after {warmup} \
         warm-up rounds, interleaved; {} CPUs",
        tree.display(),
        rg.display(),
        support::cpus()
    );

    for (kind, pattern) in PATTERNS {
        let load_before = load_average();
        for _ in 0..warmup {
            for cmd in Cmd::ALL {
                bench.once(cmd, pattern).await;
            }
        }
        let mut times: Vec<Vec<Duration>> = vec![Vec::with_capacity(runs); Cmd::ALL.len()];
        let mut last: Vec<Option<Run>> = (0..Cmd::ALL.len()).map(|_| None).collect();
        for i in 0..runs {
            for k in 0..Cmd::ALL.len() {
                let j = (i + k) % Cmd::ALL.len();
                let run = bench.once(Cmd::ALL[j], pattern).await;
                times[j].push(run.took);
                last[j] = Some(run);
            }
        }
        let load_after = load_average();
        for t in &mut times {
            t.sort();
        }
        let corral_med = median(&times[0]);
        let corral_min = times[0][0];
        println!();
        println!("### {kind} `{pattern}` (load average {load_before} -> {load_after})");
        println!();
        println!(
            "| command | median ms | min ms | max ms | corral ÷ this (median) | corral ÷ this (min) |"
        );
        println!("|---|---:|---:|---:|---:|---:|");
        for (cmd, t) in Cmd::ALL.iter().zip(&times) {
            println!(
                "| {} | {:.1} | {:.1} | {:.1} | {:.2}× | {:.2}× |",
                cmd.label(),
                ms(median(t)),
                ms(t[0]),
                ms(t[t.len() - 1]),
                ms(corral_med) / ms(median(t)),
                ms(corral_min) / ms(t[0]),
            );
        }
        let vs_sorted = ms(corral_med) / ms(median(&times[1]));
        let vs_unsorted = ms(corral_med) / ms(median(&times[2]));
        println!();
        println!(
            "goals (medians): corral <= 0.45x `rg -l --sortr=modified`: {vs_sorted:.2}x ({}); \
             corral <= 1.05x `rg -l`: {vs_unsorted:.2}x ({})",
            if vs_sorted <= 0.45 { "met" } else { "NOT met" },
            if vs_unsorted <= 1.05 {
                "met"
            } else {
                "NOT met"
            },
        );
        let corral = last[0].as_ref().expect("corral ran");
        let rg_all = &last[2].as_ref().expect("rg ran").paths;
        println!("check: {}", check(corral, rg_all));
    }
    drop(daemon);
}
