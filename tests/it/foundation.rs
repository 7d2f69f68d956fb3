//! The foundation through the real gRPC surface: a real `corral serve` on a temporary socket.

use crate::common::{self, CORRAL, Daemon, scratch};
use corral::api::{self, SandboxMode};
use std::time::Duration;
use tonic::Code;

#[tokio::test]
async fn health_reports_serving() {
    let d = Daemon::start(&[]).await;
    let mut health = tonic_health::pb::health_client::HealthClient::new(d.channel().await);
    for service in [
        "",
        "corral.v1.Sessions",
        "corral.v1.Tools",
        "corral.v1.Bridge",
    ] {
        let resp = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            resp.status,
            tonic_health::pb::health_check_response::ServingStatus::Serving as i32,
            "{service}"
        );
    }
}

#[tokio::test]
async fn reflection_lists_services_in_v1_and_v1alpha() {
    use tonic_reflection::pb::{v1, v1alpha};
    let d = Daemon::start(&[]).await;

    let mut client = v1::server_reflection_client::ServerReflectionClient::new(d.channel().await);
    let req = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(
            String::new(),
        )),
    };
    let mut stream = client
        .server_reflection_info(tokio_stream::iter(vec![req]))
        .await
        .unwrap()
        .into_inner();
    let resp = stream.message().await.unwrap().unwrap();
    let Some(v1::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        resp.message_response
    else {
        panic!("unexpected reflection response");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for want in [
        "corral.v1.Sessions",
        "corral.v1.Tools",
        "corral.v1.Bridge",
        "grpc.health.v1.Health",
    ] {
        assert!(
            names.iter().any(|n| n == want),
            "{want} missing from {names:?}"
        );
    }

    let mut alpha =
        v1alpha::server_reflection_client::ServerReflectionClient::new(d.channel().await);
    let req = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1alpha::server_reflection_request::MessageRequest::ListServices(String::new()),
        ),
    };
    let mut stream = alpha
        .server_reflection_info(tokio_stream::iter(vec![req]))
        .await
        .unwrap()
        .into_inner();
    let resp = stream.message().await.unwrap().unwrap();
    assert!(matches!(
        resp.message_response,
        Some(v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(ref l))
            if l.service.iter().any(|s| s.name == "corral.v1.Tools")
    ));
}

#[tokio::test]
async fn sessions_open_close_and_not_found_after() {
    let d = Daemon::start(&[]).await;
    let dir = scratch();
    let id = d.open(dir.path(), SandboxMode::ReadOnly).await;
    assert_eq!(id.len(), 32);
    let mut sessions = d.sessions().await;
    sessions
        .close_session(api::CloseSessionRequest {
            session_id: id.clone(),
        })
        .await
        .unwrap();
    let err = sessions
        .close_session(api::CloseSessionRequest {
            session_id: id.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let err = d
        .tools()
        .await
        .read_file(api::ReadFileRequest {
            session_id: id,
            file_path: "/etc/hostname".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
}

#[tokio::test]
async fn unknown_session_is_not_found() {
    let d = Daemon::start(&[]).await;
    let err = d
        .tools()
        .await
        .list_dir(api::ListDirRequest {
            session_id: "00000000000000000000000000000000".into(),
            dir_path: "/".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert!(err.message().contains("not found"), "{}", err.message());
}

#[tokio::test]
async fn open_session_rejects_bad_input_naming_the_field() {
    let d = Daemon::start(&[]).await;
    let dir = scratch();
    let file = dir.path().join("f");
    std::fs::write(&file, "x").unwrap();
    let cases = [
        (
            String::new(),
            SandboxMode::ReadOnly,
            vec![],
            "cwd is required",
        ),
        (
            "relative/dir".into(),
            SandboxMode::ReadOnly,
            vec![],
            "cwd must be an absolute path",
        ),
        (
            file.display().to_string(),
            SandboxMode::ReadOnly,
            vec![],
            "is not a directory",
        ),
        (
            dir.path().display().to_string(),
            SandboxMode::WorkspaceWrite,
            vec!["rel".to_string()],
            "writable_roots[0] must be an absolute path",
        ),
        (
            dir.path().display().to_string(),
            SandboxMode::Unspecified,
            vec![],
            "mode is required",
        ),
    ];
    for (cwd, mode, roots, want) in cases {
        let err = d
            .sessions()
            .await
            .open_session(api::OpenSessionRequest {
                cwd,
                mode: mode as i32,
                writable_roots: roots,
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(err.message().contains(want), "{} !~ {want}", err.message());
        // The field is also named in a google.rpc.BadRequest detail.
        use tonic_types::StatusExt;
        let details = err.get_error_details();
        let bad = details.bad_request().expect("BadRequest detail");
        assert!(!bad.field_violations[0].field.is_empty());
    }
}

#[tokio::test]
async fn idle_sessions_expire() {
    let d = Daemon::start(&["--session-idle-timeout", "1"]).await;
    let dir = scratch();
    let id = d.open(dir.path(), SandboxMode::ReadOnly).await;
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let err = d
        .tools()
        .await
        .list_dir(api::ListDirRequest {
            session_id: id,
            dir_path: ".".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
}

#[tokio::test]
async fn read_file_typed_and_its_errors() {
    let d = Daemon::start(&[]).await;
    let dir = scratch();
    std::fs::write(dir.path().join("f.txt"), "alpha\nbeta\ngamma\n").unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let id = d.open(dir.path(), SandboxMode::ReadOnly).await;
    let mut tools = d.tools().await;

    let resp = tools
        .read_file(api::ReadFileRequest {
            session_id: id.clone(),
            file_path: "f.txt".into(),
            offset: Some(2),
            limit: Some(2),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.text, "L2: beta\nL3: gamma");
    assert_eq!(resp.path, dir.path().join("f.txt").display().to_string());
    assert_eq!(
        resp.lines,
        vec![
            api::NumberedLine {
                number: 2,
                text: "beta".into()
            },
            api::NumberedLine {
                number: 3,
                text: "gamma".into()
            },
        ]
    );

    let read = |file_path: &str, offset: Option<u64>| api::ReadFileRequest {
        session_id: id.clone(),
        file_path: file_path.into(),
        offset,
        ..Default::default()
    };
    // The typed call's errors name the path (Invoke's model text stays Codex's); a directory
    // is the wrong kind of file, not an internal fault.
    let at = |name: &str| dir.path().join(name).display().to_string();
    let cases = [
        (
            read("f.txt", Some(0)),
            Code::InvalidArgument,
            format!("{}: offset must be a 1-indexed line number", at("f.txt")),
        ),
        (
            read("f.txt", Some(9)),
            Code::InvalidArgument,
            format!("{}: offset exceeds file length", at("f.txt")),
        ),
        (
            read("missing.txt", None),
            Code::NotFound,
            format!(
                "{}: failed to read file: No such file or directory (os error 2)",
                at("missing.txt")
            ),
        ),
        (
            read("sub", None),
            Code::FailedPrecondition,
            format!(
                "{}: failed to read file: Is a directory (os error 21)",
                at("sub")
            ),
        ),
    ];
    for (req, code, text) in cases {
        let err = tools.read_file(req).await.unwrap_err();
        assert_eq!((err.code(), err.message()), (code, text.as_str()));
    }
}

#[tokio::test]
async fn list_dir_typed() {
    let d = Daemon::start(&[]).await;
    let dir = scratch();
    std::fs::write(dir.path().join("entry.txt"), "x").unwrap();
    std::os::unix::fs::symlink("entry.txt", dir.path().join("link")).unwrap();
    std::fs::create_dir_all(dir.path().join("nested/deeper")).unwrap();
    std::fs::write(dir.path().join("nested/child.txt"), "x").unwrap();
    std::fs::write(dir.path().join("nested/deeper/grandchild.txt"), "x").unwrap();
    let id = d.open(dir.path(), SandboxMode::ReadOnly).await;
    let resp = d
        .tools()
        .await
        .list_dir(api::ListDirRequest {
            session_id: id.clone(),
            dir_path: dir.path().display().to_string(),
            offset: Some(1),
            limit: Some(20),
            depth: Some(3),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        resp.text,
        format!(
            "Absolute path: {}\nentry.txt\nlink@\nnested/\n  child.txt\n  deeper/\n    grandchild.txt",
            dir.path().display()
        )
    );
    assert!(!resp.more_entries);
    assert_eq!(resp.entries[1].kind, api::EntryKind::Symlink as i32);
    assert_eq!(resp.entries[5].depth, 2);

    let err = d
        .tools()
        .await
        .list_dir(api::ListDirRequest {
            session_id: id,
            dir_path: "nested".into(),
            offset: Some(10),
            limit: Some(1),
            depth: Some(1),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_eq!(
        err.message(),
        format!(
            "{}: offset exceeds directory entry count",
            dir.path().join("nested").display()
        )
    );
}

#[tokio::test]
async fn list_tools_in_both_formats() {
    let d = Daemon::start(&[]).await;
    let mut bridge = d.bridge().await;
    let responses = bridge
        .list_tools(api::ListToolsRequest {
            format: api::ToolFormat::Responses as i32,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .tools_json;
    let read_file_def = include_str!("../../src/calls/definitions/read_file.json");
    assert!(responses.contains(read_file_def));
    let parsed: Vec<serde_json::Value> = serde_json::from_str(&responses).unwrap();
    assert!(parsed.iter().any(|t| t["name"] == "list_dir"));

    let chat = bridge
        .list_tools(api::ListToolsRequest {
            format: api::ToolFormat::ChatCompletions as i32,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .tools_json;
    let parsed: Vec<serde_json::Value> = serde_json::from_str(&chat).unwrap();
    for tool in &parsed {
        assert_eq!(tool["type"], "function");
        assert!(tool.get("name").is_none());
        assert_eq!(tool["function"]["strict"], false);
    }
    assert!(chat.starts_with(
        r#"[{"type":"function","function":{"name":"shell","description":"Runs a shell command"#
    ));
}

#[tokio::test]
async fn invoke_tools_and_model_facing_errors() {
    let d = Daemon::start(&[]).await;
    let dir = scratch();
    std::fs::write(dir.path().join("f.txt"), "alpha\nbeta\n").unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    std::fs::write(dir.path().join("sub/a.txt"), "").unwrap();
    let id = d.open(dir.path(), SandboxMode::ReadOnly).await;

    assert_eq!(
        d.invoke(&id, "read_file", r#"{"file_path":"f.txt"}"#).await,
        ("L1: alpha\nL2: beta".to_string(), true)
    );
    assert_eq!(
        d.invoke(&id, "list_dir", r#"{"dir_path":"sub"}"#).await,
        (
            format!("Absolute path: {}/sub\na.txt", dir.path().display()),
            true
        )
    );
    let failures = [
        (
            "read_file",
            r#"{"file_path":"f.txt","offset":0}"#,
            "offset must be a 1-indexed line number".to_string(),
        ),
        (
            "read_file",
            r#"{"file_path":"f.txt","offset":5}"#,
            "offset exceeds file length".to_string(),
        ),
        (
            "read_file",
            r#"{"file_path":"sub"}"#,
            "failed to read file: Is a directory (os error 21)".to_string(),
        ),
        (
            "read_file",
            r#"{"file_path":"nope.txt"}"#,
            "failed to read file: No such file or directory (os error 2)".to_string(),
        ),
        (
            "read_file",
            r#"{"file_path": "#,
            "failed to parse function arguments: EOF while parsing a value at line 1 column 14"
                .to_string(),
        ),
        (
            "read_file",
            r#"{"offset":1}"#,
            "failed to parse function arguments: missing field `file_path` at line 1 column 12"
                .to_string(),
        ),
        (
            "list_dir",
            r#"{"dir_path":"sub","depth":0}"#,
            "depth must be greater than zero".to_string(),
        ),
        (
            "list_dir",
            r#"{"dir_path":"f.txt"}"#,
            "failed to read directory: Not a directory (os error 20)".to_string(),
        ),
        (
            "no_such_tool",
            "{}",
            "unsupported call: no_such_tool".to_string(),
        ),
    ];
    for (name, args, want) in failures {
        assert_eq!(
            d.invoke(&id, name, args).await,
            (want, false),
            "{name} {args}"
        );
    }

    let err = d
        .bridge()
        .await
        .invoke(api::InvokeRequest {
            session_id: "feedface".into(),
            name: "read_file".into(),
            arguments: "{}".into(),
            call_id: "c".into(),
            freeform: false,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
}

#[tokio::test]
async fn the_cli_talks_to_the_daemon() {
    let d = Daemon::start(&[]).await;
    let dir = scratch();
    std::fs::write(dir.path().join("f.txt"), "one\ntwo\n").unwrap();
    let run = |args: &[&str]| {
        std::process::Command::new(CORRAL)
            .args(args)
            .args(["--socket", d.target()])
            .output()
            .unwrap()
    };
    let out = run(&["health"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "SERVING\n");

    let cwd = dir.path().to_str().unwrap();
    let out = run(&["read-file", "f.txt", "--cwd", cwd]);
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "L1: one\nL2: two\n");

    let out = run(&[
        "invoke",
        "read_file",
        r#"{"file_path":"f.txt","limit":1}"#,
        "--cwd",
        cwd,
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["output"], "L1: one");
    assert_eq!(v["success"], true);

    let out = run(&[
        "invoke",
        "read_file",
        r#"{"file_path":"nope"}"#,
        "--cwd",
        cwd,
    ]);
    assert_eq!(out.status.code(), Some(1));

    let out = run(&["read-file", "nope", "--cwd", cwd]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "one clear line: {stderr}");
    assert!(
        stderr.starts_with("error: NotFound: ") && stderr.contains("/nope: failed to read file"),
        "{stderr}"
    );
}

#[tokio::test]
async fn sigterm_stops_cleanly_and_removes_the_socket() {
    let mut d = Daemon::start(&[]).await;
    let status = d.terminate();
    assert!(
        status.success(),
        "exit status {status:?}; log:\n{}",
        d.log_text()
    );
    assert!(!d.socket.exists(), "socket file removed");
}

#[tokio::test]
async fn a_live_socket_is_refused_and_a_stale_one_replaced() {
    let d = Daemon::start(&[]).await;
    let out = std::process::Command::new(CORRAL)
        .args(["serve", "--listen", &format!("unix:{}", d.target())])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("already listening"));

    // A stale socket: bound, then abandoned without unlinking.
    let dir = scratch();
    let stale = dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    assert!(stale.exists());
    let mut d2 = common::Daemon {
        child: Some(
            std::process::Command::new(CORRAL)
                .args(["serve", "--listen", &format!("unix:{}", stale.display())])
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        ),
        socket: stale.clone(),
        log: dir.path().join("none.log"),
        _dir: dir,
        caller: None,
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        if corral::client::connect(stale.to_str().unwrap())
            .await
            .is_ok()
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "daemon over stale socket did not start"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(d2.terminate().success());
}

#[tokio::test]
async fn sigterm_lets_in_flight_calls_finish() {
    let mut d = Daemon::start(&[]).await;
    let dir = scratch();
    let id = d.open(dir.path(), SandboxMode::ReadOnly).await;
    let mut tools = d.tools().await;
    let call = tokio::spawn(async move {
        tools
            .shell(api::ShellRequest {
                session_id: id,
                command: vec!["bash".into(), "-c".into(), "sleep 1; echo finished".into()],
                ..Default::default()
            })
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pid = nix::unistd::Pid::from_raw(d.pid() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let resp = call
        .await
        .unwrap()
        .expect("the in-flight call completes")
        .into_inner();
    assert_eq!(resp.exit_code, 0);
    assert_eq!(resp.stdout.unwrap().head, b"finished\n");
    assert!(d.terminate_wait().success());
    assert!(!d.socket.exists());
}

#[tokio::test]
async fn serves_a_socket_passed_by_systemd_socket_activation() {
    let dir = common::outside();
    let socket = dir.path().join("activated.sock");
    let mut child = std::process::Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/support/socket_activate.py"
        ))
        .arg(&socket)
        .arg(CORRAL)
        .args(["serve", "--listen", &format!("unix:{}", socket.display())])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let target = socket.to_str().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let channel = loop {
        if let Ok(c) = corral::client::connect(target).await {
            break c;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "activated daemon did not answer"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let resp = tonic_health::pb::health_client::HealthClient::new(channel)
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        resp.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(child.wait().unwrap().success());
    // The socket file belongs to the activator (systemd), not to the daemon.
    assert!(socket.exists());
}

/// `corral tools | head -c1`: a reader that leaves ends the command quietly (no panic, no error
/// line), as for any Unix filter.
#[tokio::test]
async fn a_closed_stdout_ends_a_cli_command_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let d = Daemon::start(&[]).await;
    let mut child = std::process::Command::new(CORRAL)
        .args(["tools", "--socket", d.target()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The reader is gone before the command writes a byte.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.is_empty(), "nothing to report: {stderr}");
    assert_eq!(
        out.status.signal(),
        Some(nix::sys::signal::Signal::SIGPIPE as i32),
        "{:?}",
        out.status
    );
}

/// Every INVALID_ARGUMENT carries a google.rpc.BadRequest naming the request field: a tool's
/// own refusal (ReadFile's `offset 0`), one the worker names by the call's main input, and
/// the daemon's own (a profile that does not exist).
#[tokio::test]
async fn invalid_arguments_name_their_field_in_a_bad_request() {
    use tonic_types::StatusExt;
    let d = Daemon::start(&[]).await;
    let dir = scratch();
    std::fs::write(dir.path().join("f.txt"), "alpha\n").unwrap();
    let id = d.open(dir.path(), SandboxMode::WorkspaceWrite).await;
    let mut tools = d.tools().await;
    let field = |s: tonic::Status| {
        assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
        let bad = s
            .get_details_bad_request()
            .unwrap_or_else(|| panic!("{s:?}"));
        assert_eq!(bad.field_violations.len(), 1);
        bad.field_violations[0].field.clone()
    };
    let read = |offset, limit| api::ReadFileRequest {
        session_id: id.clone(),
        file_path: "f.txt".into(),
        offset,
        limit,
        ..Default::default()
    };
    let err = tools.read_file(read(Some(0), None)).await.unwrap_err();
    // The message is unchanged; the detail is beside it.
    assert!(
        err.message()
            .ends_with("f.txt: offset must be a 1-indexed line number"),
        "{}",
        err.message()
    );
    assert_eq!(field(err), "offset");
    let err = tools.read_file(read(Some(9), None)).await.unwrap_err();
    assert_eq!(field(err), "offset");
    let err = tools.read_file(read(None, Some(0))).await.unwrap_err();
    assert_eq!(field(err), "limit");
    let err = tools
        .list_dir(api::ListDirRequest {
            session_id: id.clone(),
            dir_path: ".".into(),
            depth: Some(0),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(field(err), "depth");
    let err = tools
        .grep_files(api::GrepFilesRequest {
            session_id: id.clone(),
            pattern: "(".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(field(err), "pattern");
    let err = tools
        .apply_patch(api::ApplyPatchRequest {
            session_id: id.clone(),
            patch: "not a patch".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(field(err), "patch");
    let err = d
        .sessions()
        .await
        .open_session(api::OpenSessionRequest {
            cwd: dir.path().display().to_string(),
            mode: SandboxMode::ReadOnly as i32,
            profile: "no-such-profile".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(field(err), "profile");
}

/// JSON null is "absent" for every optional argument of every tool through Invoke, and a
/// required one sent as null fails with Codex's own text.
#[tokio::test]
async fn invoke_takes_null_for_every_optional_argument() {
    let d = Daemon::start(&[]).await;
    let dir = scratch();
    std::fs::write(dir.path().join("f.txt"), "alpha\nbeta\n").unwrap();
    let png = dir.path().join("i.png");
    let mut bytes = std::io::Cursor::new(Vec::new());
    image::RgbaImage::new(1, 1)
        .write_to(&mut bytes, image::ImageFormat::Png)
        .unwrap();
    std::fs::write(&png, bytes.get_ref()).unwrap();
    let id = d.open(dir.path(), SandboxMode::ReadOnly).await;
    let calls = [
        (
            "read_file",
            r#"{"file_path":"f.txt","offset":null,"limit":null,"mode":null,"indentation":null}"#,
        ),
        (
            "read_file",
            r#"{"file_path":"f.txt","mode":"indentation","indentation":{"anchor_line":null,"max_levels":null,"include_siblings":null,"include_header":null,"max_lines":null}}"#,
        ),
        (
            "list_dir",
            r#"{"dir_path":".","offset":null,"limit":null,"depth":null}"#,
        ),
        (
            "grep_files",
            r#"{"pattern":"alpha","include":null,"path":null,"limit":null}"#,
        ),
        (
            "update_plan",
            r#"{"explanation":null,"plan":[{"step":"a","status":"pending"}]}"#,
        ),
        ("view_image", r#"{"path":"i.png","detail":null}"#),
        (
            "exec_command",
            r#"{"cmd":"echo hi","workdir":null,"shell":null,"login":null,"tty":null,"yield_time_ms":null,"max_output_tokens":null,"sandbox_permissions":null,"with_escalated_permissions":null,"justification":null,"prefix_rule":null}"#,
        ),
    ];
    for (name, args) in calls {
        let (text, ok) = d.invoke(&id, name, args).await;
        assert!(ok, "{name} {args}: {text}");
    }
    let (text, ok) = d
        .invoke(
            &id,
            "exec_command",
            r#"{"cmd":"sleep 2","tty":null,"yield_time_ms":250}"#,
        )
        .await;
    assert!(ok, "{text}");
    let pid: i32 = text
        .lines()
        .find_map(|l| l.strip_prefix("Process running with session ID "))
        .unwrap_or_else(|| panic!("{text}"))
        .parse()
        .unwrap();
    let (text, ok) = d
        .invoke(
            &id,
            "write_stdin",
            &format!(
                r#"{{"session_id":{pid},"chars":null,"yield_time_ms":null,"max_output_tokens":null}}"#
            ),
        )
        .await;
    assert!(ok, "{text}");
    // A required argument sent as null: Codex's error, its column that of the text as sent.
    assert_eq!(
        d.invoke(&id, "exec_command", r#"{"cmd":null,"tty":null}"#)
            .await,
        (
            "failed to parse function arguments: invalid type: null, expected a string at line 1 column 11"
                .to_string(),
            false
        )
    );
}
