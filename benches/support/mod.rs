//! Helpers shared by the benchmark binaries (`mod support;` in each). It lives in a subdirectory
//! so cargo does not take it for a bench target of its own.

// Every bench uses only some of these.
#![allow(dead_code)]

pub mod plot;
pub mod procfs;

use corral::api::{self, sessions_client::SessionsClient};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tonic::transport::Channel;

pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Prints `<bench> bench: msg` to stderr and exits with status 2.
pub fn fail(msg: &str) -> ! {
    eprintln!("{} bench: {msg}", env!("CARGO_CRATE_NAME"));
    std::process::exit(2);
}

/// The daemon binary: `$CORRAL_BIN`, else the one cargo built alongside this bench.
pub fn corral_bin() -> PathBuf {
    let path = std::env::var_os("CORRAL_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_corral")));
    if !path.is_file() {
        fail(&format!(
            "corral binary not found at {}; run `cargo build --release` first (or set CORRAL_BIN)",
            path.display()
        ));
    }
    path
}

/// Runs `future` to completion on a single-threaded tokio runtime.
pub fn block_on<F: Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
        .block_on(future)
}

/// Number of CPUs available to this process (0 if unknown), for the report.
pub fn cpus() -> usize {
    std::thread::available_parallelism().map_or(0, |p| p.get())
}

/// A `corral serve` on a Unix socket in a private directory; SIGTERMed on drop.
///
/// Start-up and `open_session` failures come back as `Err(message)` (the message includes the
/// daemon's log), so each bench decides whether to panic or [`fail`].
pub struct Daemon {
    child: Child,
    socket: PathBuf,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Daemon {
    pub async fn start() -> Result<Daemon, String> {
        Daemon::start_with_config(None).await
    }

    /// [`Daemon::start`] with `config` (TOML) as the daemon's `--config` file.
    pub async fn start_with_config(config: Option<&str>) -> Result<Daemon, String> {
        Daemon::start_binary(&corral_bin(), config).await
    }

    /// [`Daemon::start_with_config`] with another daemon binary (an A/B comparison of builds).
    pub async fn start_binary(bin: &Path, config: Option<&str>) -> Result<Daemon, String> {
        // The daemon's state must not lie inside a writable root (/tmp is one by default).
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
        let socket = dir.path().join("corral.sock");
        let log = dir.path().join("daemon.log");
        let mut cmd = Command::new(bin);
        cmd.args(["serve", "--log-level", "warn", "--listen"])
            .arg(format!("unix:{}", socket.display()));
        if let Some(config) = config {
            let file = dir.path().join("corral.toml");
            std::fs::write(&file, config).expect("config file");
            cmd.arg("--config").arg(file);
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("spawn corral serve");
        let daemon = Daemon {
            child,
            socket,
            log,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if daemon.socket.exists() && daemon.channel().await.is_ok() {
                return Ok(daemon);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(format!("daemon did not start; log:\n{}", daemon.log_text()))
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn socket_path(&self) -> &Path {
        &self.socket
    }

    pub async fn channel(&self) -> Result<Channel, String> {
        corral::client::connect(self.socket.to_str().expect("utf-8 socket path")).await
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Opens a session (build `req` with [`session_request`]); returns its id.
    pub async fn open_session(&self, req: api::OpenSessionRequest) -> Result<String, String> {
        SessionsClient::new(self.channel().await.expect("connect"))
            .open_session(req)
            .await
            .map(|r| r.into_inner().session_id)
            .map_err(|s| format!("open_session: {s:?}\nlog:\n{}", self.log_text()))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A session request for `cwd` in `mode`, passing our `PATH` through and with `HOME` = `cwd`;
/// adjust the rest with struct update syntax.
pub fn session_request(cwd: &Path, mode: api::SandboxMode) -> api::OpenSessionRequest {
    let mut env = HashMap::new();
    if let Ok(path) = std::env::var("PATH") {
        env.insert("PATH".to_string(), path);
    }
    env.insert("HOME".to_string(), cwd.display().to_string());
    api::OpenSessionRequest {
        cwd: cwd.to_string_lossy().into_owned(),
        mode: mode as i32,
        env,
        ..Default::default()
    }
}

/// Nearest-rank percentile of sorted samples.
pub fn pct(sorted: &[Duration], q: f64) -> Duration {
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// Median of sorted samples (the mean of the middle two for an even count).
pub fn median(sorted: &[Duration]) -> Duration {
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2
    }
}

pub fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// ripgrep from `$CORRAL_RG` or PATH, version >= 14 (13's `--sortr=modified` is not a global
/// sort). Returns the binary and its version line.
pub fn ripgrep() -> (PathBuf, String) {
    let rg = std::env::var_os("CORRAL_RG")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("rg"));
    let out = Command::new(&rg)
        .arg("--version")
        .output()
        .unwrap_or_else(|e| {
            fail(&format!(
                "cannot run ripgrep ({}): {e}; put ripgrep >= 14 on PATH or set CORRAL_RG \
             (`cargo install --locked ripgrep --root DIR`)",
                rg.display()
            ))
        });
    let line = String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string();
    let major: u32 = line
        .strip_prefix("ripgrep ")
        .and_then(|v| v.split('.').next())
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    if major < 14 {
        fail(&format!(
            "{} is `{line}`; ripgrep >= 14 is required (set CORRAL_RG)",
            rg.display()
        ));
    }
    (rg, line)
}
