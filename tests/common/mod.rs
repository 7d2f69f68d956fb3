//! Test harness: a real `corral serve` on a temporary Unix socket, and gRPC clients for it.
#![allow(dead_code)]

use corral::api::{
    self, bridge_client::BridgeClient, sessions_client::SessionsClient, tools_client::ToolsClient,
};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tonic::transport::Channel;

pub const CORRAL: &str = env!("CARGO_BIN_EXE_corral");

/// A running daemon; SIGTERMed and reaped on drop.
pub struct Daemon {
    pub child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub log: PathBuf,
}

impl Daemon {
    /// Starts `corral serve` with extra flags and waits until it answers.
    pub async fn start(extra: &[&str]) -> Daemon {
        Self::start_wrapped(&[], extra).await
    }

    /// Starts `WRAPPER... corral serve ...` (e.g. under a seccomp filter) and waits for it.
    pub async fn start_wrapped(wrapper: &[&str], extra: &[&str]) -> Daemon {
        // The daemon's state (its socket directory) must not lie inside a writable root, and
        // /tmp is one by default.
        let dir = outside();
        let socket = dir.path().join("corral.sock");
        let log = dir.path().join("daemon.log");
        let mut cmd = match wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(CORRAL);
                c
            }
            None => Command::new(CORRAL),
        };
        let child = cmd
            .arg("serve")
            .arg("--listen")
            .arg(format!("unix:{}", socket.display()))
            .args(extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("spawn corral serve");
        let daemon = Daemon {
            child: Some(child),
            dir,
            socket,
            log,
        };
        daemon.wait_ready().await;
        daemon
    }

    async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if self.socket.exists() && corral::client::connect(self.target()).await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("daemon did not start; log:\n{}", self.log_text());
    }

    pub fn target(&self) -> &str {
        self.socket.to_str().expect("utf-8 socket path")
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    pub async fn channel(&self) -> Channel {
        corral::client::connect(self.target())
            .await
            .expect("connect")
    }

    pub async fn sessions(&self) -> SessionsClient<Channel> {
        SessionsClient::new(self.channel().await)
    }

    pub async fn tools(&self) -> ToolsClient<Channel> {
        ToolsClient::new(self.channel().await)
    }

    pub async fn bridge(&self) -> BridgeClient<Channel> {
        BridgeClient::new(self.channel().await)
    }

    /// Opens a session (with the test's PATH and HOME as its environment) and returns its id.
    pub async fn open(&self, cwd: &Path, mode: api::SandboxMode) -> String {
        self.open_with(api::OpenSessionRequest {
            cwd: cwd.to_string_lossy().into_owned(),
            mode: mode as i32,
            env: session_env(cwd),
            ..Default::default()
        })
        .await
    }

    pub async fn open_with(&self, req: api::OpenSessionRequest) -> String {
        self.try_open_with(req)
            .await
            .unwrap_or_else(|s| panic!("open_session: {s:?}\nlog:\n{}", self.log_text()))
    }

    /// OpenSession with just a cwd and a mode (no environment); the id or the refusal.
    pub async fn try_open(
        &self,
        cwd: &Path,
        mode: api::SandboxMode,
    ) -> Result<String, tonic::Status> {
        self.try_open_with(api::OpenSessionRequest {
            cwd: cwd.to_string_lossy().into_owned(),
            mode: mode as i32,
            ..Default::default()
        })
        .await
    }

    /// OpenSession; the id or the refusal.
    pub async fn try_open_with(
        &self,
        req: api::OpenSessionRequest,
    ) -> Result<String, tonic::Status> {
        self.sessions()
            .await
            .open_session(req)
            .await
            .map(|r| r.into_inner().session_id)
    }

    /// Runs a bridge call and returns (output, success).
    pub async fn invoke(&self, session: &str, name: &str, arguments: &str) -> (String, bool) {
        let r = self
            .bridge()
            .await
            .invoke(api::InvokeRequest {
                session_id: session.into(),
                name: name.into(),
                arguments: arguments.into(),
                call_id: "call_1".into(),
                freeform: false,
            })
            .await
            .unwrap_or_else(|s| panic!("invoke: {s:?}"))
            .into_inner();
        assert_eq!(r.call_id, "call_1");
        (r.output, r.success)
    }

    /// Waits for the daemon (already signalled) to exit.
    pub fn terminate_wait(&mut self) -> std::process::ExitStatus {
        self.child.take().expect("running").wait().expect("wait")
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .expect("SIGTERM");
        child.wait().expect("wait")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The environment test sessions give their commands: the test's PATH, and HOME in the session's
/// own directory so a login shell does not run the machine's personal rc files.
pub fn session_env(home: &Path) -> std::collections::HashMap<String, String> {
    let mut env = std::collections::HashMap::new();
    if let Ok(path) = std::env::var("PATH") {
        env.insert("PATH".to_string(), path);
    }
    env.insert("HOME".to_string(), home.display().to_string());
    env
}

/// A scratch directory outside any git repository.
pub fn scratch() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

/// The result of a sandboxed command run through the typed Shell RPC.
#[derive(Debug)]
pub struct Ran {
    pub exit_code: i32,
    /// stdout and stderr in arrival order, lossy UTF-8.
    pub output: String,
    pub response: api::ShellResponse,
}

impl Daemon {
    /// Runs `bash -c script` in the session through the typed Shell RPC.
    pub async fn sh(&self, session: &str, script: &str) -> Ran {
        self.shell(api::ShellRequest {
            session_id: session.into(),
            command: vec!["bash".into(), "-c".into(), script.into()],
            ..Default::default()
        })
        .await
    }

    pub async fn shell(&self, req: api::ShellRequest) -> Ran {
        let response = self
            .tools()
            .await
            .shell(req)
            .await
            .unwrap_or_else(|s| panic!("shell: {s:?}\nlog:\n{}", self.log_text()))
            .into_inner();
        let combined = response.combined.clone().unwrap_or_default();
        let mut bytes = combined.head.clone();
        bytes.extend_from_slice(&combined.tail);
        Ran {
            exit_code: response.exit_code,
            output: String::from_utf8_lossy(&bytes).into_owned(),
            response,
        }
    }
}

/// A scratch directory outside every writable root: not under /tmp (a root by default) — and
/// the checkout itself may live under /tmp, so not under the target directory either.
pub fn outside() -> tempfile::TempDir {
    let base = std::path::Path::new("/var/tmp/corral-tests");
    std::fs::create_dir_all(base).expect("create /var/tmp/corral-tests");
    tempfile::tempdir_in(base).expect("tempdir")
}

/// Runs `bash -c script` on the host (the baseline outside the sandbox); returns (status, output).
pub fn host_sh(script: &str) -> (i32, String) {
    let out = Command::new("bash")
        .args(["-c", script])
        .output()
        .expect("bash");
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), text)
}
