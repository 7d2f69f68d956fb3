//! Approval policies (spec/sandbox.md §5.2) through a real daemon: every row of the table, the
//! two "done when" scenarios driven through Invoke as a scripted model would, the typed calls,
//! `approved_for_session`, the operator's veto, every bad decision (with nothing run, checked on
//! the host), the audit lines of each decision, ClassifyCommand and the CLI's answers.

use crate::common::{
    self, Daemon, TestUser, connect_as_unchecked, eventually, outside, scratch, session_env,
};
use corral::api::{
    self, ApprovalDecision, ApprovalKind, ApprovalPolicy, SandboxMode, bridge_client::BridgeClient,
};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};
use tonic::Code;

const REJECTED: &str = "exec command rejected by user";
const RETRY_REASON: &str = "command failed; retry without sandbox?";

/// A daemon with an audit log; `escalation`: the operator allows escalated calls (and trusts
/// root callers with them, as the test calls as root).
struct Fixture {
    d: Daemon,
    audit: PathBuf,
    _logs: tempfile::TempDir,
}

async fn daemon(escalation: bool) -> Fixture {
    let logs = outside();
    let audit = logs.path().join("audit.log");
    let mut args = vec!["--audit-log", audit.to_str().unwrap()];
    if escalation {
        args.extend(["--allow-escalation", "--root-callers", "trusted"]);
    }
    let d = Daemon::start(&args).await;
    Fixture {
        d,
        audit,
        _logs: logs,
    }
}

impl Fixture {
    async fn open(&self, cwd: &Path, policy: ApprovalPolicy) -> String {
        self.open_with(cwd, policy, None).await
    }

    async fn open_with(&self, cwd: &Path, policy: ApprovalPolicy, timeout: Option<u64>) -> String {
        self.d
            .open_with(api::OpenSessionRequest {
                cwd: cwd.to_string_lossy().into_owned(),
                mode: SandboxMode::WorkspaceWrite as i32,
                env: session_env(cwd),
                approval_policy: policy as i32,
                approval_timeout_ms: timeout,
                ..Default::default()
            })
            .await
    }

    /// A model's call through Invoke (call id `call_7`).
    async fn call(&self, session: &str, name: &str, args: &Value) -> api::InvokeResponse {
        let r = self
            .d
            .bridge()
            .await
            .invoke(api::InvokeRequest {
                session_id: session.into(),
                name: name.into(),
                arguments: args.to_string(),
                call_id: "call_7".into(),
                freeform: false,
            })
            .await
            .unwrap_or_else(|s| panic!("invoke: {s:?}\n{}", self.d.log_text()))
            .into_inner();
        assert_eq!(r.call_id, "call_7");
        r
    }

    async fn decide(
        &self,
        session: &str,
        approval_id: &str,
        decision: ApprovalDecision,
    ) -> Result<api::DecideApprovalResponse, tonic::Status> {
        decide_on(&mut self.d.bridge().await, session, approval_id, decision).await
    }

    /// An approval the model's call got, decided: the completed call.
    async fn decided(
        &self,
        session: &str,
        approval: &api::ApprovalRequest,
        decision: ApprovalDecision,
    ) -> api::InvokeResponse {
        match self
            .decide(session, &approval.approval_id, decision)
            .await
            .unwrap_or_else(|s| panic!("decide: {s:?}\n{}", self.d.log_text()))
            .result
        {
            Some(api::decide_approval_response::Result::Invoke(r)) => r,
            other => panic!("not an Invoke result: {other:?}"),
        }
    }

    /// The audit lines about `approval_id`, in order.
    fn audit_of(&self, approval_id: &str) -> Vec<Value> {
        audit_lines(&self.audit)
            .into_iter()
            .filter(|l| l["approval_id"] == approval_id)
            .collect()
    }
}

async fn decide_on(
    bridge: &mut BridgeClient<tonic::transport::Channel>,
    session: &str,
    approval_id: &str,
    decision: ApprovalDecision,
) -> Result<api::DecideApprovalResponse, tonic::Status> {
    bridge
        .decide_approval(api::DecideApprovalRequest {
            session_id: session.into(),
            approval_id: approval_id.into(),
            decision: decision as i32,
        })
        .await
        .map(|r| r.into_inner())
}

fn audit_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `(outcome, approval_kind, decision)` of audit lines.
fn summary(lines: &[Value]) -> Vec<(String, String, String)> {
    let s = |v: &Value| v.as_str().unwrap_or("").to_string();
    lines
        .iter()
        .map(|l| (s(&l["outcome"]), s(&l["approval_kind"]), s(&l["decision"])))
        .collect()
}

fn row(outcome: &str, kind: &str, decision: &str) -> (String, String, String) {
    (outcome.into(), kind.into(), decision.into())
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The sandbox's refusal as a command reports it (Landlock's EACCES or the read-only mount).
fn looks_denied(output: &str) -> bool {
    let o = output.to_lowercase();
    o.contains("permission denied") || o.contains("read-only file system")
}

fn shell(argv: &[&str]) -> Value {
    json!({ "command": argv })
}

/// Done when (1): under on-failure, a write outside the workspace is denied by the sandbox; the
/// model's call comes back as an approval request; approved, the command reruns unsandboxed
/// and its output reaches the model. Each step is in the audit log.
#[tokio::test]
async fn on_failure_asks_after_a_denial_and_the_approved_rerun_reaches_the_model() {
    let f = daemon(true).await;
    let cwd = scratch();
    let out = outside();
    let target = out.path().join("report.txt");
    let id = f.open(cwd.path(), ApprovalPolicy::OnFailure).await;
    let script = format!("echo escaped > {0} && cat {0}", target.display());
    let args = json!({
        "command": ["bash", "-c", script],
        "justification": "write the report",
    });
    let before = now_ms();
    let r = f.call(&id, "shell", &args).await;
    let a = r
        .approval
        .clone()
        .expect("an approval request, not a result");
    assert_eq!((r.output.as_str(), r.success), ("", false));
    assert_eq!(a.kind, ApprovalKind::RetryUnsandboxed as i32);
    assert_eq!(a.reason, RETRY_REASON);
    assert_eq!(a.command, ["bash", "-c", script.as_str()]);
    assert_eq!(a.cwd, cwd.path().to_str().unwrap());
    assert_eq!(a.justification, "write the report");
    assert_eq!(a.rejected_output, REJECTED);
    assert_eq!(a.call_id, "call_7");
    assert_eq!(a.approval_id.len(), 32);
    assert!(a.approval_id.bytes().all(|b| b.is_ascii_hexdigit()));
    assert!(
        a.expires_at_unix_ms >= before + 590_000 && a.expires_at_unix_ms <= now_ms() + 600_000,
        "the default wait is ten minutes: {}",
        a.expires_at_unix_ms
    );
    assert!(!target.exists(), "the sandbox denied the write");

    let done = f.decided(&id, &a, ApprovalDecision::Approved).await;
    assert!(done.approval.is_none());
    assert_eq!(done.call_id, "call_7");
    assert!(done.success, "{}", done.output);
    let output: Value = serde_json::from_str(&done.output).unwrap();
    assert_eq!(output["output"], "escaped\n");
    assert_eq!(output["metadata"]["exit_code"], 0);
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "escaped\n");

    let lines = f.audit_of(&a.approval_id);
    assert_eq!(
        summary(&lines),
        [
            row("approval_requested", "retry_unsandboxed", ""),
            row("approved", "retry_unsandboxed", "approved"),
            row("ok", "retry_unsandboxed", "approved"),
        ],
        "{lines:?}"
    );
    assert_eq!(lines[0]["escalated"], false);
    assert_eq!(lines[0]["mode"], "workspace-write");
    assert_eq!(lines[0]["tool"], "shell");
    assert_eq!(lines[0]["targets"], json!(["bash", "-c", script]));
    assert_eq!(lines[2]["escalated"], true);
    assert_eq!(lines[2]["mode"], "danger-full-access");
    // Denied (rejected) works the same way, and leaves the host alone.
    std::fs::remove_file(&target).unwrap();
    let r = f.call(&id, "shell", &args).await;
    let a = r
        .approval
        .expect("asked again: `approved` was for that call only");
    let done = f.decided(&id, &a, ApprovalDecision::Denied).await;
    assert_eq!((done.output.as_str(), done.success), (REJECTED, false));
    assert!(done.approval.is_none());
    assert!(!target.exists());
    assert_eq!(
        summary(&f.audit_of(&a.approval_id)),
        [
            row("approval_requested", "retry_unsandboxed", ""),
            row("rejected", "retry_unsandboxed", "denied"),
        ]
    );

    // The other command tools: shell_command's script, and exec_command's process when it
    // exits denied within its call (Codex's unified exec retries those too).
    for (tool, args, file) in [
        (
            "shell_command",
            json!({ "command": format!("echo sc > {}/sc", out.path().display()) }),
            "sc",
        ),
        (
            "exec_command",
            json!({ "cmd": format!("echo ec > {}/ec", out.path().display()), "yield_time_ms": 5000 }),
            "ec",
        ),
    ] {
        let r = f.call(&id, tool, &args).await;
        let a = r
            .approval
            .unwrap_or_else(|| panic!("{tool}: no retry question: {}", r.output));
        assert_eq!(a.kind, ApprovalKind::RetryUnsandboxed as i32, "{tool}");
        assert!(!out.path().join(file).exists());
        let done = f.decided(&id, &a, ApprovalDecision::Approved).await;
        assert!(done.approval.is_none(), "{tool}: {done:?}");
        assert_eq!(
            std::fs::read_to_string(out.path().join(file)).unwrap(),
            format!("{file}\n"),
            "{tool}: {}",
            done.output
        );
    }
    // A command that fails for its own reasons is not a denial: no question.
    let r = f
        .call(&id, "shell", &shell(&["bash", "-c", "exit 3"]))
        .await;
    assert!(r.approval.is_none() && !r.success, "{r:?}");
}

/// Done when (2): under untrusted, `ls` runs at once and `rm x` waits for a decision (x stays
/// on the host until it is approved); denied, the model gets Codex's rejection text and the
/// file stays. The same for exec_command and shell_command. No escalation is involved, so the
/// operator need not allow any.
#[tokio::test]
async fn untrusted_runs_known_safe_commands_at_once_and_waits_for_the_rest() {
    let f = daemon(false).await;
    let cwd = scratch();
    let x = cwd.path().join("x");
    std::fs::write(&x, "keep\n").unwrap();
    let id = f.open(cwd.path(), ApprovalPolicy::Untrusted).await;

    let r = f.call(&id, "shell", &shell(&["ls"])).await;
    assert!(r.approval.is_none(), "ls is known safe: {r:?}");
    assert!(
        r.success && r.output.contains("\"output\":\"x\\n\""),
        "{}",
        r.output
    );

    let r = f.call(&id, "shell", &shell(&["rm", "x"])).await;
    let a = r.approval.expect("rm needs a decision");
    assert_eq!(a.kind, ApprovalKind::BeforeRun as i32);
    assert_eq!(a.command, ["rm", "x"]);
    assert_eq!(a.reason, "");
    assert!(x.exists(), "nothing ran before the decision");
    let denied = f.decided(&id, &a, ApprovalDecision::Denied).await;
    assert_eq!((denied.output.as_str(), denied.success), (REJECTED, false));
    assert!(x.exists(), "denied: x stays");

    let r = f.call(&id, "shell", &shell(&["rm", "x"])).await;
    let a = r
        .approval
        .expect("asked again: the denial was for that call");
    assert!(x.exists());
    let done = f.decided(&id, &a, ApprovalDecision::Approved).await;
    assert!(done.success && done.approval.is_none(), "{done:?}");
    assert!(!x.exists(), "approved: rm ran");
    // It ran sandboxed, as the request said.
    let lines = f.audit_of(&a.approval_id);
    assert_eq!(
        summary(&lines),
        [
            row("approval_requested", "before_run", ""),
            row("approved", "before_run", "approved"),
            row("ok", "before_run", "approved"),
        ]
    );
    assert_eq!(lines[2]["escalated"], false);
    assert_eq!(lines[2]["mode"], "workspace-write");

    // The other command tools: the session's shell builds the argv.
    std::fs::write(cwd.path().join("y"), "y").unwrap();
    let r = f
        .call(
            &id,
            "exec_command",
            &json!({"cmd": "rm y", "yield_time_ms": 2000}),
        )
        .await;
    let a = r.approval.expect("exec_command rm waits");
    assert_eq!(a.command.last().map(String::as_str), Some("rm y"));
    assert_eq!(a.command[1], "-lc");
    assert!(cwd.path().join("y").exists());
    let done = f.decided(&id, &a, ApprovalDecision::Approved).await;
    assert!(
        done.output.contains("Process exited with code 0"),
        "{}",
        done.output
    );
    assert!(!cwd.path().join("y").exists());
    let r = f
        .call(
            &id,
            "exec_command",
            &json!({"cmd": "ls && cat x 2>/dev/null; pwd"}),
        )
        .await;
    assert!(r.approval.is_some(), "a redirection is not known safe");
    let r = f
        .call(&id, "exec_command", &json!({"cmd": "ls && pwd"}))
        .await;
    assert!(
        r.approval.is_none(),
        "known safe through the shell too: {r:?}"
    );
    let r = f
        .call(&id, "shell_command", &json!({"command": "touch z"}))
        .await;
    let a = r.approval.expect("shell_command waits");
    let done = f.decided(&id, &a, ApprovalDecision::Denied).await;
    assert_eq!(done.output, REJECTED);
    assert!(!cwd.path().join("z").exists());
    // Not commands: never asked.
    let r = f.call(&id, "read_file", &json!({"file_path": "x2"})).await;
    assert!(r.approval.is_none());
    let patch = "*** Begin Patch\n*** Add File: p.txt\n+p\n*** End Patch";
    let r = f.call(&id, "apply_patch", &json!({ "input": patch })).await;
    assert!(r.approval.is_none() && r.success, "{r:?}");
    let r = f
        .call(
            &id,
            "shell",
            &shell(&["apply_patch", &patch.replace("p.txt", "q.txt")]),
        )
        .await;
    assert!(
        r.approval.is_none() && r.success,
        "apply_patch through shell: {r:?}"
    );
    assert!(cwd.path().join("q.txt").exists());
}

/// `approved_for_session` is not asked again for the same command in the same directory — at
/// the level approved: sandboxed for a before-run question, unsandboxed for a retry.
#[tokio::test]
async fn approved_for_session_skips_the_second_question() {
    let f = daemon(true).await;
    let cwd = scratch();
    let id = f.open(cwd.path(), ApprovalPolicy::Untrusted).await;
    let touch = shell(&["touch", "a"]);
    let a = f.call(&id, "shell", &touch).await.approval.unwrap();
    let done = f
        .decided(&id, &a, ApprovalDecision::ApprovedForSession)
        .await;
    assert!(done.success);
    std::fs::remove_file(cwd.path().join("a")).unwrap();
    let r = f.call(&id, "shell", &touch).await;
    assert!(r.approval.is_none() && r.success, "not asked again: {r:?}");
    assert!(cwd.path().join("a").exists());
    assert_eq!(
        summary(&f.audit_of(&a.approval_id))[1],
        row("approved_for_session", "before_run", "approved_for_session")
    );
    // Another command, or the same one elsewhere, is asked.
    assert!(
        f.call(&id, "shell", &shell(&["touch", "b"]))
            .await
            .approval
            .is_some()
    );
    let elsewhere = json!({"command": ["touch", "a"], "workdir": "/"});
    assert!(f.call(&id, "shell", &elsewhere).await.approval.is_some());

    // A retry without the sandbox approved for the session: the next denial of that command
    // reruns unsandboxed at once (audited as such), not asked again.
    let out = outside();
    let id = f.open(cwd.path(), ApprovalPolicy::OnFailure).await;
    let write = shell(&[
        "bash",
        "-c",
        &format!("echo 1 >> {}/log", out.path().display()),
    ]);
    let a = f.call(&id, "shell", &write).await.approval.unwrap();
    assert_eq!(a.kind, ApprovalKind::RetryUnsandboxed as i32);
    let done = f
        .decided(&id, &a, ApprovalDecision::ApprovedForSession)
        .await;
    assert!(done.success, "{}", done.output);
    let r = f.call(&id, "shell", &write).await;
    assert!(r.approval.is_none() && r.success, "retried at once: {r:?}");
    assert_eq!(
        std::fs::read_to_string(out.path().join("log")).unwrap(),
        "1\n1\n"
    );
    let lines = audit_lines(&f.audit);
    let tail = summary(&lines[lines.len() - 2..]);
    assert_eq!(
        tail,
        [
            row("denied", "", ""),
            row("ok", "retry_unsandboxed", "approved_for_session"),
        ],
        "the sandboxed denial, then the granted retry"
    );
    assert_eq!(lines[lines.len() - 1]["escalated"], true);
}

/// The "model asks for escalation" column: on-request asks (showing the justification) and an
/// approved escalation's first run is unsandboxed; the other policies refuse with Codex's text
/// (shell's "should not", unified exec's "cannot"); no policy keeps corral's old behaviour.
#[tokio::test]
async fn escalation_requests_are_asked_only_under_on_request() {
    let f = daemon(true).await;
    let cwd = scratch();
    let out = outside();
    let target = out.path().join("esc");
    let argv = ["touch", target.to_str().unwrap()];
    let escalate = json!({
        "command": argv,
        "sandbox_permissions": "require_escalated",
        "justification": "needs the host",
    });

    let id = f.open(cwd.path(), ApprovalPolicy::OnRequest).await;
    let a = f.call(&id, "shell", &escalate).await.approval.unwrap();
    assert_eq!(a.kind, ApprovalKind::Escalate as i32);
    assert_eq!(a.justification, "needs the host");
    assert_eq!(a.reason, "");
    assert_eq!(a.command, argv);
    assert!(!target.exists(), "nothing runs before the decision");
    let done = f.decided(&id, &a, ApprovalDecision::Approved).await;
    assert!(done.success, "{}", done.output);
    assert!(target.exists(), "the first run was unsandboxed");
    let lines = f.audit_of(&a.approval_id);
    assert_eq!(lines[2]["escalated"], true);
    // Denied: Codex's text; nothing ran.
    std::fs::remove_file(&target).unwrap();
    let a = f.call(&id, "shell", &escalate).await.approval.unwrap();
    let done = f.decided(&id, &a, ApprovalDecision::Denied).await;
    assert_eq!((done.output.as_str(), done.success), (REJECTED, false));
    assert!(!target.exists());
    // Without asking for escalation, on-request runs sandboxed and the denial stands.
    let r = f.call(&id, "shell", &shell(&argv)).await;
    assert!(r.approval.is_none() && !r.success, "{r:?}");
    assert!(!target.exists());

    for (policy, name) in [
        (ApprovalPolicy::Untrusted, "UnlessTrusted"),
        (ApprovalPolicy::OnFailure, "OnFailure"),
        (ApprovalPolicy::Never, "Never"),
    ] {
        let id = f.open(cwd.path(), policy).await;
        let r = f.call(&id, "shell", &escalate).await;
        assert!(r.approval.is_none());
        assert_eq!(
            (r.output.as_str(), r.success),
            (
                format!(
                    "approval policy is {name}; reject command \u{2014} you should not ask for escalated permissions if the approval policy is {name}"
                )
                .as_str(),
                false
            )
        );
        let r = f
            .call(
                &id,
                "exec_command",
                &json!({"cmd": "id", "sandbox_permissions": "require_escalated"}),
            )
            .await;
        assert_eq!(
            r.output,
            format!(
                "approval policy is {name}; reject command \u{2014} you cannot ask for escalated permissions if the approval policy is {name}"
            )
        );
        assert!(!target.exists());
    }
    // No policy: the operator's leave alone decides, as before approval policies.
    let id = f.open(cwd.path(), ApprovalPolicy::Unspecified).await;
    let r = f.call(&id, "shell", &escalate).await;
    assert!(r.approval.is_none() && r.success, "{r:?}");
    assert!(target.exists());
}

/// The "after a sandbox denial" column: untrusted and on-failure ask to retry; on-request,
/// never and no policy return the denial. Under untrusted that is a second question after the
/// first approval.
#[tokio::test]
async fn after_a_denial_only_untrusted_and_on_failure_ask() {
    let f = daemon(true).await;
    let cwd = scratch();
    let out = outside();
    let target = out.path().join("t");
    let write = shell(&["bash", "-c", &format!("echo hi > {}", target.display())]);
    for policy in [
        ApprovalPolicy::OnRequest,
        ApprovalPolicy::Never,
        ApprovalPolicy::Unspecified,
    ] {
        let id = f.open(cwd.path(), policy).await;
        let r = f.call(&id, "shell", &write).await;
        assert!(r.approval.is_none(), "{policy:?}: {r:?}");
        assert!(!r.success);
        assert!(looks_denied(&r.output), "{}", r.output);
        assert!(!target.exists());
    }
    let id = f.open(cwd.path(), ApprovalPolicy::Untrusted).await;
    let first = f.call(&id, "shell", &write).await.approval.unwrap();
    assert_eq!(first.kind, ApprovalKind::BeforeRun as i32);
    let r = f.decided(&id, &first, ApprovalDecision::Approved).await;
    let retry = r
        .approval
        .expect("the sandboxed run was denied: asked again, to retry");
    assert_eq!(retry.kind, ApprovalKind::RetryUnsandboxed as i32);
    assert_eq!(retry.reason, RETRY_REASON);
    assert_ne!(retry.approval_id, first.approval_id);
    assert!(!target.exists());
    let done = f.decided(&id, &retry, ApprovalDecision::Approved).await;
    assert!(done.success, "{}", done.output);
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "hi\n");
    assert_eq!(
        summary(&f.audit_of(&first.approval_id)),
        [
            row("approval_requested", "before_run", ""),
            row("approved", "before_run", "approved"),
        ]
    );
    assert_eq!(
        summary(&f.audit_of(&retry.approval_id)),
        [
            row("approval_requested", "retry_unsandboxed", ""),
            row("approved", "retry_unsandboxed", "approved"),
            row("ok", "retry_unsandboxed", "approved"),
        ]
    );
}

/// An operator who does not allow escalation is never asked for it: the denial (or the
/// refusal) stands without a question; untrusted still asks before running, sandboxed.
#[tokio::test]
async fn without_the_operators_leave_nothing_unsandboxed_is_asked() {
    let f = daemon(false).await;
    let cwd = scratch();
    let out = outside();
    let target = out.path().join("t");
    let write = shell(&["bash", "-c", &format!("echo hi > {}", target.display())]);
    let id = f.open(cwd.path(), ApprovalPolicy::OnFailure).await;
    let r = f.call(&id, "shell", &write).await;
    assert!(r.approval.is_none() && !r.success, "{r:?}");
    assert!(looks_denied(&r.output), "{}", r.output);
    let id = f.open(cwd.path(), ApprovalPolicy::OnRequest).await;
    let r = f
        .call(
            &id,
            "shell",
            &json!({"command": ["touch", target], "sandbox_permissions": "require_escalated"}),
        )
        .await;
    assert!(r.approval.is_none());
    assert_eq!(
        r.output,
        "approval policy is Never; reject command \u{2014} you should not ask for escalated permissions if the approval policy is Never"
    );
    let id = f.open(cwd.path(), ApprovalPolicy::Untrusted).await;
    let a = f.call(&id, "shell", &write).await.approval.unwrap();
    assert_eq!(a.kind, ApprovalKind::BeforeRun as i32);
    let r = f.decided(&id, &a, ApprovalDecision::Approved).await;
    assert!(
        r.approval.is_none() && !r.success,
        "the denial stands: {r:?}"
    );
    assert!(!target.exists());
}

/// Bad decisions — an unknown id, another user's approval, a second decision, one after the
/// deadline, a malformed one — each get their own clear error, and nothing runs (checked on
/// the host). Each is audited, and so is the approval nobody answered.
#[tokio::test]
async fn bad_decisions_are_refused_and_run_nothing() {
    let f = daemon(true).await;
    std::fs::set_permissions(
        f.d.socket.parent().unwrap(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let cwd = scratch();
    let marker = cwd.path().join("marker");
    let touch = shell(&["touch", "marker"]);
    let id = f.open(cwd.path(), ApprovalPolicy::Untrusted).await;
    let a = f.call(&id, "shell", &touch).await.approval.unwrap();

    // Malformed.
    let e = f
        .decide(&id, &a.approval_id, ApprovalDecision::Unspecified)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains("decision is required"),
        "{}",
        e.message()
    );
    let e = f
        .decide(&id, "", ApprovalDecision::Approved)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    // Unknown.
    let unknown = "0123456789abcdef0123456789abcdef";
    let e = f
        .decide(&id, unknown, ApprovalDecision::Approved)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    assert!(e.message().contains("not found") && e.message().contains("nothing ran"));
    // Another user's: neither through the owner's session nor through their own.
    let user = TestUser::create("apr");
    let channel = connect_as_unchecked(&f.d.socket, user.uid, user.gid)
        .await
        .unwrap();
    let mut theirs = BridgeClient::new(channel.clone());
    let their_session = corral::api::sessions_client::SessionsClient::new(channel)
        .open_session(api::OpenSessionRequest {
            cwd: user.dir.to_string_lossy().into_owned(),
            mode: SandboxMode::WorkspaceWrite as i32,
            approval_policy: ApprovalPolicy::Untrusted as i32,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .session_id;
    for session in [id.as_str(), their_session.as_str()] {
        let e = decide_on(
            &mut theirs,
            session,
            &a.approval_id,
            ApprovalDecision::Approved,
        )
        .await
        .unwrap_err();
        assert_eq!(e.code(), Code::NotFound, "{session}: {e:?}");
    }
    assert!(!marker.exists(), "nothing ran");
    // Their attempts left it pending: its owner decides it once, and only once.
    let denied = f.decided(&id, &a, ApprovalDecision::Denied).await;
    assert_eq!(denied.output, REJECTED);
    let e = f
        .decide(&id, &a.approval_id, ApprovalDecision::Approved)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(
        e.message().contains("already decided (denied)"),
        "{}",
        e.message()
    );
    assert!(!marker.exists(), "a second decision runs nothing");
    // Two decisions racing for one request: exactly one is taken, and the command runs once.
    let append = shell(&["bash", "-c", "echo once >> raced"]);
    let raced = f.call(&id, "shell", &append).await.approval.unwrap();
    let (mut b1, mut b2) = (f.d.bridge().await, f.d.bridge().await);
    let (r1, r2) = tokio::join!(
        decide_on(&mut b1, &id, &raced.approval_id, ApprovalDecision::Approved),
        decide_on(&mut b2, &id, &raced.approval_id, ApprovalDecision::Approved),
    );
    let codes =
        [r1.map(|_| Code::Ok), r2.map(|_| Code::Ok)].map(|r| r.unwrap_or_else(|e| e.code()));
    assert!(
        codes.contains(&Code::Ok) && codes.contains(&Code::FailedPrecondition),
        "{codes:?}"
    );
    assert_eq!(
        std::fs::read_to_string(cwd.path().join("raced")).unwrap(),
        "once\n"
    );

    // Too late: DEADLINE_EXCEEDED, naming the time and the text for the model.
    let quick = f
        .open_with(cwd.path(), ApprovalPolicy::Untrusted, Some(300))
        .await;
    let late = f.call(&quick, "shell", &touch).await.approval.unwrap();
    assert!(late.expires_at_unix_ms <= now_ms() + 300);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let e = f
        .decide(&quick, &late.approval_id, ApprovalDecision::Approved)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::DeadlineExceeded);
    assert!(
        e.message().contains("expired at") && e.message().contains(REJECTED),
        "{}",
        e.message()
    );
    assert!(!marker.exists(), "an expired approval runs nothing");

    let codes = |id: &str| -> Vec<String> {
        f.audit_of(id)
            .iter()
            .map(|l| {
                format!(
                    "{}:{}",
                    l["outcome"].as_str().unwrap(),
                    l["decision"].as_str().unwrap_or("")
                )
            })
            .collect()
    };
    assert_eq!(codes(unknown), ["NOT_FOUND:approved"]);
    assert_eq!(
        codes(&a.approval_id),
        [
            "approval_requested:",
            "NOT_FOUND:approved",
            "NOT_FOUND:approved",
            "rejected:denied",
            "FAILED_PRECONDITION:approved",
        ]
    );
    assert_eq!(
        codes(&late.approval_id),
        [
            "approval_requested:",
            "expired:expired",
            "DEADLINE_EXCEEDED:approved"
        ]
    );
    let other_user_lines: Vec<Value> = f
        .audit_of(&a.approval_id)
        .into_iter()
        .filter(|l| l["uid"] == user.uid)
        .collect();
    assert_eq!(other_user_lines.len(), 2, "both attempts are theirs");
    // The session's option is bounded.
    for bad in [0, 3_600_001] {
        let e =
            f.d.try_open_with(api::OpenSessionRequest {
                cwd: cwd.path().to_string_lossy().into_owned(),
                mode: SandboxMode::WorkspaceWrite as i32,
                approval_timeout_ms: Some(bad),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(
            e.message().contains("approval_timeout_ms"),
            "{}",
            e.message()
        );
    }
    let e =
        f.d.try_open_with(api::OpenSessionRequest {
            cwd: cwd.path().to_string_lossy().into_owned(),
            mode: SandboxMode::WorkspaceWrite as i32,
            approval_policy: 42,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
}

/// A session holds at most 16 calls waiting for a decision; they die with it (audited as
/// expired), and a decision for one afterwards finds nothing.
#[tokio::test]
async fn waiting_calls_are_bounded_and_die_with_their_session() {
    let f = daemon(false).await;
    let cwd = scratch();
    let id = f.open(cwd.path(), ApprovalPolicy::Untrusted).await;
    let mut waiting = Vec::new();
    for i in 0..16 {
        let r = f
            .call(&id, "shell", &shell(&["touch", &format!("f{i}")]))
            .await;
        waiting.push(r.approval.unwrap());
    }
    let e =
        f.d.bridge()
            .await
            .invoke(api::InvokeRequest {
                session_id: id.clone(),
                name: "shell".into(),
                arguments: shell(&["touch", "f16"]).to_string(),
                ..Default::default()
            })
            .await
            .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted);
    assert!(e.message().contains("16 calls waiting"), "{}", e.message());
    // Known-safe calls still run.
    assert!(f.call(&id, "shell", &shell(&["pwd"])).await.success);
    f.d.sessions()
        .await
        .close_session(api::CloseSessionRequest {
            session_id: id.clone(),
        })
        .await
        .unwrap();
    let e = f
        .decide(&id, &waiting[0].approval_id, ApprovalDecision::Approved)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    assert!(
        eventually(Duration::from_secs(5), || {
            waiting.iter().all(|a| {
                f.audit_of(&a.approval_id)
                    .iter()
                    .any(|l| l["outcome"] == "expired")
            })
        })
        .await,
        "each waiting call is audited as expired when its session closes"
    );
    assert_eq!(
        std::fs::read_dir(cwd.path()).unwrap().count(),
        0,
        "nothing ran"
    );
}

/// The typed calls wait too: Shell answers with an approval in its ShellResponse, ShellStream
/// with a one-event stream, StartProcess in its response; DecideApproval completes each with
/// its own result type (a typed call's denial is PERMISSION_DENIED with Codex's text).
#[tokio::test]
async fn typed_calls_wait_for_decisions_too() {
    let f = daemon(true).await;
    let cwd = scratch();
    let id = f.open(cwd.path(), ApprovalPolicy::Untrusted).await;
    let mut tools = f.d.tools().await;
    let req = |argv: &[&str]| api::ShellRequest {
        session_id: id.clone(),
        command: argv.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    let r = tools
        .shell(req(&["touch", "s"]))
        .await
        .unwrap()
        .into_inner();
    let a = r.approval.expect("Shell waits");
    assert_eq!((r.exit_code, r.text.as_str(), r.escalated), (0, "", false));
    assert!(!cwd.path().join("s").exists());
    let shell_result = |d: api::DecideApprovalResponse| match d.result {
        Some(api::decide_approval_response::Result::Shell(r)) => r,
        other => panic!("not a Shell result: {other:?}"),
    };
    let done = shell_result(
        f.decide(&id, &a.approval_id, ApprovalDecision::Approved)
            .await
            .unwrap(),
    );
    assert!(
        done.success && !done.escalated && done.approval.is_none(),
        "{done:?}"
    );
    assert!(cwd.path().join("s").exists());

    // ShellStream: the only event is the request.
    use tokio_stream::StreamExt;
    let mut stream = tools
        .shell_stream(req(&["touch", "streamed"]))
        .await
        .unwrap()
        .into_inner();
    let first = stream.next().await.unwrap().unwrap();
    let Some(api::shell_stream_event::Event::Approval(a)) = first.event else {
        panic!("expected an approval event: {first:?}");
    };
    assert!(stream.next().await.is_none(), "the stream ends with it");
    assert!(!cwd.path().join("streamed").exists());
    let done = shell_result(
        f.decide(&id, &a.approval_id, ApprovalDecision::Approved)
            .await
            .unwrap(),
    );
    assert!(done.success, "{done:?}");
    assert!(cwd.path().join("streamed").exists());

    // StartProcess: denied is PERMISSION_DENIED and nothing started; approved, it starts.
    let mut processes = f.d.processes().await;
    let start = || api::StartProcessRequest {
        session_id: id.clone(),
        command: Some(api::start_process_request::Command::Argv(api::Argv {
            args: vec!["touch".into(), "proc".into()],
        })),
        ..Default::default()
    };
    let r = processes.start_process(start()).await.unwrap().into_inner();
    assert_eq!(r.process_id, 0);
    let a = r.approval.expect("StartProcess waits");
    let e = f
        .decide(&id, &a.approval_id, ApprovalDecision::Denied)
        .await
        .unwrap_err();
    assert_eq!((e.code(), e.message()), (Code::PermissionDenied, REJECTED));
    assert!(!cwd.path().join("proc").exists());
    let a = processes
        .start_process(start())
        .await
        .unwrap()
        .into_inner()
        .approval
        .unwrap();
    match f
        .decide(&id, &a.approval_id, ApprovalDecision::Approved)
        .await
        .unwrap()
        .result
    {
        Some(api::decide_approval_response::Result::StartProcess(r)) => {
            assert!(r.process_id > 0 && r.approval.is_none(), "{r:?}")
        }
        other => panic!("not a StartProcess result: {other:?}"),
    }
    assert!(
        eventually(Duration::from_secs(5), || cwd.path().join("proc").exists()).await,
        "the approved process ran"
    );

    // A typed Shell denied by the sandbox under on-failure: the retry runs escalated and says
    // so.
    let out = outside();
    let id = f.open(cwd.path(), ApprovalPolicy::OnFailure).await;
    let r = tools
        .shell(api::ShellRequest {
            session_id: id.clone(),
            script: format!("echo typed > {}/t", out.path().display()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let a = r.approval.expect("asked to retry");
    assert_eq!(a.kind, ApprovalKind::RetryUnsandboxed as i32);
    assert_eq!(a.command[1], "-lc");
    let done = shell_result(
        f.decide(&id, &a.approval_id, ApprovalDecision::Approved)
            .await
            .unwrap(),
    );
    assert!(done.success && done.escalated, "{done:?}");
    assert_eq!(
        std::fs::read_to_string(out.path().join("t")).unwrap(),
        "typed\n"
    );
}

/// ClassifyCommand is §9's classification, for clients that pre-approve in their UI; it needs
/// no session.
#[tokio::test]
async fn classify_command_tells_known_safe_commands() {
    let d = Daemon::start(&[]).await;
    let mut bridge = d.bridge().await;
    for (argv, safe) in [
        (vec!["ls", "-la"], true),
        (vec!["bash", "-lc", "ls && cat README.md | wc -l"], true),
        (vec!["git", "status"], false),
        (vec!["sed", "-n", "1,5p", "f"], true),
        (vec!["rm", "x"], false),
        (vec!["bash", "-lc", "ls > out"], false),
        (vec!["find", ".", "-delete"], false),
        (vec![], false),
    ] {
        let r = bridge
            .classify_command(api::ClassifyCommandRequest {
                command: argv.iter().map(|s| s.to_string()).collect(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.known_safe, safe, "{argv:?}");
        assert_eq!(
            safe,
            corral::tools::command_safety::is_known_safe_command(
                &argv.iter().map(|s| s.to_string()).collect::<Vec<_>>()
            )
        );
    }
}

/// `corral invoke` answers approval requests: on a terminal it asks, without one it denies
/// (saying why) unless `--approvals` decided in advance.
#[tokio::test]
async fn the_cli_asks_on_its_terminal_and_denies_without_one() {
    let d = Daemon::start(&[]).await;
    let cwd = scratch();
    let run = |extra: &[&str]| {
        let out = std::process::Command::new(common::CORRAL)
            .args(["invoke", "shell", r#"{"command":["touch","m"]}"#, "--json"])
            .args(["--socket", d.target(), "--mode", "workspace-write"])
            .args(["--approval-policy", "untrusted", "--cwd"])
            .arg(cwd.path())
            .args(extra)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, out, err) = run(&[]);
    assert_eq!(code, Some(1), "{out} {err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (v["output"].as_str(), v["success"].as_bool()),
        (Some(REJECTED), Some(false))
    );
    assert!(
        err.contains("touch m") && err.contains("no terminal"),
        "{err}"
    );
    assert!(!cwd.path().join("m").exists());
    let (code, out, err) = run(&["--approvals", "approve"]);
    assert_eq!(code, Some(0), "{out} {err}");
    assert!(cwd.path().join("m").exists());

    // On a terminal (a pty from script(1)) it asks, and takes the answer typed there.
    let ask = |answer: &str, file: &str| {
        let cmd = format!(
            "{} invoke shell '{{\"command\":[\"touch\",\"{file}\"]}}' --socket {} \
             --mode workspace-write --approval-policy untrusted --cwd {}",
            common::CORRAL,
            d.target(),
            cwd.path().display()
        );
        let out = std::process::Command::new("script")
            .args(["-qec", &cmd, "/dev/null"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut child| {
                use std::io::Write;
                child
                    .stdin
                    .take()
                    .unwrap()
                    .write_all(format!("{answer}\n").as_bytes())?;
                child.wait_with_output()
            })
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let shown = ask("n", "tty-no");
    assert!(
        shown.contains("approve this command to run in the sandbox?")
            && shown.contains("$ touch tty-no")
            && shown.contains("[y]es, [n]o, [a]lways"),
        "{shown}"
    );
    assert!(shown.contains(REJECTED), "{shown}");
    assert!(!cwd.path().join("tty-no").exists());
    let shown = ask("y", "tty-yes");
    assert!(cwd.path().join("tty-yes").exists(), "{shown}");
}

/// The model cannot approve its own commands: a sandboxed process that reaches a daemon's
/// socket (here a second daemon's, outside its default socket directories, which are masked)
/// gets its approval request, but its decision is refused and nothing runs. From the host the
/// same CLI call approves and runs.
#[tokio::test]
async fn a_sandboxed_process_cannot_decide_approvals() {
    // The daemon hosting the model's sandbox.
    let a = Daemon::start(&[]).await;
    let ws = scratch();
    let cwd = ws.path().to_str().unwrap().to_string();
    let b_dir = outside();
    let b_socket = b_dir.path().join("corral.sock");
    let _b = Daemon::start_at(&b_socket, &[], &[], std::process::Stdio::null()).await;
    let b = b_socket.to_str().unwrap().to_string();
    let mark = ws.path().join("mark");
    let approve = format!(
        "{} invoke shell '{{\"command\":[\"touch\",\"mark\"]}}' --socket {b} --cwd {cwd} \
         --mode workspace-write --approval-policy untrusted --approvals approve --json",
        common::CORRAL
    );
    let (code, out) = common::host_sh(&approve);
    assert_eq!(code, 0, "from the host the approval runs it: {out}");
    assert!(mark.exists());
    std::fs::remove_file(&mark).unwrap();

    let session = a
        .open_with(api::OpenSessionRequest {
            cwd: cwd.clone(),
            mode: SandboxMode::WorkspaceWrite as i32,
            network_access: true,
            env: session_env(ws.path()),
            ..Default::default()
        })
        .await;
    // The sandboxed process cannot open a session on B at all (H19)...
    let ran = a.sh(&session, &format!("{approve}; echo rc=$?")).await;
    assert!(ran.output.contains("rc=2"), "{}", ran.output);
    assert!(
        ran.output.contains("inside a corral sandbox"),
        "the open is refused: {}",
        ran.output
    );
    // ...and given the id of a session the host opened there, it gets the approval request
    // but its decision is refused.
    let (code, b_session) = common::host_sh(&format!(
        "{} open-session --socket {b} --cwd {cwd} --mode workspace-write \
         --approval-policy untrusted",
        common::CORRAL
    ));
    assert_eq!(code, 0, "{b_session}");
    let approve_in = format!(
        "{} invoke shell '{{\"command\":[\"touch\",\"mark\"]}}' --socket {b} --session {} \
         --approvals approve --json",
        common::CORRAL,
        b_session.trim()
    );
    let ran = a.sh(&session, &format!("{approve_in}; echo rc=$?")).await;
    assert!(ran.output.contains("rc=2"), "{}", ran.output);
    assert!(
        ran.output.contains("not from a sandboxed process"),
        "the decision is refused: {}",
        ran.output
    );
    assert!(!mark.exists(), "a sandboxed process approved a command");
}

/// H22: what a person approves is what runs. The red team's spoof — a command whose text
/// carries `\r\x1b[2K  $ ls -la` to paint a harmless command over the real one — and a
/// direction override in the reason are shown escaped on the CLI's terminal prompt; nothing of
/// the model's text reaches the terminal as a control sequence. Answering no runs nothing.
#[tokio::test]
async fn the_cli_prompt_shows_hidden_characters_escaped() {
    let d = Daemon::start(&[]).await;
    let cwd = scratch();
    let args = outside();
    let file = args.path().join("args.json");
    let spoof = "touch pwned\r\u{1b}[2K  $ ls -la";
    std::fs::write(
        &file,
        json!({"command": ["bash", "-c", spoof],
               "justification": "list files\u{202e}txt.exe"})
        .to_string(),
    )
    .unwrap();
    let cmd = format!(
        "{} invoke shell @{} --socket {} --mode workspace-write --approval-policy untrusted \
         --cwd {}",
        common::CORRAL,
        file.display(),
        d.target(),
        cwd.path().display()
    );
    let out = std::process::Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(b"n\n")?;
            child.wait_with_output()
        })
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains(r"$ bash -c $'touch pwned\r\x1b[2K  $ ls -la'"),
        "{shown:?}"
    );
    assert!(shown.contains(r"list files\u202etxt.exe"), "{shown:?}");
    assert!(
        !shown.contains('\u{1b}') && !shown.contains('\u{202e}'),
        "a control sequence reached the terminal: {shown:?}"
    );
    assert!(!cwd.path().join("pwned").exists());
}
