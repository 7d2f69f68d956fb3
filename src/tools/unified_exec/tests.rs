use super::*;

#[test]
fn exec_yield_is_clamped_to_250_30000() {
    assert_eq!(clamp_exec_yield(0), 250);
    assert_eq!(clamp_exec_yield(500), 500);
    assert_eq!(clamp_exec_yield(999_999), 30_000);
    assert_eq!(clamp_exec_yield(DEFAULT_EXEC_YIELD_TIME_MS), 10_000);
}

#[test]
fn write_yield_clamps() {
    let max = DEFAULT_MAX_BACKGROUND_TERMINAL_TIMEOUT_MS;
    // A write: [250, 30 000].
    assert_eq!(clamp_write_yield(0, false, max), 250);
    assert_eq!(clamp_write_yield(999_999, false, max), 30_000);
    // An empty poll: [5 000, 300 000].
    assert_eq!(clamp_write_yield(250, true, max), 5_000);
    assert_eq!(clamp_write_yield(60_000, true, max), 60_000);
    assert_eq!(clamp_write_yield(999_999, true, max), 300_000);
    // The session's bound is never below 5 000.
    assert_eq!(clamp_write_yield(999_999, true, 1_000), 5_000);
}

#[test]
fn environment_overrides() {
    let env = process_env(
        &[
            ("PATH".into(), "/bin".into()),
            ("TERM".into(), "xterm".into()),
            ("PAGER".into(), "less".into()),
        ],
        true,
    );
    let get = |k: &str| {
        env.iter()
            .filter(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
            .collect::<Vec<_>>()
    };
    assert_eq!(get("PATH"), ["/bin"]);
    assert_eq!(get("TERM"), ["dumb"]);
    assert_eq!(get("PAGER"), ["cat"]);
    assert_eq!(get("COLORTERM"), [""]);
    assert_eq!(get("CODEX_CI"), ["1"]);
    assert_eq!(get("LC_ALL"), ["C.UTF-8"]);
    assert_eq!(get(NETWORK_DISABLED_ENV_VAR), ["1"]);
}

#[test]
fn argv_and_quoting() {
    let a = ExecCommandArgs::parse(r#"{"cmd":"echo hi","extra":1}"#).unwrap();
    assert!(!a.tty);
    assert_eq!(a.yield_time_ms, 10_000);
    let argv = a.argv("/bin/bash", true).unwrap();
    assert_eq!(argv, ["/bin/bash", "-lc", "echo hi"]);
    assert_eq!(shell_join(&argv), "/bin/bash -lc 'echo hi'");
    assert_eq!(shell_quote("it's"), r#"'it'"'"'s'"#);
    assert_eq!(shell_quote(""), "''");
    let a = ExecCommandArgs::parse(r#"{"cmd":"x","login":false,"shell":"/bin/sh"}"#).unwrap();
    assert_eq!(a.argv("/bin/bash", true).unwrap(), ["/bin/sh", "-c", "x"]);
    let a = ExecCommandArgs::parse(r#"{"cmd":"x","login":true}"#).unwrap();
    assert_eq!(
        a.argv("/bin/bash", false).unwrap_err().message,
        "login shell is disabled by config; omit `login` or set it to false."
    );
    assert_eq!(
        ExecCommandArgs::parse("{}").unwrap_err().message,
        "failed to parse function arguments: missing field `cmd` at line 1 column 2"
    );
    let w = WriteStdinArgs::parse(r#"{"session_id":5}"#).unwrap();
    assert_eq!((w.chars.as_str(), w.yield_time_ms), ("", 250));
    assert!(WriteStdinArgs::parse(r#"{"session_id":99999999999}"#).is_err());
}

#[test]
fn error_texts() {
    assert_eq!(
        errors::unknown_process(999_999).message,
        "write_stdin failed: Unknown process id 999999"
    );
    assert_eq!(
        errors::stdin_closed().message,
        "write_stdin failed: stdin is closed for this session; rerun exec_command with tty=true to keep stdin open"
    );
    assert_eq!(
        errors::write_failed().message,
        "write_stdin failed: failed to write to stdin"
    );
    assert_eq!(
        errors::create_failed(
            "/bin/bash -lc 'echo hi'",
            "No such file or directory (os error 2): /nope"
        )
        .message,
        "exec_command failed for `/bin/bash -lc 'echo hi'`: Failed to create unified exec process: No such file or directory (os error 2): /nope"
    );
    assert!(process_count_warning(61).ends_with("you currently have 61 processes open. Reuse older processes or close them to prevent automatic pruning of old processes"));
}

fn ctx(dir: &std::path::Path, session: &str) -> ToolContext {
    let mut c = crate::worker::commands::test_context(dir);
    c.session_id = session.to_string();
    c
}

#[test]
fn short_command_exits_within_the_call() {
    let dir = tempfile::tempdir().unwrap();
    let c = ctx(dir.path(), "unit-short");
    let args =
        ExecCommandArgs::parse(r#"{"cmd":"echo hi; echo $PAGER $TERM","login":false}"#).unwrap();
    let r = exec_command(&c, &args).unwrap();
    let text = r.model_text();
    assert!(
        text.contains(
            "\nProcess exited with code 0\nOriginal token count: 3\nOutput:\nhi\ncat dumb\n"
        ),
        "{text}"
    );
    assert!(r.output.wall_time < Duration::from_secs(2));
    assert!(table_of("unit-short").is_empty());
}

#[test]
fn pty_process_lives_between_calls() {
    let dir = tempfile::tempdir().unwrap();
    let c = ctx(dir.path(), "unit-pty");
    let args =
        ExecCommandArgs::parse(r#"{"cmd":"cat","tty":true,"login":false,"yield_time_ms":250}"#)
            .unwrap();
    let r = exec_command(&c, &args).unwrap();
    let id = r.output.session_id.expect("still running");
    let w = WriteStdinArgs::parse(&format!(r#"{{"session_id":{id},"chars":"abc\n"}}"#)).unwrap();
    let text = write_stdin(&c, &w).unwrap().model_text();
    assert!(text.contains("abc"), "{text}");
    assert!(
        text.contains(&format!("Process running with session ID {id}")),
        "{text}"
    );
    assert_eq!(close_session("unit-pty"), 1);
    assert_eq!(
        write_stdin(&c, &w).unwrap_err().message,
        format!("write_stdin failed: Unknown process id {id}")
    );
}

#[test]
fn pipes_have_no_stdin() {
    let dir = tempfile::tempdir().unwrap();
    let c = ctx(dir.path(), "unit-pipes");
    // stdin is closed: cat ends at once.
    let args = ExecCommandArgs::parse(r#"{"cmd":"cat; echo done","login":false}"#).unwrap();
    let text = exec_command(&c, &args).unwrap().model_text();
    assert!(text.contains("Process exited with code 0"), "{text}");
    let args =
        ExecCommandArgs::parse(r#"{"cmd":"sleep 5","login":false,"yield_time_ms":250}"#).unwrap();
    let id = exec_command(&c, &args).unwrap().output.session_id.unwrap();
    let w = WriteStdinArgs::parse(&format!(r#"{{"session_id":{id},"chars":"x"}}"#)).unwrap();
    assert_eq!(
        write_stdin(&c, &w).unwrap_err().message,
        errors::stdin_closed().message
    );
    close_session("unit-pipes");
}

#[test]
fn spawn_failure_text() {
    let dir = tempfile::tempdir().unwrap();
    let c = ctx(dir.path(), "unit-fail");
    let args =
        ExecCommandArgs::parse(r#"{"cmd":"echo hi","workdir":"nope","login":false}"#).unwrap();
    let e = exec_command(&c, &args).unwrap_err();
    assert_eq!(
        e.message,
        format!(
            "exec_command failed for `/bin/bash -c 'echo hi'`: Failed to create unified exec process: No such file or directory (os error 2): {}",
            dir.path().join("nope").display()
        )
    );
}

#[test]
fn escalation_refusal_says_cannot() {
    assert_eq!(
        errors::escalation_refused("Never").message,
        "approval policy is Never; reject command \u{2014} you cannot ask for escalated permissions if the approval policy is Never"
    );
}
