//! Authenticated TCP: TLS with client certificates (mTLS) or bearer tokens mapped to local users;
//! UNAUTHENTICATED for anything else, with no detail that helps guessing.

use crate::common::{self, CORRAL, outside, scratch};
use corral::api::{self, sessions_client::SessionsClient};
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA and a certificate it signs (`name` as CN; the server's also has SANs for localhost).
fn make_pki(dir: &Path) {
    for ca in ["ca", "otherca"] {
        openssl(
            dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                &format!("/CN={ca}"),
                "-keyout",
                &format!("{ca}.key"),
                "-out",
                &format!("{ca}.pem"),
            ],
        );
    }
    // Extensions make them X.509 v3 certificates, which rustls requires.
    std::fs::write(
        dir.join("server.ext"),
        "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("client.ext"),
        "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n",
    )
    .unwrap();
    for (name, ca, ext) in [
        ("server", "ca", Some("server.ext")),
        ("alice", "ca", Some("client.ext")),
        ("mallory", "ca", Some("client.ext")),
        ("stranger", "otherca", Some("client.ext")),
    ] {
        openssl(
            dir,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-subj",
                &format!("/CN={name}"),
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
            ],
        );
        let mut args: Vec<String> = [
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            &format!("{ca}.pem"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            &format!("{name}.pem"),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if let Some(ext) = ext {
            args.extend(["-extfile".to_string(), ext.to_string()]);
        }
        openssl(dir, &args.iter().map(String::as_str).collect::<Vec<_>>());
    }
}

struct TlsDaemon {
    child: Child,
    port: u16,
    pki: tempfile::TempDir,
    /// The daemon's stderr.
    log: std::path::PathBuf,
}

impl Drop for TlsDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start() -> TlsDaemon {
    let pki = outside();
    let p = pki.path();
    make_pki(p);
    let token_hash = corral::token_hash("token-123");
    let config = format!(
        "[tls]\ncert = \"{0}/server.pem\"\nkey = \"{0}/server.key\"\nclient_ca = \"{0}/ca.pem\"\n\
         [[tls.clients]]\nname = \"alice\"\nuser = \"root\"\n\
         [[tokens]]\nname = \"ci\"\nsha256 = \"{token_hash}\"\nuser = \"root\"\n",
        p.display()
    );
    serve(pki, &config).await
}

/// Starts `corral serve` with `config` (written to the PKI directory) on a free loopback port.
async fn serve(pki: tempfile::TempDir, config: &str) -> TlsDaemon {
    let p = pki.path();
    std::fs::write(p.join("corral.toml"), config).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let log = p.join("daemon.log");
    let child = Command::new(CORRAL)
        .args(["serve", "--config"])
        .arg(p.join("corral.toml"))
        .args(["--listen", &format!("tcp:127.0.0.1:{port}")])
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    // Ready once the start-up block is out: it is printed after every listener is up.
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("try:")
    {
        assert!(
            Instant::now() < deadline,
            "TLS daemon did not start:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    TlsDaemon {
        child,
        port,
        pki,
        log,
    }
}

/// Runs the CLI with `args` in `cwd`, with `CORRAL_TOKEN` set to `token` (or unset);
/// returns (exit code, stdout, stderr).
fn cli(cwd: &Path, token: Option<&str>, args: &[&str]) -> (i32, String, String) {
    let mut cmd = Command::new(CORRAL);
    cmd.args(args).current_dir(cwd).env_remove("CORRAL_TOKEN");
    if let Some(t) = token {
        cmd.env("CORRAL_TOKEN", t);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The `try:` line of the daemon's start-up block, as printed.
fn try_line(d: &TlsDaemon) -> String {
    let log = std::fs::read_to_string(&d.log).unwrap();
    log.lines()
        .find_map(|l| l.trim_start().strip_prefix("try:"))
        .unwrap_or_else(|| panic!("no try: line in\n{log}"))
        .trim()
        .to_string()
}

/// Runs each command of a `try:` line (`A   or   B`) exactly as printed, through a shell.
fn run_try_line(line: &str, cwd: &Path, token: &str) -> Vec<(i32, String, String)> {
    line.split("   or   ")
        .map(|command| {
            let out = Command::new("sh")
                .args(["-c", command])
                .current_dir(cwd)
                .env("CORRAL_TOKEN", token)
                .output()
                .unwrap();
            (
                out.status.code().unwrap_or(-1),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        })
        .collect()
}

async fn channel(
    d: &TlsDaemon,
    client: Option<&str>,
    ca: &str,
) -> Result<Channel, tonic::transport::Error> {
    let p = d.pki.path();
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(
            std::fs::read(p.join(format!("{ca}.pem"))).unwrap(),
        ))
        .domain_name("localhost");
    if let Some(name) = client {
        tls = tls.identity(Identity::from_pem(
            std::fs::read(p.join(format!("{name}.pem"))).unwrap(),
            std::fs::read(p.join(format!("{name}.key"))).unwrap(),
        ));
    }
    Endpoint::from_shared(format!("https://127.0.0.1:{}", d.port))
        .unwrap()
        .tls_config(tls)?
        .connect()
        .await
}

async fn open(ch: Channel, token: Option<&str>) -> Result<String, tonic::Status> {
    let cwd = scratch();
    let mut req = tonic::Request::new(api::OpenSessionRequest {
        cwd: cwd.path().display().to_string(),
        mode: api::SandboxMode::ReadOnly as i32,
        ..Default::default()
    });
    if let Some(t) = token {
        req.metadata_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    SessionsClient::new(ch)
        .open_session(req)
        .await
        .map(|r| r.into_inner().session_id)
}

#[tokio::test]
async fn mtls_and_tokens_authenticate_and_everything_else_is_refused() {
    if Command::new("openssl").arg("version").output().is_err() {
        panic!("openssl is required for the TLS tests (CI installs it)");
    }
    let d = start().await;

    // A client certificate mapped to a user: accepted.
    let id = open(channel(&d, Some("alice"), "ca").await.unwrap(), None)
        .await
        .unwrap();
    assert_eq!(id.len(), 32);
    // Signed by the trusted CA but mapped to nobody: UNAUTHENTICATED, with no hint why.
    let err = open(channel(&d, Some("mallory"), "ca").await.unwrap(), None)
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    assert!(!err.message().contains("mallory"));
    // Signed by another CA: the handshake itself fails.
    let refused = match channel(&d, Some("stranger"), "ca").await {
        Err(_) => true,
        Ok(ch) => open(ch, None).await.is_err(),
    };
    assert!(refused, "a certificate from an untrusted CA was accepted");

    // Bearer tokens: the right one works, a wrong one and none are refused alike.
    let anon = channel(&d, None, "ca").await.unwrap();
    assert!(open(anon.clone(), Some("token-123")).await.is_ok());
    let wrong = open(anon.clone(), Some("token-124")).await.unwrap_err();
    let none = open(anon, None).await.unwrap_err();
    assert_eq!(wrong.code(), tonic::Code::Unauthenticated);
    assert_eq!(
        (wrong.code(), wrong.message()),
        (none.code(), none.message())
    );

    // Plain TCP to the TLS port gets nowhere.
    let plain = Endpoint::from_shared(format!("http://127.0.0.1:{}", d.port))
        .unwrap()
        .connect()
        .await;
    if let Ok(ch) = plain {
        assert!(open(ch, Some("token-123")).await.is_err());
    }
}

#[tokio::test]
async fn the_cli_authenticates_with_a_token_or_a_client_certificate_over_tls() {
    let d = start().await;
    let p = d.pki.path();
    let work = scratch();
    std::fs::write(work.path().join("marker.txt"), "x").unwrap();
    let socket = format!("tcp:127.0.0.1:{}", d.port);
    let ca = p.join("ca.pem").display().to_string();
    let (alice_pem, alice_key) = (
        p.join("alice.pem").display().to_string(),
        p.join("alice.key").display().to_string(),
    );
    let list = |token: Option<&str>, extra: &[&str]| {
        let mut args = vec!["list-dir", ".", "--socket", &socket];
        args.extend_from_slice(extra);
        cli(work.path(), token, &args)
    };

    // Health needs TLS but no credential.
    let (code, out, err) = cli(
        work.path(),
        None,
        &["health", "--socket", &socket, "--tls-ca", &ca],
    );
    assert_eq!((code, out.trim()), (0, "SERVING"), "{err}");

    // A token from CORRAL_TOKEN, or from --token.
    let (code, out, err) = list(Some("token-123"), &["--tls-ca", &ca]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("marker.txt"), "{out}");
    let (code, out, err) = list(None, &["--tls-ca", &ca, "--token", "token-123"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("marker.txt"), "{out}");
    // A client certificate mapped to a user.
    let (code, out, err) = list(
        None,
        &[
            "--tls-ca",
            &ca,
            "--tls-cert",
            &alice_pem,
            "--tls-key",
            &alice_key,
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("marker.txt"), "{out}");

    // Refusals: no credential, a wrong token, a certificate mapped to nobody.
    for (token, extra) in [
        (None, vec!["--tls-ca", ca.as_str()]),
        (Some("token-124"), vec!["--tls-ca", ca.as_str()]),
    ] {
        let (code, _, err) = list(token, &extra);
        assert_eq!(code, 2, "{token:?}: {err}");
        assert!(err.contains("Unauthenticated"), "{err}");
    }
    let mallory = (
        p.join("mallory.pem").display().to_string(),
        p.join("mallory.key").display().to_string(),
    );
    let (code, _, err) = list(
        None,
        &[
            "--tls-ca",
            &ca,
            "--tls-cert",
            &mallory.0,
            "--tls-key",
            &mallory.1,
        ],
    );
    assert_eq!(code, 2);
    assert!(err.contains("Unauthenticated"), "{err}");
    // A daemon whose certificate the given CA did not sign is not talked to.
    let other = p.join("otherca.pem").display().to_string();
    let (code, _, err) = list(Some("token-123"), &["--tls-ca", &other]);
    assert_eq!(code, 2);
    assert!(err.contains("certificate"), "{err}");

    // The client refuses what would not do what was meant, before sending anything: a token
    // over plain TCP, TLS settings or --token for a Unix socket, half a client certificate.
    let (code, _, err) = list(Some("token-123"), &[]);
    assert_eq!(code, 2);
    assert!(err.contains("only sent over TLS"), "{err}");
    let (code, _, err) = cli(
        work.path(),
        None,
        &[
            "health",
            "--socket",
            "unix:/run/corral-none/c.sock",
            "--tls-ca",
            &ca,
        ],
    );
    assert_eq!(code, 2);
    assert!(err.contains("are for tcp: addresses"), "{err}");
    let (code, _, err) = cli(
        work.path(),
        None,
        &[
            "health",
            "--socket",
            "unix:/run/corral-none/c.sock",
            "--token",
            "t",
        ],
    );
    assert_eq!(code, 2);
    assert!(err.contains("--token is for tcp: addresses"), "{err}");
    let (code, _, err) = list(None, &["--tls-ca", &ca, "--tls-cert", &alice_pem]);
    assert_eq!(code, 2);
    assert!(err.contains("go together"), "{err}");
}

/// The daemon's `try:` line, run exactly as printed, works against a TLS daemon: with a CA
/// from the config (a server certificate signed by the client CA) and with a self-signed
/// certificate that names only `localhost` (so the line must add --tls-server-name).
#[tokio::test]
async fn the_printed_try_line_works_against_a_tls_daemon() {
    let work = scratch();
    std::fs::write(work.path().join("marker.txt"), "x").unwrap();

    let d = start().await;
    let line = try_line(&d);
    let ca = d.pki.path().join("ca.pem");
    assert!(
        line.contains(&format!("--tls-ca {}", ca.display())),
        "{line}"
    );
    assert!(!line.contains("--tls-server-name"), "{line}");
    check_try_results(&line, run_try_line(&line, work.path(), "token-123"));
    drop(d);

    let pki = outside();
    let p = pki.path();
    openssl(
        p,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=corral test",
            "-addext",
            "subjectAltName=DNS:localhost",
            "-addext",
            "basicConstraints=critical,CA:FALSE",
            "-addext",
            "extendedKeyUsage=serverAuth",
            "-keyout",
            "self.key",
            "-out",
            "self.pem",
        ],
    );
    let config = format!(
        "[tls]\ncert = \"{0}/self.pem\"\nkey = \"{0}/self.key\"\n\
         [[tokens]]\nname = \"ci\"\nsha256 = \"{1}\"\nuser = \"root\"\n",
        p.display(),
        corral::token_hash("token-9")
    );
    let d = serve(pki, &config).await;
    let line = try_line(&d);
    assert!(
        line.contains(&format!(
            "--tls-ca {} --tls-server-name localhost",
            d.pki.path().join("self.pem").display()
        )),
        "{line}"
    );
    check_try_results(&line, run_try_line(&line, work.path(), "token-9"));
}

fn check_try_results(line: &str, results: Vec<(i32, String, String)>) {
    assert_eq!(results.len(), 2, "{line}");
    let (code, out, err) = &results[0];
    assert_eq!((*code, out.trim()), (0, "SERVING"), "{line}: {err}");
    let (code, out, err) = &results[1];
    assert_eq!(*code, 0, "{line}: {err}");
    assert!(out.contains("marker.txt"), "{line}: {out}");
}

/// H19: a TCP credential alone never buys danger-full-access or escalation — a sandbox with
/// the network on can read the files its user keeps a token or client key in (red team finding
/// 2) — unless the operator's mapping for that credential says `allow_danger_full_access`. A
/// danger-full-access session opened by a credential that may does not become usable (nor
/// listed) through one that may not. And the sandbox cannot read `~/.config/corral`.
#[tokio::test]
async fn a_tcp_credential_gets_danger_full_access_only_where_its_mapping_says_so() {
    let pki = outside();
    let p = pki.path().to_path_buf();
    make_pki(&p);
    let (ci, admin) = (
        corral::token_hash("token-ci"),
        corral::token_hash("token-admin"),
    );
    // Root may have danger-full-access at all (root_callers = trusted): what is tested is the
    // credential's mapping.
    let config = format!(
        "root_callers = \"trusted\"\n\
         [tls]\ncert = \"{0}/server.pem\"\nkey = \"{0}/server.key\"\nclient_ca = \"{0}/ca.pem\"\n\
         [[tls.clients]]\nname = \"alice\"\nuser = \"root\"\n\
         [[tokens]]\nname = \"ci\"\nsha256 = \"{ci}\"\nuser = \"root\"\n\
         [[tokens]]\nname = \"admin\"\nsha256 = \"{admin}\"\nuser = \"root\"\n\
         allow_danger_full_access = true\n",
        p.display()
    );
    let d = serve(pki, &config).await;
    let cwd = scratch();
    let open_mode = |token: &'static str, mode: api::SandboxMode| {
        let d = &d;
        let cwd = cwd.path().display().to_string();
        async move {
            let ch = channel(d, None, "ca").await.unwrap();
            let mut req = tonic::Request::new(api::OpenSessionRequest {
                cwd,
                mode: mode as i32,
                ..Default::default()
            });
            req.metadata_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
            SessionsClient::new(ch)
                .open_session(req)
                .await
                .map(|r| r.into_inner().session_id)
        }
    };
    // Baseline: the token the operator allowed gets danger-full-access.
    let dfa = open_mode("token-admin", api::SandboxMode::DangerFullAccess)
        .await
        .expect("allowed by its mapping");
    // The ordinary token: sandboxed modes yes, danger-full-access no, saying how to allow it.
    open_mode("token-ci", api::SandboxMode::WorkspaceWrite)
        .await
        .unwrap();
    let e = open_mode("token-ci", api::SandboxMode::DangerFullAccess)
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("allow_danger_full_access"), "{e:?}");
    // Variant: a client certificate whose mapping does not allow it.
    let alice = channel(&d, Some("alice"), "ca").await.unwrap();
    let e = SessionsClient::new(alice)
        .open_session(api::OpenSessionRequest {
            cwd: cwd.path().display().to_string(),
            mode: api::SandboxMode::DangerFullAccess as i32,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    // Variant: the ordinary token cannot use (or see) the admin's danger-full-access session,
    // though both map to the same user.
    let anon = channel(&d, None, "ca").await.unwrap();
    let with = |token: &str, mut req: tonic::Request<api::ShellRequest>| {
        req.metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
        req
    };
    let shell = |token: &str| {
        with(
            token,
            tonic::Request::new(api::ShellRequest {
                session_id: dfa.clone(),
                command: vec!["true".into()],
                ..Default::default()
            }),
        )
    };
    let e = corral::api::tools_client::ToolsClient::new(anon.clone())
        .shell(shell("token-ci"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    let ran = corral::api::tools_client::ToolsClient::new(anon.clone())
        .shell(shell("token-admin"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ran.exit_code, 0);
    let listed = |token: &str| {
        let mut req = tonic::Request::new(api::ListSessionsRequest {});
        req.metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
        let anon = anon.clone();
        async move {
            SessionsClient::new(anon)
                .list_sessions(req)
                .await
                .unwrap()
                .into_inner()
                .sessions
                .into_iter()
                .map(|s| s.session_id)
                .collect::<Vec<_>>()
        }
    };
    assert!(listed("token-admin").await.contains(&dfa));
    assert!(!listed("token-ci").await.contains(&dfa));
}

/// H19: a sandboxed command cannot read the credentials its user keeps for corral's clients
/// (`~/.config/corral`); the rest of the home stays readable.
#[tokio::test]
async fn the_users_corral_credentials_are_masked_in_the_sandbox() {
    let user = common::TestUser::create("h19cred");
    let home = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(user.uid))
        .unwrap()
        .unwrap()
        .dir;
    // useradd --no-create-home: make the home and a token file in it, as the user would.
    let conf = home.join(".config/corral");
    std::fs::create_dir_all(&conf).unwrap();
    std::fs::write(conf.join("token"), "SECRET-TOKEN").unwrap();
    std::fs::write(home.join("notes.txt"), "readable").unwrap();
    common::host_sh(&format!(
        "chown -R {0}:{1} '{2}' && chmod 700 '{2}'",
        user.uid,
        user.gid,
        home.display()
    ));
    let d = common::Daemon::start(&[]).await;
    let socket = d.open_to_local_users();
    let (code, out, err) = user.corral(
        &socket,
        &[
            "exec",
            "--cwd",
            &user.dir.display().to_string(),
            "--",
            "sh",
            "-c",
            &format!(
                "cat {0}/notes.txt; cat {0}/.config/corral/token; ls -A {0}/.config/corral",
                home.display()
            ),
        ],
    );
    assert!(out.contains("readable"), "{code} {out} {err}");
    assert!(!out.contains("SECRET-TOKEN"), "{out}");
    // Baseline: the same user outside the sandbox reads it.
    let (_, host) = common::host_sh(&format!(
        "setpriv --reuid {0} --regid {1} --clear-groups cat '{2}/token'",
        user.uid,
        user.gid,
        conf.display()
    ));
    assert_eq!(host, "SECRET-TOKEN");
    // The file is still there on the host.
    assert_eq!(
        std::fs::read_to_string(conf.join("token")).unwrap(),
        "SECRET-TOKEN"
    );
    let _ = std::fs::remove_dir_all(&home);
}
