//! Growth curves: how latency and memory change as one quantity grows by decades, against one
//! real daemon per curve (issue 13).
//!
//! `cargo bench --bench growth -- sessions|workers|grep|output|all` (harness = false: `cargo test`
//! never runs it). Each curve prints a markdown table and writes `docs/growth-<curve>.csv` and
//! `docs/growth-<curve>.svg` (log x axis).
//!
//! - `sessions`: N = 1 … 10 000 open sessions of one policy (read-only, one cwd), so they share
//!   one sandbox worker. At each N: `OpenSession` (each followed by an untimed `CloseSession`, so N
//!   stays put) and `ReadFile` on a random open session, p50/p99; daemon RSS, worker RSS, daemon
//!   fds.
//! - `workers`: N = 1 … 1 000 distinct policies (read-only, one cwd each, so each session gets its
//!   own worker; `--writable`: workspace-write, whose workers each hold an inotify instance and so
//!   meet fs.inotify.max_user_instances). At each N: `ReadFile` on a random existing worker, and the `OpenSession`
//!   that starts one more worker (the last up to 20 opens before N), p50/p99; daemon RSS, the sum of
//!   PSS and of RSS of everything below the daemon, fds. Stops early, saying so, if the memory the
//!   next step would take (measured per worker so far) exceeds `--max-memory` (default 8 GiB, at
//!   most half of MemAvailable).
//! - `grep`: trees of 1k … 1M small files (one nested tree under `target/growth-tree`, the smaller
//!   ones are its subtrees; generated once, reused, removed at the end unless `--keep-tree`);
//!   `GrepFiles` of a literal in 0.1 % of the files vs `rg -l` on the same subtree, interleaved;
//!   peak worker RSS.
//! - `output`: `sh -c 'head -c SIZE /dev/zero | tr "\0" a'` for 1 KB … 1 GB through `Shell`
//!   (typed, head + tail capture) and `ShellStream` (every byte streamed), against the same
//!   pipeline spawned by the bench itself; latency, throughput, peak daemon and worker RSS.
//!
//! The daemon's config raises the global and per-user session caps to 20 000 and the per-user
//! worker cap to 2 000 (defaults 1 024, 64 and 16); everything else is the default.
//!
//! Flags (after the curve): `--points 1,10,100` (the x values), `--samples 300` (calls per point
//! for sessions/workers), `--runs 5` (grep and output runs per point), `--keep-tree`,
//! `--max-memory 8` (GiB), `--writable` (workers curve in workspace-write). Environment: `CORRAL_BIN`, `CORRAL_RG` (ripgrep for `grep`).

mod support;

use corral::api::{
    self, SandboxMode, sessions_client::SessionsClient, shell_stream_event::Event,
    tools_client::ToolsClient,
};
use std::fmt::Write as _;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::plot::{Chart, Panel, Series};
use support::procfs::{PeakSampler, descendants, mib, pss_bytes, rss_bytes, sample};
use support::{Daemon, fail, load_average, median, ms, pct, us};
use tonic::transport::Channel;

const CONFIG: &str = "\
max_sessions = 20000

[policy.default]
max_sessions = 20000
max_workers = 2000
max_concurrent_commands = 64
";

/// A curve's table: printed as markdown, written as CSV, and plotted.
struct Table {
    curve: &'static str,
    /// (markdown header, CSV column, decimals)
    columns: Vec<(&'static str, &'static str, usize)>,
    rows: Vec<Vec<f64>>,
}

impl Table {
    fn new(curve: &'static str, columns: Vec<(&'static str, &'static str, usize)>) -> Table {
        Table {
            curve,
            columns,
            rows: Vec::new(),
        }
    }

    fn push(&mut self, row: Vec<f64>) {
        assert_eq!(row.len(), self.columns.len());
        let line: Vec<String> = row
            .iter()
            .zip(&self.columns)
            .map(|(v, (_, _, d))| format!("{v:.*}", *d))
            .collect();
        // Each row as it is measured, so a long run shows progress.
        eprintln!("  {}: {}", self.curve, line.join(" | "));
        self.rows.push(row);
    }

    fn column(&self, csv: &str) -> Vec<f64> {
        let i = self
            .columns
            .iter()
            .position(|c| c.1 == csv)
            .unwrap_or_else(|| panic!("no column {csv}"));
        self.rows.iter().map(|r| r[i]).collect()
    }

    /// (x, column) pairs for a series.
    fn series(&self, name: &str, csv: &str) -> Series {
        let x = self.column(self.columns[0].1);
        Series::new(name, x.into_iter().zip(self.column(csv)).collect())
    }

    fn markdown(&self) -> String {
        let mut s = String::new();
        let heads: Vec<&str> = self.columns.iter().map(|c| c.0).collect();
        let _ = writeln!(s, "| {} |", heads.join(" | "));
        let _ = writeln!(s, "|{}", "---:|".repeat(heads.len()));
        for r in &self.rows {
            let cells: Vec<String> = r
                .iter()
                .zip(&self.columns)
                .map(|(v, (_, _, d))| format!("{v:.*}", *d))
                .collect();
            let _ = writeln!(s, "| {} |", cells.join(" | "));
        }
        s
    }

    fn csv(&self) -> String {
        let mut s = String::new();
        let heads: Vec<&str> = self.columns.iter().map(|c| c.1).collect();
        let _ = writeln!(s, "{}", heads.join(","));
        for r in &self.rows {
            let cells: Vec<String> = r.iter().map(|v| format!("{v}")).collect();
            let _ = writeln!(s, "{}", cells.join(","));
        }
        s
    }

    /// Prints the table and writes docs/growth-<curve>.{csv,svg}.
    fn emit(&self, chart: Chart, notes: &[String]) {
        println!("\n{}", self.markdown());
        for n in notes {
            println!("{n}");
        }
        let docs = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs");
        let base = docs.join(format!("growth-{}", self.curve));
        std::fs::write(base.with_extension("csv"), self.csv()).expect("write csv");
        std::fs::write(base.with_extension("svg"), chart.svg()).expect("write svg");
        println!(
            "wrote docs/growth-{0}.csv and docs/growth-{0}.svg; load average {1}",
            self.curve,
            load_average()
        );
    }
}

fn sorted(mut v: Vec<Duration>) -> Vec<Duration> {
    v.sort();
    v
}

/// xorshift64: a fixed, cheap sequence for picking sessions.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

struct Conn {
    sessions: SessionsClient<Channel>,
    tools: ToolsClient<Channel>,
}

impl Conn {
    async fn new(daemon: &Daemon) -> Conn {
        let channel = daemon.channel().await.unwrap_or_else(|e| fail(&e));
        Conn {
            sessions: SessionsClient::new(channel.clone()),
            tools: ToolsClient::new(channel),
        }
    }

    async fn open(&mut self, daemon: &Daemon, req: api::OpenSessionRequest) -> String {
        self.sessions
            .open_session(req)
            .await
            .unwrap_or_else(|s| fail(&format!("open_session: {s:?}\nlog:\n{}", daemon.log_text())))
            .into_inner()
            .session_id
    }

    async fn try_open(&mut self, req: api::OpenSessionRequest) -> Result<String, tonic::Status> {
        Ok(self
            .sessions
            .open_session(req)
            .await?
            .into_inner()
            .session_id)
    }

    async fn close(&mut self, id: String) {
        self.sessions
            .close_session(api::CloseSessionRequest { session_id: id })
            .await
            .unwrap_or_else(|s| fail(&format!("close_session: {s:?}")));
    }

    async fn read(&mut self, session: &str, file: &str) -> Duration {
        let t = Instant::now();
        let r = self
            .tools
            .read_file(api::ReadFileRequest {
                session_id: session.into(),
                file_path: file.into(),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|s| fail(&format!("read_file: {s:?}")))
            .into_inner();
        let d = t.elapsed();
        if r.lines.len() != FILE_LINES {
            fail(&format!("read_file: {} lines", r.lines.len()));
        }
        d
    }
}

const FILE_LINES: usize = 40;

fn write_small_file(path: &Path) {
    let mut text = String::new();
    for l in 0..FILE_LINES {
        let _ = writeln!(
            text,
            "line {l}: the quick brown fox jumps over the lazy dog"
        );
    }
    std::fs::write(path, text).expect("write file");
}

async fn sessions(args: &Args) {
    let points = args
        .points
        .clone()
        .unwrap_or(vec![1, 10, 100, 1000, 10_000]);
    let daemon = Daemon::start_with_config(Some(CONFIG))
        .await
        .unwrap_or_else(|e| fail(&e));
    let pid = daemon.pid() as i32;
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    write_small_file(&dir.path().join("f.txt"));
    let req = support::session_request(dir.path(), SandboxMode::ReadOnly);
    let mut c = Conn::new(&daemon).await;
    println!(
        "growth sessions: points {points:?}, {} calls per point, load average {}",
        args.samples,
        load_average()
    );
    let mut t = Table::new(
        "sessions",
        vec![
            ("open sessions", "sessions", 0),
            ("OpenSession p50 µs", "open_p50_us", 0),
            ("OpenSession p99 µs", "open_p99_us", 0),
            ("ReadFile p50 µs", "read_p50_us", 0),
            ("ReadFile p99 µs", "read_p99_us", 0),
            ("daemon RSS MiB", "daemon_rss_mib", 1),
            ("worker RSS MiB", "worker_rss_mib", 1),
            ("workers", "workers", 0),
            ("daemon fds", "daemon_fds", 0),
            ("opening rate /s (to reach N)", "fill_rate_per_s", 0),
        ],
    );
    let mut ids: Vec<String> = Vec::new();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for &n in &points {
        let fill = Instant::now();
        let before = ids.len();
        while ids.len() < n {
            ids.push(c.open(&daemon, req.clone()).await);
        }
        let rate = (n - before) as f64 / fill.elapsed().as_secs_f64();
        let mut open = Vec::new();
        let mut read = Vec::new();
        for _ in 0..args.samples {
            let s = Instant::now();
            let extra = c.open(&daemon, req.clone()).await;
            open.push(s.elapsed());
            c.close(extra).await;
            let id = ids[rng.below(ids.len())].clone();
            read.push(c.read(&id, "f.txt").await);
        }
        let (open, read) = (sorted(open), sorted(read));
        let s = sample(pid);
        t.push(vec![
            n as f64,
            us(pct(&open, 0.5)),
            us(pct(&open, 0.99)),
            us(pct(&read, 0.5)),
            us(pct(&read, 0.99)),
            mib(s.daemon_rss),
            mib(s.workers_rss),
            s.workers as f64,
            s.daemon_fds as f64,
            rate,
        ]);
    }
    let rss = t.column("daemon_rss_mib");
    let mut notes = Vec::new();
    if points.len() > 1 {
        let (n0, n1) = (points[0] as f64, *points.last().unwrap() as f64);
        notes.push(format!(
            "daemon RSS per open session ({n0} → {n1}): {:.2} KiB",
            (rss[rss.len() - 1] - rss[0]) * 1024.0 / (n1 - n0)
        ));
    }
    let chart = Chart {
        title: "corral: open sessions of one policy (one shared worker)".into(),
        x_label: "open sessions".into(),
        log_x: true,
        panels: vec![
            Panel::new(
                "latency (µs)",
                true,
                vec![
                    t.series("OpenSession p50", "open_p50_us"),
                    t.series("OpenSession p99", "open_p99_us"),
                    t.series("ReadFile p50", "read_p50_us"),
                    t.series("ReadFile p99", "read_p99_us"),
                ],
            ),
            Panel::new(
                "RSS (MiB)",
                false,
                vec![
                    t.series("daemon", "daemon_rss_mib"),
                    t.series("worker", "worker_rss_mib"),
                ],
            ),
            Panel::new(
                "daemon file descriptors",
                false,
                vec![t.series("daemon fds", "daemon_fds")],
            ),
        ],
    };
    t.emit(chart, &notes);
}

fn mem_available() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemAvailable:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .unwrap_or(0)
        * 1024
}

async fn workers(args: &Args) {
    let points = args.points.clone().unwrap_or(vec![1, 10, 100, 1000]);
    let daemon = Daemon::start_with_config(Some(CONFIG))
        .await
        .unwrap_or_else(|e| fail(&e));
    let pid = daemon.pid() as i32;
    let root = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let mut c = Conn::new(&daemon).await;
    let bound = args.max_memory.min(mem_available() / 2);
    // Read-only by default: a workspace-write worker holds an inotify instance (the protected-name
    // guard), charged to the uid, and fs.inotify.max_user_instances (128 by default) would end
    // the curve near 128 workers; `--writable` measures that case.
    let mode = if args.writable {
        SandboxMode::WorkspaceWrite
    } else {
        SandboxMode::ReadOnly
    };
    println!(
        "growth workers: points {points:?}, {} sessions, {} calls per point, memory bound {:.1} GiB, load average {}",
        if args.writable {
            "workspace-write"
        } else {
            "read-only"
        },
        args.samples,
        bound as f64 / (1u64 << 30) as f64,
        load_average()
    );
    let mut t = Table::new(
        "workers",
        vec![
            ("workers (distinct policies)", "workers", 0),
            ("ReadFile on an existing worker p50 µs", "read_p50_us", 0),
            ("ReadFile p99 µs", "read_p99_us", 0),
            ("OpenSession + new worker p50 ms", "open_p50_ms", 2),
            ("OpenSession + new worker p99 ms", "open_p99_ms", 2),
            ("daemon RSS MiB", "daemon_rss_mib", 1),
            ("workers Σ PSS MiB", "workers_pss_mib", 1),
            ("workers Σ RSS MiB", "workers_rss_mib", 1),
            ("processes below the daemon", "processes", 0),
            ("daemon fds", "daemon_fds", 0),
            ("workers fds", "workers_fds", 0),
        ],
    );
    let mut ids: Vec<String> = Vec::new();
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let mut notes = Vec::new();
    let mut stopped = None;
    for &n in &points {
        // Memory guard: what the step to n would add, at the highest per-worker figure so far.
        // PSS, not RSS: the workers share the corral binary's and the libraries' pages, which a
        // sum of RSS counts once per worker (the smoke run: 12.7 MiB RSS, 2.1 MiB PSS each).
        if let Some(last) = t.rows.last() {
            let per_worker = last[6] / last[0] * 1024.0 * 1024.0;
            let projected = per_worker * n as f64;
            if projected > bound.min(mem_available() / 2) as f64 {
                let msg = format!(
                    "stopped before {n} workers: {:.2} MiB PSS per worker at {} would make {:.1} GiB, \
                     over the bound of {:.1} GiB (--max-memory, at most half of MemAvailable)",
                    per_worker / 1048576.0,
                    last[0],
                    projected / (1u64 << 30) as f64,
                    bound as f64 / (1u64 << 30) as f64
                );
                println!("{msg}");
                notes.push(msg);
                break;
            }
        }
        let mut open = Vec::new();
        let first_timed = n.saturating_sub(20).max(ids.len());
        while ids.len() < n {
            let cwd = root.path().join(format!("w{}", ids.len()));
            std::fs::create_dir(&cwd).expect("worker dir");
            write_small_file(&cwd.join("f.txt"));
            let req = support::session_request(&cwd, mode);
            let s = Instant::now();
            let id = match c.try_open(req).await {
                Ok(id) => id,
                Err(e) => {
                    stopped = Some(format!(
                        "OpenSession #{} failed, curve stopped at {} workers: {}",
                        ids.len() + 1,
                        ids.len(),
                        e.message()
                    ));
                    break;
                }
            };
            if ids.len() >= first_timed {
                open.push(s.elapsed());
            }
            ids.push(id);
        }
        if let Some(msg) = stopped.take() {
            println!("{msg}");
            notes.push(msg);
            break;
        }
        // A first call on every new worker (maps its code paths) before the timed ones.
        let mut read = Vec::new();
        for i in 0..args.samples {
            let id = ids[rng.below(ids.len())].clone();
            let d = c.read(&id, "f.txt").await;
            if i >= args.samples / 10 {
                read.push(d);
            }
        }
        let (open, read) = (sorted(open), sorted(read));
        let s = sample(pid);
        let below = descendants(pid);
        let pss: u64 = below.iter().map(|p| pss_bytes(*p)).sum();
        let rss: u64 = below.iter().map(|p| rss_bytes(*p)).sum();
        if s.workers != n {
            fail(&format!(
                "{n} sessions of distinct policies but {} workers",
                s.workers
            ));
        }
        t.push(vec![
            n as f64,
            us(pct(&read, 0.5)),
            us(pct(&read, 0.99)),
            ms(pct(&open, 0.5)),
            ms(pct(&open, 0.99)),
            mib(s.daemon_rss),
            mib(pss),
            mib(rss),
            below.len() as f64,
            s.daemon_fds as f64,
            s.workers_fds as f64,
        ]);
    }
    if let (Some(first), Some(last)) = (t.rows.first(), t.rows.last())
        && last[0] > first[0]
    {
        let dn = last[0] - first[0];
        notes.push(format!(
            "per worker ({} → {}): daemon RSS {:.1} KiB, workers PSS {:.2} MiB, RSS {:.2} MiB, \
             {:.1} processes, {:.1} daemon fds, {:.1} worker fds",
            first[0],
            last[0],
            (last[5] - first[5]) * 1024.0 / dn,
            (last[6] - first[6]) / dn,
            (last[7] - first[7]) / dn,
            (last[8] - first[8]) / dn,
            (last[9] - first[9]) / dn,
            (last[10] - first[10]) / dn,
        ));
    }
    let chart = Chart {
        title: "corral: distinct session policies, one sandbox worker each".into(),
        x_label: "workers".into(),
        log_x: true,
        panels: vec![
            Panel::new(
                "latency (µs)",
                true,
                vec![
                    t.series("ReadFile p50", "read_p50_us"),
                    t.series("ReadFile p99", "read_p99_us"),
                    Series::new(
                        "OpenSession+worker p50",
                        t.column("workers")
                            .into_iter()
                            .zip(t.column("open_p50_ms").into_iter().map(|v| v * 1000.0))
                            .collect(),
                    ),
                ],
            ),
            Panel::new(
                "memory (MiB)",
                true,
                vec![
                    t.series("daemon RSS", "daemon_rss_mib"),
                    t.series("workers Σ PSS", "workers_pss_mib"),
                    t.series("workers Σ RSS", "workers_rss_mib"),
                ],
            ),
            Panel::new(
                "file descriptors",
                true,
                vec![
                    t.series("daemon", "daemon_fds"),
                    t.series("workers", "workers_fds"),
                ],
            ),
        ],
    };
    t.emit(chart, &notes);
}

/// The grep trees: file i lives at `a{i/100000}/b{i/10000%10}/c{i/1000%10}/f{i%1000}.txt`, so
/// the first 1k, 10k and 100k files are the subtrees `a0/b0/c0`, `a0/b0` and `a0`.
fn tree_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/growth-tree")
}

fn subtree(n: usize) -> PathBuf {
    let root = tree_root();
    match n {
        1000 => root.join("a0/b0/c0"),
        10_000 => root.join("a0/b0"),
        100_000 => root.join("a0"),
        1_000_000 => root,
        _ => fail(&format!(
            "grep points are 1000, 10000, 100000 or 1000000, not {n}"
        )),
    }
}

/// One file in a thousand holds the needle.
const NEEDLE: &str = "growth_needle_7f3a";

fn free_inodes(path: &Path) -> u64 {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: `c` is a valid C string and `st` a properly sized out-parameter.
    unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c.as_ptr(), &mut st) != 0 {
            return 0;
        }
        st.f_favail as u64
    }
}

/// Creates the files 0..n that are missing (by leaf directory of 1 000; a leaf is complete when
/// its marker, outside the tree so no search sees it, exists).
fn ensure_tree(n: usize) {
    let root = tree_root();
    let marks = root.with_file_name("growth-tree.done");
    std::fs::create_dir_all(&marks).expect("marker dir");
    let missing: Vec<usize> = (0..n / 1000)
        .filter(|leaf| !marks.join(leaf.to_string()).exists())
        .collect();
    if missing.is_empty() {
        return;
    }
    let need = missing.len() as u64 * 1001;
    let free = free_inodes(root.parent().unwrap());
    if free < need + 200_000 {
        fail(&format!(
            "{need} inodes needed for the grep tree but {free} free on {} (df -i)",
            root.parent().unwrap().display()
        ));
    }
    eprintln!(
        "  grep: creating {} files under {} ({free} inodes free)",
        missing.len() * 1000,
        root.display()
    );
    let t = Instant::now();
    for leaf in missing {
        let dir = root.join(format!(
            "a{}/b{}/c{}",
            leaf / 100,
            leaf / 10 % 10,
            leaf % 10
        ));
        std::fs::create_dir_all(&dir).expect("tree dir");
        for f in 0..1000 {
            let i = leaf * 1000 + f;
            let mut text = String::new();
            for l in 0..8 {
                if i % 1000 == 7 && l == 4 {
                    let _ = writeln!(text, "line {l} of file {i}: {NEEDLE} here");
                } else {
                    let _ = writeln!(text, "line {l} of file {i}: lorem ipsum dolor sit amet");
                }
            }
            std::fs::write(dir.join(format!("f{f:03}.txt")), text).expect("tree file");
        }
        std::fs::write(marks.join(leaf.to_string()), "").expect("marker");
    }
    eprintln!("  grep: created in {:.1} s", t.elapsed().as_secs_f64());
}

fn rg_count(rg: &Path, dir: &Path) -> (Duration, usize) {
    let t = Instant::now();
    let out = Command::new(rg)
        .args(["-l", NEEDLE])
        .arg(dir)
        .stderr(Stdio::null())
        .output()
        .unwrap_or_else(|e| fail(&format!("rg: {e}")));
    let d = t.elapsed();
    (
        d,
        out.stdout
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .count(),
    )
}

async fn grep(args: &Args) {
    let points = args
        .points
        .clone()
        .unwrap_or(vec![1000, 10_000, 100_000, 1_000_000]);
    let (rg, rg_version) = support::ripgrep();
    ensure_tree(*points.iter().max().unwrap());
    let daemon = Daemon::start_with_config(Some(CONFIG))
        .await
        .unwrap_or_else(|e| fail(&e));
    let pid = daemon.pid() as i32;
    let mut c = Conn::new(&daemon).await;
    let session = c
        .open(
            &daemon,
            support::session_request(&tree_root(), SandboxMode::ReadOnly),
        )
        .await;
    println!(
        "growth grep: points {points:?}, {} runs per point (+1 warm-up), {rg_version}, load average {}",
        args.runs,
        load_average()
    );
    let mut t = Table::new(
        "grep",
        vec![
            ("files", "files", 0),
            ("GrepFiles p50 ms", "corral_p50_ms", 1),
            ("`rg -l` p50 ms", "rg_p50_ms", 1),
            ("ratio", "ratio", 2),
            ("GrepFiles µs per file", "corral_us_per_file", 2),
            ("matches", "matches", 0),
            ("worker peak RSS MiB", "worker_peak_rss_mib", 1),
            ("daemon peak RSS MiB", "daemon_peak_rss_mib", 1),
        ],
    );
    for &n in &points {
        let dir = subtree(n);
        let expected = n / 1000;
        let mut corral = Vec::new();
        let mut rgt = Vec::new();
        let sampler = PeakSampler::start(pid, Duration::from_millis(20));
        // The 1M-file tree takes seconds per search: fewer runs there.
        let runs = if n >= 1_000_000 {
            args.runs.min(3)
        } else {
            args.runs
        };
        for run in 0..=runs {
            // Alternate which goes first so drift in load hits both alike.
            for k in 0..2 {
                if (run + k) % 2 == 0 {
                    let s = Instant::now();
                    let r = c
                        .tools
                        .grep_files(api::GrepFilesRequest {
                            session_id: session.clone(),
                            pattern: NEEDLE.into(),
                            path: dir.to_string_lossy().into_owned(),
                            limit: Some(2000),
                            ..Default::default()
                        })
                        .await
                        .unwrap_or_else(|s| fail(&format!("grep_files: {s:?}")))
                        .into_inner();
                    let d = s.elapsed();
                    if r.matches.len() != expected {
                        fail(&format!(
                            "grep_files found {} files, expected {expected}",
                            r.matches.len()
                        ));
                    }
                    if run > 0 {
                        corral.push(d);
                    }
                } else {
                    let (d, found) = rg_count(&rg, &dir);
                    if found != expected {
                        fail(&format!("rg found {found} files, expected {expected}"));
                    }
                    if run > 0 {
                        rgt.push(d);
                    }
                }
            }
        }
        let peak = sampler.finish();
        let (corral, rgt) = (sorted(corral), sorted(rgt));
        let (cm, rm) = (median(&corral), median(&rgt));
        t.push(vec![
            n as f64,
            ms(cm),
            ms(rm),
            cm.as_secs_f64() / rm.as_secs_f64(),
            us(cm) / n as f64,
            expected as f64,
            mib(peak.workers_rss),
            mib(peak.daemon_rss),
        ]);
    }
    let chart = Chart {
        title: "corral: GrepFiles (literal, 0.1 % of files match) vs rg -l, by tree size".into(),
        x_label: "files in the tree".into(),
        log_x: true,
        panels: vec![
            Panel::new(
                "median latency (ms)",
                true,
                vec![
                    t.series("GrepFiles", "corral_p50_ms"),
                    t.series("rg -l", "rg_p50_ms"),
                ],
            ),
            Panel::new("GrepFiles / rg -l", false, vec![t.series("ratio", "ratio")]),
            Panel::new(
                "peak RSS (MiB)",
                false,
                vec![
                    t.series("worker", "worker_peak_rss_mib"),
                    t.series("daemon", "daemon_peak_rss_mib"),
                ],
            ),
        ],
    };
    t.emit(chart, &[]);
    drop(daemon);
    if args.keep_tree {
        println!("kept the tree at {} (--keep-tree)", tree_root().display());
    } else {
        let s = Instant::now();
        let _ = std::fs::remove_dir_all(tree_root());
        let _ = std::fs::remove_dir_all(tree_root().with_file_name("growth-tree.done"));
        println!(
            "removed the tree in {:.1} s (--keep-tree keeps it)",
            s.elapsed().as_secs_f64()
        );
    }
}

fn script(size: u64) -> String {
    format!("head -c {size} /dev/zero | tr '\\0' a")
}

fn bare(size: u64) -> Duration {
    let t = Instant::now();
    let mut child = Command::new("sh")
        .args(["-c", &script(size)])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn sh");
    let mut out = child.stdout.take().unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0u64;
    loop {
        match out.read(&mut buf) {
            Ok(0) => break,
            Ok(k) => total += k as u64,
            Err(e) => fail(&format!("read: {e}")),
        }
    }
    child.wait().expect("wait sh");
    let d = t.elapsed();
    if total != size {
        fail(&format!(
            "bare pipeline gave {total} bytes, expected {size}"
        ));
    }
    d
}

fn shell_request(session: &str, size: u64) -> api::ShellRequest {
    api::ShellRequest {
        session_id: session.into(),
        command: vec!["sh".into(), "-c".into(), script(size)],
        timeout_ms: Some(300_000),
        ..Default::default()
    }
}

async fn typed(c: &mut Conn, session: &str, size: u64) -> Duration {
    let t = Instant::now();
    let r = c
        .tools
        .shell(shell_request(session, size))
        .await
        .unwrap_or_else(|s| fail(&format!("shell: {s:?}")))
        .into_inner();
    let d = t.elapsed();
    let out = r.stdout.unwrap_or_default();
    if r.exit_code != 0 || out.total_bytes != size {
        fail(&format!(
            "shell: exit {}, {} bytes, expected {size}",
            r.exit_code, out.total_bytes
        ));
    }
    d
}

async fn streamed(c: &mut Conn, session: &str, size: u64) -> Duration {
    let t = Instant::now();
    let mut stream = c
        .tools
        .shell_stream(shell_request(session, size))
        .await
        .unwrap_or_else(|s| fail(&format!("shell_stream: {s:?}")))
        .into_inner();
    let mut total = 0u64;
    let mut end = None;
    while let Some(ev) = stream
        .message()
        .await
        .unwrap_or_else(|s| fail(&format!("shell_stream: {s:?}")))
    {
        match ev.event {
            Some(Event::Delta(d)) => total += d.data.len() as u64,
            Some(Event::End(r)) => end = Some(r),
            _ => {}
        }
    }
    let d = t.elapsed();
    match end {
        Some(r) if r.exit_code == 0 && total == size => d,
        other => fail(&format!(
            "shell_stream: {total} bytes streamed, expected {size}; end {:?}",
            other.map(|r| r.exit_code)
        )),
    }
}

async fn output(args: &Args) {
    let points: Vec<u64> = args
        .points
        .clone()
        .map_or((3..=9).map(|e| 10u64.pow(e)).collect(), |p| {
            p.into_iter().map(|v| v as u64).collect()
        });
    let daemon = Daemon::start_with_config(Some(CONFIG))
        .await
        .unwrap_or_else(|e| fail(&e));
    let pid = daemon.pid() as i32;
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let mut c = Conn::new(&daemon).await;
    let session = c
        .open(
            &daemon,
            support::session_request(dir.path(), SandboxMode::ReadOnly),
        )
        .await;
    println!(
        "growth output: sizes {points:?}, {} runs per size (+1 warm-up), load average {}",
        args.runs,
        load_average()
    );
    let mut t = Table::new(
        "output",
        vec![
            ("bytes", "bytes", 0),
            ("bare pipeline p50 ms", "bare_p50_ms", 2),
            ("Shell p50 ms", "shell_p50_ms", 2),
            ("ShellStream p50 ms", "stream_p50_ms", 2),
            ("bare MB/s", "bare_mb_s", 1),
            ("Shell MB/s", "shell_mb_s", 1),
            ("ShellStream MB/s", "stream_mb_s", 1),
            ("Shell: daemon peak RSS MiB", "shell_daemon_rss_mib", 1),
            ("Shell: worker peak RSS MiB", "shell_worker_rss_mib", 1),
            (
                "ShellStream: daemon peak RSS MiB",
                "stream_daemon_rss_mib",
                1,
            ),
            (
                "ShellStream: worker peak RSS MiB",
                "stream_worker_rss_mib",
                1,
            ),
        ],
    );
    for &size in &points {
        let mut b = Vec::new();
        let mut s = Vec::new();
        let mut st = Vec::new();
        // Peaks per variant; `below the daemon` includes the command itself (sh, head, tr),
        // which is small and the same for every size.
        let mut typed_peak = support::procfs::Sample::default();
        let mut stream_peak = support::procfs::Sample::default();
        // From 100 MB on a call takes seconds and a warm-up adds nothing: one run, no warm-up.
        let (first, runs) = if size >= 100_000_000 {
            (1, 1)
        } else {
            (0, args.runs)
        };
        for run in first..=runs {
            let d = bare(size);
            if run > 0 {
                b.push(d);
            }
            let sampler = PeakSampler::start(pid, Duration::from_millis(10));
            let d = typed(&mut c, &session, size).await;
            let p = sampler.finish();
            typed_peak.daemon_rss = typed_peak.daemon_rss.max(p.daemon_rss);
            typed_peak.workers_rss = typed_peak.workers_rss.max(p.workers_rss);
            if run > 0 {
                s.push(d);
            }
            let sampler = PeakSampler::start(pid, Duration::from_millis(10));
            let d = streamed(&mut c, &session, size).await;
            let p = sampler.finish();
            stream_peak.daemon_rss = stream_peak.daemon_rss.max(p.daemon_rss);
            stream_peak.workers_rss = stream_peak.workers_rss.max(p.workers_rss);
            if run > 0 {
                st.push(d);
            }
        }
        let (b, s, st) = (median(&sorted(b)), median(&sorted(s)), median(&sorted(st)));
        let mbs = |d: Duration| size as f64 / d.as_secs_f64() / 1e6;
        t.push(vec![
            size as f64,
            ms(b),
            ms(s),
            ms(st),
            mbs(b),
            mbs(s),
            mbs(st),
            mib(typed_peak.daemon_rss),
            mib(typed_peak.workers_rss),
            mib(stream_peak.daemon_rss),
            mib(stream_peak.workers_rss),
        ]);
    }
    let chart = Chart {
        title: "corral: shell output size, typed Shell (head + tail) vs ShellStream (all bytes)"
            .into(),
        x_label: "bytes of output".into(),
        log_x: true,
        panels: vec![
            Panel::new(
                "median latency (ms)",
                true,
                vec![
                    t.series("bare pipeline", "bare_p50_ms"),
                    t.series("Shell", "shell_p50_ms"),
                    t.series("ShellStream", "stream_p50_ms"),
                ],
            ),
            Panel::new(
                "throughput (MB/s)",
                true,
                vec![
                    t.series("bare pipeline", "bare_mb_s"),
                    t.series("Shell", "shell_mb_s"),
                    t.series("ShellStream", "stream_mb_s"),
                ],
            ),
            Panel::new(
                "peak RSS during the call (MiB)",
                false,
                vec![
                    t.series("Shell: daemon", "shell_daemon_rss_mib"),
                    t.series("Shell: below daemon", "shell_worker_rss_mib"),
                    t.series("ShellStream: daemon", "stream_daemon_rss_mib"),
                    t.series("ShellStream: below daemon", "stream_worker_rss_mib"),
                ],
            ),
        ],
    };
    t.emit(chart, &[]);
}

struct Args {
    curves: Vec<&'static str>,
    points: Option<Vec<usize>>,
    samples: usize,
    runs: usize,
    keep_tree: bool,
    max_memory: u64,
    writable: bool,
}

fn args() -> Args {
    let mut a = Args {
        curves: Vec::new(),
        points: None,
        samples: 300,
        runs: 5,
        keep_tree: false,
        max_memory: 8 << 30,
        writable: false,
    };
    let usage = "usage: growth sessions|workers|grep|output|all [--points 1,10,100] [--samples 300] \
                 [--runs 5] [--keep-tree] [--max-memory 8] [--writable]";
    let mut it = std::env::args().skip(1);
    let number = |v: Option<String>, name: &str| -> usize {
        v.and_then(|v| v.parse().ok())
            .unwrap_or_else(|| fail(&format!("{name} takes a number; {usage}")))
    };
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "sessions" => a.curves.push("sessions"),
            "workers" => a.curves.push("workers"),
            "grep" => a.curves.push("grep"),
            "output" => a.curves.push("output"),
            "all" => a.curves = vec!["sessions", "workers", "grep", "output"],
            "--points" => {
                let v = it.next().unwrap_or_default();
                a.points = Some(
                    v.split(',')
                        .map(|n| {
                            n.trim()
                                .parse()
                                .ok()
                                .filter(|n| *n > 0)
                                .unwrap_or_else(|| fail(&format!("bad point {n:?}; {usage}")))
                        })
                        .collect(),
                );
            }
            "--samples" => a.samples = number(it.next(), "--samples").max(10),
            "--runs" => a.runs = number(it.next(), "--runs").max(1),
            "--max-memory" => a.max_memory = (number(it.next(), "--max-memory") as u64) << 30,
            "--keep-tree" => a.keep_tree = true,
            "--writable" => a.writable = true,
            // cargo bench passes --bench to harness = false binaries.
            "--bench" => {}
            other => fail(&format!("unknown argument {other:?}; {usage}")),
        }
    }
    if a.curves.is_empty() {
        fail(usage);
    }
    a
}

fn main() {
    let args = args();
    support::block_on(async {
        for curve in &args.curves {
            println!(
                "\n## growth: {curve} ({} CPUs, load average {} at start)",
                support::cpus(),
                load_average()
            );
            let t = Instant::now();
            match *curve {
                "sessions" => sessions(&args).await,
                "workers" => workers(&args).await,
                "grep" => grep(&args).await,
                "output" => output(&args).await,
                _ => unreachable!(),
            }
            println!(
                "{curve}: {:.0} s, load average {} at the end",
                t.elapsed().as_secs_f64(),
                load_average()
            );
        }
    });
}
