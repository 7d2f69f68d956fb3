//! apply_patch against `git apply`: one change of 100 hunks to a 10 000-line file.
//!
//! `cargo bench --bench apply_patch` (harness = false: `cargo test` never runs it). One run
//! generates (deterministically) a 10 000-line Rust-like source file and a change of 100 hunks
//! spread through it (3 lines of context before and after, 1–3 lines removed, 1–4 added),
//! expresses the change as a Codex patch and as a unified diff, checks that every engine turns the
//! file into the same bytes, then measures, interleaved round-robin so load drift hits every
//! variant alike, each on a fresh copy of the file (rewritten, untimed, before every repetition):
//!
//! - corral in-process: `corral::tools::apply_patch::apply_patch(patch, &ctx)`, the engine the
//!   worker runs (parse, verify, sandbox-rule checks, temp file + fsync + rename, unified diff);
//! - corral over gRPC: the typed `ApplyPatch` RPC in a workspace-write session over the Unix
//!   socket (session opened and channel connected beforehand; daemon ↔ worker IPC included);
//! - `git apply change.diff`, spawned in the file's directory (outside any repository), process
//!   spawn included;
//! - for context: `parse_patch` alone; the per-file unified diff corral returns (`similar`,
//!   context radius 1) alone; writing the result through a temp file and rename with and without
//!   `fsync` (corral fsyncs, `git apply` does not); and `git --version` (the cost of spawning git).
//!
//! Environment: `CORRAL_BENCH_N` (measured repetitions, default 200), `CORRAL_BENCH_WARMUP`
//! (default 20), `CORRAL_BIN` (daemon binary; default the `corral` cargo built with this bench),
//! `CORRAL_BENCH_NO_DAEMON=1` (skip the gRPC variant), `CORRAL_BENCH_DIR` (where the work
//! directories live, default `$TMPDIR` or /tmp; e.g. /dev/shm to take the disk's `fsync` out).

mod support;

use corral::api::{self, tools_client::ToolsClient};
use corral::tools::apply_patch::{PatchContext, apply_patch, parse_patch};
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::{Daemon, env_usize, fail, load_average, pct, us};
use tonic::transport::Channel;

const LINES: usize = 10_000;
const HUNKS: usize = 100;
const CONTEXT: usize = 3;
const FILE: &str = "engine.rs";

// ---------------------------------------------------------------------------------------------
// The workload.

/// A tiny deterministic generator (SplitMix64): the workload is the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// `LINES` lines of Rust-like source: 12-line functions, every one naming its own index, so any
/// run of a few lines is unique in the file.
fn source_lines() -> Vec<String> {
    let mut lines = Vec::with_capacity(LINES);
    let mut n = 0usize;
    while lines.len() < LINES {
        let body = [
            format!(
                "/// Folds the input for item {n}, skipping {} values.",
                n % 7
            ),
            format!("pub fn item_{n}(input: &[u32]) -> u32 {{"),
            format!(
                "    let mut acc_{n}: u32 = {};",
                n * 2_654_435_761 % 1_000_003
            ),
            format!("    for value in input.iter().skip({}) {{", n % 7),
            format!("        acc_{n} = acc_{n}.wrapping_mul(31).wrapping_add(*value ^ {n});"),
            "    }".to_string(),
            format!("    if acc_{n} % 3 == 0 {{"),
            format!("        return acc_{n} / 3;"),
            "    }".to_string(),
            format!("    acc_{n}"),
            "}".to_string(),
            String::new(),
        ];
        for line in body {
            if lines.len() < LINES {
                lines.push(line);
            }
        }
        n += 1;
    }
    lines
}

/// One hunk: `old[start..start + removed]` replaced by `added`, with `CONTEXT` lines around.
struct Hunk {
    start: usize,
    removed: usize,
    added: Vec<String>,
}

/// `HUNKS` hunks, one in each `LINES / HUNKS`-line band, at a random offset inside it.
fn hunks() -> Vec<Hunk> {
    let mut rng = Rng(0x00C0_22A1_u64);
    let band = LINES / HUNKS;
    (0..HUNKS)
        .map(|h| {
            let start =
                h * band + CONTEXT + 1 + rng.below((band - 2 * CONTEXT - 8) as u64) as usize;
            let removed = 1 + rng.below(3) as usize;
            let added = (0..1 + rng.below(4))
                .map(|k| match k {
                    0 => format!("    // hunk {h}: checked arithmetic from here on"),
                    1 => format!("    let guard_{h} = input.len().min({});", 64 + h),
                    2 => format!("    debug_assert!(guard_{h} <= {});", 64 + h),
                    _ => format!("    tracing::trace!(hunk = {h}, \"folded\");"),
                })
                .collect();
            Hunk {
                start,
                removed,
                added,
            }
        })
        .collect()
}

fn joined(lines: &[String]) -> String {
    let mut s = String::with_capacity(lines.iter().map(|l| l.len() + 1).sum());
    for l in lines {
        s.push_str(l);
        s.push('\n');
    }
    s
}

/// The file after the change.
fn expected(old: &[String], hunks: &[Hunk]) -> Vec<String> {
    let mut new = Vec::with_capacity(old.len() + hunks.len() * 2);
    let mut at = 0;
    for h in hunks {
        new.extend_from_slice(&old[at..h.start]);
        new.extend(h.added.iter().cloned());
        at = h.start + h.removed;
    }
    new.extend_from_slice(&old[at..]);
    new
}

/// The change as a Codex patch: one Update hunk, one `@@` chunk per hunk.
fn codex_patch(old: &[String], hunks: &[Hunk]) -> String {
    let mut p = format!("*** Begin Patch\n*** Update File: {FILE}\n");
    for h in hunks {
        p.push_str("@@\n");
        for l in &old[h.start - CONTEXT..h.start] {
            let _ = writeln!(p, " {l}");
        }
        for l in &old[h.start..h.start + h.removed] {
            let _ = writeln!(p, "-{l}");
        }
        for l in &h.added {
            let _ = writeln!(p, "+{l}");
        }
        for l in &old[h.start + h.removed..h.start + h.removed + CONTEXT] {
            let _ = writeln!(p, " {l}");
        }
    }
    p.push_str("*** End Patch\n");
    p
}

/// The same change as a git-style unified diff.
fn unified_diff(old: &[String], hunks: &[Hunk]) -> String {
    let mut p = format!("diff --git a/{FILE} b/{FILE}\n--- a/{FILE}\n+++ b/{FILE}\n");
    let mut delta: isize = 0;
    for h in hunks {
        let old_start = h.start - CONTEXT + 1;
        let old_len = 2 * CONTEXT + h.removed;
        let new_len = 2 * CONTEXT + h.added.len();
        let new_start = old_start as isize + delta;
        let _ = writeln!(p, "@@ -{old_start},{old_len} +{new_start},{new_len} @@");
        for l in &old[h.start - CONTEXT..h.start] {
            let _ = writeln!(p, " {l}");
        }
        for l in &old[h.start..h.start + h.removed] {
            let _ = writeln!(p, "-{l}");
        }
        for l in &h.added {
            let _ = writeln!(p, "+{l}");
        }
        for l in &old[h.start + h.removed..h.start + h.removed + CONTEXT] {
            let _ = writeln!(p, " {l}");
        }
        delta += h.added.len() as isize - h.removed as isize;
    }
    p
}

// ---------------------------------------------------------------------------------------------
// Measurement.

/// The file system type of `path` (from `stat -f`), for the report.
fn fs_type(path: &Path) -> String {
    Command::new("stat")
        .args(["-f", "-c", "%T"])
        .arg(path)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "?".into())
}

#[derive(Clone, Copy, PartialEq)]
enum Variant {
    CorralModel,
    CorralInProcess,
    CorralGrpc,
    GitApply,
    ParseOnly,
    DiffOnly,
    WriteFsync,
    WriteNoFsync,
    GitVersion,
}

impl Variant {
    fn label(self) -> &'static str {
        match self {
            Variant::CorralModel => {
                "(a) corral apply_patch for the model (Invoke's path: no diffs), in-process"
            }
            Variant::CorralInProcess => {
                "(a2) corral apply_patch with per-file diffs (typed RPC's path), in-process"
            }
            Variant::CorralGrpc => "(b) corral ApplyPatch RPC (daemon + worker)",
            Variant::GitApply => "(c) git apply change.diff (spawned)",
            Variant::ParseOnly => "(ctx) corral parse_patch only",
            Variant::DiffOnly => "(ctx) similar unified diff old → new (radius 1), in memory",
            Variant::WriteFsync => "(ctx) temp file + write + fsync + rename (corral's commit)",
            Variant::WriteNoFsync => "(ctx) temp file + write + rename, no fsync",
            Variant::GitVersion => "(ctx) git --version (spawn floor)",
        }
    }
}

/// A directory holding one copy of the file, outside any git repository.
struct Workdir {
    dir: tempfile::TempDir,
    /// Canonical form (the writable root of the in-process context).
    canonical: PathBuf,
}

impl Workdir {
    fn new() -> Workdir {
        let base = std::env::var_os("CORRAL_BENCH_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        let dir = tempfile::Builder::new()
            .prefix("corral-bench-apply-patch-")
            .tempdir_in(&base)
            .unwrap_or_else(|e| fail(&format!("tempdir in {}: {e}", base.display())));
        let canonical = dir.path().canonicalize().expect("canonicalize");
        Workdir { dir, canonical }
    }

    fn file(&self) -> PathBuf {
        self.canonical.join(FILE)
    }

    fn reset(&self, original: &str) {
        std::fs::write(self.file(), original).expect("write original");
    }

    fn check(&self, want: &str, who: &str) {
        let got = std::fs::read_to_string(self.file()).expect("read result");
        if got != want {
            let at = got
                .lines()
                .zip(want.lines())
                .position(|(a, b)| a != b)
                .unwrap_or(got.lines().count().min(want.lines().count()));
            fail(&format!(
                "{who} produced a different file ({} vs {} bytes; first differing line {})",
                got.len(),
                want.len(),
                at + 1
            ));
        }
    }
}

struct Bench {
    original: String,
    want: String,
    patch: String,
    diff_path: PathBuf,
    local: Workdir,
    ctx: PatchContext,
    git: Workdir,
    /// Set `GIT_CEILING_DIRECTORIES` so git never finds a repository above the work directory.
    git_ceiling: PathBuf,
    grpc: Option<(ToolsClient<Channel>, String, Workdir)>,
    /// For the write-only context variants.
    scratch: Workdir,
}

impl Bench {
    fn git_cmd(&self) -> Command {
        let mut c = Command::new("git");
        c.current_dir(&self.git.canonical)
            .env("GIT_CEILING_DIRECTORIES", &self.git_ceiling)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        c
    }

    /// One timed run of `v` on a fresh copy; the result is checked (untimed) afterwards.
    async fn once(&mut self, v: Variant) -> Duration {
        match v {
            Variant::CorralModel | Variant::CorralInProcess => {
                self.local.reset(&self.original);
                let start = Instant::now();
                let r = if v == Variant::CorralModel {
                    corral::tools::apply_patch::apply_patch_for_model(&self.patch, &self.ctx)
                } else {
                    apply_patch(&self.patch, &self.ctx)
                };
                let took = start.elapsed();
                if let Err(e) = r {
                    fail(&format!("in-process apply_patch failed: {e:?}"));
                }
                self.local.check(&self.want, v.label());
                took
            }
            Variant::CorralGrpc => {
                let (tools, session, dir) = self.grpc.as_mut().expect("daemon");
                dir.reset(&self.original);
                let req = api::ApplyPatchRequest {
                    session_id: session.clone(),
                    patch: self.patch.clone(),
                };
                let start = Instant::now();
                let r = tools.apply_patch(req).await;
                let took = start.elapsed();
                match r {
                    Ok(resp) => assert_eq!(resp.into_inner().changes.len(), 1),
                    Err(s) => fail(&format!("ApplyPatch RPC failed: {s:?}")),
                }
                dir.check(&self.want, v.label());
                took
            }
            Variant::GitApply => {
                self.git.reset(&self.original);
                let mut cmd = self.git_cmd();
                cmd.arg("apply").arg(&self.diff_path);
                let start = Instant::now();
                let out = cmd.output().expect("spawn git");
                let took = start.elapsed();
                if !out.status.success() {
                    fail(&format!(
                        "git apply failed ({}): {}",
                        out.status,
                        String::from_utf8_lossy(&out.stderr)
                    ));
                }
                self.git.check(&self.want, v.label());
                took
            }
            Variant::ParseOnly => {
                let start = Instant::now();
                let p = parse_patch(&self.patch);
                let took = start.elapsed();
                assert!(p.is_ok_and(|p| p.hunks.len() == 1));
                took
            }
            Variant::DiffOnly => {
                let start = Instant::now();
                let d = similar::TextDiff::from_lines(self.original.as_str(), self.want.as_str())
                    .unified_diff()
                    .context_radius(1)
                    .to_string();
                let took = start.elapsed();
                assert!(!d.is_empty());
                took
            }
            Variant::WriteFsync | Variant::WriteNoFsync => {
                self.scratch.reset(&self.original);
                let target = self.scratch.file();
                let start = Instant::now();
                let mut tmp = tempfile::Builder::new()
                    .prefix(".engine.rs.")
                    .tempfile_in(&self.scratch.canonical)
                    .expect("temp file");
                tmp.write_all(self.want.as_bytes()).expect("write");
                if v == Variant::WriteFsync {
                    tmp.as_file().sync_all().expect("fsync");
                }
                tmp.persist(&target).expect("rename");
                let took = start.elapsed();
                self.scratch.check(&self.want, v.label());
                took
            }
            Variant::GitVersion => {
                let mut cmd = self.git_cmd();
                cmd.arg("--version");
                let start = Instant::now();
                let out = cmd.output().expect("spawn git");
                let took = start.elapsed();
                assert!(out.status.success());
                took
            }
        }
    }
}

fn main() {
    let n = env_usize("CORRAL_BENCH_N", 200).max(1);
    let warmup = env_usize("CORRAL_BENCH_WARMUP", 20);
    let use_daemon = std::env::var_os("CORRAL_BENCH_NO_DAEMON").is_none_or(|v| v.is_empty());
    support::block_on(async_main(n, warmup, use_daemon));
}

async fn async_main(n: usize, warmup: usize, use_daemon: bool) {
    let git_version = Command::new("git")
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| fail("git not found on PATH"));

    // The workload.
    let old = source_lines();
    let hs = hunks();
    let new = expected(&old, &hs);
    let original = joined(&old);
    let want = joined(&new);
    let patch = codex_patch(&old, &hs);
    let diff = unified_diff(&old, &hs);
    let removed: usize = hs.iter().map(|h| h.removed).sum();
    let added: usize = hs.iter().map(|h| h.added.len()).sum();

    let inputs = tempfile::Builder::new()
        .prefix("corral-bench-apply-patch-inputs-")
        .tempdir()
        .expect("tempdir");
    let diff_path = inputs.path().join("change.diff");
    std::fs::write(&diff_path, &diff).expect("write diff");
    std::fs::write(inputs.path().join("change.patch"), &patch).expect("write patch");

    let local = Workdir::new();
    let ctx = PatchContext {
        cwd: local.canonical.clone(),
        writable_roots: vec![local.canonical.clone()],
        read_only: false,
        protected_names: vec![".git".into(), ".codex".into(), ".agents".into()],
        protected_paths: Vec::new(),
    };
    let git = Workdir::new();
    let git_ceiling = git
        .canonical
        .parent()
        .expect("tempdir has a parent")
        .to_path_buf();

    let daemon = if use_daemon {
        Some(Daemon::start().await.unwrap_or_else(|e| fail(&e)))
    } else {
        None
    };
    let grpc = match &daemon {
        Some(d) => {
            let dir = Workdir::new();
            let req = support::session_request(dir.dir.path(), api::SandboxMode::WorkspaceWrite);
            let session = d.open_session(req).await.unwrap_or_else(|e| fail(&e));
            let tools = ToolsClient::new(d.channel().await.expect("connect"));
            Some((tools, session, dir))
        }
        None => None,
    };

    let mut bench = Bench {
        original,
        want,
        patch,
        diff_path,
        local,
        ctx,
        git,
        git_ceiling,
        grpc,
        scratch: Workdir::new(),
    };

    let mut variants = vec![Variant::CorralModel, Variant::CorralInProcess];
    if bench.grpc.is_some() {
        variants.push(Variant::CorralGrpc);
    }
    variants.extend([
        Variant::GitApply,
        Variant::ParseOnly,
        Variant::DiffOnly,
        Variant::WriteFsync,
        Variant::WriteNoFsync,
        Variant::GitVersion,
    ]);

    // Correctness first: every engine must produce exactly the expected bytes (checked inside
    // `once`, and again on every measured repetition).
    for &v in &variants {
        bench.once(v).await;
    }

    let load_before = load_average();
    for _ in 0..warmup {
        for &v in &variants {
            bench.once(v).await;
        }
    }
    let mut samples: Vec<Vec<Duration>> = vec![Vec::with_capacity(n); variants.len()];
    let started = Instant::now();
    for i in 0..n {
        for k in 0..variants.len() {
            let j = (i + k) % variants.len();
            let d = bench.once(variants[j]).await;
            samples[j].push(d);
        }
    }
    let elapsed = started.elapsed();
    let load_after = load_average();
    for s in &mut samples {
        s.sort();
    }

    let git_idx = variants
        .iter()
        .position(|&v| v == Variant::GitApply)
        .expect("git variant");
    let (g50, g90) = (pct(&samples[git_idx], 0.5), pct(&samples[git_idx], 0.9));

    println!();
    println!(
        "apply_patch vs git apply: {LINES}-line file ({} bytes), {HUNKS} hunks \
         ({removed} lines removed, {added} added, {CONTEXT} context lines each side); \
         Codex patch {} bytes, unified diff {} bytes",
        bench.original.len(),
        bench.patch.len(),
        diff.len()
    );
    println!(
        "all engines produced byte-identical results ({} bytes); N={n} per variant after {warmup} \
         warm-up rounds, interleaved, fresh copy each time; work dirs on {} ({}); {:.1} s; \
         load average {load_before} -> {load_after}; {} CPUs; {git_version}",
        bench.want.len(),
        bench
            .local
            .canonical
            .parent()
            .unwrap_or(Path::new("/"))
            .display(),
        fs_type(&bench.local.canonical),
        elapsed.as_secs_f64(),
        support::cpus()
    );
    if !use_daemon {
        println!("(CORRAL_BENCH_NO_DAEMON set: gRPC variant skipped)");
    }
    println!();
    println!("| variant | p50 µs | p90 µs | p99 µs | min µs | p50 ÷ git apply | p90 ÷ git apply |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (v, s) in variants.iter().zip(&samples) {
        let (p50, p90, p99) = (pct(s, 0.5), pct(s, 0.9), pct(s, 0.99));
        println!(
            "| {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2}× | {:.2}× |",
            v.label(),
            us(p50),
            us(p90),
            us(p99),
            us(s[0]),
            us(p50) / us(g50),
            us(p90) / us(g90),
        );
    }
    println!();
    let ratio = |v: Variant| {
        variants
            .iter()
            .position(|&x| x == v)
            .map(|i| us(pct(&samples[i], 0.5)) / us(g50))
    };
    let verdict = |r: f64| if r <= 1.0 { "met" } else { "NOT met" };
    if let Some(r) = ratio(Variant::CorralModel) {
        println!(
            "goal: p50 of corral <= 1.0x git apply: in-process, model path {r:.2}x ({})",
            verdict(r)
        );
    }
    if let Some(r) = ratio(Variant::CorralInProcess) {
        println!("in-process with diffs (typed RPC path): {r:.2}x");
    }
    if let Some(r) = ratio(Variant::CorralGrpc) {
        println!(
            "goal: p50 of corral <= 1.0x git apply: over gRPC {r:.2}x ({})",
            verdict(r)
        );
    }
    if let Some(spawn) = variants.iter().position(|&v| v == Variant::GitVersion) {
        let floor = pct(&samples[spawn], 0.5);
        println!(
            "git apply minus its spawn floor (p50 git apply - p50 git --version): {:.0} µs",
            us(g50) - us(floor)
        );
    }
    drop(bench);
    drop(daemon);
}
