//! Test harness: a real `corral serve` on a temporary Unix socket, and gRPC clients for it.
#![allow(dead_code)]

use corral::api::{
    self, bridge_client::BridgeClient, processes_client::ProcessesClient,
    sessions_client::SessionsClient, tools_client::ToolsClient,
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

    /// Starts `corral serve` on `socket` (any directory) with `env` added to this process's
    /// environment and the given stderr, and waits until it answers.
    pub async fn start_at(
        socket: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
        stderr: Stdio,
    ) -> Daemon {
        let child = Command::new(CORRAL)
            .arg("serve")
            .arg("--listen")
            .arg(format!("unix:{}", socket.display()))
            .args(extra)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn corral serve");
        let dir = outside();
        let daemon = Daemon {
            child: Some(child),
            log: dir.path().join("daemon.log"),
            dir,
            socket: socket.to_path_buf(),
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
            .max_decoding_message_size(corral::client::MAX_MESSAGE_BYTES)
    }

    pub async fn processes(&self) -> ProcessesClient<Channel> {
        ProcessesClient::new(self.channel().await)
            .max_decoding_message_size(corral::client::MAX_MESSAGE_BYTES)
    }

    pub async fn bridge(&self) -> BridgeClient<Channel> {
        BridgeClient::new(self.channel().await)
            .max_decoding_message_size(corral::client::MAX_MESSAGE_BYTES)
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

/// A v1 memory cgroup with a cap for a daemon under test, so a test that could exhaust memory
/// cannot hurt the host; removed on drop with the worker groups the daemon made inside it.
/// `None` where the controller is absent or the test is not root.
pub struct DaemonCgroup(pub PathBuf);

impl DaemonCgroup {
    pub fn create(tag: &str, limit_bytes: u64) -> Option<DaemonCgroup> {
        let root = Path::new("/sys/fs/cgroup/memory");
        if !root.join("cgroup.procs").exists() || !nix::unistd::geteuid().is_root() {
            return None;
        }
        let dir = root.join(format!("corral-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).ok()?;
        std::fs::write(dir.join("memory.limit_in_bytes"), limit_bytes.to_string()).ok()?;
        Some(DaemonCgroup(dir))
    }

    /// The `sh -c` script for [`Daemon::start_wrapped`] that joins the group, then execs.
    pub fn join_script(&self) -> String {
        format!("echo $$ > {}/cgroup.procs; exec \"$@\"", self.0.display())
    }
}

impl Drop for DaemonCgroup {
    fn drop(&mut self) {
        // Deepest first: cgroupfs removes only empty directories.
        fn rmdirs(dir: &Path) -> bool {
            if let Ok(entries) = std::fs::read_dir(dir) {
                for e in entries.flatten() {
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        rmdirs(&e.path());
                    }
                }
            }
            std::fs::remove_dir(dir).is_ok()
        }
        // Wait for the daemon's processes to leave.
        for _ in 0..100 {
            if rmdirs(&self.0) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A local user created for the test and deleted on drop, with a private 0700 directory
/// `/tmp/<name>` it owns. Needs root.
pub struct TestUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub dir: PathBuf,
}

impl TestUser {
    pub fn create(tag: &str) -> TestUser {
        use std::os::unix::fs::PermissionsExt;
        let name = format!("crl{tag}{}", std::process::id());
        let out = Command::new("useradd")
            .args(["--no-create-home", "--shell", "/bin/bash", &name])
            .output()
            .expect("useradd");
        assert!(
            out.status.success(),
            "useradd: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let user = nix::unistd::User::from_name(&name).unwrap().unwrap();
        let dir = PathBuf::from(format!("/tmp/{name}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::chown(&dir, Some(user.uid.as_raw()), Some(user.gid.as_raw())).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        TestUser {
            name,
            uid: user.uid.as_raw(),
            gid: user.gid.as_raw(),
            dir,
        }
    }

    /// Runs the corral CLI as this user, in its directory, against `socket`; returns (exit
    /// code, stdout, stderr), trimmed.
    pub fn corral(&self, socket: &str, args: &[&str]) -> (i32, String, String) {
        let out = Command::new("setpriv")
            .args([
                "--reuid",
                &self.name,
                "--regid",
                &self.name,
                "--init-groups",
                "--",
            ])
            .arg(client_binary())
            .args(args)
            .args(["--socket", socket])
            .current_dir(&self.dir)
            .output()
            .expect("setpriv");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).trim_end().to_string(),
            String::from_utf8_lossy(&out.stderr).trim_end().to_string(),
        )
    }
}

impl Drop for TestUser {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = Command::new("userdel").arg(&self.name).output();
    }
}

/// The CLI binary where every user may run it: the checkout may live in a directory only root
/// can enter (e.g. /root), so the tests run a copy.
pub fn client_binary() -> &'static Path {
    use std::os::unix::fs::PermissionsExt;
    static COPY: std::sync::OnceLock<(tempfile::TempDir, PathBuf)> = std::sync::OnceLock::new();
    let (_, path) = COPY.get_or_init(|| {
        let dir = outside();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = dir.path().join("corral");
        std::fs::copy(CORRAL, &path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        (dir, path)
    });
    path
}
