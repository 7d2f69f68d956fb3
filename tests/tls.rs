//! Authenticated TCP: TLS with client certificates (mTLS) or bearer tokens mapped to local users;
//! UNAUTHENTICATED for anything else, with no detail that helps guessing.

mod common;

use common::{CORRAL, outside, scratch};
use corral::api::{self, sessions_client::SessionsClient};
use std::path::Path;
use std::process::{Child, Command, Stdio};
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
    let token_hash = corral::daemon::auth::token_hash("token-123");
    let config = format!(
        "[tls]\ncert = \"{0}/server.pem\"\nkey = \"{0}/server.key\"\nclient_ca = \"{0}/ca.pem\"\n\
         [[tls.clients]]\nname = \"alice\"\nuser = \"root\"\n\
         [[tokens]]\nname = \"ci\"\nsha256 = \"{token_hash}\"\nuser = \"root\"\n",
        p.display()
    );
    std::fs::write(p.join("corral.toml"), config).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(CORRAL)
        .args(["serve", "--config"])
        .arg(p.join("corral.toml"))
        .args(["--listen", &format!("tcp:127.0.0.1:{port}")])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "TLS daemon did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    TlsDaemon { child, port, pki }
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
