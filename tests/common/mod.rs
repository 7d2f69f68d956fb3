//! Test harness: a real `corral serve` on a temporary Unix socket, and gRPC clients for it.

pub mod procs;

use corral::api::{
    self, bridge_client::BridgeClient, files_client::FilesClient,
    processes_client::ProcessesClient, sessions_client::SessionsClient, tools_client::ToolsClient,
};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tonic::transport::Channel;

pub const CORRAL: &str = env!("CARGO_BIN_EXE_corral");

/// A running daemon; SIGTERMed and reaped on drop.
pub struct Daemon {
    pub child: Option<Child>,
    /// The daemon's directory (its socket and log): held, never read, so it lives as long as
    /// the daemon does.
    pub _dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub log: PathBuf,
    /// `(uid, gid)` the test connects as; `None`: as this (root) process. A daemon that is not
    /// root serves only its own uid, so the test calls it as that user.
    pub caller: Option<(u32, u32)>,
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
            _dir: dir,
            socket,
            log,
            caller: None,
        };
        daemon.wait_ready().await;
        daemon
    }

    /// Starts `corral serve` as the ordinary user `user` (a single-user daemon: no root, so its
    /// workers sandbox through a user namespace), on a socket in a directory that user owns,
    /// and waits until it answers. The test then connects as that user.
    pub async fn start_as(user: &TestUser, extra: &[&str]) -> Daemon {
        use std::os::unix::fs::PermissionsExt;
        // Outside /tmp (a writable root by default) and owned by the user, private.
        let dir = outside();
        std::os::unix::fs::chown(dir.path(), Some(user.uid), Some(user.gid)).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let socket = dir.path().join("corral.sock");
        let log = dir.path().join("daemon.log");
        let child = Command::new("setpriv")
            .args([
                "--reuid",
                &user.name,
                "--regid",
                &user.name,
                "--init-groups",
                "--",
            ])
            .arg(client_binary())
            .arg("serve")
            .arg("--listen")
            .arg(format!("unix:{}", socket.display()))
            .args(extra)
            .current_dir(dir.path())
            .env("HOME", dir.path())
            .env_remove("XDG_RUNTIME_DIR")
            .env_remove("CORRAL_SOCKET")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("spawn corral serve as the test user");
        let daemon = Daemon {
            child: Some(child),
            _dir: dir,
            socket,
            log,
            caller: Some((user.uid, user.gid)),
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
            _dir: dir,
            socket: socket.to_path_buf(),
            caller: None,
        };
        daemon.wait_ready().await;
        daemon
    }

    pub async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if self.socket.exists() && self.try_channel().await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("daemon did not start; log:\n{}", self.log_text());
    }

    pub fn target(&self) -> &str {
        self.socket.to_str().expect("utf-8 socket path")
    }

    /// Lets local users reach the socket (its directory is private to the test by default), so
    /// tests can call the daemon as other users; returns the target to give them.
    pub fn open_to_local_users(&self) -> String {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            self.socket.parent().expect("socket directory"),
            std::fs::Permissions::from_mode(0o755),
        )
        .expect("chmod the socket directory");
        self.target().to_string()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    pub async fn channel(&self) -> Channel {
        self.try_channel().await.expect("connect")
    }

    async fn try_channel(&self) -> Result<Channel, String> {
        match self.caller {
            None => corral::client::connect(self.target()).await,
            Some((uid, gid)) => connect_as(&self.socket, uid, gid).await,
        }
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

    pub async fn files(&self) -> FilesClient<Channel> {
        FilesClient::new(self.channel().await)
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

/// A channel to the daemon at `socket` whose connections carry `uid`/`gid` as their peer
/// credentials. Credentials are per thread in the kernel: each connection is made by a fresh
/// thread that switches only itself (raw syscalls; the libc wrappers would switch every thread
/// of the test process), checks the socket as that user would, connects, and ends.
pub async fn connect_as(socket: &Path, uid: u32, gid: u32) -> Result<Channel, String> {
    connect_with_credentials(socket, uid, gid, true).await
}

/// [`connect_as`] without the client's socket trust check: for tests of what the daemon does
/// with a caller that a real client would not even let connect (e.g. another user).
pub async fn connect_as_unchecked(socket: &Path, uid: u32, gid: u32) -> Result<Channel, String> {
    connect_with_credentials(socket, uid, gid, false).await
}

async fn connect_with_credentials(
    socket: &Path,
    uid: u32,
    gid: u32,
    check: bool,
) -> Result<Channel, String> {
    use hyper_util::rt::TokioIo;
    let shown = socket.display().to_string();
    let socket = socket.to_path_buf();
    tonic::transport::Endpoint::from_static("http://corral.invalid")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let socket = socket.clone();
            async move {
                let (tx, rx) = tokio::sync::oneshot::channel();
                std::thread::spawn(move || {
                    let _ = tx.send(connect_on_this_thread_as(&socket, uid, gid, check));
                });
                let stream = rx.await.map_err(std::io::Error::other)??;
                stream.set_nonblocking(true)?;
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::from_std(stream)?))
            }
        }))
        .await
        .map_err(|e| format!("cannot connect to {shown} as uid {uid}: {e}"))
}

fn connect_on_this_thread_as(
    socket: &Path,
    uid: u32,
    gid: u32,
    check: bool,
) -> std::io::Result<std::os::unix::net::UnixStream> {
    // SAFETY: raw credential syscalls act on the calling thread only, which ends right after.
    unsafe {
        if libc::syscall(libc::SYS_setgroups, 0usize, std::ptr::null::<libc::gid_t>()) != 0
            || libc::syscall(libc::SYS_setresgid, gid, gid, gid) != 0
            || libc::syscall(libc::SYS_setresuid, uid, uid, uid) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    if check {
        corral::check_client(socket, uid).map_err(std::io::Error::other)?;
    }
    std::os::unix::net::UnixStream::connect(socket)
}

/// A TCP listener on the host's loopback that counts the connections it accepts.
pub struct Listener {
    pub port: u16,
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Listener {
    pub fn start() -> Listener {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        std::thread::spawn(move || {
            for stream in l.incoming() {
                let Ok(mut s) = stream else { continue };
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut buf = [0u8; 512];
                let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
                let _ = std::io::Read::read(&mut s, &mut buf);
                let _ = std::io::Write::write_all(
                    &mut s,
                    b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
                );
            }
        });
        Listener { port, accepted }
    }

    pub fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
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

    /// [`Daemon::sh`], keeping a refusal (a stopped session, H18) as the error it is.
    pub async fn try_sh(&self, session: &str, script: &str) -> Result<Ran, tonic::Status> {
        let response = self
            .tools()
            .await
            .shell(api::ShellRequest {
                session_id: session.into(),
                command: vec!["bash".into(), "-c".into(), script.into()],
                ..Default::default()
            })
            .await?
            .into_inner();
        let combined = response.combined.clone().unwrap_or_default();
        let mut bytes = combined.head.clone();
        bytes.extend_from_slice(&combined.tail);
        Ok(Ran {
            exit_code: response.exit_code,
            output: String::from_utf8_lossy(&bytes).into_owned(),
            response,
        })
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

/// A gitdir whose `core.fsmonitor` appends the running git's pid to `counter` each time a host
/// git runs it (one `git status` runs the hook twice: count gits with [`count_lines`]).
pub fn gitdir_script(dir: &str, counter: &Path) -> String {
    format!(
        "mkdir -p {dir}/objects {dir}/refs/heads && printf 'ref: refs/heads/main\\n' > {dir}/HEAD \
         && printf '[core]\\n\\tfsmonitor = \"echo $PPID >> {counter}; false\"\\n' > {dir}/config",
        counter = counter.display()
    )
}

/// How many different lines `p` has (0 when it does not exist): with [`gitdir_script`]'s
/// hook, how many host git processes ran it.
pub fn count_lines(p: &Path) -> usize {
    std::fs::read_to_string(p)
        .map(|s| s.lines().collect::<std::collections::HashSet<_>>().len())
        .unwrap_or(0)
}

/// A v1 memory (or other controller's) cgroup with a cap for a daemon under test, so a test
/// that could exhaust memory (or the pid table) cannot hurt the host; removed on drop with the worker groups the daemon made inside it.
/// `None` where the controller is absent or the test is not root.
pub struct DaemonCgroup(pub PathBuf);

impl DaemonCgroup {
    pub fn create(tag: &str, limit_bytes: u64) -> Option<DaemonCgroup> {
        Self::create_in("memory", tag, "memory.limit_in_bytes", limit_bytes)
    }

    /// The same in the v1 hierarchy of `controller`, capped by writing `limit` to `file`
    /// (e.g. `pids`, `pids.max`).
    pub fn create_in(controller: &str, tag: &str, file: &str, limit: u64) -> Option<DaemonCgroup> {
        let root = Path::new("/sys/fs/cgroup").join(controller);
        if !root.join("cgroup.procs").exists() || !nix::unistd::geteuid().is_root() {
            return None;
        }
        let dir = root.join(format!("corral-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).ok()?;
        std::fs::write(dir.join(file), limit.to_string()).ok()?;
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
        let out = {
            let _one_at_a_time = USER_DB.lock().unwrap_or_else(|p| p.into_inner());
            Command::new("useradd")
                .args(["--no-create-home", "--shell", "/bin/bash", &name])
                .output()
                .expect("useradd")
        };
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
            // First: after an exec's `--`, every argument belongs to the command.
            .args(["--socket", socket])
            .args(args)
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
        let _one_at_a_time = USER_DB.lock().unwrap_or_else(|p| p.into_inner());
        // userdel refuses (exit 8) while a process of the user still runs: a daemon's last
        // sandbox processes may still be exiting, or a daemon that outlives this user (declared
        // first, dropped last) still holds its worker. The user is the test's own: after a
        // grace period its processes are killed, so no user is left behind.
        for attempt in 0..100 {
            let out = Command::new("userdel").arg(&self.name).output();
            match out {
                Ok(o) if o.status.code() == Some(8) => {
                    if attempt >= 20 {
                        let _ = Command::new("pkill")
                            .args(["-KILL", "-U", &self.uid.to_string()])
                            .status();
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                Ok(o) if !o.status.success() => {
                    eprintln!(
                        "userdel {}: {}",
                        self.name,
                        String::from_utf8_lossy(&o.stderr)
                    );
                    break;
                }
                _ => break,
            }
        }
    }
}

/// useradd and userdel lock the user database and give up, rather than wait, when another
/// holds it: tests of one process take turns.
static USER_DB: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Who runs the daemon under test — root (CI's default) or an ordinary user created for the
/// test (a single-user daemon, DESIGN.md §1) — and therefore who calls it, owns the scratch
/// directories and runs the host-side baselines (spec/sandbox.md §8.1: "as the same uid").
/// Escape cases written against a `RunAs` run unchanged against both daemons.
#[derive(Clone)]
pub enum RunAs {
    Root,
    User(std::sync::Arc<TestUser>),
}

impl RunAs {
    /// A new ordinary user (needs root; CI is root). `tag` must be unique in the test binary.
    pub fn ordinary_user(tag: &str) -> RunAs {
        RunAs::User(std::sync::Arc::new(TestUser::create(tag)))
    }

    /// A new ordinary user for one case, named `PREFIX` and a number (removed with it); `None`,
    /// with a note, when the test is not root and so cannot create one.
    pub fn next_ordinary_user(prefix: &str) -> Option<RunAs> {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: creating a user needs root (CI runs as root)");
            return None;
        }
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Some(RunAs::ordinary_user(&format!("{prefix}{n}")))
    }

    pub fn is_root(&self) -> bool {
        matches!(self, RunAs::Root)
    }

    /// Starts the daemon as this user and waits until it answers.
    pub async fn start(&self, extra: &[&str]) -> Daemon {
        match self {
            RunAs::Root => Daemon::start(extra).await,
            RunAs::User(user) => Daemon::start_as(user, extra).await,
        }
    }

    /// [`scratch`], owned by this user.
    pub fn scratch(&self) -> tempfile::TempDir {
        let dir = scratch();
        self.own(dir.path());
        dir
    }

    /// [`outside`], owned by this user.
    pub fn outside(&self) -> tempfile::TempDir {
        let dir = outside();
        self.own(dir.path());
        dir
    }

    /// Gives `path` (and, for a directory, everything below it) to this user, so that only the
    /// sandbox, never the file permissions, can stop that user from changing it.
    pub fn own(&self, path: &Path) {
        let RunAs::User(user) = self else { return };
        std::os::unix::fs::lchown(path, Some(user.uid), Some(user.gid)).unwrap();
        if path.is_dir() && !path.is_symlink() {
            for entry in std::fs::read_dir(path).unwrap() {
                self.own(&entry.unwrap().path());
            }
        }
    }

    /// Writes a file owned by this user.
    pub fn write(&self, path: &Path, contents: &str) {
        std::fs::write(path, contents).unwrap();
        self.own(path);
    }

    /// [`host_sh`] as this user: the baseline outside the sandbox with the sandbox's uid.
    pub fn host_sh(&self, script: &str) -> (i32, String) {
        let RunAs::User(user) = self else {
            return host_sh(script);
        };
        let out = Command::new("setpriv")
            .args([
                "--reuid",
                &user.name,
                "--regid",
                &user.name,
                "--init-groups",
                "--",
            ])
            .args(["bash", "-c", script])
            .current_dir("/")
            .output()
            .expect("setpriv bash");
        let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&out.stderr));
        (out.status.code().unwrap_or(-1), text)
    }
}

/// The CLI binary where every user may run it: the checkout may live in a directory only root
/// can enter (e.g. /root), so the tests run it from a directory everyone may enter.
pub fn client_binary() -> &'static Path {
    CLIENT_BINARY.get_or_init(|| {
        use std::os::unix::fs::PermissionsExt;
        let dir = outside().keep();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = dir.join("corral");
        // A hard link costs no space; a copy of the debug binary is about 300 MB.
        if std::fs::hard_link(CORRAL, &path).is_err() {
            std::fs::copy(CORRAL, &path).unwrap();
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        // A static is never dropped: without this, every test binary left its copy behind.
        // SAFETY: registers a plain function; it runs once, when the test binary exits.
        unsafe { libc::atexit(remove_client_binary) };
        path
    })
}

static CLIENT_BINARY: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

extern "C" fn remove_client_binary() {
    if let Some(dir) = CLIENT_BINARY.get().and_then(|p| p.parent()) {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Pids of host processes whose command line matches `pattern` (write one letter as `[x]`, or
/// the shell running pgrep matches too).
pub fn host_pids(pattern: &str) -> Vec<String> {
    let (_, out) = host_sh(&format!("pgrep -f '{pattern}' || true"));
    out.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect()
}

/// Waits up to `limit` for `cond`.
pub async fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cond()
}

/// A small tmpfs mounted for one test (root only), unmounted on drop: a disk that fills up.
pub struct SmallDisk(pub tempfile::TempDir);

impl SmallDisk {
    pub fn mount(bytes: u64) -> SmallDisk {
        let dir = scratch();
        let (code, out) = host_sh(&format!(
            "mount -t tmpfs -o size={bytes},mode=0755 corral-test {}",
            dir.path().display()
        ));
        assert_eq!(code, 0, "mount: {out}");
        SmallDisk(dir)
    }

    /// Bytes in use on it.
    pub fn used(&self) -> u64 {
        let st = nix::sys::statvfs::statvfs(self.0.path()).unwrap();
        (st.blocks() - st.blocks_free()) * st.fragment_size()
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = host_sh(&format!("umount -l {}", self.0.path().display()));
    }
}

/// Runs each listed case `async fn CASE(who: &RunAs)` twice: as the test `root::CASE` (the
/// daemon runs as root: CI's setting) and as `ordinary_user::CASE` (the daemon of an ordinary
/// user created for the test, named PREFIX and a number, called by that user, whose scratch
/// directories and host-side baselines are that user's too, so only the sandbox can make a
/// difference).
macro_rules! on_both_daemons {
    ($prefix:literal; $($(#[$attr:meta])* $case:ident),* $(,)?) => {
        mod root {
            $(
                $(#[$attr])*
                #[tokio::test]
                async fn $case() {
                    super::$case(&$crate::common::RunAs::Root).await;
                }
            )*
        }
        mod ordinary_user {
            $(
                $(#[$attr])*
                #[tokio::test]
                async fn $case() {
                    let Some(who) = $crate::common::RunAs::next_ordinary_user($prefix) else {
                        return;
                    };
                    super::$case(&who).await;
                }
            )*
        }
    };
}
pub(crate) use on_both_daemons;
