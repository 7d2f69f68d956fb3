//! The audit log: one JSON line per call — who, which session, which tool, the argv or paths it
//! named (never file contents or patch bodies), the mode, escalation, the outcome, the exit code,
//! the duration and the bytes in and out. Written to a file (reopened on SIGHUP, for logrotate)
//! or to stdout.

use crate::daemon::caller::identity::Caller;
use crate::daemon::error::{CallError, Class};
use crate::sync::LockExt;
use crate::wire::{worker_reply::Result as Reply, worker_request::Call};
use prost::Message;
use serde::Serialize;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// Where audit lines go.
#[derive(Clone)]
pub struct Audit {
    sink: Arc<Mutex<Sink>>,
}

enum Sink {
    None,
    Stdout,
    File { path: PathBuf, file: File },
}

/// One audit line.
#[derive(Debug, Serialize)]
pub struct Record<'a> {
    /// RFC 3339 time, UTC.
    pub time: String,
    pub uid: u32,
    pub pid: Option<i32>,
    /// For authenticated TCP: `token:NAME` or `cert:NAME` (never the secret).
    pub credential: Option<String>,
    pub session: &'a str,
    pub tool: &'a str,
    /// The argv of a command, or the paths a call named. Never file contents.
    pub targets: Vec<String>,
    /// The session's working directory (where a command starts unless it names a workdir).
    #[serde(skip_serializing_if = "str::is_empty")]
    pub cwd: &'a str,
    pub mode: &'a str,
    pub escalated: bool,
    /// `ok`, `failed` (the tool reported failure), `denied` (sandbox denial), `timed_out`,
    /// `refused` (an escalation policy refused, answered to the model), the approval flow's
    /// `approval_requested`, `rejected` (the user denied) and `expired` (nobody answered in
    /// time), or the gRPC code of an error (`NOT_FOUND`, `PERMISSION_DENIED`, …).
    pub outcome: String,
    pub exit_code: Option<i32>,
    /// A command still running when the call ended: the process id it is kept under (an
    /// `exec_command` that yielded, a `write_stdin`, a started process). Its exit is on the
    /// line of the call that sees it (`exit_code` with this id).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process_id: Option<i32>,
    /// Bytes written to a running process's stdin (`write_stdin`, WriteProcess).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input_bytes: Option<usize>,
    pub duration_ms: u128,
    pub bytes_in: usize,
    pub bytes_out: usize,
    /// The approval the line is about (spec/sandbox.md §5.2), on lines of calls that asked or
    /// were decided.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approval_id: Option<&'a str>,
    /// The question: `before_run`, `retry_unsandboxed` or `escalate`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approval_kind: Option<&'a str>,
    /// The answer: `approved`, `approved_for_session`, `denied`, or `expired` (no answer in
    /// time).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decision: Option<&'a str>,
    /// A connection through the session's egress proxy (tool `egress`): which rule decided,
    /// why it was refused or failed, and the address connected to (or refused).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress: Option<EgressLine<'a>>,
}

/// What an egress line adds (see [`Record::egress`]).
#[derive(Debug, Serialize)]
pub struct EgressLine<'a> {
    pub method: &'a str,
    pub rule: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    pub reason: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
}

/// What an audit line says about an approval.
#[derive(Debug, Clone, Default)]
pub struct ApprovalNote {
    pub id: String,
    pub kind: &'static str,
    pub decision: Option<&'static str>,
}

fn open(path: &PathBuf) -> Result<File, String> {
    OpenOptions::new()
        .create(true)
        .append(true)
        // Readable by the daemon's user only (spec/sandbox.md §2.8).
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("cannot open the audit log {}: {e}", path.display()))
}

impl Audit {
    /// `target`: a file path, `-` for stdout, or `None` for no audit log.
    pub fn new(target: Option<&str>) -> Result<Audit, String> {
        let sink = match target {
            None => Sink::None,
            Some("-") => Sink::Stdout,
            Some(path) => {
                let path = PathBuf::from(path);
                let file = open(&path)?;
                Sink::File { path, file }
            }
        };
        Ok(Audit {
            sink: Arc::new(Mutex::new(sink)),
        })
    }

    /// Whether lines are written at all.
    pub fn enabled(&self) -> bool {
        !matches!(&*self.sink.locked(), Sink::None)
    }

    /// Reopens the file (after logrotate moved it). Keeps the old one if the new cannot open.
    pub fn reopen(&self) -> Result<(), String> {
        let mut sink = self.sink.locked();
        if let Sink::File { path, file } = &mut *sink {
            *file = open(path)?;
        }
        Ok(())
    }

    pub fn write(&self, record: &Record<'_>) {
        let Ok(mut line) = serde_json::to_string(record) else {
            return;
        };
        line.push('\n');
        let mut sink = self.sink.locked();
        let result = match &mut *sink {
            Sink::None => Ok(()),
            Sink::Stdout => std::io::stdout().lock().write_all(line.as_bytes()),
            Sink::File { file, .. } => file.write_all(line.as_bytes()),
        };
        if let Err(e) = result {
            tracing::error!("cannot write the audit log: {e}");
        }
    }

    /// Records one call as the pipeline finished it.
    pub fn call(&self, done: &Finished<'_>) {
        if !self.enabled() {
            return;
        }
        let (tool, targets) = crate::calls::facts::describe(done.call, done.parsed);
        let (written_to, input_bytes) =
            crate::calls::facts::stdin_of(done.call, done.parsed).unzip();
        self.write(&Record {
            time: rfc3339(SystemTime::now()),
            uid: done.caller.uid,
            pid: done.caller.pid,
            credential: done.credential.clone(),
            session: done.session,
            tool: &tool,
            targets,
            cwd: done.cwd,
            mode: done.mode,
            escalated: done.escalated,
            outcome: done.outcome.name.clone(),
            exit_code: done.outcome.exit_code,
            process_id: done.outcome.process_id.or(written_to),
            input_bytes,
            duration_ms: done.duration.as_millis(),
            bytes_in: done.bytes_in,
            bytes_out: done.outcome.bytes_out,
            // A retry `approved_for_session` covered was never asked: it has no id.
            approval_id: done
                .approval
                .map(|a| a.id.as_str())
                .filter(|id| !id.is_empty()),
            approval_kind: done.approval.map(|a| a.kind),
            decision: done.approval.and_then(|a| a.decision),
            egress: None,
        });
    }
}

impl Audit {
    /// A decision that matched no waiting call (unknown, decided or expired approval): the
    /// line names the approval, the decision attempted and the refusal's code.
    pub fn unmatched_decision(
        &self,
        caller: Caller,
        credential: Option<String>,
        session: &str,
        approval_id: &str,
        decision: &str,
        class: Class,
    ) {
        if !self.enabled() {
            return;
        }
        self.write(&Record {
            time: rfc3339(SystemTime::now()),
            uid: caller.uid,
            pid: caller.pid,
            credential,
            session,
            tool: "decide_approval",
            targets: Vec::new(),
            cwd: "",
            mode: "",
            escalated: false,
            outcome: class.name().to_string(),
            exit_code: None,
            process_id: None,
            input_bytes: None,
            duration_ms: 0,
            bytes_in: 0,
            bytes_out: 0,
            approval_id: Some(approval_id),
            approval_kind: None,
            decision: Some(decision),
            egress: None,
        });
    }
}

impl Audit {
    /// One connection through a session's egress proxy: `outcome` is `allowed` or `denied`,
    /// `targets` the host and port asked for, bytes in and out as the sandbox sent and got them.
    pub fn egress(&self, owner_uid: u32, session: &str, d: &crate::egress::Decision) {
        if !self.enabled() {
            return;
        }
        self.write(&Record {
            time: rfc3339(SystemTime::now()),
            uid: owner_uid,
            pid: None,
            credential: None,
            session,
            tool: "egress",
            targets: vec![format!("{}:{}", d.host, d.port)],
            cwd: "",
            mode: "",
            escalated: false,
            outcome: if d.allowed { "allowed" } else { "denied" }.into(),
            exit_code: None,
            process_id: None,
            input_bytes: None,
            duration_ms: d.duration.as_millis(),
            bytes_in: usize::try_from(d.bytes_up).unwrap_or(usize::MAX),
            bytes_out: usize::try_from(d.bytes_down).unwrap_or(usize::MAX),
            approval_id: None,
            approval_kind: None,
            decision: None,
            egress: Some(EgressLine {
                method: d.method,
                rule: &d.rule,
                reason: &d.reason,
                address: d.address.map(|a| a.to_string()),
            }),
        });
    }
}

impl Audit {
    /// A SetNetworkRules attempt: `targets` are the rules asked for (`allow HOST`, `deny HOST`),
    /// `outcome` `ok` or the refusal's code.
    pub fn network_rules(
        &self,
        caller: Caller,
        credential: Option<String>,
        session: &str,
        targets: Vec<String>,
        outcome: &str,
    ) {
        if !self.enabled() {
            return;
        }
        self.write(&Record {
            time: rfc3339(SystemTime::now()),
            uid: caller.uid,
            pid: caller.pid,
            credential,
            session,
            tool: "set_network_rules",
            targets,
            cwd: "",
            mode: "",
            escalated: false,
            outcome: outcome.to_string(),
            exit_code: None,
            process_id: None,
            input_bytes: None,
            duration_ms: 0,
            bytes_in: 0,
            bytes_out: 0,
            approval_id: None,
            approval_kind: None,
            decision: None,
            egress: None,
        });
    }
}

/// One call as it left the pipeline: what the audit line says.
pub struct Finished<'a> {
    pub caller: Caller,
    /// `token:NAME` or `cert:NAME` for authenticated TCP.
    pub credential: Option<String>,
    pub session: &'a str,
    /// The mode the call ran in and the session's cwd (empty if it never reached a session).
    pub mode: &'a str,
    pub cwd: &'a str,
    pub call: &'a Call,
    /// The call's arguments as parsed once (a model call).
    pub parsed: Option<&'a crate::calls::facts::ToolCall>,
    pub escalated: bool,
    pub outcome: &'a Outcome,
    pub duration: Duration,
    pub bytes_in: usize,
    pub approval: Option<&'a ApprovalNote>,
}

/// How a call ended, for the audit line and the metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// `ok`, `failed`, `denied`, `timed_out`, `refused` (an escalation the model asked for and
    /// policy refused, answered to the model), or the gRPC code's name.
    pub name: String,
    pub exit_code: Option<i32>,
    /// The process a command left running (see [`Record::process_id`]).
    pub process_id: Option<i32>,
    pub bytes_out: usize,
}

impl Outcome {
    pub fn of(result: &Result<Reply, CallError>) -> Outcome {
        match result {
            Ok(reply) => outcome_of(reply),
            Err(e) => Outcome::failed(e),
        }
    }

    /// A call that failed: the failure's class names the outcome.
    pub fn failed(error: &CallError) -> Outcome {
        Self::class(error.class())
    }

    /// A streamed call whose client went away before its end.
    pub fn client_left() -> Outcome {
        Self::class(Class::Cancelled)
    }

    /// A streamed call whose worker ended it without saying how it ended.
    pub fn unfinished() -> Outcome {
        Self::class(Class::Internal)
    }

    fn class(class: Class) -> Outcome {
        Self::named(class.name(), 0)
    }

    /// A model's escalation request refused by policy: the refusal text went back as output.
    pub fn refused(bytes_out: usize) -> Outcome {
        Self::named("refused", bytes_out)
    }

    /// An outcome of the approval flow: `approval_requested` (the call waits for a decision),
    /// `rejected` (denied, or expired: the model got the rejection text), `expired`.
    pub fn named(name: &str, bytes_out: usize) -> Outcome {
        Outcome {
            name: name.into(),
            exit_code: None,
            process_id: None,
            bytes_out,
        }
    }
}

/// The encoded size of a call's request (the audit's bytes in).
pub fn call_len(call: &Call) -> usize {
    match call {
        Call::ReadFile(r) => r.encoded_len(),
        Call::ListDir(r) => r.encoded_len(),
        Call::GrepFiles(r) => r.encoded_len(),
        Call::ApplyPatch(r) => r.encoded_len(),
        Call::Shell(r) => r.encoded_len(),
        Call::Invoke(r) => r.encoded_len(),
        Call::Process(p) => p.encoded_len(),
        Call::PromptContext(r) => r.encoded_len(),
        Call::Files(f) => f.encoded_len(),
        Call::Cancel(_) | Call::Credit(_) | Call::CloseSession(_) | Call::UploadPiece(_) => 0,
    }
}

fn outcome_of(reply: &Reply) -> Outcome {
    let bytes = match reply {
        Reply::ReadFile(r) => r.encoded_len(),
        Reply::ListDir(r) => r.encoded_len(),
        Reply::GrepFiles(r) => r.encoded_len(),
        Reply::ApplyPatch(r) => r.encoded_len(),
        Reply::Shell(r) => r.encoded_len(),
        Reply::Invoke(r) => r.encoded_len(),
        Reply::Process(r) => r.encoded_len(),
        Reply::PromptContext(r) => r.encoded_len(),
        Reply::Files(r) => r.encoded_len(),
        _ => 0,
    };
    let outcome = |name: &str, exit_code, process_id| Outcome {
        name: name.into(),
        exit_code,
        process_id,
        bytes_out: bytes,
    };
    match reply {
        Reply::Shell(r) => {
            let name = if r.timed_out {
                "timed_out"
            } else if r.sandbox_denied {
                "denied"
            } else if r.success {
                "ok"
            } else {
                "failed"
            };
            outcome(name, Some(r.exit_code), None)
        }
        // H25: how the model's command ended, or the process it left running.
        Reply::Invoke(r) => outcome(
            if r.success { "ok" } else { "failed" },
            r.command.and_then(|c| c.exit_code),
            r.command.and_then(|c| c.process_id),
        ),
        Reply::Process(crate::wire::ProcessReply {
            op: Some(crate::wire::process_reply::Op::Start(r)),
        }) if r.process_id != 0 => outcome("ok", None, Some(r.process_id)),
        _ => outcome("ok", None, None),
    }
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` from the system clock (civil-from-days, UTC).
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_millis()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_utc() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        assert_eq!(rfc3339(t), "2023-11-14T22:13:20.123Z");
        assert_eq!(rfc3339(SystemTime::UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
    }

    #[test]
    fn patches_are_described_by_their_paths_only() {
        let p = "*** Begin Patch\n*** Add File: a.txt\n+secret\n*** Update File: b.txt\n*** Move to: c.txt\n@@\n-x\n+y\n*** End Patch";
        assert_eq!(
            crate::calls::facts::patch_paths(p),
            ["a.txt", "b.txt", "c.txt"]
        );
        assert_eq!(
            Outcome::failed(&CallError::Denied("no".into())).name,
            "PERMISSION_DENIED"
        );
    }
}
